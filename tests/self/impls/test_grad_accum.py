"""The four grad_weight accumulation steps (reference/numerics/accumulation.py, as the built-ins bind them in
impls/builtin/grad_accum.py): accuracy against float64 with the expected
ordering, probe-driven path choice, fp32 and meta behaviour, AMP-style mixed operands, bad input.

Accuracy case: K = 64 chunks of C = 16 rows, bf16 G_k [C, V] and x_k [C, H] (V = 48, H = 24), fp32 accumulator
(bf16 for lowp_accum). Exact answer: float64 Σ_k G_kᵀx_k of the same bf16 values. With A_k = |G_k|ᵀ|x_k|,
A = Σ_k A_k, u_b = 2⁻⁸, γ_n = n·2⁻²⁴/(1 − n·2⁻²⁴) (Higham ch. 3; bf16 products are exact in fp32):

* fp32 accumulation (``fp32_operands``, ``addmm_out_dtype``): one recursive sum of K·C products in fp32,
  |err| ≤ γ_{KC}·A.
* ``fallback``: each chunk's fp32 product (error γ_C·A_k) is rounded to bf16 (≤ u_b·(1+γ_C)·A_k) and added in
  fp32 (γ_K on the running sum): |err| ≤ (u_b + γ_{C+K})·(1 + u_b)·A.
* ``lowp_accum``: step k computes S_{k−1} + P_k in fp32 (γ_{C+1}·(|S_{k−1}| + A_k)) and rounds it to bf16
  (u_b·|S_k|), with |S_k| ≤ (1+u_b)^k·Σ_{j≤k} A_j: |err| ≤ (u_b + γ_{C+1})·(1+u_b)^K·Σ_k Σ_{j≤k} A_j.

The ordering fp32 < fallback < lowp_accum (relative Frobenius error) is the point of carrying all four: the
fallback rounds K partial products, lowp_accum rounds K growing partial sums.
"""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.builtin import grad_accum
from numcheck.impls.measure import capabilities
from numcheck.reference.numerics import accumulation

pytestmark = pytest.mark.torch_versions(
    reason="grad_weight accumulation through addmm(out_dtype=) or its fallback, as the addmm_out_dtype probe says"
)

U32, UB = 2.0**-24, 2.0**-8
K, C, V, H = 64, 16, 48, 24


