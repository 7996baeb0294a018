"""Element-wise error bounds of a grouped quantized linear: the single linear's model
(:mod:`properties.fp8.tolerance`) applied per expert, and the accumulation of wgrad over micro-batches.

**Per expert.** Expert ``i``'s outputs are those of one quantized linear on its rows (:mod:`reference.grouped_fp8_linear`):
each element of ``y_i`` reduces over K, of ``dgrad_i`` over N, of ``wgrad_i`` and ``bgrad_i`` over its own
``m_i`` rows. So every element gets the single linear's bound on that expert's operands — against the
dequantized reference ``E + u_o·(|o_dq| + E) + η_o`` with ``E = γ_{n+4}(u_a)·Σ|â||b̂| + (n+4)·2⁻¹⁵⁰`` (or the
promoted form), against the original one ``+ Q`` from each operand's quantization bound ρ — with ``n`` the
expert's own reduction length and the operands' scales the expert's own. Nothing is shared between experts, so no
term couples them. An *empty* expert's ``wgrad_i`` and ``bgrad_i`` are empty sums: 0 in any arithmetic, bound 0
(the impl must return exact zeros).

**Accumulation over micro-batches** (:func:`accumulated_bounds`). T micro-batches on one weight; ``S_t`` the exact
wgrad of micro-batch t (dequantized operands), ``A_t = Σ|â||b̂|``, ``n`` its reduction length, ``C_0`` what the
accumulator held before (``main_grad`` as given; nothing for ``weight.grad``), ``C_t^ex = C_0 + Σ_{s≤t} S_s`` and
``e_t`` a bound on ``|C_t − C_t^ex|``:

* *fused into an fp32 ``main_grad``* — two ways are allowed and the bound covers both. (a) The GEMM's fp32
  result ``Ŝ_t`` (``|Ŝ_t − S_t| ≤ E_t``, the single linear's E) added in fp32: ``C_t = (C_{t−1} + Ŝ_t)(1 + δ)``,
  ``|δ| ≤ u₃₂``, so ``e_t ≤ e_{t−1} + E_t + u₃₂·(|C_t^ex| + e_{t−1} + E_t)``. (b) The GEMM accumulating onto
  ``C_{t−1}``: a sum of ``n + 1`` terms, ``C_{t−1}`` one of them, in any order, so
  ``e_t ≤ e_{t−1} + g·(|C_{t−1}^ex| + e_{t−1} + A_t) + (n + 5)·2⁻¹⁵⁰`` with ``g`` the single linear's accumulation
  factor for a reduction of ``n + 1`` (:func:`properties.fp8.tolerance.accumulation_gamma`). ``e_t`` is the larger.
* *``weight.grad`` accumulated by autograd* in the weight dtype (unit roundoff ``u_o``): each micro-batch's
  gradient is first rounded to it (its single-call bound ``B_t = E_t + u_o·(|S_t| + E_t) + η_o``), then added and
  rounded again: ``e_1 = B_1``, ``e_t ≤ e_{t−1} + B_t + u_o·(|C_t^ex| + e_{t−1} + B_t) + η_o``.

An element whose running exact sum (plus its bound) reaches the accumulator's overflow threshold at any step is
unspecified, as a single output reaching it is. Against the original operands ``|C_T − C_T^true| ≤ e_T + Σ_t Q_t`` and each ``Q_t`` is below that micro-batch's
original-reference bound, which is what is added (valid, and exact in its quantization term).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numcheck.properties.fp8.tolerance import (
    ETA32,
    OUT_ETA,
    OUT_U,
    U32,
    OutputBounds,
    accumulation_gamma,
    output_bounds,
)
from numcheck.reference.fp8_formats import F64
from numcheck.reference.grouped_fp8_linear import ROW_OUTPUTS, GroupedFp8LinearReference


def expert_tensors(t, ref: GroupedFp8LinearReference, i: int):
    """Expert ``i``'s ``(x_i, W_i, dy_i, b_i)`` of the grouped tensors ``t`` (a ``GroupedTensors``)."""
    rows = ref.rows(i)
    return t.x[rows], t.weights[i], t.dy[rows], (t.biases[i] if t.biases is not None else None)


def grouped_bounds(
    ref: GroupedFp8LinearReference,
    output: str,
    t,
    *,
    out_dtype: torch.dtype,
    accum_u: float,
    accum_chunk: int | None = None,
) -> OutputBounds:
    """The bounds of ``output`` (assembled like the output: rows for y and dgrad, experts for wgrad and bgrad) from
    each expert's single-linear bounds (module docstring); an empty expert's wgrad and bgrad get bound 0."""
    parts: list[OutputBounds] = []
    shape = ref.dq[output].shape
    for i in range(ref.G):
        sub = ref.experts[i]
        if sub is None:
            if output in ROW_OUTPUTS:
                continue
            z = torch.zeros(shape[1:], dtype=F64)
            parts.append(OutputBounds(z, z, torch.zeros(shape[1:], dtype=torch.bool), z))
            continue
        x_i, w_i, dy_i, b_i = expert_tensors(t, ref, i)
        parts.append(
            output_bounds(
                sub, output, x_i, w_i, dy_i, b_i, out_dtype=out_dtype, accum_u=accum_u, accum_chunk=accum_chunk
            )
        )
    join = torch.cat if output in ROW_OUTPUTS else torch.stack
    return OutputBounds(*(join([getattr(p, f) for p in parts]) for f in ("dq", "true", "unspecified", "expected_dq")))


