"""The chunked, recompute and chunked_triton impls against the float64 oracle on hand-picked fp32 CPU cases,
plus what is specific to them: AMP dtypes, O(N) held across backward, no per-chunk host synchronisation.

fp32 bound (stated once, evaluated per element from the oracle's own quantities, u = 2⁻²⁴, γ_n = n·u/(1−n·u)):

* logits: |δz_ij| ≤ γ_{H+1}·Z_ij, Z = |x||W|ᵀ + |b|; Zmax_i = max_j Z_ij. Softcap rounds tanh, /s, ·s:
  + 3u·|z'| ≤ 3u·Zmax_i, and its derivative d = 1 − tanh² moves by ≤ 2·γ_{H+1}·Zmax_i/s.
* per row, every |δ log p_ij| and |δ(lse_i − z'_ij)| is at most
  e_i = 2·γ_{H+1}·Zmax_i + γ_{V+4}·(1 + |lse_i|) + 3u·Zmax_i   (δz' enters twice: itself and through lse;
  γ_{V+4} covers the length-V sum of exponentials, the shift, exp and log).
* G_ij is a sum of terms of total magnitude Gabs_ij = |c_i|·(C_i·p_ij + q_ij) + |c^z_i|·2λ|lse_i|·p_ij
  (C_i = (1−ε)w_{y_i} + (ε/V)S_w, q_ij = (1−ε)w_{y_i}δ_{j,y_i} + (ε/V)w_j, c, c^z the reduction coefficients
  times the upstream gradient); ∂g/∂z' is bounded by the same magnitudes, so
  |δG_ij| ≤ Gabs_ij·(e_i + 5u) =: dG_ij. Under softcap G = g·d and δG = d·δg + g·δd with
  |δd| ≤ 2d·γ_{H+1}Zmax_i/s, so Gabs is multiplied by d and 2γ_{H+1}Zmax_i/s is added to e_i + 5u.
* grad_x = G·W: dG·|W| + γ_V·Gabs·|W| + u|gx|;  grad_W = Gᵀx: dGᵀ|x| + γ_N·Gabsᵀ|x| + u|gW|;
  grad_b: Σ_i dG + γ_N·Σ_i Gabs + u|gb|.
* row loss ℓ_i = C_i·lse_i − Σ_j q_ij z'_ij: |δℓ_i| ≤ C_i·e_i + γ_{V+4}·(C_i|lse_i| + Σ_j q_ij|z'_ij|);
  z-loss |δζ_i| ≤ 2λ|lse_i|·e_i + 3u·ζ_i; reductions add γ_N times the sum of magnitudes (mean: also for D
  and |M|, each a length-N sum) and u·|result|.

Everything is multiplied by a safety factor of 2 for second-order terms and for exp/log/tanh being accurate to
about 1–2 ulp rather than u. That keeps the bound at fp32 level (about (H + V + N)·u relative to magnitudes),
while every semantic bug (an option ignored, upstream applied after the matmuls, a wrong normaliser) is O(1).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from numcheck.impls.builtin.chunked import DEFAULT_CHUNK_ROWS, chunked, recompute
from numcheck.impls.builtin.triton_ce import SPLIT_CHUNK_ROWS, triton_impls
from numcheck.properties.core.compare import compare
from numcheck.properties.core.device import DEVICE_TYPE
from numcheck.properties.linear_ce.cases import Problem, Tensors, build
from numcheck.properties.linear_ce.harness import oracle_operands, run_impl, run_oracle
from numcheck.reference.linear_ce import LinearCEResult

U = 2.0**-24
SAFETY = 2.0
CHUNK = 8  # small chunks so every case below sees several, and a ragged last one


def gamma(n: int) -> float:
    """γ_n at fp32's unit roundoff."""
    return n * U / (1 - n * U)


def _impls() -> list[Any]:
    out = [chunked(p) for p in ("addmm_out_dtype", "fallback", "fp32_operands", "lowp_accum")]
    out.append(recompute())
    out.extend(triton_impls())
    return [i.with_chunk_rows(CHUNK) for i in out]


