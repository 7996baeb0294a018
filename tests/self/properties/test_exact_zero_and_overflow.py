"""Judged outputs whose float64 value is exactly zero, and AMP fp16 overflow (docs/error-analysis.md).

(1) Under a softcap the oracle's d = 1 − tanh²(z/s) cancels to exactly 0 once |z/s| ≳ 18.7, so its G and whole
grad_x rows are 0 while a correct fp32 evaluation, whose tanh may be one rounding below 1, gives d = 2^-23: the
bound must keep |g|·3u_L there. (2) Under autocast fp16 the gradient GEMMs return fp16: an exact gradient past
65504 comes back ±inf, which is correct rounding; an overflow the exact computation does not imply still fails.
(3) Under a loss scale the gradient of a row's log-probability, −u·c_i, can itself pass 65504 (one row, u = 2^17):
an fp16 log-softmax backward (eager's on CUDA) then turns every gradient non-finite, legitimately.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport
from numcheck.impls.registry import builtin
from numcheck.properties.core.device import DEVICE
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.harness import run_impl, run_oracle
from numcheck.properties.linear_ce.props import reduction_consistency
from numcheck.properties.linear_ce.tolerance import upstream_overflow

#: Liger's CUDA false alarm : 87 of its 2049 rows have |z/s| > 18.7 for both classes.
SATURATED = Problem(N=2049, H=1, V=2, dtype="float32", ignored=0.1, softcap=3.96, regime="large", seed=0, device=DEVICE)
#: eager under AMP fp16, grad_weight's exact value −67829.9 (V=1) and 91352.4 (V=157) pass 65504.
OVERFLOWING = [
    Problem(
        N=64,
        H=1,
        V=1,
        dtype="float32",
        autocast="float16",
        ignored=0.1,
        reduction="sum",
        z_loss_scale=0.5,
        regime="outlier_rows",
        seed=1,
        device=DEVICE,
    ),
    Problem(
        N=2,
        H=17,
        V=157,
        dtype="float32",
        autocast="float16",
        bias=True,
        ignored=0.1,
        z_loss_scale=0.5,
        regime="outlier_rows",
        seed=117246739,
        device=DEVICE,
    ),
]
#: reduction_consistency's scalar upstream (u ≈ 3) takes eager's 'sum' grad_x to −121900 under AMP fp16.
SCALED_OVERFLOW = Problem(
    N=7,
    H=1,
    V=90,
    dtype="float32",
    autocast="float16",
    ignored=0.1,
    z_loss_scale=0.5,
    regime="large",
    seed=0,
    device=DEVICE,
)


class _TanhTowardZero(torch.autograd.Function):
    """tanh rounded toward zero (a faithful rounding, within one u of the exact value); backward 1 − t²."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        exact = torch.tanh(a.double())
        t = exact.to(a.dtype)
        t = torch.where((t.double().abs() >= exact.abs()) & (t != 0), torch.nextafter(t, torch.zeros_like(t)), t)
        ctx.save_for_backward(t)
        return t

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (t,) = ctx.saved_tensors
        return g * (1 - t * t)


def _faithful_tanh_ce(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Any = None,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    softcap: float | None = None,
) -> torch.Tensor:
    """fp32 linear + softcap + CE, the softcap's tanh rounded toward zero: a correct fp32 evaluation."""
    z = F.linear(x, weight, bias)
    if softcap is not None:
        z = softcap * _TanhTowardZero.apply(z / softcap)
    return F.cross_entropy(z, target, reduction=reduction, ignore_index=ignore_index)


FAITHFUL_TANH = FunctionImpl(
    "faithful_tanh",
    _faithful_tanh_ce,
    LinearCESupport(
        options=frozenset({"bias", "ignore_index", "softcap"}),
        all_ignored="nan",
        logits_dtype="float32",
        dtypes=frozenset({torch.float32}),
        autocast=frozenset(),
    ),
)


def _fp16_ce(shift: bool):
    """CE of fp16 logits evaluated in fp16, with the max shift (``shift``) or without it (the mutant)."""

    def fn(
        x: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        bias: Any = None,
        *,
        reduction: str = "mean",
        ignore_index: int = -100,
    ) -> torch.Tensor:
        z = F.linear(x, weight, bias)
        with torch.autocast(z.device.type, enabled=False):
            zh = z.to(torch.float16)
            m = zh.amax(dim=-1, keepdim=True).detach() if shift else torch.zeros_like(zh[:, :1])
            lse = (m + torch.log(torch.exp(zh - m).sum(dim=-1, keepdim=True))).squeeze(-1)
            valid = target != ignore_index
            z_y = zh.gather(1, target.clamp_min(0)[:, None]).squeeze(1)
            row = torch.where(valid, (lse - z_y).float(), torch.zeros((), device=z.device))
            return row.sum() / valid.sum() if reduction == "mean" else row.sum() if reduction == "sum" else row

    return fn


