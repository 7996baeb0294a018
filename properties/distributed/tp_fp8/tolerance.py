"""Element-wise bounds of a tensor-parallel FP8 linear: the single-device model of :mod:`properties.fp8.tolerance`
plus the terms of a sharded reduction.

Quantization is the unsharded one (every per-tensor scale is the group's, no block crosses a shard:
:mod:`impls.protocols.tp_fp8_linear`), so the dequantized operands ``â, b̂`` are the oracle's and only the *summation*
of an output can differ from a single device. Outputs whose reduction is not sharded (column-parallel y, wgrad
and bgrad; row-parallel dgrad and wgrad; every output at P = 1 but the two below) are one GEMM over the full
reduction on the rank that owns the element: the single-device bounds apply unchanged.

**A sharded reduction** (column-parallel dgrad = Σ_r dy_r·W_r over N; row-parallel y = Σ_r x_r·W_rᵀ over K):
rank r computes the partial ``p_r = Σ_{k∈S_r} â_k b̂_k`` (``n_r = |S_r|`` terms) with the single-device
accumulation bound (same notation: ``u_a``, γ, 4 extra roundings, fp32 underflow per operation)::

    E_r = γ_{n_r+4}(u_a)·Σ_{k∈S_r}|â_k||b̂_k| + (n_r + 4)·2⁻¹⁵⁰

then rounds it to the partial dtype ``c`` (the declared ``partial_dtype``: the output dtype, or fp32) at ``u_c``
with underflow ``η_c``:  ``|p̂_r − p_r| ≤ D_r := E_r + u_c·(|p_r| + E_r) + η_c``. The all-reduce or
reduce-scatter adds the P values in dtype c in an order the backend chooses (ring, tree, pairwise): P − 1
additions, each rounding its result at u_c, and every partial sum of any order is bounded by ``Σ_r |p̂_r|``, so
(Higham §4.2, any order) ``|fl(Σ p̂_r) − Σ p̂_r| ≤ γ_{P−1}(u_c)·Σ_r |p̂_r| + (P − 1)·η_c`` with
``|p̂_r| ≤ |p_r| + D_r``. Hence, against the dequantized reference ``o_dq = Σ_r p_r`` (+ b)::

    B_red = Σ_r D_r + γ_{P−1}(u_c)·Σ_r (|p_r| + D_r) + (P − 1)·η_c

and where the reduced value is rounded once more — the row-parallel bias added after the reduction (an fp32
addition, then the rounding to the output dtype) or fp32 partials cast to a narrower output — ::

    B_dq = B_red + (u_32 + u_o + u_32·u_o)·(|o_dq| + B_red) + η_o + 2⁻¹⁵⁰

(otherwise ``B_dq = B_red``: partials already in the output dtype are returned as they are). The partial
magnitudes ``|p_r|`` are the oracle's exact partials of the dequantized operands (they may cancel across ranks,
which is why the rounding terms scale with ``Σ_r |p_r|`` and not with ``|o_dq|``). At P = 1 this is the
single-device bound (one partial, no addition), plus the second rounding where the bias comes after.

**Against the original reference:** ``|ô − o_true| ≤ B_dq + Q`` with Q the single-device quantization term
(``Σ_k ρ(a_k)|b_k| + |a_k|ρ(b_k) + ρ(a_k)ρ(b_k)``: the quantization is the unsharded one).

**World-size invariance** (``world_size_invariance``: the outputs at two world sizes, within the sum of their
B_dq): what may legitimately differ between the two runs, term by term, is all of B_dq. The quantization is the
unsharded one at every P (not in B_dq; ``dist_same_scale`` holds every rank to it), so the dequantized operands and
o_dq are common to both runs; what is left is each run's fp32 accumulation over its slices (another blocking of the
reduction at each P, and a GEMM of another shape where the reduction is not sharded: measured on the CPU, an fp32
GEMM's last bits change with its shape), each partial's rounding to the partial dtype, the P − 1 additions and
the last rounding, each made on values the other run does not hold. No term is shared, so the sum of the two B_dq
is the relation's tolerance, as derived for the vocabulary-parallel relation
(:mod:`numcheck.properties.distributed.linear_ce.tolerance`); it already follows the declared ``partial_dtype``
through u_c.

**Row-parallel SP bias gradient:** rank r returns ``Σ_{i∈rows r} dy_i`` summed in fp32 and rounded to the output
dtype: ``γ_{n_r}(u_32)·Σ_{i∈rows r}|dy_i| + n_r·2⁻¹⁵⁰ + u_o·(|p_r| + ·) + η_o`` against the oracle's partial
(the optimizer's all-reduce is not the layer's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numcheck.properties.fp8.tolerance import (
    ETA32,
    EXTRA_ROUNDINGS,
    OUT_ETA,
    OUT_U,
    U32,
    _nan0,
    accumulation_gamma,
    gamma,
    gemm_operands,
    output_bounds,
)
from numcheck.reference.fp8_formats import F64, round_to_fp32
from numcheck.reference.fp8_linear import Fp8LinearReference


@dataclass(frozen=True)
class ShardedBounds:
    """The bounds of one output whose reduction is sharded: against the dequantized and the original reference,
    and the elements the contract leaves free (the single-device rule)."""

    dq: torch.Tensor
    true: torch.Tensor
    unspecified: torch.Tensor


def partial_terms(
    abs_part: torch.Tensor, n: int, accum_u: float, u_c: float, eta_c: float, part_abs_value: torch.Tensor
) -> torch.Tensor:
    """``D_r`` of one partial (module docstring): its GEMM's accumulation bound plus its rounding to dtype c."""
    E = accumulation_gamma(n, accum_u, None) * abs_part + (n + EXTRA_ROUNDINGS) * ETA32
    return E + u_c * (part_abs_value + E) + eta_c


