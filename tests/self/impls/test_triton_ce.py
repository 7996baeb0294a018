"""The Triton CE kernel (impls/builtin/triton_ce.py) equals the torch CE block (reference/numerics/ce_block.py) on small chunks, for
every option, both dtypes, ragged rows and vocabulary (padded lanes), one and several vocabulary blocks.

Bound on the difference (both read the same stored logits z; u = 2⁻²⁴, γ_n = n·u/(1−n·u), u_b = 2⁻⁸):

* z' = s·tanh(z/s): torch rounds /s, tanh (≤ 2 ulp) and ·s: ≤ 4u|z'|; the kernel's own tanh (module docstring
  of impls/builtin/triton_ce.py: ≤ 3u below |a| = 0.15, and e/(1−e) ≤ 2.9 times exp's ≤ 2u plus two roundings above)
  with /s and ·s: ≤ 10u|z'|. So |Δz'| ≤ 14u·Zmax_i, Zmax_i = max_j |z'_ij| (0 without softcap).
* each side's lse has error ≤ its δz' + R_i, R_i = γ_{V+4}(1 + |lse_i|) (a length-V sum of exponentials, the
  shift, exp, log), so |Δlse_i|, |Δ log s_i|, |Δ log p_ij| ≤ e_i = 2·14u·Zmax_i + 2R_i; the row maxima differ by
  at most |Δz'| (not at all without softcap). Given row statistics pass through both unchanged (bound 0).
* G (fp32 math on both sides): |ΔG_ij| ≤ Gabs_ij·(e_i + 10u) (the few products of each side), + 30u·Gabs_ij
  under softcap (d = 1 − t² with t off by ≤ 12u|t| on each side), Gabs = |c|(C·p + q) + |c^z|·2λ|lse|·p as in
  tests/self/impls/test_impls_oracle.py (without the factor d, which is ≤ 1); stored bf16 adds each side's rounding,
  2u_b·Gabs·(1 + e_i).
* per-row CE: |Δℓ_i| ≤ C_i·e_i + 2γ_{V+4}·(C_i|lse_i| + Σ_j q_ij|z'_ij|); z-loss: 2λ|lse_i|·e_i + 6u·ζ_i.

Safety factor 2 for second-order terms. Observed differences are far below (ratios ~1e-2).
"""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.builtin import triton_ce
from numcheck.reference.numerics.ce_block import SoftmaxStats, ce_block_, reduction_coefficients, row_weights

U, UB = 2.0**-24, 2.0**-8
SAFETY = 2.0
IGN = -100
DEVICE = "cpu" if triton_ce.INTERPRET else "cuda"  # the interpreter runs on CPU tensors

pytestmark = pytest.mark.skipif(
    triton_ce.unavailable_reason() is not None, reason=f"Triton kernel unavailable: {triton_ce.unavailable_reason()}"
)
pytestmark = [
    pytestmark,
    pytest.mark.torch_versions(
        reason="numcheck's Triton kernels under the Triton release this torch pins (3.2 with torch 2.6)"
    ),
]


def gamma(n: int) -> float:
    """γ_n at fp32's unit roundoff."""
    return n * U / (1 - n * U)