_AMP16 = LinearCESupport(
    options=frozenset({"ignore_index"}),
    all_ignored=None,
    logits_dtype="compute",
    ce_dtype="compute",
    dtypes=frozenset({torch.float32}),
    autocast=frozenset({torch.float16}),
)
SHIFTED_FP16_CE = FunctionImpl("fp16_ce_shifted", _fp16_ce(shift=True), _AMP16)
UNSHIFTED_FP16_CE = FunctionImpl("mutant_fp16_exp_without_max_shift", _fp16_ce(shift=False), _AMP16)

#: The mutant's pre-scale of G before its fp16 grad_weight GEMM (undone afterwards): 2^12.
PRESCALE = 4096.0


class _PrescaledGradWeight(torch.autograd.Function):
    """fp32 CE of fp16 logits; backward forms grad_weight as fp16((PRESCALE·G)ᵀ·x) / PRESCALE: an fp16 GEMM whose
    output is PRESCALE times the gradient, so it overflows where the gradient itself fits (grad_x is plain)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, reduction: str, ignore_index: int
    ) -> torch.Tensor:
        ctx.save_for_backward(x, w, target)
        ctx.opts = (reduction, ignore_index)
        logits = (x.half() @ w.half().T).float()
        return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):
        x, w, target = ctx.saved_tensors
        reduction, ignore_index = ctx.opts
        with torch.enable_grad():
            logits = (x.half() @ w.half().T).float().requires_grad_()
            loss = F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)
            (G,) = torch.autograd.grad(loss, logits, g)
        gx = (G.half() @ w.half()).to(x.dtype)
        gw = ((G * PRESCALE).half().T @ x.half()).to(w.dtype) / PRESCALE
        return gx, gw, None, None, None


def _prescaled(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Any = None,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
) -> torch.Tensor:
    with torch.autocast(x.device.type, enabled=False):
        return _PrescaledGradWeight.apply(x, weight, target, reduction, ignore_index)


PRESCALED_GRAD_WEIGHT = FunctionImpl(
    "mutant_prescaled_fp16_grad_weight",
    _prescaled,
    LinearCESupport(
        options=frozenset({"ignore_index"}),
        all_ignored=None,
        logits_dtype="compute",
        dtypes=frozenset({torch.float32}),
        autocast=frozenset({torch.float16}),
    ),
)

#: 'sum' over rows scaled by 64: |grad_weight| reaches hundreds (fits fp16), PRESCALE times that does not.
NEEDLESS = Problem(
    N=16, H=4, V=8, dtype="float32", autocast="float16", reduction="sum", regime="outlier_rows", seed=3, device=DEVICE
)


def test_saturated_softcap_rows_keep_their_rounding_term() -> None:
    """Where the oracle's softcap derivative cancels to 0 (whole grad_x rows exactly 0), a correct fp32 evaluation
    with d = 2^-23 is within bound: the bound keeps |g|·3u_L instead of collapsing to η·Σ|W|."""
    t = build(SATURATED)
    ref = run_oracle(SATURATED, t, all_ignored="nan")
    out = run_impl(FAITHFUL_TANH, SATURATED, t)
    valid = t.target != SATURATED.ignore_index
    zero_rows = valid & (ref.grad_x == 0).all(dim=1)
    assert int(zero_rows.sum()) > 0 and bool((out.grad_x[zero_rows] != 0).any()), "no saturated row to judge"
    res = check_accuracy(FAITHFUL_TANH, SATURATED, t=t)
    assert res.ok, "\n".join(res.failure_lines())


def test_amp_fp16_gradient_overflow_is_correct_rounding() -> None:
    """eager under AMP fp16 returns ±inf where the exact grad_weight passes fp16's range, and that is accepted."""
    eager = builtin("eager")
    for p in OVERFLOWING:
        res = check_accuracy(eager, p)
        assert res.ok, "\n".join(res.failure_lines())
        assert res.analytic["grad_weight"].extra.get("overflowed", 0) >= 1, f"nothing overflowed on {p}"