IMPLS = _impls()
IMPL_IDS = [i.name for i in IMPLS]


def device_of(impl: Any) -> str:
    """Where to run ``impl``: the suite's device (``NUMCHECK_DEVICE``) when it declares it, else CPU when it
    declares CPU (the Triton one does only under the interpreter), else CUDA."""
    devices = impl.support.devices
    if DEVICE_TYPE in devices:
        return DEVICE_TYPE
    return "cpu" if "cpu" in devices else "cuda"


def _loss_bounds(
    o: Any, ref: LinearCEResult, C: torch.Tensor, q: torch.Tensor, zc: torch.Tensor, e: torch.Tensor, N: int
) -> dict[str, torch.Tensor]:
    """The loss and z-loss part of :func:`fp32_bounds`: each row's bound from the logits' error ``e``, then the
    reduction's sum (γ_N) and last rounding."""
    f = torch.float64
    dev = e.device
    V = q.shape[1]
    st = ref.stats
    lse = st.lse
    lam = float(o.z_loss_scale)
    out: dict[str, torch.Tensor] = {}
    valid = st.valid.to(f)
    d_ce = (C * e + gamma(V + 4) * (C * lse.abs() + (q * zc.abs()).sum(1))) * valid
    zeta = lam * lse * lse * valid
    d_z = 2 * lam * lse.abs() * e * valid + 3 * U * zeta
    ce_abs = ref.per_row.abs() - zeta  # ℓ_i ≥ 0, so |per_row| − ζ = ℓ_i
    if o.reduction == "none":
        out["loss"] = d_ce + d_z + U * ref.loss.abs()
        out["z_loss"] = d_z + U * zeta
    elif o.reduction == "sum":
        zsum = float(zeta.sum())
        out["z_loss"] = torch.tensor(float(d_z.sum()) + gamma(N) * zsum + U * zsum, dtype=f, device=dev)
        out["loss"] = torch.tensor(
            float((d_ce + d_z).sum()) + gamma(N) * float(ref.per_row.abs().sum()) + U * float(ref.loss.abs()),
            dtype=f,
            device=dev,
        )
    else:
        D, M = float(st.w_target.sum()), float(st.valid.sum())
        if M == 0:  # all ignored: the result is NaN by convention, compared exactly
            out["loss"] = out["z_loss"] = torch.zeros((), dtype=f, device=dev)
        else:
            zl = float(zeta.sum()) / M
            dz = float(d_z.sum()) / M + 2 * gamma(N) * zl + U * zl
            out["z_loss"] = torch.tensor(dz, dtype=f, device=dev)
            out["loss"] = torch.tensor(
                float(d_ce.sum()) / D + 2 * gamma(N) * float(ce_abs.sum()) / D + dz + U * float(ref.loss.abs()),
                dtype=f,
                device=dev,
            )
    return out