def _case(C: int, V: int, dtype: torch.dtype, *, ignored: int, cw: bool, seed: int, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(C, V, generator=g, dtype=torch.float64) * scale
    if V > 1024:  # put every row's maximum in the last (ragged) vocabulary block: online rescaling must work
        logits[:, -3] = logits.abs().amax(dim=1) + 1.0
    logits = logits.to(dtype)
    target = torch.randint(0, V, (C,), generator=g)
    target[:ignored] = IGN
    weights = torch.rand(V, generator=g) + 0.25 if cw else None
    upstream = torch.randn(C, generator=g)  # a non-uniform per-row upstream, folded into the coefficients
    valid, _, w_t = row_weights(target, weights, IGN)
    logits, target = logits.to(DEVICE), target.to(DEVICE)
    weights = weights.to(DEVICE) if weights is not None else None
    coef = reduction_coefficients(valid.to(DEVICE), w_t.to(DEVICE), "none", upstream=upstream.to(DEVICE))
    return logits, target, weights, coef


def _bounds(logits, target, weights, coef, *, eps, softcap, lam, stats_given):
    f = torch.float64
    logits, target = logits.cpu(), target.cpu()
    weights = weights.cpu() if weights is not None else None
    coef = type(coef)(*(c.cpu() for c in coef))
    z = logits.to(f)
    C, V = z.shape
    zc = softcap * torch.tanh(z / softcap) if softcap is not None else z
    lse = torch.logsumexp(zc, dim=1)
    p = torch.exp(zc - lse[:, None])
    valid, safe, w_t = row_weights(target, weights, IGN)
    w_t = w_t.to(f)
    cw = weights.to(f) if weights is not None else torch.ones(V, dtype=f)
    Cc = (1 - eps) * w_t + (eps / V) * float(cw.sum()) * valid
    q = ((eps / V) * cw[None, :] * valid[:, None]).clone()
    q[torch.arange(C), safe] += (1 - eps) * w_t
    Gabs = (
        coef.coef_ce.to(f).abs()[:, None] * (Cc[:, None] * p + q)
        + (coef.coef_z.to(f).abs() * 2 * lam * lse.abs())[:, None] * p
    )
    zmax = zc.abs().amax(dim=1) if softcap is not None else torch.zeros(C, dtype=f)
    R = gamma(V + 4) * (1 + lse.abs())
    e = 2 * 14 * U * zmax + 2 * R
    dG = Gabs * (e + 10 * U + (30 * U if softcap is not None else 0.0))[:, None]
    if logits.dtype != torch.float32:
        dG = dG + 2 * UB * Gabs * (1 + e)[:, None]
    zeta = lam * lse * lse * valid
    return {
        "lse": torch.zeros(C, dtype=f) if stats_given else e,
        "m": torch.zeros(C, dtype=f) if stats_given else 14 * U * zmax,
        "log_s": torch.zeros(C, dtype=f) if stats_given else e,
        "ce": (Cc * e + 2 * gamma(V + 4) * (Cc * lse.abs() + (q * zc.abs()).sum(1))) * valid,
        "z": 2 * lam * lse.abs() * e * valid + 6 * U * zeta,
        "G": dG,
    }


OPTION_SETS = {
    "plain": dict(),
    "ignore+smoothing": dict(eps=0.1),
    "class_weights+smoothing": dict(eps=0.2, cw=True),
    "softcap": dict(softcap=2.5),
    "z_loss": dict(lam=1e-2),
    "all": dict(eps=0.1, cw=True, softcap=4.0, lam=1e-3),
}


@pytest.mark.parametrize("mode", ["loss+grad", "stats-given-grad-only", "loss-only"])
@pytest.mark.parametrize("V", [37, 1500], ids=["V37", "V1500-two-blocks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_triton_equals_torch_block(opts, dtype, V, mode, request):
    """ce_block_triton_ gives the same per-row CE, z-loss, lse, row statistics and in-place gradient as ce_block_."""
    o = OPTION_SETS[opts]
    eps, softcap, lam = o.get("eps", 0.0), o.get("softcap"), o.get("lam", 0.0)
    C = 13  # not a multiple of the interpreter's rows per program
    logits, target, weights, coef = _case(
        C, V, dtype, ignored=3, cw=o.get("cw", False), seed=list(OPTION_SETS).index(opts) * 7 + V
    )
    stats = None
    if mode == "stats-given-grad-only":
        zc = logits.float()
        zc = softcap * torch.tanh(zc / softcap) if softcap is not None else zc
        m = zc.amax(dim=1)
        stats = SoftmaxStats(m, torch.logsumexp(zc - m[:, None], dim=1))
    kw = dict(
        ignore_index=IGN,
        label_smoothing=eps,
        class_weights=weights,
        softcap=softcap,
        z_loss_scale=lam,
        stats=stats,
        want_loss=mode != "stats-given-grad-only",
        want_grad=mode != "loss-only",
    )
    a, b = logits.clone(), logits.clone()
    ra = ce_block_(a, target, coef.coef_ce, coef.coef_z, **kw)
    rb = triton_ce.ce_block_triton_(b, target, coef.coef_ce, coef.coef_z, **kw)
    bounds = _bounds(logits, target, weights, coef, eps=eps, softcap=softcap, lam=lam, stats_given=stats is not None)
    pairs = {"lse": (ra.lse, rb.lse), "m": (ra.stats.m, rb.stats.m), "log_s": (ra.stats.log_s, rb.stats.log_s)}
    if kw["want_loss"]:
        pairs.update(ce=(ra.ce, rb.ce), z=(ra.z, rb.z))
    if kw["want_grad"]:
        pairs["G"] = (a, b)
    else:
        assert torch.equal(b, logits), "the kernel wrote the logits although want_grad=False"
    for name, (x_t, x_k) in pairs.items():
        x_t, x_k = x_t.double().cpu(), x_k.double().cpu()
        diff = (x_k - x_t).abs()
        bound = SAFETY * bounds[name]
        ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / bound)
        worst = int(ratio.argmax())
        assert float(ratio.max()) <= 1.0, (
            f"Triton vs torch CE block: {name} differs by {float(diff.reshape(-1)[worst]):.3g} > bound "
            f"{float(bound.reshape(-1)[worst]):.3g} at flat index {worst} (torch {float(x_t.reshape(-1)[worst]):.9g}, "
            f"triton {float(x_k.reshape(-1)[worst]):.9g}); options {opts}, {dtype}, V={V}, mode {mode}; "
            f"repro: pytest '{request.node.nodeid}'"
        )


def test_ignored_rows_get_exact_zero_gradient():
    """Ignored rows come out of the kernel with G exactly 0 and CE/z-loss exactly 0, whatever the options."""
    logits, target, weights, coef = _case(9, 37, torch.float32, ignored=4, cw=True, seed=5)
    b = logits.clone()
    r = triton_ce.ce_block_triton_(
        b,
        target,
        coef.coef_ce,
        coef.coef_z,
        ignore_index=IGN,
        label_smoothing=0.1,
        class_weights=weights,
        softcap=3.0,
        z_loss_scale=1e-2,
    )
    assert torch.equal(b[:4], torch.zeros_like(b[:4])), "non-zero gradient on ignored rows"
    assert torch.equal(r.ce[:4].cpu(), torch.zeros(4)) and torch.equal(r.z[:4].cpu(), torch.zeros(4))


def test_non_unit_stride_rejected():
    """A logits chunk without unit stride along V is refused with a ValueError naming logits."""
    logits, target, _, coef = _case(4, 8, torch.float32, ignored=0, cw=False, seed=6)
    with pytest.raises(ValueError, match="logits"):
        triton_ce.ce_block_triton_(logits.t().contiguous().t(), target, coef.coef_ce, coef.coef_z, ignore_index=IGN)