def test_scaled_run_overflow_is_consistent() -> None:
    """reduction_consistency accepts the scalar-upstream run's ±inf where u·(exact gradient) passes 65504."""
    eager = builtin("eager")
    q = SCALED_OVERFLOW.replace(reduction="sum", upstream="scalar")
    assert bool(torch.isinf(run_impl(eager, q).grad_x).any()), "the scaled run no longer overflows"
    assert reduction_consistency(eager, SCALED_OVERFLOW)["error/bound"] <= 1.0


def test_exp_without_max_shift_in_fp16_fails() -> None:
    """fp16 CE without the max shift overflows exp where the exact loss is ordinary: caught; with it, passed."""
    p = SCALED_OVERFLOW.replace(z_loss_scale=0.0)
    good = check_accuracy(SHIFTED_FP16_CE, p, relative=False)
    assert good.ok, "\n".join(good.failure_lines())
    bad = check_accuracy(UNSHIFTED_FP16_CE, p, relative=False)
    assert not bad.ok and bad.analytic["loss"].state == "nonfinite_mismatch"


def test_needless_gradient_overflow_fails() -> None:
    """An fp16 grad_weight GEMM fed PRESCALE·G overflows where the exact gradient fits fp16: not accepted."""
    ref = run_oracle(NEEDLESS, build(NEEDLESS), all_ignored="nan")
    top = float(ref.grad_weight.abs().max())
    assert 65504 / PRESCALE < top < 65504 / 2, f"max |grad_weight| {top} does not separate the mutant"
    res = check_accuracy(PRESCALED_GRAD_WEIGHT, NEEDLESS, relative=False)
    assert not res.ok and res.analytic["grad_weight"].state == "nonfinite_mismatch"
    assert check_accuracy(builtin("eager"), NEEDLESS).ok


def _fp16_log_softmax_ce(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    class_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Linear + CE whose log-softmax runs in the logits' fp16 under autocast, as eager's does on CUDA; its
    backward holds ∂L/∂log p = −u·c_i in fp16."""
    logits = F.linear(x, weight, bias)
    with torch.autocast(logits.device.type, enabled=False):
        logp = torch.log_softmax(logits, dim=-1)
        return F.nll_loss(logp.float(), target, weight=class_weights, reduction=reduction, ignore_index=ignore_index)


FP16_LOG_SOFTMAX = FunctionImpl(
    name="fp16_log_softmax_ce",
    fn=_fp16_log_softmax_ce,
    support=LinearCESupport(
        options=("class_weights",), autocast=("float16",), grad_accumulation="fp32", ce_dtype="compute"
    ),
    description="log-softmax in fp16 under autocast (CUDA eager's cross_entropy)",
)
#: CUDA seed 12: a loss scale of 2^17 over one row: ∂L/∂log p_y = −131072, inf in fp16.
ONE_ROW_SCALED = Problem(
    N=1,
    H=16,
    V=44,
    dtype="float32",
    autocast="float16",
    bias=True,
    class_weights=True,
    upstream="loss_scale",
    regime="confident",
    seed=305,
    device=DEVICE,
)


def test_upstream_overflow_before_the_gradients_is_accepted() -> None:
    """A backward whose −u·c_i itself overflows fp16 may return non-finite gradients; with 64 rows it may not."""
    assert upstream_overflow(ONE_ROW_SCALED), "the one-row loss-scaled case no longer overflows"
    out = run_impl(FP16_LOG_SOFTMAX, ONE_ROW_SCALED)
    assert not bool(torch.isfinite(out.grad_weight).any()), "the fp16 log-softmax did not overflow"
    res = check_accuracy(FP16_LOG_SOFTMAX, ONE_ROW_SCALED, relative=False)
    assert res.ok, "\n".join(res.failure_lines())
    assert res.analytic["grad_x"].extra.get("overflow_upstream"), "the overflow was not recorded"
    many = ONE_ROW_SCALED.replace(N=64, class_weights=False)
    assert not upstream_overflow(many)
    broken = FunctionImpl(
        name="nan_grads", fn=lambda *a, **k: _nan_grad(_fp16_log_softmax_ce(*a, **k)), support=FP16_LOG_SOFTMAX.support
    )
    assert not check_accuracy(broken, many, relative=False).ok, "non-finite gradients passed without an overflow"


class _NanGrad(torch.autograd.Function):
    """Identity whose backward returns NaN: a gradient that goes non-finite with no overflow to explain it."""

    @staticmethod
    def forward(ctx: Any, v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return v.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.full_like(g, math.nan)


def _nan_grad(v: torch.Tensor) -> torch.Tensor:
    return _NanGrad.apply(v)
