"""Vocabulary-parallel linear+CE impls declared as docs/distributed.md tells a user to (``numcheck.dist_linear_ce_impl``
on module-level functions), differing only in the dtype grad_x's rank partials are all-reduced in and in what they
declare about it: the world-size relation's and judgement (b)'s self tests run the distributed suite on them.

Each rank: fp32 logits of its shard (x, W and b upcast first: ``logits_dtype="float32"``), the row maximum, the
shard's Σ exp(z − m) and the owning rank's target logit all-reduced in fp32, the loss from the global statistics
on every rank, the gradient of the logits in fp32 and the rank's grad_x partial G_r·W_r formed in fp32.

* :func:`fp32_reduce` all-reduces the fp32 partials and rounds the sum once to x's dtype; it declares
  ``grad_x_reduce_dtype="float32"``: it does what it declares.
* :func:`bf16_reduce_declared_fp32` rounds each partial to x's dtype (bf16 for bf16 inputs) and all-reduces it
  there, yet declares ``"float32"``: the defect.
* :func:`bf16_reduce_declared_input` is the same code declaring ``"input"``: what it does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import numcheck


class _CopyToRanks(torch.autograd.Function):
    """x as every rank uses it: identity forward, all-reduce (SUM) of the gradient backward, in its own dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        g = g.contiguous().clone()
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=ctx.group)
        return g, None


class _SumAcrossRanks(torch.autograd.Function):
    """All-reduce (SUM) of a row statistic; backward the identity (every rank's loss is the same function of it)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: Any) -> torch.Tensor:
        out = t.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return g, None


def _rank_loss(
    xin: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    group: Any,
    vocab_start: int,
    reduction: str,
    ignore_index: int,
) -> torch.Tensor:
    """The rank's part of linear+CE from ``xin`` (x as its fp32 matmul sees it; see the module docstring)."""
    z = torch.nn.functional.linear(xin, weight.float(), bias.float() if bias is not None else None)
    size = weight.shape[0]
    valid = target != ignore_index
    local = torch.where(valid, target, torch.zeros_like(target)) - vocab_start
    owns = valid & (local >= 0) & (local < size)
    m = z.detach().amax(dim=1)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    lse = m + torch.log(_SumAcrossRanks.apply(torch.exp(z - m[:, None]).sum(dim=1), group))
    z_y = z.gather(1, local.clamp(0, size - 1)[:, None]).squeeze(1)
    z_y = _SumAcrossRanks.apply(torch.where(owns, z_y, torch.zeros_like(z_y)), group)
    ce = torch.where(valid, lse - z_y, torch.zeros_like(lse))
    if reduction == "none":
        return ce
    if reduction == "sum":
        return ce.sum()
    return ce.sum() / valid.sum()


_DECLARED = dict(
    dtypes=("float32", "bfloat16"),
    options=("bias", "ignore_index"),
    autocast=(),
    all_ignored="nan",
    logits_dtype="float32",
    world_sizes=(1, 2, 4),
    backends=("gloo",),
    uneven_vocab=True,
)


@numcheck.dist_linear_ce_impl(name="vp_fp32_reduce", grad_x_reduce_dtype="float32", **_DECLARED)
def fp32_reduce(
    x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100
):
    """grad_x partials all-reduced in fp32, rounded once (declares float32)."""
    xin = _CopyToRanks.apply(x.float(), group)
    return _rank_loss(xin, weight_shard, target, bias_shard, group, vocab_start, reduction, ignore_index)


@numcheck.dist_linear_ce_impl(name="vp_bf16_reduce_declared_fp32", grad_x_reduce_dtype="float32", **_DECLARED)
def bf16_reduce_declared_fp32(
    x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100
):
    """grad_x partials rounded to x's dtype and all-reduced in it (declares float32: the defect)."""
    xin = _CopyToRanks.apply(x, group).float()
    return _rank_loss(xin, weight_shard, target, bias_shard, group, vocab_start, reduction, ignore_index)


@numcheck.dist_linear_ce_impl(name="vp_bf16_reduce_declared_input", grad_x_reduce_dtype="input", **_DECLARED)
def bf16_reduce_declared_input(
    x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100
):
    """grad_x partials rounded to x's dtype and all-reduced in it (declares input: what it does)."""
    xin = _CopyToRanks.apply(x, group).float()
    return _rank_loss(xin, weight_shard, target, bias_shard, group, vocab_start, reduction, ignore_index)
