"""Impls written as the README tells a user to (the decorator on a module-level function, nothing else), for the
self tests holding ``numcheck report`` and ``numcheck premerge`` as strict as the suite:

* a hand-written linear+CE with label smoothing but no class weights (:func:`smoothing_ce`), and its twin
  :func:`smoothing_ce_ignored_grad` whose only defect is a smoothing gradient on ignored rows (its loss is right);
* a vocabulary-parallel linear+CE (:func:`vp_ce`), and its twin :func:`vp_ce_rank_start` that takes its first
  class to be ``rank·V_r`` (right only when every shard has V_r classes);
* :func:`all_nan_ce`, whose loss and gradients are NaN everywhere.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import numcheck

_SMOOTHING = dict(
    dtypes=("float32", "bfloat16"),
    options=("bias", "ignore_index", "label_smoothing"),
    autocast=(),
    logits_dtype="float32",
    all_ignored="nan",
)


class _SmoothedCE(torch.autograd.Function):
    """Smoothed CE over fp32 logits with the gradient formed in forward (as fused kernels do); ``leak`` forgets
    the ignored-row mask on the smoothing term of the gradient."""

    @staticmethod
    def forward(
        ctx: Any, z: torch.Tensor, target: torch.Tensor, reduction: str, ignore_index: int, eps: float, leak: bool
    ) -> torch.Tensor:
        V = z.shape[1]
        valid = target != ignore_index
        safe = torch.where(valid, target, torch.zeros_like(target))
        logp = torch.log_softmax(z, dim=1)
        per_row = -(1 - eps) * logp.gather(1, safe[:, None]).squeeze(1) - eps * logp.mean(dim=1)
        per_row = torch.where(valid, per_row, torch.zeros_like(per_row))
        m = valid[:, None].to(z.dtype)
        onehot = F.one_hot(safe, V).to(z.dtype)
        smooth = eps / V if leak else (eps / V) * m  # the defect: ignored rows keep −ε/V in every class
        g = logp.exp() * m - (1 - eps) * onehot * m - smooth
        n = valid.sum().to(z.dtype)
        if reduction == "mean":
            ctx.save_for_backward(g / n.clamp_min(1))
            return per_row.sum() / n
        ctx.save_for_backward(g)
        return per_row.sum() if reduction == "sum" else per_row

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        (g,) = ctx.saved_tensors
        scale = grad_out[:, None] if grad_out.dim() == 1 else grad_out
        return g * scale, None, None, None, None, None


def _smoothed(x, weight, target, bias, reduction, ignore_index, label_smoothing, leak):
    z = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return _SmoothedCE.apply(z, target, reduction, ignore_index, float(label_smoothing), leak)


@numcheck.linear_ce_impl(name="strict_smoothing_ce", **_SMOOTHING)
def smoothing_ce(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    """fp32 logits, smoothed CE with its gradient formed in forward; ignored rows get none."""
    return _smoothed(x, weight, target, bias, reduction, ignore_index, label_smoothing, leak=False)


@numcheck.linear_ce_impl(name="strict_smoothing_ce_ignored_grad", **_SMOOTHING)
def smoothing_ce_ignored_grad(
    x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, label_smoothing=0.0
):
    """As strict_smoothing_ce, but ignored rows get the smoothing term's gradient −ε/V in every class."""
    return _smoothed(x, weight, target, bias, reduction, ignore_index, label_smoothing, leak=True)


@numcheck.linear_ce_impl(name="strict_all_nan", dtypes=("float32", "bfloat16"), autocast=(), all_ignored="nan")
def all_nan_ce(
    x,
    weight,
    target,
    bias=None,
    *,
    reduction="mean",
    ignore_index=-100,
    label_smoothing=0.0,
    class_weights=None,
    softcap=None,
    z_loss_scale=0.0,
):
    """A loss that is NaN everywhere, and so every gradient that depends on it."""
    logits = F.linear(x, weight, bias)
    loss = F.cross_entropy(logits.float(), target, reduction=reduction, ignore_index=ignore_index)
    return loss * float("nan")


# -- vocabulary parallel ------------------------------------------------------------------------------------
class _Sum(torch.autograd.Function):
    """All-reduce (SUM) of a row statistic every rank's loss uses; backward is the identity."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: Any) -> torch.Tensor:
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return g, None


class _Copy(torch.autograd.Function):
    """x as every rank uses it; backward all-reduces the rank's grad_x partial (in fp32: x is upcast first)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


def _vp(x, weight_shard, target, bias_shard, group, first_class, reduction, ignore_index):
    size = weight_shard.shape[0]
    xf = _Copy.apply(x.float(), group)
    z = F.linear(xf, weight_shard.float(), None if bias_shard is None else bias_shard.float())
    valid = target != ignore_index
    local = torch.where(valid, target, torch.zeros_like(target)) - first_class
    owns = valid & (local >= 0) & (local < size)
    m = z.detach().amax(dim=1)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    lse = m + torch.log(_Sum.apply(torch.exp(z - m[:, None]).sum(dim=1), group))
    z_y = z.gather(1, local.clamp(0, size - 1)[:, None]).squeeze(1)
    z_y = _Sum.apply(torch.where(owns, z_y, torch.zeros_like(z_y)), group)
    ce = torch.where(valid, lse - z_y, torch.zeros_like(lse))
    if reduction == "none":
        return ce
    return ce.sum() if reduction == "sum" else ce.sum() / valid.sum()


_VP = dict(
    world_sizes=(1, 2, 4),
    backends=("gloo",),
    uneven_vocab=True,
    grad_x_reduce_dtype="float32",
    dtypes=("float32", "bfloat16"),
    options=("bias", "ignore_index"),
    autocast=(),
    logits_dtype="float32",
    all_ignored="nan",
)


@numcheck.dist_linear_ce_impl(name="strict_vp_ce", **_VP)
def vp_ce(
    x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100
):
    """fp32 logits, all-reduced max / sum-exp / target logit, grad_x partials all-reduced in fp32."""
    return _vp(x, weight_shard, target, bias_shard, group, vocab_start, reduction, ignore_index)


@numcheck.dist_linear_ce_impl(name="strict_vp_ce_rank_start", **_VP)
def vp_ce_rank_start(
    x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100
):
    """As strict_vp_ce, but the shard's first class is taken to be rank·V_r (wrong when shards are uneven)."""
    first = dist.get_rank(group) * weight_shard.shape[0]
    return _vp(x, weight_shard, target, bias_shard, group, first, reduction, ignore_index)