def sharded_reduction_bounds(
    ref: Fp8LinearReference,
    output: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    bias: torch.Tensor | None,
    parts: list[slice],
    *,
    out_dtype: torch.dtype,
    partial_dtype: torch.dtype,
    accum_u: float,
) -> ShardedBounds:
    """Bounds of ``output`` (``"y"`` or ``"dgrad"``) reduced over the ``parts`` of its reduction dimension, one
    partial per rank (module docstring). ``bias`` is added after the reduction (row-parallel y)."""
    ops = gemm_operands(ref, output, x, weight, dy)
    u_c, eta_c = OUT_U[partial_dtype], OUT_ETA[partial_dtype]
    Ad, Bd = _nan0(ops.A_dq), _nan0(ops.B_dq)
    D_sum = torch.zeros(Ad.shape[0], Bd.shape[0], dtype=F64)
    mag = torch.zeros_like(D_sum)
    for s in parts:
        p = Ad[:, s] @ Bd[:, s].t()
        abs_part = Ad[:, s].abs() @ Bd[:, s].abs().t()
        n = s.stop - s.start
        D = partial_terms(abs_part, n, accum_u, u_c, eta_c, p.abs())
        D_sum += D
        mag += p.abs() + D
    P = len(parts)
    B = D_sum + gamma(P - 1, u_c) * mag + (P - 1) * eta_c
    o_dq = _nan0(ref.dq[output].abs())
    if (output == "y" and bias is not None) or partial_dtype != out_dtype:
        u_o, eta_o = OUT_U[out_dtype], OUT_ETA[out_dtype]
        B = B + (U32 + u_o + U32 * u_o) * (o_dq + B) + eta_o + ETA32
    oA, oB = _nan0(ops.A.abs()), _nan0(ops.B.abs())
    rA, rB = _nan0(ops.rho_A), _nan0(ops.rho_B)
    Q = rA @ oB.t() + oA @ rB.t() + rA @ rB.t()
    single = output_bounds(ref, output, x, weight, dy, bias, out_dtype=out_dtype, accum_u=accum_u)
    return ShardedBounds(B, B + Q, single.unspecified)


def partial_bias_grad_bound(dy: torch.Tensor, rows: slice, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partial, bound)``: the oracle's ``Σ_{i∈rows} dy_i`` (float64) and the bound of a rank's fp32 sum of it
    rounded to ``out_dtype`` (module docstring)."""
    d = round_to_fp32(dy.detach().to("cpu", F64))[rows]
    p = d.sum(dim=0)
    n = d.shape[0]
    E = gamma(n, U32) * _nan0(d.abs().sum(dim=0)) + n * ETA32
    return p, E + OUT_U[out_dtype] * (_nan0(p.abs()) + E) + OUT_ETA[out_dtype]