def fp32_bounds(p: Problem, t: Tensors, ref: LinearCEResult) -> dict[str, torch.Tensor]:
    """Element-wise fp32 error bounds of every output (the derivation is in the module docstring)."""
    f = torch.float64
    x, w, b = (a.to(f) if a is not None else None for a in oracle_operands(p, t))
    N, H = x.shape
    V = w.shape[0]
    dev = x.device
    o = t.options
    Z = x.abs() @ w.abs().T + (b.abs() if b is not None else 0.0)
    zmax = Z.amax(dim=1)
    z = x @ w.T + (b if b is not None else 0.0)
    zc = o.softcap * torch.tanh(z / o.softcap) if o.softcap is not None else z
    st = ref.stats
    lse = st.lse
    p_ = torch.exp(zc - lse[:, None])
    eps, lam = float(o.label_smoothing), float(o.z_loss_scale)
    cw = o.class_weights.to(f) if o.class_weights is not None else torch.ones(V, dtype=f, device=dev)
    S_w = float(cw.sum())
    C = (1 - eps) * st.w_target + (eps / V) * S_w * st.valid
    safe_t = torch.where(st.valid, t.target, torch.zeros_like(t.target))
    q = (eps / V) * cw[None, :] * st.valid[:, None].to(f)
    q = q.clone()
    q[torch.arange(N, device=dev), safe_t] += (1 - eps) * st.w_target
    Gabs = st.coef_ce.abs()[:, None] * (C[:, None] * p_ + q) + (st.coef_z.abs() * 2 * lam * lse.abs())[:, None] * p_
    e = 2 * gamma(H + 1) * zmax + gamma(V + 4) * (1 + lse.abs()) + 3 * U * zmax
    de = e + 5 * U
    if o.softcap is not None:  # G = g·d: both δg and δd carry the factor d
        Gabs = Gabs * (1 - torch.tanh(z / o.softcap) ** 2)
        de = de + 2 * gamma(H + 1) * zmax / o.softcap
    dG = Gabs * de[:, None]
    out = {
        "grad_x": dG @ w.abs() + gamma(V) * (Gabs @ w.abs()) + U * ref.grad_x.abs(),
        "grad_weight": dG.T @ x.abs() + gamma(N) * (Gabs.T @ x.abs()) + U * ref.grad_weight.abs(),
    }
    if b is not None:
        out["grad_bias"] = dG.sum(0) + gamma(N) * Gabs.sum(0) + U * ref.grad_bias.abs()
    out.update(_loss_bounds(o, ref, C, q, zc, e, N))
    return {k: SAFETY * v for k, v in out.items()}


BASE = dict(N=37, H=16, V=33)  # N not a multiple of CHUNK, V odd
ALL = dict(bias=True, ignored=0.25, label_smoothing=0.1, class_weights=True, softcap=4.0, z_loss_scale=1e-2)
CASES: list[tuple[str, Problem]] = [
    ("plain", Problem(**BASE)),
    ("bias", Problem(**BASE, bias=True)),
    ("ignore_index", Problem(**BASE, ignored=0.25, ignore_index=-7)),
    ("label_smoothing", Problem(**BASE, label_smoothing=0.2)),
    ("class_weights", Problem(**BASE, class_weights=True)),
    ("softcap", Problem(**BASE, softcap=30.0, regime="large")),
    ("softcap-saturated", Problem(**BASE, softcap=2.0, bias=True)),
    ("z_loss", Problem(**BASE, z_loss_scale=1e-2)),
    ("all-mean", Problem(**BASE, **ALL, seed=1)),
    ("all-sum-scalar-upstream", Problem(**BASE, **ALL, reduction="sum", upstream="scalar", seed=2)),
    ("all-none-per-row-upstream", Problem(**BASE, **ALL, reduction="none", upstream="per_row", seed=3)),
    ("none-per-row-upstream-plain", Problem(**BASE, reduction="none", upstream="per_row", seed=4)),
    ("all-ignored-mean", Problem(**BASE, ignored=1.0, z_loss_scale=1e-2)),
    ("all-ignored-sum", Problem(**BASE, ignored=1.0, reduction="sum", bias=True)),
    ("all-ignored-none", Problem(**BASE, ignored=1.0, reduction="none", upstream="per_row")),
    ("N-below-chunk-V-prime", Problem(N=5, H=8, V=31, **ALL)),
    ("confident", Problem(**BASE, regime="confident", label_smoothing=0.1, z_loss_scale=1e-3)),
]


