"""``recompute``: linear + CE that holds only O(N) between forward and backward.

The fused chunked design (:mod:`impls.chunked`) computes grad_x and grad_W during forward and keeps them —
an fp32 [V, H] buffer — until backward, for the whole pipeline stage (seed 002). Here forward keeps only what
autograd already has (x, W, target, bias, class weights: inputs, no copies) plus the per-row fp32 softmax
statistics (m, log s), lse = m + log s (8·N bytes); backward recomputes the logits chunk by chunk, turns each
chunk into G with the statistics from forward
and the upstream gradient folded into the per-row coefficients, and accumulates grad_x, grad_W, grad_b.
Nothing of size [V, H] or [N, V] is held across backward (under autocast the [V, H] compute-dtype copy of W
is made again in backward, not kept). Cost: 8·N·H·V flops instead of 6·N·H·V.

:class:`RecomputeFunction` is also the ``reduction='none'`` path of every chunked impl, because a per-row
upstream gradient must scale G's rows before the matmuls (see :mod:`impls.chunked`).

grad_weight accumulates through the ``addmm_out_dtype`` step (fp32 accumulation; the fp32-operand addmm where
the capability probe says out_dtype does not work). Same options and conventions as the chunked impls.
"""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls import grad_accum
from numcheck.impls.ce_block import RowStats, reduction_coefficients, row_weights
from numcheck.impls.chunked import DEFAULT_CHUNK_ROWS, ChunkedLinearCE, Plan, autocast_off, operands, reduce_rows, sweep


class RecomputeFunction(torch.autograd.Function):
    """Forward: per-row losses and softmax statistics only. Backward: recompute each logits chunk, G with the upstream
    gradient (scalar or per-row) in the coefficients, and accumulate the gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
                plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
        o = plan.options
        with autocast_off(x.device.type):
            xc, wc, bc = operands(plan, x, weight, bias)
            valid, _, w_t = row_weights(target, o.class_weights, o.ignore_index)
            coef = reduction_coefficients(valid, w_t, o.reduction)
            ce, z, stats = sweep(plan, xc, wc, bc, target)
            loss, z_loss = reduce_rows(o.reduction, ce, z, coef)  # type: ignore[arg-type]
        ctx.save_for_backward(x, weight, bias, target, stats.m, stats.log_s)
        ctx.plan = plan
        ctx.mark_non_differentiable(z_loss)
        return loss, z_loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, grad_z: torch.Tensor | None):  # type: ignore[override]
        x, weight, bias, target, m, log_s = ctx.saved_tensors
        plan: Plan = ctx.plan
        o = plan.options
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        with autocast_off(x.device.type):
            xc, wc, bc = operands(plan, x, weight, bias)
            valid, _, w_t = row_weights(target, o.class_weights, o.ignore_index)
            coef = reduction_coefficients(valid, w_t, o.reduction, upstream=grad_loss)
            N, H = x.shape
            V = weight.shape[0]
            gx = torch.empty(N, H, dtype=xc.dtype, device=x.device) if need_x else None
            gw = grad_accum.make_accumulator(plan.path, (V, H), weight.dtype, x.device) if need_w else None
            gb = (grad_accum.make_accumulator(plan.path, (V,), bias.dtype, x.device)
                  if need_b and bias is not None else None)
            sweep(plan, xc, wc, bc, target, coef=coef, stats=RowStats(m, log_s), want_loss=False, gx=gx, gw=gw, gb=gb)
            return (gx.to(x.dtype) if gx is not None else None,
                    gw.finish(None, weight.dtype) if gw is not None else None,
                    gb.finish(None, bias.dtype) if gb is not None else None,
                    None, None)


def recompute(*, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> ChunkedLinearCE:
    """The built-in ``recompute`` impl."""
    return ChunkedLinearCE(
        "recompute", path="addmm_out_dtype", chunk_rows=chunk_rows, recompute=True,
        description="forward keeps x, W, target, bias and per-row (max, log-sum); backward recomputes the logits chunk by chunk",
    )


def recompute_impls() -> list[ChunkedLinearCE]:
    """``recompute``."""
    return [recompute()]
