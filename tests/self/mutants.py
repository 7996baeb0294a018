"""Small deliberately wrong linear+CE impls the suite must catch (tests/self/test_mutants.py runs them).

Each is a plausible mistake built on the eager composition, declared as if it were correct.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from numcheck.impls.protocol import FunctionImpl, LinearCESupport


def _fp32_ce(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    logits = F.linear(x, weight, bias).float()
    return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)


def _bf16_grad_weight_accumulation(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Chunked over tokens; grad_weight summed across 4-row chunks in bf16 while declaring fp32 accumulation."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return _fp32_ce(x, w, target, reduction=reduction, ignore_index=ignore_index)

        @staticmethod
        def backward(ctx, g):
            xs, ws = ctx.saved_tensors
            with torch.enable_grad():
                logits = (xs.detach().float() @ ws.detach().float().T).requires_grad_()
                loss = F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)
                (G,) = torch.autograd.grad(loss, logits, g)
            gx = (G @ ws.detach().float()).to(xs.dtype)
            gw = torch.zeros(ws.shape, dtype=torch.bfloat16, device=ws.device)
            for s in range(0, G.shape[0], 4):
                gw += (G[s:s + 4].T @ xs.detach().float()[s:s + 4]).to(torch.bfloat16)
            return gx, gw.to(ws.dtype)

    return Fn.apply(x, weight)


def _mean_over_all_rows(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """`mean` divides by N instead of the number of non-ignored rows."""
    if reduction != "mean":
        return _fp32_ce(x, weight, target, bias, reduction=reduction, ignore_index=ignore_index)
    s = _fp32_ce(x, weight, target, bias, reduction="sum", ignore_index=ignore_index)
    return s / target.numel()


def _loss_rounded_to_bf16(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Computes in fp32 but rounds the loss through bf16 before returning it as fp32."""
    loss = _fp32_ce(x, weight, target, bias, reduction=reduction, ignore_index=ignore_index)
    return loss + (loss.detach().to(torch.bfloat16).float() - loss.detach())


def _zloss_over_weight_sum(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100,
                           class_weights=None, z_loss_scale=0.0, **_):
    """`mean` divides the z-loss by the class-weight sum D (the CE normalizer) instead of the row count |M|."""
    logits = F.linear(x, weight, bias).float()
    loss = F.cross_entropy(logits, target, weight=class_weights, reduction=reduction, ignore_index=ignore_index)
    valid = target != ignore_index
    lse = torch.logsumexp(logits, dim=-1)
    z = torch.where(valid, z_loss_scale * lse * lse, torch.zeros_like(lse))
    if reduction == "mean":
        D = (class_weights[target.clamp_min(0)] * valid).sum() if class_weights is not None else valid.sum()
        return loss + z.sum() / D
    return loss + (z.sum() if reduction == "sum" else z)


def _softcap_without_chain_rule(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100,
                                softcap=None, **_):
    """Caps the logits in forward but back-propagates as if uncapped (the tanh derivative dropped)."""
    z = F.linear(x, weight, bias).float()
    if softcap is not None:
        z = z + (softcap * torch.tanh(z / softcap) - z).detach()
    return F.cross_entropy(z, target, reduction=reduction, ignore_index=ignore_index)