def gamma(n: int) -> float:
    """γ_n at fp32's unit roundoff."""
    return n * U32 / (1 - n * U32)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _chunks(
    dtype: torch.dtype = torch.bfloat16, seed: int = 0, device: str = "cpu"
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    Gs = [torch.randn(C, V, generator=g).to(device, dtype) for _ in range(K)]
    xs = [torch.randn(C, H, generator=g).to(device, dtype) for _ in range(K)]
    return Gs, xs


def _accumulate(path: str, Gs: list[torch.Tensor], xs: list[torch.Tensor], param_dtype: torch.dtype) -> torch.Tensor:
    gw = torch.zeros(V, H, dtype=accumulation.accumulator_dtype(path, param_dtype), device=Gs[0].device)
    for G, x in zip(Gs, xs):
        grad_accum.PATHS[path](gw, G, x)
    return gw


def _bounds(Gs: list[torch.Tensor], xs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    Ak = [G.double().abs().T @ x.double().abs() for G, x in zip(Gs, xs)]
    A = sum(Ak)
    prefix = torch.stack(Ak).cumsum(0).sum(0)
    fp32 = gamma(K * C) * A
    return {
        "fp32_operands": fp32,
        "addmm_out_dtype": fp32,
        "fallback": (UB + gamma(C + K)) * (1 + UB) * A,
        "lowp_accum": (UB + gamma(C + 1)) * (1 + UB) ** K * prefix,
    }


@pytest.mark.parametrize("device", DEVICES)
def test_paths_within_bounds_and_ordered(device):
    """On bf16 chunks every path is within its derived bound of float64, and fp32 < fallback < lowp_accum
    (on CUDA, addmm_out_dtype runs the real out_dtype call where the probe allows it)."""
    Gs, xs = _chunks(device=device)
    exact = sum(G.double().T @ x.double() for G, x in zip(Gs, xs))
    bounds = _bounds(Gs, xs)
    rel = {}
    for path in grad_accum.PATHS:
        gw = _accumulate(path, Gs, xs, torch.bfloat16)
        err = (gw.double() - exact).abs()
        ratio = (err / bounds[path]).max()
        worst = divmod(int((err / bounds[path]).argmax()), H)
        assert ratio <= 1, (
            f"path {path} (runs as {grad_accum.resolved_path(path, device, torch.bfloat16)} on {device}): "
            f"error/bound {float(ratio):.3g} at {worst}; repro: pytest tests/self/impls/test_grad_accum.py -k ordered"
        )
        rel[path] = float((gw.double() - exact).norm() / exact.norm())
    fp32 = max(rel["fp32_operands"], rel["addmm_out_dtype"])
    assert fp32 < rel["fallback"] < rel["lowp_accum"], f"expected fp32 < fallback < lowp_accum, got {rel}"
    assert rel["fallback"] > 100 * fp32, f"fallback should be orders of magnitude worse than fp32 accumulation: {rel}"


def test_fp32_operands_make_every_path_plain_addmm():
    """With fp32 operands and fp32 gw every path gives bitwise the result of the plain fp32 addmm."""
    Gs, xs = _chunks(torch.float32, seed=1)
    want = torch.zeros(V, H)
    for G, x in zip(Gs[:8], xs[:8]):
        torch.addmm(want, G.t(), x, out=want)
    for path in grad_accum.PATHS:
        got = _accumulate(path, Gs[:8], xs[:8], torch.float32)
        assert torch.equal(got, want), (
            f"path {path}: fp32 operands differ from plain addmm by {(got - want).abs().max()}"
        )
        assert grad_accum.resolved_path(path, "cpu", torch.float32) in ("fp32_operands", "lowp_accum"), path


def test_addmm_out_dtype_follows_the_probe():
    """addmm_out_dtype takes the out_dtype call exactly when the capability probe says so, else fp32 operands."""
    Gs, xs = _chunks(seed=2)
    G, x = Gs[0], xs[0]
    probe = capabilities.addmm_out_dtype("cpu", torch.bfloat16)
    with capabilities.forced(addmm_out_dtype=False):
        assert grad_accum.resolved_path("addmm_out_dtype", "cpu", torch.bfloat16) == "fp32_operands"
        a = torch.zeros(V, H)
        grad_accum.PATHS["addmm_out_dtype"](a, G, x)
    b = torch.zeros(V, H)
    accumulation.fp32_operands(b, G, x)
    assert torch.equal(a, b), "the probe-off path must be the fp32-operand addmm"
    with capabilities.forced(addmm_out_dtype=True):
        assert grad_accum.resolved_path("addmm_out_dtype", "cpu", torch.bfloat16) == "addmm_out_dtype"
        if not probe:  # CPU: the out_dtype call itself is what runs, and it raises there
            # (NotImplementedError from 2.8 on; TypeError before, where addmm has no out_dtype keyword)
            with pytest.raises((NotImplementedError, RuntimeError, TypeError)):
                grad_accum.PATHS["addmm_out_dtype"](torch.zeros(V, H), G, x)
    assert grad_accum.resolved_path("addmm_out_dtype", "cpu", torch.bfloat16) == (
        "addmm_out_dtype" if probe else "fp32_operands"
    )


@pytest.mark.parametrize("path", list(grad_accum.PATHS))
def test_meta_device(path):
    """Every step runs on the meta device (shapes and dtypes only), as the memory accounting needs."""
    if path == "addmm_out_dtype":
        try:
            acc = torch.zeros(2, 2, device="meta")
            torch.addmm(
                acc,
                torch.ones(2, 3, device="meta", dtype=torch.bfloat16),
                torch.ones(3, 2, device="meta", dtype=torch.bfloat16),
                out_dtype=torch.float32,
                out=acc,
            )
        except Exception as exc:  # torch 2.11's meta decomposition of addmm(out_dtype) raises TypeError
            pytest.skip(
                f"this torch ({torch.__version__}) cannot run addmm(out_dtype=) on meta: {type(exc).__name__}: {exc}"
            )
    with capabilities.forced(addmm_out_dtype=True):
        gw = torch.zeros(V, H, device="meta", dtype=accumulation.accumulator_dtype(path, torch.bfloat16))
        grad_accum.PATHS[path](
            gw,
            torch.empty(C, V, device="meta", dtype=torch.bfloat16),
            torch.empty(C, H, device="meta", dtype=torch.bfloat16),
        )
        gb = torch.zeros(V, device="meta", dtype=gw.dtype)
        accumulation.accumulate_bias(grad_accum.PATHS[path], gb, torch.empty(C, V, device="meta", dtype=torch.bfloat16))
    assert gw.shape == (V, H) and gb.shape == (V,)


@pytest.mark.parametrize("path", list(grad_accum.PATHS))
def test_mixed_operands_under_amp(path):
    """bf16 G with an fp32 x (as under autocast), inside and outside autocast: no dtype error, and the result
    equals the same path on x rounded to bf16 (fp32_operands, and lowp_accum with an fp32 parameter's
    accumulator, align to fp32: on x itself)."""
    Gs, xs = _chunks(seed=3)
    G, x32 = Gs[0], xs[0].float() + 1e-3  # not exactly bf16
    xr = x32 if path in ("fp32_operands", "lowp_accum") else x32.bfloat16()
    for ctx in (torch.autocast("cpu", dtype=torch.bfloat16), torch.autocast("cpu", enabled=False)):
        gw_dtype = accumulation.accumulator_dtype(path, torch.float32)
        a, b = torch.zeros(V, H, dtype=gw_dtype), torch.zeros(V, H, dtype=gw_dtype)
        with ctx:
            grad_accum.PATHS[path](a, G, x32)
        grad_accum.PATHS[path](b, G, xr)
        assert torch.equal(a, b), f"path {path}: mixed operands differ from aligned ones by {(a - b).abs().max()}"


def test_bias_accumulation_is_column_sum():
    """accumulate_bias adds Σ_rows G through the step (fp32 path: equals the fp32 column sum to γ_C)."""
    G = _chunks(seed=4)[0][0]
    gb = torch.zeros(V)
    accumulation.accumulate_bias(accumulation.fp32_operands, gb, G)
    exact = G.double().sum(0)
    assert ((gb.double() - exact).abs() <= gamma(C) * G.double().abs().sum(0)).all()


def test_bad_input_names_argument():
    """Wrong accumulator dtype, shapes or path names raise ValueError naming the argument."""
    G, x = torch.zeros(C, V, dtype=torch.bfloat16), torch.zeros(C, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gw must be float32"):
        accumulation.fallback(torch.zeros(V, H, dtype=torch.bfloat16), G, x)
    with pytest.raises(ValueError, match="gw has shape"):
        accumulation.fp32_operands(torch.zeros(H, V), G, x)
    with pytest.raises(ValueError, match="x_chunk"):
        accumulation.lowp_accum(torch.zeros(V, H), G, x[:-1])
    with pytest.raises(ValueError, match="path"):
        grad_accum.resolved_path("nope", "cpu", torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_scaling_multiplies_in_fp32(dtype):
    """A stored gradient times the upstream gradient is computed in fp32 and rounded once, whatever the buffer's
    dtype: a loss scale of 2^17 must not round to inf in fp16 first (0·inf = NaN: seen on the H200, where a
    bf16/fp16 tensor's in-place mul rounds an fp32 scalar to its own dtype), nor 1 + 2^-10 to 1 in bf16."""
    from numcheck.properties.core.device import DEVICE

    buf = torch.tensor([[0.0, 1e-3, -(2.0**-20)], [3.0, -1e-4, 0.5]], dtype=dtype, device=DEVICE)
    for g in (2.0**17, 1.0 + 2.0**-10):
        want = (buf.double() * g).to(dtype)
        got = accumulation.scaled_(buf.clone(), torch.tensor(g, dtype=torch.float32, device=DEVICE), dtype)
        assert got.dtype == dtype and torch.equal(got, want), f"{dtype}, g={g}: {got.tolist()} != {want.tolist()}"