def check_against_oracle(impl: Any, p: Problem, case: str, repro: str = "") -> dict[str, float]:
    """Run ``impl`` on ``p`` and assert every output within :func:`fp32_bounds`; return error/bound ratios."""
    __tracebackhide__ = True
    t = build(p)
    ref = run_oracle(p, t, all_ignored=impl.support.all_ignored)
    out = run_impl(impl, p, t)
    bounds = fp32_bounds(p, t, ref)
    ratios, bad = {}, []
    for name, bound in bounds.items():
        c = compare(name, out.get(name), getattr(ref, name), bound)
        ratios[name] = c.ratio
        if not c.ok:
            bad.append(c.describe())
    if bad:
        pytest.fail(
            f"impl {impl.name!r} (chunk_rows={impl.chunk_rows}) differs from the float64 oracle beyond the fp32 bound\n"
            f"  case {case}: {p!r}\n  " + "\n  ".join(bad) + f"\n  reproduce: {repro}",
            pytrace=False,
        )
    return ratios


@pytest.mark.parametrize("case,p", CASES, ids=[c for c, _ in CASES])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_matches_oracle(impl, case, p, request):
    """Loss, z_loss, grad_x, grad_W and grad_b equal the float64 oracle within the derived fp32 bound."""
    reason = impl.support.unavailable_reason()
    if reason:
        pytest.skip(f"{impl.name} unavailable: {reason}")
    check_against_oracle(impl, p.replace(device=device_of(impl)), case, repro=f"pytest '{request.node.nodeid}'")


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_default_chunk_is_declared(impl):
    """The registered impls declare their documented default chunk (DEFAULT_CHUNK_ROWS; SPLIT_CHUNK_ROWS for the
    split_fp32 ones), and with_chunk_rows changes only that."""
    base = {i.name: i for i in _registered()}[impl.name]
    default = SPLIT_CHUNK_ROWS if base.path == "split_fp32" else DEFAULT_CHUNK_ROWS
    assert base.support.chunk_rows == base.chunk_rows == default, f"{impl.name}: {base.support.chunk_rows}"
    assert impl.support.chunk_rows == impl.chunk_rows == CHUNK, f"{impl.name}: {impl.support.chunk_rows}"
    import dataclasses

    assert dataclasses.replace(impl.support, chunk_rows=default) == base.support, impl.name


def _registered() -> list[Any]:
    from numcheck.impls.registry import builtin_impls

    return [e.impl for e in builtin_impls() if getattr(e, "name", "") in IMPL_IDS]


AMP_BIAS = [
    ("no-bias", False, None),
    ("bias-bf16", True, "bfloat16"),
    ("bias-fp32", True, "float32"),
    ("bias-fp16", True, "float16"),
]


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("bias_case,bias,bias_dtype", AMP_BIAS, ids=[a[0] for a in AMP_BIAS])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_amp_smoke(impl, bias_case, bias, bias_dtype, reduction):
    """Under bf16 autocast (CPU; CUDA for a CUDA-only impl) with fp32 params (any bias dtype) the impl runs and returns finite gradients in
    the params' dtypes."""
    reason = impl.support.unavailable_reason()
    if reason:
        pytest.skip(f"{impl.name} unavailable: {reason}")
    assert torch.bfloat16 in impl.support.autocast, f"{impl.name} does not declare bf16 autocast"
    p = Problem(
        N=19,
        H=16,
        V=33,
        autocast="bfloat16",
        bias=bias,
        bias_dtype=bias_dtype,
        reduction=reduction,
        ignored=0.2,
        upstream="per_row" if reduction == "none" else "one",
        device=device_of(impl),
    )
    out = run_impl(impl, p)
    want = {
        "grad_x": torch.float32,
        "grad_weight": torch.float32,
        "grad_bias": getattr(torch, bias_dtype) if bias else None,
    }
    for name, dt in want.items():
        g = out.get(name)
        if dt is None:
            assert g is None, f"{impl.name}: {name} returned without a bias ({p!r})"
            continue
        assert g is not None and g.dtype == dt, (
            f"{impl.name}: {name} dtype {None if g is None else g.dtype}, want {dt} ({p!r})"
        )
        assert bool(torch.isfinite(g).all()), f"{impl.name}: non-finite {name} under AMP ({p!r})"


