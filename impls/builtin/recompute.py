"""``recompute``: linear + CE that holds only O(N) between forward and backward.

The fused chunked design (:mod:`impls.builtin.chunked`) computes grad_x and grad_W during forward and keeps them —
an fp32 [V, H] buffer — until backward, for the whole pipeline stage (seed 002). Here forward keeps only what
autograd already has (x, W, target, bias, class weights: inputs, no copies) plus the per-row fp32 softmax
statistics (m, log s), lse = m + log s (8·N bytes); backward recomputes the logits chunk by chunk, turns each
chunk into G with the statistics from forward
and the upstream gradient folded into the per-row coefficients, and accumulates grad_x, grad_W, grad_b.
Nothing of size [V, H] or [N, V] is held across backward (under autocast the [V, H] compute-dtype copy of W
is made again in backward, not kept). Cost: 8·N·H·V flops instead of 6·N·H·V.

:class:`RecomputeFunction` is also the ``reduction='none'`` path of every chunked impl, because a per-row
upstream gradient must scale G's rows before the matmuls (see :mod:`impls.builtin.chunked`).

The built-in ``recompute`` impl (:func:`impls.builtin.chunked.recompute`) is a :class:`impls.builtin.chunked.ChunkedLinearCE`
that uses this function for every reduction; its grad_weight accumulates through the ``addmm_out_dtype`` step
(fp32 accumulation; the fp32-operand addmm where the capability probe says out_dtype does not work). Same
options and conventions as the chunked impls. Both passes are :func:`impls.builtin.chunk_sweep.run_sweep`.
"""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls.builtin.chunk_sweep import run_sweep
from numcheck.reference.numerics.ce_block import SoftmaxStats
from numcheck.reference.numerics.sweep import Plan, autocast_off, reduce_rows


class RecomputeFunction(torch.autograd.Function):
    """Forward: per-row losses and softmax statistics only. Backward: recompute each logits chunk, G with the upstream
    gradient (scalar or per-row) in the coefficients, and accumulate the gradients."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor, plan: Plan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast_off(x.device.type):
            res = run_sweep(plan, x, weight, bias, target)
            loss, z_loss = reduce_rows(plan.options.reduction, res.ce, res.z, res.coef)  # type: ignore[arg-type]
        ctx.save_for_backward(x, weight, bias, target, res.stats.m, res.stats.log_s)
        ctx.plan = plan
        ctx.mark_non_differentiable(z_loss)
        return loss, z_loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, grad_z: torch.Tensor | None):  # type: ignore[override]
        x, weight, bias, target, m, log_s = ctx.saved_tensors
        plan: Plan = ctx.plan
        with autocast_off(x.device.type):
            res = run_sweep(
                plan,
                x,
                weight,
                bias,
                target,
                needs=tuple(ctx.needs_input_grad[:3]),
                upstream=grad_loss,
                stats=SoftmaxStats(m, log_s),
                want_loss=False,
            )
            g = res.grads  # never None: needs was given
            return (
                g.x.to(x.dtype) if g.x is not None else None,  # type: ignore[union-attr]
                g.weight.finish(None, weight.dtype) if g.weight is not None else None,  # type: ignore[union-attr]
                g.bias.finish(None, bias.dtype) if g.bias is not None else None,  # type: ignore[union-attr]
                None,
                None,
            )