def _clamps_target_in_place(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Masks the ignored rows, then overwrites their targets with class 0 in place to make the gather safe: every
    output is right, but the caller's target tensor has lost its ignored rows."""
    valid = target != ignore_index
    target.masked_fill_(~valid, 0)
    losses = F.cross_entropy(F.linear(x, weight, bias).float(), target, reduction="none") * valid
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.sum() / valid.sum()


def _upstream_before_mean_in_compute_dtype(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Backward multiplies p − y by the upstream gradient, rounds that to the compute dtype, and only then divides
    by the row count: right for small upstreams, inf in fp16 under a mixed-precision loss scale (2^17·|p − y|
    passes 65504 once |p − y| > 1/2), though the scaled gradient itself fits."""

    dev = x.device.type
    c = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            z = (x.to(c) @ w.to(c).T).float()
            ctx.save_for_backward(x, w, z)
            return F.cross_entropy(z, target, reduction=reduction, ignore_index=ignore_index)

        @staticmethod
        def backward(ctx, g):
            x, w, z = ctx.saved_tensors
            valid = target != ignore_index
            d = z.softmax(-1)
            d[valid, target[valid]] -= 1.0
            d = d * valid[:, None]
            G = (d * g).to(c)  # scaled before it is normalized
            if reduction == "mean":
                G = G / valid.sum().to(c)
            return (G @ w.to(c)).to(x.dtype), (G.T @ x.to(c)).to(w.dtype)

    return Fn.apply(x, weight)


#: Caught by the loss-scale draws only (tests/self/test_mutants.py), so not in MUTANTS' general draws.
upstream_before_mean = FunctionImpl(
    "mutant_upstream_before_mean", _upstream_before_mean_in_compute_dtype,
    LinearCESupport(options=frozenset({"ignore_index"}), all_ignored=None, logits_dtype="compute",
                    dtypes=frozenset({torch.float32}), autocast=frozenset({torch.float16}),
                    reductions=frozenset({"mean", "sum"})))

_SUPPORT = LinearCESupport(options=frozenset({"bias", "ignore_index"}), all_ignored="nan",
                           logits_dtype="float32", dtypes=frozenset({torch.float32, torch.bfloat16}))

MUTANTS = [
    FunctionImpl("mutant_bf16_grad_weight_accum", _bf16_grad_weight_accumulation,
                 LinearCESupport(options=frozenset({"ignore_index"}), all_ignored="nan", logits_dtype="float32",
                                 dtypes=frozenset({torch.float32}), autocast=frozenset())),
    FunctionImpl("mutant_mean_over_N", _mean_over_all_rows, _SUPPORT),
    FunctionImpl("mutant_loss_bf16", _loss_rounded_to_bf16, _SUPPORT),
    FunctionImpl("mutant_target_clamped_in_place", _clamps_target_in_place, _SUPPORT),
    FunctionImpl("mutant_zloss_over_weight_sum", _zloss_over_weight_sum,
                 LinearCESupport(options=frozenset({"bias", "ignore_index", "class_weights", "z_loss"}),
                                 all_ignored=None, logits_dtype="float32", dtypes=frozenset({torch.float32}),
                                 autocast=frozenset())),
    FunctionImpl("mutant_softcap_no_chain_rule", _softcap_without_chain_rule,
                 LinearCESupport(options=frozenset({"bias", "ignore_index", "softcap"}), all_ignored="nan",
                                 logits_dtype="float32", dtypes=frozenset({torch.float32}), autocast=frozenset())),
]


# -- bugs that plain accuracy cannot see: each fails the property written for its class ---------------------
def _assumes_contiguous_x(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Reads x as a row-major [N, H] block from its first element (a kernel indexing x_ptr + i·H + j): right for
    a contiguous x, wrong for a column slice of a wider buffer."""
    xs = torch.as_strided(x, x.shape, (x.shape[1], 1))
    return F.cross_entropy(F.linear(xs, weight).float(), target, reduction=reduction, ignore_index=ignore_index)


class _GradXIfWeightNeedsGrad(torch.autograd.Function):
    """x·Wᵀ whose backward forms both gradients only when the *weight* needs one (the wrong needs_input_grad
    index)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x.float() @ w.float().T

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return None, None
        return (g @ w.float()).to(x.dtype), (g.T @ x.float()).to(w.dtype)


def _grad_x_needs_weight_grad(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Linear + CE in fp32 whose grad_x is lost when the weight is frozen."""
    return F.cross_entropy(_GradXIfWeightNeedsGrad.apply(x, weight), target, reduction=reduction,
                           ignore_index=ignore_index)


#: One gradient workspace per input shape, shared by every call (the bug: a second call of the same shape
#: overwrites the first call's gradients before its backward runs).
_WORKSPACE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


class _SharedWorkspaceCE(torch.autograd.Function):
    """Fused linear + CE that forms its gradients in forward into a per-shape workspace."""

    @staticmethod
    def forward(ctx, x, w, target, reduction, ignore_index):
        with torch.enable_grad():
            xf, wf = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
            loss = F.cross_entropy(xf @ wf.T, target, reduction=reduction, ignore_index=ignore_index)
            gx, gw = torch.autograd.grad(loss, (xf, wf))
        ctx.key = (tuple(x.shape), tuple(w.shape))
        _WORKSPACE[ctx.key] = (gx, gw)
        ctx.dtypes = (x.dtype, w.dtype)
        return loss.detach()

    @staticmethod
    def backward(ctx, g):
        gx, gw = _WORKSPACE[ctx.key]
        return (g * gx).to(ctx.dtypes[0]), (g * gw).to(ctx.dtypes[1]), None, None, None


def _shared_workspace(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Correct for one call per backward; two calls of one shape in one graph get the second call's gradients."""
    return _SharedWorkspaceCE.apply(x, weight, target, reduction, ignore_index)


def _bf16_loss_under_amp(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Under autocast, hands the (fp32-computed) loss back in the autocast dtype, where autocast's own
    cross_entropy returns fp32: the accuracy bound, which trusts the returned dtype, allows its rounding."""
    loss = F.cross_entropy(F.linear(x, weight, bias).float(), target, reduction=reduction, ignore_index=ignore_index)
    dev = x.device.type
    return loss.to(torch.get_autocast_dtype(dev)) if torch.is_autocast_enabled(dev) else loss


_TOKEN_COUNTS: dict[tuple[int, int], torch.Tensor] = {}


def _cached_token_count(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """`mean` divides by a token count cached per (N, ignore_index), computed on the first batch of that shape and
    reused after: right for the first call, wrong for the next batch whose ignored rows differ."""
    losses = F.cross_entropy(F.linear(x, weight, bias).float(), target, reduction="none", ignore_index=ignore_index)
    if reduction != "mean":
        return losses.sum() if reduction == "sum" else losses
    key = (target.shape[0], ignore_index)
    if key not in _TOKEN_COUNTS:
        _TOKEN_COUNTS[key] = (target != ignore_index).sum()
    return losses.sum() / _TOKEN_COUNTS[key]


class _UpstreamDividedInPlace(torch.autograd.Function):
    """fp32 CE whose backward scales the incoming gradient by 1/count in place (saving an allocation)."""

    @staticmethod
    def forward(ctx, x, w, target, ignore_index):
        ctx.save_for_backward(x, w, target)
        ctx.ignore_index = ignore_index
        return F.cross_entropy(x.float() @ w.float().T, target, reduction="sum", ignore_index=ignore_index) \
            / (target != ignore_index).sum()

    @staticmethod
    def backward(ctx, g):
        x, w, target = ctx.saved_tensors
        valid = target != ctx.ignore_index
        g.div_(valid.sum())  # the caller's tensor
        d = (x.float() @ w.float().T).softmax(-1)
        d[valid, target[valid]] -= 1.0
        d = d * valid[:, None] * g
        return (d @ w.float()).to(x.dtype), (d.T @ x.float()).to(w.dtype), None, None


def _upstream_divided_in_place(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    return _UpstreamDividedInPlace.apply(x, weight, target, ignore_index)


class _CachedCastCE(torch.autograd.Function):
    """fp32 CE over logits formed from x and a low-precision copy of the weight handed in by a cache (the matmul
    operands rounded as autocast would, the products summed in fp32)."""

    @staticmethod
    def forward(ctx, x, w, w_lp, target, reduction, ignore_index):
        x_lp = x.detach().to(w_lp.dtype)
        ctx.save_for_backward(x_lp, w_lp, target)
        ctx.reduction, ctx.ignore_index, ctx.dtypes = reduction, ignore_index, (x.dtype, w.dtype)
        dev = x.device.type
        with torch.autocast(dev, enabled=False):
            return F.cross_entropy(x_lp.float() @ w_lp.float().T, target, reduction=reduction,
                                   ignore_index=ignore_index)

    @staticmethod
    def backward(ctx, g):
        x_lp, w_lp, target = ctx.saved_tensors
        with torch.enable_grad(), torch.autocast(g.device.type, enabled=False):
            logits = (x_lp.float() @ w_lp.float().T).requires_grad_()
            loss = F.cross_entropy(logits, target, reduction=ctx.reduction, ignore_index=ctx.ignore_index)
            (G,) = torch.autograd.grad(loss, logits, g)
        return ((G @ w_lp.float()).to(ctx.dtypes[0]), (G.T @ x_lp.float()).to(ctx.dtypes[1]),
                None, None, None, None)


def _cached_cast(key: Callable[[torch.Tensor, torch.dtype], tuple]) -> Callable[..., torch.Tensor]:
    """An impl that casts the weight to the compute dtype once and reuses the cast while ``key(weight, dtype)``
    is unchanged (the cache holds each weight tensor weakly, so a freed weight takes its entry with it)."""
    from torch.utils.weak import WeakIdKeyDictionary

    cache: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
        dev = x.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight.dtype
        k = key(weight, dt)
        hit = cache.get(weight)
        if hit is None or hit[0] != k:
            hit = (k, weight.detach().to(dt).clone())
            cache[weight] = hit
        return _CachedCastCE.apply(x, weight, hit[1], target, reduction, ignore_index)

    return impl


#: A cast weight cached per (tensor, compute dtype), blind to in-place updates (no version in the key): an
#: optimizer step leaves the cache serving the old weights.
_cast_cache_ignores_update = _cached_cast(lambda w, dt: (dt,))
#: A cast weight cached per (tensor, version), blind to the autocast dtype: the first AMP dtype's cast serves both.
_cast_cache_ignores_dtype = _cached_cast(lambda w, dt: (w._version,))


_PLAIN_FP32 = LinearCESupport(options=frozenset({"ignore_index"}), all_ignored="nan", logits_dtype="float32",
                              dtypes=frozenset({torch.float32}), autocast=frozenset(),
                              reductions=frozenset({"mean", "sum"}))

#: (mutant, the property that must catch it, a case on which plain accuracy passes and that property fails).
DIRECTED = [
    (FunctionImpl("mutant_assumes_contiguous_x", _assumes_contiguous_x, _PLAIN_FP32), "strided_inputs",
     "Problem(N=8, H=16, V=24, seed=1)"),
    (FunctionImpl("mutant_grad_x_needs_weight_grad", _grad_x_needs_weight_grad, _PLAIN_FP32), "frozen_weight",
     "Problem(N=8, H=16, V=24, seed=2)"),
    (FunctionImpl("mutant_shared_workspace", _shared_workspace, _PLAIN_FP32), "two_calls",
     "Problem(N=8, H=16, V=24, reduction='sum', seed=3)"),
    (FunctionImpl("mutant_cached_token_count", _cached_token_count, _PLAIN_FP32), "two_calls",
     "Problem(N=8, H=16, V=24, ignored=0.5, reduction='mean', seed=5)"),
    (FunctionImpl("mutant_cast_cache_ignores_update", _cast_cache_ignores_update, _PLAIN_FP32), "earlier_calls",
     "Problem(N=8, H=16, V=24, seed=2)"),
    (FunctionImpl("mutant_cast_cache_ignores_dtype", _cast_cache_ignores_dtype,
                  replace(_PLAIN_FP32, autocast=frozenset({torch.bfloat16, torch.float16}))), "earlier_calls",
     "Problem(N=8, H=16, V=24, dtype='float32', autocast='float16', seed=2)"),
    (FunctionImpl("mutant_bf16_loss_under_amp", _bf16_loss_under_amp,
                  replace(_PLAIN_FP32, autocast=frozenset({torch.bfloat16}))), "loss_dtype",
     "Problem(N=8, H=16, V=24, autocast='bfloat16', seed=4)"),
]


#: Right outputs, but backward divides the caller's upstream gradient in place (run_impl must name it).
upstream_divided_in_place = FunctionImpl(
    "mutant_upstream_divided_in_place", _upstream_divided_in_place,
    replace(_PLAIN_FP32, reductions=frozenset({"mean"})))