# -- memory held across backward and host syncs ------------------------------------------------------------
def _held_across_backward(impl: Any, p: Problem) -> list[tuple[tuple[int, ...], bool]]:
    """(shape, aliases an input) of every tensor autograd saves during forward."""
    t = build(p)
    x = t.x.clone().requires_grad_(True)
    w = t.weight.clone().requires_grad_(True)
    b = t.bias.clone().requires_grad_(True) if t.bias is not None else None
    inputs = {a.untyped_storage().data_ptr() for a in (x, w, b, t.target) if a is not None}
    saved: list[tuple[tuple[int, ...], bool]] = []

    def pack(s: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(s.shape), s.untyped_storage().data_ptr() in inputs))
        return s

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda s: s):
        impl(x, w, t.target, b, **t.options.call_kwargs())
    return saved


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_recompute_holds_o_n(reduction):
    """recompute (and chunked for `none`) keeps nothing but inputs and O(N) fp32 across backward; chunked for
    `mean` keeps its [V, H] grad_W accumulator (fp32 buffer, or bf16 gradient plus int16 lower half)."""
    from numcheck.impls.measure import memory
    from numcheck.properties.linear_ce.memory import held_across_backward

    p = Problem(N=24, H=16, V=40, bias=True, reduction=reduction, dtype="bfloat16")
    by_name = {i.name: i for i in IMPLS}
    from numcheck.impls.builtin import triton_ce

    # Under Triton's interpreter the last chunk's kernel arguments (its [C, V] logits and five [C] row vectors,
    # measured) stay alive after the launch, so the Triton impls' O(N) claim is checked where they compile.
    triton = () if triton_ce.INTERPRET else ("chunked_triton[split_fp32]", "recompute_triton[split_fp32]")
    for impl in [by_name[n] for n in ("recompute", "chunked[addmm_out_dtype]", *triton)]:
        if impl.support.unavailable_reason():
            continue
        held = held_across_backward(impl, p.replace(device=device_of(impl)))
        fused = not impl.name.startswith("recompute") and reduction != "none"
        if fused:
            assert held >= p.V * p.H * 4, f"{impl.name} {reduction}: holds {held} B, less than a [V, H] accumulator"
        else:
            # at most four fp32 [N] vectors, each rounded up to the CUDA caching allocator's 512-byte blocks
            o_n = 4 * (-(-4 * p.N // memory.CUDA_BLOCK) * memory.CUDA_BLOCK if device_of(impl) == "cuda" else 4 * p.N)
            assert held <= o_n, f"{impl.name} {reduction}: holds {held} B across backward, beyond O(N) ({o_n} B)"


class _SyncCounter(TorchDispatchMode):
    """Counts device→host reads (``.item()``, ``bool(tensor)``, ``int(tensor)`` all dispatch to
    ``aten._local_scalar_dense``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _syncs(impl: Any, p: Problem) -> int:
    t = build(p)
    x = t.x.clone().requires_grad_(True)
    w = t.weight.clone().requires_grad_(True)
    with _SyncCounter() as m:
        loss, _ = impl(x, w, t.target, None, **t.options.call_kwargs())
        up = t.upstream if t.upstream is not None else torch.ones_like(loss)
        loss.backward(up.expand_as(loss))
    return m.count


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_no_per_chunk_host_sync(impl, reduction):
    """Forward + backward makes as many host reads with 6 chunks as with 1: none inside the chunk loop."""
    reason = impl.support.unavailable_reason()
    if reason:
        pytest.skip(f"{impl.name} unavailable: {reason}")
    p = Problem(
        N=48,
        H=8,
        V=17,
        ignored=0.2,
        label_smoothing=0.1,
        class_weights=True,
        softcap=5.0,
        z_loss_scale=1e-3,
        reduction=reduction,
        upstream="per_row" if reduction == "none" else "one",
        device=device_of(impl),
    )
    one, six = _syncs(impl.with_chunk_rows(48), p), _syncs(impl.with_chunk_rows(8), p)
    assert six == one, f"{impl.name} {reduction}: {one} host reads with 1 chunk, {six} with 6 ({p!r})"


def test_bad_input_names_argument():
    """Bad calls raise ValueError naming the argument (dtype mismatch outside autocast, bad target, shapes)."""
    impl = chunked("addmm_out_dtype")
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    with pytest.raises(ValueError, match="weight"):
        impl(x, w.bfloat16(), torch.zeros(4, dtype=torch.long), reduction="mean", ignore_index=-100)
    with pytest.raises(ValueError, match=r"target\[2\]"):
        impl(x, w, torch.tensor([0, 1, 9, 2]), reduction="mean", ignore_index=-100)
    with pytest.raises(ValueError, match="bias"):
        impl(x, w, torch.zeros(4, dtype=torch.long), torch.zeros(4), reduction="mean", ignore_index=-100)
    with pytest.raises(ValueError, match="chunk_rows"):
        impl.with_chunk_rows(0)
    with pytest.raises(ValueError, match="reduction"):
        impl(x, w, torch.zeros(4, dtype=torch.long), reduction="avg", ignore_index=-100)


def test_second_backward():
    """The fused path consumes its stored gradients (a second backward raises, naming retain_graph);
    recompute can run backward twice and gives the same gradients."""
    t = build(Problem(N=12, H=8, V=17, bias=True))
    for impl, twice_ok in (
        (chunked("fallback").with_chunk_rows(CHUNK), False),
        (recompute().with_chunk_rows(CHUNK), True),
    ):
        w = t.weight.clone().requires_grad_(True)
        loss, _ = impl(t.x, w, t.target, t.bias, **t.options.call_kwargs())
        loss.backward(retain_graph=True)
        first = w.grad.clone()
        if twice_ok:
            w.grad = None
            loss.backward()
            assert torch.equal(w.grad, first), f"{impl.name}: second backward differs"
        else:
            with pytest.raises(RuntimeError, match="retain_graph"):
                loss.backward()


def test_compare_accepts_overflow_only_as_correct_rounding():
    """±inf matches a finite oracle only when a value within the bound rounds to it in the output dtype."""
    big = torch.tensor([87983.0, -70000.0, 65519.0], dtype=torch.float64)
    b = torch.tensor([1.0, 1.0, 16.0], dtype=torch.float64)
    assert compare("loss", big.to(torch.float16), big, b).ok  # 87983, -70000 -> ±inf; 65519 -> 65504 (half ulp 16)
    assert not compare("loss", torch.tensor([float("-inf")], dtype=torch.float16), big[:1], b[:1]).ok  # wrong sign
    assert not compare(
        "loss", torch.tensor([float("inf")], dtype=torch.float16), torch.tensor([43.0], dtype=torch.float64), b[:1]
    ).ok  # a representable mean: inf is wrong
    near = torch.tensor([65500.0], dtype=torch.float64)
    assert compare("loss", torch.tensor([float("inf")], dtype=torch.float16), near, torch.tensor([30.0])).ok
    assert not compare("loss", torch.tensor([float("inf")], dtype=torch.float16), near, torch.tensor([10.0])).ok


@pytest.mark.parametrize(
    "impl_value, state, words",
    [
        (None, "missing", "produced no value"),
        (torch.zeros(2), "shape_differs", "shape (2,) differs from the oracle's (3,)"),
        (torch.tensor([0.0, float("nan"), 0.0]), "nonfinite_mismatch", "non-finite mismatch at index [1]"),
        (torch.tensor([0.0, 2.0, 0.0]), "compared", "1 / 3 elements beyond bound"),
    ],
)
def test_compare_names_what_it_could_compare(impl_value, state, words):
    """A missing output, a shape that differs and a non-finite mismatch each get their own state and message."""
    c = compare("grad_x", impl_value, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    assert (c.ok, c.state) == (False, state)
    assert words in c.describe()
    assert bool(c.nonfinite) == (state == "nonfinite_mismatch")