@dataclass(frozen=True)
class AccumulatedBounds:
    """The exact accumulated wgrad (both references), its bounds and the elements the contract leaves free."""

    dq: torch.Tensor
    true: torch.Tensor
    bound_dq: torch.Tensor
    bound_true: torch.Tensor
    unspecified: torch.Tensor


def _nan0(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def accumulated_bounds(
    refs: list[GroupedFp8LinearReference],
    steps: list,
    start: torch.Tensor | None,
    *,
    main_grad: bool,
    out_dtype: torch.dtype,
    accum_u: float,
    accum_chunk: int | None,
) -> AccumulatedBounds:
    """wgrad ``[G, N, K]`` accumulated over the micro-batches ``steps`` (their references ``refs``) onto ``start``
    (``main_grad`` as given, or ``None``), in fp32 (``main_grad``) or in ``out_dtype`` by autograd (module
    docstring); per expert ``i`` the reduction length is ``m_i``."""
    c_dq = torch.zeros_like(refs[0].dq["wgrad"]) if start is None else start.detach().to("cpu", F64).clone()
    c_true = c_dq.clone()
    e = torch.zeros_like(c_dq)
    q_sum = torch.zeros_like(c_dq)
    unspec = torch.zeros(c_dq.shape, dtype=torch.bool)
    u_o, eta_o = (U32, ETA32) if main_grad else (OUT_U[out_dtype], OUT_ETA[out_dtype])
    out_max = float(torch.finfo(torch.float32 if main_grad else out_dtype).max)
    for t_i, (ref, t) in enumerate(zip(refs, steps)):
        b = grouped_bounds(
            ref,
            "wgrad",
            t,
            out_dtype=torch.float32 if main_grad else out_dtype,
            accum_u=accum_u,
            accum_chunk=accum_chunk,
        )
        prev = _nan0(c_dq).abs()
        c_dq = c_dq + ref.dq["wgrad"]
        c_true = c_true + ref.true["wgrad"]
        now = _nan0(c_dq).abs()
        E, A = _accumulation_terms(ref, accum_u, accum_chunk)
        if main_grad:  # an empty expert's main_grad must stay as given: its bound does not grow
            add = e + E + U32 * (now + e + E)
            fused = e + _fused_step(ref, accum_u, accum_chunk) * (prev + e + A) + _eta_terms(ref)
            e = torch.where(_empty(ref), e, torch.maximum(add, fused))
        elif t_i == 0 and start is None:
            e = b.dq
        else:
            e = e + b.dq + u_o * (now + e + b.dq) + eta_o
        q_sum = q_sum + b.true
        # a running sum that may reach the accumulator's overflow threshold on the way leaves the result free
        # (the rounded one could be inf there), as a single output reaching it is (properties.fp8.tolerance)
        reach = now * (1 + u_o) + e >= out_max
        unspec = unspec | reach | b.unspecified | ~torch.isfinite(ref.true["wgrad"]) | torch.isnan(ref.dq["wgrad"])
    return AccumulatedBounds(c_dq, c_true, e, e + q_sum, unspec)


def _empty(ref: GroupedFp8LinearReference) -> torch.Tensor:
    """``[G, 1, 1]``: whether each expert has no rows."""
    return torch.tensor([m == 0 for m in ref.m_splits])[:, None, None]


def _accumulation_terms(
    ref: GroupedFp8LinearReference, accum_u: float, accum_chunk: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E, A)`` per element of wgrad: the single linear's accumulation error of the fp32 GEMM result and
    ``Σ|â||b̂|`` (both 0 for an empty expert)."""
    A = _nan0(ref.abs_products["wgrad"])
    g = torch.tensor([accumulation_gamma(m, accum_u, accum_chunk) if m else 0.0 for m in ref.m_splits], dtype=F64)
    eta = torch.tensor([(m + 4) * ETA32 if m else 0.0 for m in ref.m_splits], dtype=F64)
    return g[:, None, None] * A + eta[:, None, None], A


def _fused_step(ref: GroupedFp8LinearReference, accum_u: float, accum_chunk: int | None) -> torch.Tensor:
    """Per expert the accumulation factor of ``n + 1`` terms (``C_{t−1}`` and the n products); 0 for an empty
    expert, whose ``main_grad`` must not change."""
    g = [accumulation_gamma(m + 1, accum_u, accum_chunk) if m else 0.0 for m in ref.m_splits]
    return torch.tensor(g, dtype=F64)[:, None, None]


def _eta_terms(ref: GroupedFp8LinearReference) -> torch.Tensor:
    return torch.tensor([(m + 5) * ETA32 if m else 0.0 for m in ref.m_splits], dtype=F64)[:, None, None]
