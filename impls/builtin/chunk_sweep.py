"""The built-ins' whole pass of linear + CE over the token chunks, with their gradient accumulators.

:func:`run_sweep` is the pass as the autograd functions use it: operands cast once, per-row coefficients of the
reduction (and of the upstream gradient, in backward), gradient buffers
(:func:`impls.builtin.grad_accum.make_accumulator`, the split fp32 accumulator among them), and the loop of :func:`numcheck.reference.numerics.sweep.sweep`. The fused
forward (:class:`impls.builtin.chunked.FusedFunction`) and both passes of
:class:`impls.builtin.recompute.RecomputeFunction` are :func:`run_sweep` with different arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numcheck.impls.builtin import grad_accum
from numcheck.reference.numerics.accumulation import Accumulator
from numcheck.reference.numerics.ce_block import Coefficients, SoftmaxStats, reduction_coefficients, row_weights
from numcheck.reference.numerics.sweep import Plan, operands, sweep


@dataclass(frozen=True)
class Gradients:
    """The gradient buffers one pass fills (``None`` where that gradient is not asked for): ``x`` ``[N, H]`` in
    the compute dtype, ``weight`` and ``bias`` accumulators of the plan's path."""

    x: torch.Tensor | None
    weight: Accumulator | None
    bias: Accumulator | None


@dataclass(frozen=True)
class SweepResult:
    """What one pass yields: per-row fp32 CE parts ``ce`` and z-losses ``z`` (``None`` without the loss), the
    rows' softmax statistics, the reduction's coefficients and the filled gradient buffers (``None`` when the
    pass computed no gradient)."""

    ce: torch.Tensor | None
    z: torch.Tensor | None
    stats: SoftmaxStats
    coef: Coefficients
    grads: Gradients | None


def run_sweep(
    plan: Plan,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    *,
    needs: tuple[bool, bool, bool] | None = None,
    upstream: torch.Tensor | None = None,
    stats: SoftmaxStats | None = None,
    want_loss: bool = True,
) -> SweepResult:
    """One pass of linear + CE over the chunks of ``x`` (the caller disables autocast, :func:`autocast_off`).

    ``needs`` (``(grad_x, grad_weight, grad_bias)``, as autograd's ``needs_input_grad``): compute G in every chunk
    and accumulate the gradients asked for, with the reduction's coefficients times ``upstream`` (``None`` = 1);
    without it the pass computes losses and statistics only. ``stats`` and ``want_loss`` are :func:`sweep`'s."""
    o = plan.options
    xc, wc, bc = operands(plan, x, weight, bias)
    valid, _, w_t = row_weights(target, o.class_weights, o.ignore_index)
    coef = reduction_coefficients(valid, w_t, o.reduction, upstream=upstream)
    grads = None
    if needs is not None:
        need_x, need_w, need_b = needs
        N, H = x.shape
        V = weight.shape[0]
        grads = Gradients(
            torch.empty(N, H, dtype=xc.dtype, device=x.device) if need_x else None,
            grad_accum.make_accumulator(plan.path, (V, H), weight.dtype, x.device) if need_w else None,
            (
                grad_accum.make_accumulator(plan.path, (V,), bias.dtype, x.device)
                if need_b and bias is not None
                else None
            ),
        )
    ce, z, rows = sweep(
        plan,
        xc,
        wc,
        bc,
        target,
        coef=coef if grads is not None else None,
        stats=stats,
        want_loss=want_loss,
        gx=grads.x if grads else None,
        gw=grads.weight if grads else None,
        gb=grads.bias if grads else None,
    )
    return SweepResult(ce, z, rows, coef, grads)
