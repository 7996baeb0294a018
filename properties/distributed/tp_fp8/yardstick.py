"""Judgement (b) for a tensor/sequence-parallel FP8 linear: every assembled output (and each rank's partial bias
gradient under row-parallel SP) judged as on one device, against the dequantized-operand reference, with the
relative judgement of :mod:`numcheck.properties.core.relative` (RMSE(impl − o_dq) ≤ k(n_eff)·RMSE(yardstick − o_dq) +
λ(α)·RMS(E): the same k, λ and α).

The yardstick is numcheck's evaluation of the path the declaration states, on the oracle's dequantized operands
(the quantization is the unsharded one, :mod:`numcheck.impls.protocols.tp_fp8_linear`, so only the summation differs
from a single device): an output whose reduction is sharded (column-parallel dgrad, row-parallel y) as one fp32
GEMM per rank over its slice, each partial rounded to the declared ``partial_dtype`` (the output dtype, or fp32)
and summed in it in rank order, then the bias added in fp32 and rounded to the output dtype where the reduced
value is rounded once more; every other output as one fp32 GEMM over the whole reduction (plus the bias) rounded
to the output dtype; a bias gradient as the fp32 sum of dy's rows rounded to the output dtype. An impl is so held
to an honest implementation of what it declares about its reductions' dtype.

E is the expected level (√n·u per reduction, Higham & Mary 2019) of the bounds of
:mod:`numcheck.properties.distributed.tp_fp8.tolerance` (and of :mod:`numcheck.properties.fp8.tolerance` for outputs
reduced on one rank): for a sharded reduction Σ_r (√(n_r + 4)·u_a·Σ_{k∈S_r}|â||b̂| + u_c·|p_r|) + √(P − 1)·u_c·Σ_r
|p_r|, plus u_o·|o_dq| where the reduced value is rounded again. Elements the contract leaves free (and non-finite
references) are left out of both RMSEs.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from numcheck.properties.core.relative import RelativeJudgement, relative_judgement
from numcheck.properties.distributed.tp_fp8.cases import TPFp8Case, reduction_parts, row_parts
from numcheck.properties.fp8.tolerance import EXTRA_ROUNDINGS, OUT_U, U32, _nan0, gemm_operands, output_bounds
from numcheck.reference.fp8_formats import F64, round_to_fp32


def _partial_dtype(impl: Any, out_dtype: torch.dtype) -> torch.dtype:
    return out_dtype if impl.support.partial_dtype == "output" else torch.float32


def yardstick(impl: Any, case: TPFp8Case, t: Any, ref: Any, name: str) -> torch.Tensor:
    """``name`` evaluated along the declared path (module docstring), in the output dtype."""
    dt = case.single().torch_dtype
    bias = round_to_fp32(t.bias.detach().to("cpu", F64)).float() if t.bias is not None else None
    if name == "bgrad":
        return round_to_fp32(t.dy.detach().to("cpu", F64)).float().sum(dim=0).to(dt)
    ops = gemm_operands(ref, name, t.x, t.weight, t.dy)
    A, B = _nan0(ops.A_dq).float(), _nan0(ops.B_dq).float()
    parts = reduction_parts(case, name)
    if parts is None:
        o = A @ B.t()
        return (o + bias if name == "y" and bias is not None else o).to(dt)
    pdt = _partial_dtype(impl, dt)
    total = None
    for s in parts:  # rank order: each partial rounded to the partial dtype, summed in it
        part = (A[:, s] @ B[:, s].t()).to(pdt)
        total = part if total is None else total + part
    assert total is not None
    if name == "y" and bias is not None:
        return (total.float() + bias).to(dt)
    return total.to(dt)


def expected_bound(impl: Any, case: TPFp8Case, t: Any, ref: Any, name: str) -> torch.Tensor:
    """E of ``name`` (module docstring): the expected level of its bound against the dequantized reference."""
    dt = case.single().torch_dtype
    u_a, chunk = impl.support.accumulation("cpu")
    parts = reduction_parts(case, name)
    if parts is None:
        return output_bounds(
            ref, name, t.x, t.weight, t.dy, t.bias, out_dtype=dt, accum_u=u_a, accum_chunk=chunk
        ).expected_dq
    pdt = _partial_dtype(impl, dt)
    u_c = OUT_U[pdt]
    ops = gemm_operands(ref, name, t.x, t.weight, t.dy)
    Ad, Bd = _nan0(ops.A_dq), _nan0(ops.B_dq)
    E = torch.zeros(Ad.shape[0], Bd.shape[0], dtype=F64)
    mag = torch.zeros_like(E)
    for s in parts:
        p = (Ad[:, s] @ Bd[:, s].t()).abs()
        n = s.stop - s.start
        E += math.sqrt(n + EXTRA_ROUNDINGS) * u_a * (Ad[:, s].abs() @ Bd[:, s].abs().t()) + u_c * p
        mag += p
    E += math.sqrt(len(parts) - 1) * u_c * mag
    if (name == "y" and t.bias is not None) or pdt != dt:
        E += (U32 + OUT_U[dt]) * _nan0(ref.dq[name].abs())
    return E


def _partial_bias_judgements(case: TPFp8Case, t: Any, got: list[torch.Tensor]) -> dict[str, RelativeJudgement]:
    """(b) of each rank's partial bias gradient (row-parallel SP): the fp32 sum of its rows, rounded once."""
    dt = case.single().torch_dtype
    d = round_to_fp32(t.dy.detach().to("cpu", F64))
    out = {}
    for r, (g, rows) in enumerate(zip(got, row_parts(case))):
        exact = d[rows].sum(dim=0)
        yard = d[rows].float().sum(dim=0).to(dt)
        n = rows.stop - rows.start
        E = math.sqrt(n) * U32 * _nan0(d[rows].abs().sum(dim=0)) + OUT_U[dt] * _nan0(exact.abs())
        fin = torch.isfinite(exact)
        label = f"bgrad (rank {r}'s partial)"
        out[label] = relative_judgement(
            label,
            g.cpu()[fin],
            exact[fin],
            (_rmse(yard[fin], exact[fin]), dt),
            E[fin],
            yardstick="the declared path (an fp32 sum of the rank's rows)",
        )
    return out


def _rmse(v: torch.Tensor, o: torch.Tensor) -> float:
    return float((v.to(F64) - o).nan_to_num(0.0).square().mean().sqrt()) if v.numel() else 0.0


def tp_relative(
    impl: Any, case: TPFp8Case, t: Any, ref: Any, name: str, got: Any, unspecified: torch.Tensor | None
) -> dict[str, RelativeJudgement]:
    """Judgement (b) of one assembled output ``name`` of one step (module docstring); ``unspecified``: the elements
    the contract leaves free (left out)."""
    if isinstance(got, list):
        return _partial_bias_judgements(case, t, got)
    dt = case.single().torch_dtype
    o = ref.dq[name]
    keep = torch.isfinite(o) & torch.isfinite(got.cpu().to(F64))
    if unspecified is not None:
        keep = keep & ~unspecified
    yard = yardstick(impl, case, t, ref, name)
    E = expected_bound(impl, case, t, ref, name)
    desc = (
        f"the declared path (partials in {impl.support.partial_dtype})"
        if reduction_parts(case, name)
        else "the declared path (one fp32 GEMM, one rounding)"
    )
    return {
        name: relative_judgement(
            name, got.cpu()[keep], o[keep], (_rmse(yard[keep], o[keep]), dt), E[keep], yardstick=desc
        )
    }
