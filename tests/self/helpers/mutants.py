"""Small deliberately wrong linear+CE impls the suite must catch (tests/self/mutants/test_mutants.py runs them).

Each is a plausible mistake built on the eager composition, declared as if it were correct.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport


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
                gw += (G[s : s + 4].T @ xs.detach().float()[s : s + 4]).to(torch.bfloat16)
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


def _zloss_over_weight_sum(
    x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, class_weights=None, z_loss_scale=0.0, **_
):
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


def _softcap_without_chain_rule(
    x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, softcap=None, **_
):
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


#: Caught by the loss-scale draws only (tests/self/mutants/test_mutants.py), so not in MUTANTS' general draws.
upstream_before_mean = FunctionImpl(
    "mutant_upstream_before_mean",
    _upstream_before_mean_in_compute_dtype,
    LinearCESupport(
        options=frozenset({"ignore_index"}),
        all_ignored=None,
        logits_dtype="compute",
        dtypes=frozenset({torch.float32}),
        autocast=frozenset({torch.float16}),
        reductions=frozenset({"mean", "sum"}),
    ),
)

_SUPPORT = LinearCESupport(
    options=frozenset({"bias", "ignore_index"}),
    all_ignored="nan",
    logits_dtype="float32",
    dtypes=frozenset({torch.float32, torch.bfloat16}),
)

MUTANTS = [
    FunctionImpl(
        "mutant_bf16_grad_weight_accum",
        _bf16_grad_weight_accumulation,
        LinearCESupport(
            options=frozenset({"ignore_index"}),
            all_ignored="nan",
            logits_dtype="float32",
            dtypes=frozenset({torch.float32}),
            autocast=frozenset(),
        ),
    ),
    FunctionImpl("mutant_mean_over_N", _mean_over_all_rows, _SUPPORT),
    FunctionImpl("mutant_loss_bf16", _loss_rounded_to_bf16, _SUPPORT),
    FunctionImpl("mutant_target_clamped_in_place", _clamps_target_in_place, _SUPPORT),
    FunctionImpl(
        "mutant_zloss_over_weight_sum",
        _zloss_over_weight_sum,
        LinearCESupport(
            options=frozenset({"bias", "ignore_index", "class_weights", "z_loss"}),
            all_ignored=None,
            logits_dtype="float32",
            dtypes=frozenset({torch.float32}),
            autocast=frozenset(),
        ),
    ),
    FunctionImpl(
        "mutant_softcap_no_chain_rule",
        _softcap_without_chain_rule,
        LinearCESupport(
            options=frozenset({"bias", "ignore_index", "softcap"}),
            all_ignored="nan",
            logits_dtype="float32",
            dtypes=frozenset({torch.float32}),
            autocast=frozenset(),
        ),
    ),
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
    return F.cross_entropy(
        _GradXIfWeightNeedsGrad.apply(x, weight), target, reduction=reduction, ignore_index=ignore_index
    )


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
        return (
            F.cross_entropy(x.float() @ w.float().T, target, reduction="sum", ignore_index=ignore_index)
            / (target != ignore_index).sum()
        )

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
            return F.cross_entropy(
                x_lp.float() @ w_lp.float().T, target, reduction=reduction, ignore_index=ignore_index
            )

    @staticmethod
    def backward(ctx, g):
        x_lp, w_lp, target = ctx.saved_tensors
        with torch.enable_grad(), torch.autocast(g.device.type, enabled=False):
            logits = (x_lp.float() @ w_lp.float().T).requires_grad_()
            loss = F.cross_entropy(logits, target, reduction=ctx.reduction, ignore_index=ctx.ignore_index)
            (G,) = torch.autograd.grad(loss, logits, g)
        return ((G @ w_lp.float()).to(ctx.dtypes[0]), (G.T @ x_lp.float()).to(ctx.dtypes[1]), None, None, None, None)


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


PLAIN_FP32 = LinearCESupport(
    options=frozenset({"ignore_index"}),
    all_ignored="nan",
    logits_dtype="float32",
    dtypes=frozenset({torch.float32}),
    autocast=frozenset(),
    reductions=frozenset({"mean", "sum"}),
)

#: (mutant, the property that must catch it, a case on which plain accuracy passes and that property fails).
DIRECTED = [
    (
        FunctionImpl("mutant_assumes_contiguous_x", _assumes_contiguous_x, PLAIN_FP32),
        "strided_inputs",
        "Problem(N=8, H=16, V=24, seed=1)",
    ),
    (
        FunctionImpl("mutant_grad_x_needs_weight_grad", _grad_x_needs_weight_grad, PLAIN_FP32),
        "frozen_weight",
        "Problem(N=8, H=16, V=24, seed=2)",
    ),
    (
        FunctionImpl("mutant_shared_workspace", _shared_workspace, PLAIN_FP32),
        "two_calls",
        "Problem(N=8, H=16, V=24, reduction='sum', seed=3)",
    ),
    (
        FunctionImpl("mutant_cached_token_count", _cached_token_count, PLAIN_FP32),
        "two_calls",
        "Problem(N=8, H=16, V=24, ignored=0.5, reduction='mean', seed=5)",
    ),
    (
        FunctionImpl("mutant_cast_cache_ignores_update", _cast_cache_ignores_update, PLAIN_FP32),
        "earlier_calls",
        "Problem(N=8, H=16, V=24, seed=2)",
    ),
    (
        FunctionImpl(
            "mutant_cast_cache_ignores_dtype",
            _cast_cache_ignores_dtype,
            replace(PLAIN_FP32, autocast=frozenset({torch.bfloat16, torch.float16})),
        ),
        "earlier_calls",
        "Problem(N=8, H=16, V=24, dtype='float32', autocast='float16', seed=2)",
    ),
    (
        FunctionImpl(
            "mutant_bf16_loss_under_amp",
            _bf16_loss_under_amp,
            replace(PLAIN_FP32, autocast=frozenset({torch.bfloat16})),
        ),
        "loss_dtype",
        "Problem(N=8, H=16, V=24, autocast='bfloat16', seed=4)",
    ),
]


#: Right outputs, but backward divides the caller's upstream gradient in place (run_impl must name it).
upstream_divided_in_place = FunctionImpl(
    "mutant_upstream_divided_in_place", _upstream_divided_in_place, replace(PLAIN_FP32, reductions=frozenset({"mean"}))
)


# -- bug classes, each one change to a passing built-in -------------------------------------------
# Every mutant below is the built-in ``chunked[fp32_operands]`` (or ``recompute``) with one thing changed, and
# declares exactly what that built-in declares (:func:`_builtin_twin`), so a suite that passes the built-in and
# fails the mutant has caught that one thing. The change sits in the fused ``mean``/``sum`` pass (every gradient
# formed in forward), except where a class says otherwise; ``reduction='none'`` runs the built-in's recompute
# path unchanged.
import dataclasses as _dc
import itertools as _it
from typing import Any as _Any

from numcheck.impls.builtin import grad_accum as _acc
from numcheck.impls.builtin.chunk_sweep import run_sweep as _run_sweep
from numcheck.impls.builtin.chunked import ChunkedLinearCE, FusedFunction, check_call, compute_dtype
from numcheck.impls.builtin.chunked import recompute as _builtin_recompute
from numcheck.impls.builtin.recompute import RecomputeFunction
from numcheck.reference.numerics import sweep as _sweep
from numcheck.reference.numerics.accumulation import scaled_ as _scaled
from numcheck.reference.numerics.ce_block import reduction_coefficients as _coefficients
from numcheck.reference.numerics.ce_block import row_weights as _row_weights
from numcheck.reference.options import options_from_kwargs

#: Classes per block of the vocabulary-blocked grad_x sum (a Triton kernel's BLOCK_V).
GRAD_X_BLOCK = 128


@_dc.dataclass(frozen=True)
class Mutation:
    """What one mutant changes in its built-in twin (``None``: as the built-in).

    ``grad_weight``/``grad_bias``: the dtype of the running sum across chunks (the built-in's is fp32).
    ``grad_x``: grad_x = G·W summed over :data:`GRAD_X_BLOCK`-class blocks with its running sum in this dtype
    (the built-in: one fp32-accumulated matmul over V). ``loss``: the per-chunk fp32 sums of the per-row losses
    added in this dtype. ``row_loss``: each per-row loss rounded through this dtype before the reduction.
    ``stats``: the recompute path's per-row softmax statistics (m, log s) kept in this dtype between forward
    and backward. ``order``: ``"chunks"`` processes the full chunks in an order drawn afresh on every call,
    ``"rows"`` assigns the rows to chunks in such an order (split-K/atomics-like: each row's contribution to
    grad_weight and the loss added in a per-call order); fp32 partial sums either way."""

    grad_weight: torch.dtype | None = None
    grad_bias: torch.dtype | None = None
    grad_x: torch.dtype | None = None
    loss: torch.dtype | None = None
    row_loss: torch.dtype | None = None
    stats: torch.dtype | None = None
    order: str | None = None


class NarrowSum:
    """An accumulator (:class:`reference.numerics.accumulation.Accumulator`) whose running sum is held in ``dtype``: each chunk's
    fp32 product Gᵀ·x is added in fp32 and the sum rounded back to ``dtype`` (a bias: x is the ones column)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> None:
        self.buf = torch.zeros(shape, dtype=dtype, device=device)

    def add_(self, G: torch.Tensor, x: torch.Tensor | None = None) -> None:
        """``buf = round(buf + Gᵀ·x)`` (``x`` ``[C, H]``, or a bias's ``[≥C, 1]`` ones column)."""
        C = G.shape[0]
        part = G.t().float() @ (x[:C].float() if x is not None else torch.ones(C, 1, device=G.device))
        self.buf.copy_((self.buf.float() + part.reshape(self.buf.shape)).to(self.buf.dtype))

    def finish(self, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The gradient in ``dtype``: the sum times ``scale``, multiplied in fp32 (as the built-in's)."""
        return _scaled(self.buf, scale, dtype) if scale is not None else self.buf.to(dtype)


class _BlockedGradX:
    """The plan's CE kernel, then grad_x of the chunk it was handed as Σ over class blocks of G_b·W_b, the
    running sum rounded to ``dtype`` after each block, written into ``gx`` (chunks arrive in row order)."""

    def __init__(self, kernel: _Any, wc: torch.Tensor, gx: torch.Tensor, dtype: torch.dtype) -> None:
        self.kernel, self.wc, self.gx, self.dtype, self.row = kernel, wc, gx, dtype, 0

    def __call__(self, logits: torch.Tensor, target: torch.Tensor, *args: _Any, **kw: _Any) -> _Any:
        res = self.kernel(logits, target, *args, **kw)
        C, V = logits.shape
        acc = torch.zeros(C, self.wc.shape[1], dtype=self.dtype, device=logits.device)
        for s in range(0, V, GRAD_X_BLOCK):
            acc = (acc.float() + logits[:, s : s + GRAD_X_BLOCK].float() @ self.wc[s : s + GRAD_X_BLOCK].float()).to(
                self.dtype
            )
        self.gx[self.row : self.row + C] = acc.to(self.gx.dtype)
        self.row += C
        return res


def _gradient(m: Mutation, which: str, plan: _Any, shape: tuple[int, ...], dtype: torch.dtype, device: _Any) -> _Any:
    """The accumulator of ``which`` gradient: a :class:`NarrowSum` where ``m`` narrows it, else the built-in's."""
    narrow = getattr(m, which)
    if narrow is not None:
        return NarrowSum(shape, narrow, device)
    return _acc.make_accumulator(plan.path, shape, dtype, device)


def _reduce(
    m: Mutation, plan: _Any, ce: torch.Tensor, z: torch.Tensor, coef: _Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The built-in's :func:`reference.numerics.sweep.reduce_rows`, with the chunks' loss sums added in ``m.loss``."""
    if m.row_loss is not None:
        ce = ce.to(m.row_loss).float()
    if m.loss is None:
        return _sweep.reduce_rows(plan.options.reduction, ce, z, coef)
    total = torch.zeros((), dtype=m.loss, device=ce.device)
    for s in range(0, ce.shape[0], plan.chunk_rows):
        total = (total.float() + ce[s : s + plan.chunk_rows].sum()).to(m.loss)
    zl = z.sum() / coef.n_valid if plan.options.reduction == "mean" else z.sum()
    return (total.float() / coef.D if plan.options.reduction == "mean" else total.float()) + zl, zl


class _MutatedFused(FusedFunction):
    """The built-in fused pass (:class:`impls.builtin.chunked.FusedFunction` with :func:`impls.builtin.chunk_sweep.run_sweep`'s
    body inlined) with the gradient buffers, grad_x and the reduction taken from a :class:`Mutation`."""

    @staticmethod
    def forward(
        ctx: _Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        target: torch.Tensor,
        plan: _Any,
        m: Mutation,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        o = plan.options
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        with _sweep.autocast_off(x.device.type):
            xc, wc, bc = _sweep.operands(plan, x, weight, bias)
            valid, _, w_t = _row_weights(target, o.class_weights, o.ignore_index)
            coef = _coefficients(valid, w_t, o.reduction)
            (N, H), V = x.shape, weight.shape[0]
            gx = torch.empty(N, H, dtype=xc.dtype, device=x.device) if need_x else None
            gw = _gradient(m, "grad_weight", plan, (V, H), weight.dtype, x.device) if need_w else None
            gb = _gradient(m, "grad_bias", plan, (V,), bias.dtype, x.device) if need_b and bias is not None else None
            sweep_gx = gx
            if m.grad_x is not None and gx is not None:
                plan, sweep_gx = _dc.replace(plan, kernel=_BlockedGradX(plan.kernel, wc, gx, m.grad_x)), None
            ce, z, _ = _sweep.sweep(plan, xc, wc, bc, target, coef=coef, gx=sweep_gx, gw=gw, gb=gb)
            loss, z_loss = _reduce(m, plan, ce, z, coef)
        ctx.save_for_backward(gx)
        ctx.accumulators = (gw, gb)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.mark_non_differentiable(z_loss)
        return loss, z_loss

    @staticmethod
    def backward(ctx: _Any, grad_loss: torch.Tensor, grad_z: torch.Tensor | None):  # type: ignore[override]
        return (*FusedFunction.backward(ctx, grad_loss, grad_z), None)


class _NarrowStatsRecompute(RecomputeFunction):
    """The built-in recompute pass with the per-row statistics (m, log s) stored in ``plan``'s mutation dtype
    between forward and backward instead of fp32 (backward's p = exp(z − m − log s) reads them back)."""

    dtype = torch.bfloat16

    @staticmethod
    def forward(
        ctx: _Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor, plan: _Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with _sweep.autocast_off(x.device.type):
            res = _run_sweep(plan, x, weight, bias, target)
            loss, z_loss = _sweep.reduce_rows(plan.options.reduction, res.ce, res.z, res.coef)
        narrow = _NarrowStatsRecompute.dtype
        ctx.save_for_backward(
            x, weight, bias, target, res.stats.m.to(narrow).float(), res.stats.log_s.to(narrow).float()
        )
        ctx.plan = plan
        ctx.mark_non_differentiable(z_loss)
        return loss, z_loss


#: Calls so far of the reordering mutants: call k draws its order from a generator seeded with k, so
#: consecutive identical calls differ while a whole run is reproducible.
_ORDER_CALLS = _it.count()


def _call_order(N: int, chunk_rows: int, order: str, device: torch.device) -> torch.Tensor:
    """A row order for one call: the full chunks of ``chunk_rows`` rows shuffled (the ragged last chunk stays
    last, so chunk boundaries are the built-in's), or every row shuffled (``"rows"``)."""
    g = torch.Generator().manual_seed(next(_ORDER_CALLS))
    if order == "rows":
        return torch.randperm(N, generator=g).to(device)
    full = N // chunk_rows
    perm = torch.randperm(full, generator=g) if full else torch.zeros(0, dtype=torch.long)
    idx = (perm[:, None] * chunk_rows + torch.arange(chunk_rows)).reshape(-1)
    return torch.cat([idx, torch.arange(full * chunk_rows, N)]).to(device)


class MutantChunked(ChunkedLinearCE):
    """A built-in chunked impl with one :class:`Mutation`; same declaration, name of its own."""

    def __init__(self, name: str, *, mutation: Mutation, **kw: _Any) -> None:
        super().__init__(name, **kw)
        self.mutation = mutation

    def with_chunk_rows(self, n: int) -> "MutantChunked":
        """A copy with ``n`` tokens per chunk (the mutation kept)."""
        return MutantChunked(
            self.name,
            mutation=self.mutation,
            path=self.path,
            chunk_rows=n,
            kernel=self.kernel,
            recompute=self.recompute,
            support=self.support,
            description=self.description,
        )

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
        **options: _Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.mutation
        if m.order is not None:
            return self._reordered(x, weight, target, bias, **options)
        opts = options_from_kwargs(**options)
        check_call(x, weight, target, bias, opts)
        plan = _sweep.Plan(
            options=opts,
            path=self.path,
            chunk_rows=self.chunk_rows,
            kernel=self.kernel,
            compute_dtype=compute_dtype(x, weight),
        )
        if self.recompute or opts.reduction == "none":
            fn = _NarrowStatsRecompute if m.stats is not None else RecomputeFunction
            return fn.apply(x, weight, bias, target, plan)
        return _MutatedFused.apply(x, weight, bias, target, plan, m)

    def _reordered(
        self, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None, **options: _Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The built-in on this call's row order; per-row outputs put back in the caller's order."""
        idx = _call_order(x.shape[0], self.chunk_rows, self.mutation.order, x.device)  # type: ignore[arg-type]
        loss, z = super().__call__(x[idx], weight, target[idx], bias, **options)
        if options.get("reduction") == "none":
            inv = torch.argsort(idx)
            return loss[inv], z[inv]
        return loss, z


def _builtin_twin(
    name: str, mutation: Mutation, *, dtypes: tuple[torch.dtype, ...] | None = None, recompute: bool = False
) -> MutantChunked:
    """``chunked[fp32_operands]`` (or ``recompute``) with ``mutation``, declaring what the built-in declares
    (only ``dtypes`` when given, with no AMP then: an impl that declares only bf16 or only fp16)."""
    twin = _builtin_recompute() if recompute else None
    path = "addmm_out_dtype" if recompute else "fp32_operands"
    support = LinearCESupport(returns_z_loss=True, all_ignored="nan")
    if dtypes is not None:
        support = replace(support, dtypes=frozenset(dtypes), autocast=frozenset())
    return MutantChunked(
        name,
        mutation=mutation,
        path=path,
        recompute=recompute,
        support=support,
        description=f"{twin.name if twin else 'chunked[fp32_operands]'} with {mutation}",
    )


#: An accumulator narrower than declared (each declares fp32 accumulation, as its twin does).
gw_bf16_sum = _builtin_twin("mutant_gw_bf16_sum", Mutation(grad_weight=torch.bfloat16))
gb_bf16_sum = _builtin_twin("mutant_gb_bf16_sum", Mutation(grad_bias=torch.bfloat16))
gx_bf16_sum = _builtin_twin("mutant_gx_bf16_sum", Mutation(grad_x=torch.bfloat16))
loss_bf16_sum = _builtin_twin("mutant_loss_bf16_sum", Mutation(loss=torch.bfloat16))
gw_bf16_sum_bf16_only = _builtin_twin(
    "mutant_gw_bf16_sum[bf16_only]", Mutation(grad_weight=torch.bfloat16), dtypes=(torch.bfloat16,)
)
gw_fp16_sum_fp16_only = _builtin_twin(
    "mutant_gw_fp16_sum[fp16_only]", Mutation(grad_weight=torch.float16), dtypes=(torch.float16,)
)
gx_bf16_sum_bf16_only = _builtin_twin(
    "mutant_gx_bf16_sum[bf16_only]", Mutation(grad_x=torch.bfloat16), dtypes=(torch.bfloat16,)
)
#: Nondeterminism: an order that changes between identical calls, fp32 partial sums.
chunk_order_per_call = _builtin_twin("mutant_chunk_order_per_call", Mutation(order="chunks"))
row_order_per_call = _builtin_twin("mutant_row_order_per_call", Mutation(order="rows"))
#: A per-row loss or an intermediate rounded through a narrower dtype than declared.
row_loss_bf16 = _builtin_twin("mutant_row_loss_bf16", Mutation(row_loss=torch.bfloat16))
stats_bf16 = _builtin_twin("mutant_stats_bf16", Mutation(stats=torch.bfloat16), recompute=True)

#: The bug classes → the mutants of each (the detection table's rows, in order); ``mutant_bf16_grad_weight_accum``
#: and ``mutant_loss_bf16`` (above, on the eager composition) predate them and are listed too.
CLASSES: dict[str, list[_Any]] = {
    "accumulator narrower than declared": [
        gw_bf16_sum,
        gb_bf16_sum,
        gx_bf16_sum,
        loss_bf16_sum,
        gw_bf16_sum_bf16_only,
        gw_fp16_sum_fp16_only,
        gx_bf16_sum_bf16_only,
        MUTANTS[0],
    ],
    "nondeterminism": [chunk_order_per_call, row_order_per_call],
    "intermediate rounded through a narrower dtype": [row_loss_bf16, stats_bf16, MUTANTS[2]],
}

#: Module-level names of the two eager-based mutants above, so ``--impl numcheck.tests.self.helpers.mutants:<name>`` loads
#: each alone.
bf16_grad_weight_accum = MUTANTS[0]
loss_bf16 = MUTANTS[2]
