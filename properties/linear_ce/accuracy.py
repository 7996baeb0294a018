"""Accuracy of every output against the float64 oracle, under two judgements.

(a) *Analytic*: every element within the bound of :mod:`properties.linear_ce.tolerance` (the hard ceiling gates; the
    expected level is recorded for reports).
(b) *Relative to eager*: RMSE(impl − oracle) ≤ k(n_eff)·RMSE(eager − oracle) + λ(α)·RMS(E), eager being the
    ``eager`` built-in on the same problem, E the expected-level bound (√n·u per reduction) of
    :mod:`properties.linear_ce.tolerance` for the impl's declaration with each output's last rounding at the finer of the
    impl's and eager's dtypes (the loss and z-loss at the returned one where the impl declares it: ``loss_dtype``).
    A correct impl fails it with probability at most α = :data:`RELATIVE_ALPHA` per
    output, under either of the two ways it can be correct:

    * *it errs as eager does* (the ratio half): with independent errors whose element scales are E's, the ratio
      RMSE²(impl)/RMSE²(eager) is F(n_eff, n_eff)-distributed, n_eff = (ΣE²)²/ΣE⁴ (Satterthwaite's degrees of
      freedom of ΣE_i²χ²₁: the number of elements that carry the error). k = √F⁻¹(1 − α; n_eff, n_eff), never
      below Inductor's 2 (fp32) / 3 (bf16, fp16). One number against one number says almost nothing: k is
      6.4e5 at n_eff = 1, 1000 at 2, 6.3 at 10, 2.0 at 50.
    * *it evaluates in another order* (the order half): each element's error is then sub-Gaussian at scale
      E_i (Higham & Mary 2019), and for the RMS over elements, however they are coupled, Jensen over the
      weights E_i²/ΣE² and Chernoff's bound give P(RMS(e) > λ·RMS(E)) ≤ λ·exp(−(λ² − 1)/2); λ(1e-6) = 5.67
      (:func:`rms_lambda`). This half is what covers tiny tensors and an exact eager.

    The allowance is the sum of the halves (each alone holds its rate under its own hypothesis). The last
    rounding at the finer dtype is what makes (b) see a gradient handed back coarser than eager keeps it; (a)
    takes the returned dtype as given, and so does (b) for a loss returned in the dtype its ``loss_dtype``
    declares (eager's fp32 z-loss is eager's choice, not a yardstick).

    An output an impl declares less accurate than eager keeps it (grad_weight and grad_bias under
    ``per_chunk_rounding`` or ``param_dtype`` accumulation, grad_x under such a ``grad_x_accumulation``, every
    gradient under a loss-scale upstream: :func:`declared_coarser`) has its yardstick follow the declaration:
    numcheck's own evaluation of the declared path (:mod:`numcheck.properties.linear_ce.declared_path`: the declared
    chunk rows and columns, accumulation dtype, gradients formed before the scale), an honest implementation of
    what the impl declares, with the same k and λ; the last rounding at the finer of the impl's and that
    yardstick's dtypes. Only the loss under ``target_logit="rounded_products"`` is recorded but not judged by (b),
    and (b) is skipped for an all-ignored ``mean`` (a convention, not a rounding).

Its power: an output rounded r times coarser than eager's is caught when r exceeds about k(n_eff) + λ·RMS(E)/
RMSE(eager): a per-row loss (n_eff ≈ N) rounded through bf16 at 170× its allowance, while a scalar loss
(n_eff = 1) is left to (a), which holds it to the returned dtype, and to the ``loss_dtype`` property.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from scipy import optimize, stats

from numcheck.properties.core.compare import Comparison, compare
from numcheck.properties.linear_ce.cases import Problem, Tensors, build
from numcheck.properties.linear_ce.harness import (
    FROZEN_GRADS,
    OUTPUTS,
    ImplOutputs,
    eager_yardstick,
    run_impl,
    run_oracle,
)
from numcheck.properties.linear_ce.tolerance import (
    ErrorModel,
    Level,
    error_model,
    linear_ce_bounds,
    range_dtypes,
    unit_roundoff,
    upstream_overflow,
)
from numcheck.reference.linear_ce import LinearCEResult

#: How the element-wise bounds of one error model are evaluated on the problem at hand (the default is
#: :func:`properties.linear_ce.tolerance.linear_ce_bounds`; the production-shape tier passes a cached, timed one).
BoundsFn = Callable[[ErrorModel], dict[str, torch.Tensor]]
#: Eager's RMSE against the oracle and its dtype, per output (what judgement (b) divides by).
EagerErrors = dict[str, tuple[float, torch.dtype]]

#: Inductor's multipliers (``torch._dynamo.utils.same``): the floor of the ratio half's k, per result dtype.
RELATIVE_K = {torch.float32: 2.0, torch.float64: 2.0, torch.bfloat16: 3.0, torch.float16: 3.0}
#: The false-alarm rate of judgement (b) per judged output: the probability, under the model of the module
#: docstring, that a correct impl fails it. A case judges at most five outputs, so at most 5·α per case.
RELATIVE_ALPHA = 1e-6


def effective_count(bound: torch.Tensor) -> float:
    """n_eff of an output: the participation ratio (Σb²)²/Σb⁴ of its element-wise bound ``bound``.

    It is the number of elements that carry the error: n for a flat bound, 1 when one element dominates.
    (Satterthwaite's degrees of freedom of Σ b_i²·χ²₁, the sum of squared errors whose scales are the bounds.)
    An all-zero bound gives 1; infinite elements, where there are any, are the ones counted."""
    b = bound.detach().to(torch.float64).nan_to_num(0.0, posinf=math.inf).abs().flatten()
    if bool(torch.isinf(b).any()):
        return float(torch.isinf(b).sum())
    top = float(b.max()) if b.numel() else 0.0
    if top == 0.0:
        return 1.0
    b2 = (b / top).square()
    return float(b2.sum().square() / b2.square().sum())


@functools.lru_cache(maxsize=4096)
def ratio_multiplier(n_eff: float, dtype: torch.dtype, alpha: float = RELATIVE_ALPHA) -> float:
    """k of the ratio half: √F⁻¹(1 − α; n_eff, n_eff), and never below Inductor's k for ``dtype``.

    If impl and eager err alike (independent errors of one distribution, element scales as the bound's),
    RMSE²(impl)/RMSE²(eager) is F(n_eff, n_eff)-distributed, so the ratio exceeds k² with probability α."""
    if not n_eff >= 1.0:
        raise ValueError(f"ratio_multiplier: n_eff must be ≥ 1, got {n_eff!r}")
    return max(RELATIVE_K.get(dtype, 3.0), math.sqrt(float(stats.f.isf(alpha, n_eff, n_eff))))


@functools.lru_cache(maxsize=16)
def rms_lambda(alpha: float = RELATIVE_ALPHA) -> float:
    """λ of the order half: the root above 1 of λ·exp(−(λ² − 1)/2) = α (5.67 at α = 1e-6).

    Each element's error is sub-Gaussian with scale its expected-level bound E_i (Higham & Mary 2019: a sum
    of independent mean-zero roundings; their λ = √(2 ln(2/α)) = 5.39 holds for one element). For the RMS over
    elements, however dependent, Jensen over the weights E_i²/ΣE² and Chernoff's bound give
    P(RMS(e) > λ·RMS(E)) ≤ λ·exp(−(λ² − 1)/2)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"rms_lambda: alpha must be in (0, 1), got {alpha!r}")
    return float(optimize.brentq(lambda lam: math.log(lam) - (lam * lam - 1) / 2 - math.log(alpha), 1.0 + 1e-12, 100.0))


@dataclass(frozen=True)
class RelativeJudgement:
    """Judgement (b) for one output: ``allowed`` = ``multiplier``·``rmse_eager`` + ``slack``.

    ``n_eff`` is the effective element count (:func:`effective_count`) that sets ``multiplier`` at
    false-alarm rate ``alpha``; ``slack`` = ``lam``·``rms_expected``, the expected-level bound's RMS (at the
    finer of the impl's and eager's output precision) scaled for the same rate."""

    output: str
    ok: bool
    judged: bool
    rmse_impl: float
    rmse_eager: float
    allowed: float
    note: str = ""
    n_eff: float = math.nan
    multiplier: float = math.nan
    alpha: float = RELATIVE_ALPHA
    rms_expected: float = math.nan
    lam: float = math.nan
    #: What ``rmse_eager`` was measured on: ``"eager"``, or numcheck's evaluation of the path the impl declares
    #: (:mod:`numcheck.properties.linear_ce.declared_path`) for an output declared coarser than eager keeps it.
    yardstick: str = "eager"

    @property
    def slack(self) -> float:
        """The order half of the allowance, λ·RMS(expected-level bound)."""
        return self.lam * self.rms_expected

    def describe(self) -> str:
        """One line: both RMSEs, the allowance and its two halves with n_eff, k, α and λ."""
        who = "eager" if self.yardstick == "eager" else "yardstick"
        return (
            f"{self.output}: RMSE {self.rmse_impl:.3g} vs {self.yardstick} RMSE {self.rmse_eager:.3g}; allowed "
            f"{self.allowed:.3g} = k·{who} {self.multiplier * self.rmse_eager:.3g} (k {self.multiplier:.3g} "
            f"at n_eff {self.n_eff:.3g}, α {self.alpha:.0e}) + slack {self.slack:.3g} (λ {self.lam:.3g} × "
            f"RMS of the expected-level bound {self.rms_expected:.3g}){' — ' + self.note if self.note else ''}"
        )


@dataclass
class AccuracyResult:
    """Both judgements for every output of one impl on one problem."""

    problem: Problem
    analytic: dict[str, Comparison] = field(default_factory=dict)
    expected: dict[str, Comparison] = field(default_factory=dict)
    relative: dict[str, RelativeJudgement] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.analytic.values()) and all(r.ok for r in self.relative.values())

    @property
    def worst_ratio(self) -> float:
        vals = [c.ratio for c in self.analytic.values()]
        return max(vals) if vals else 0.0

    def failure_lines(self) -> list[str]:
        lines = [f"(a) analytic bound: {c.describe()}" for c in self.analytic.values() if not c.ok]
        lines += [
            f"(b) relative to {'eager' if r.yardstick == 'eager' else 'the declared path'}: {r.describe()}"
            for r in self.relative.values()
            if not r.ok
        ]
        return lines


def _out_dtypes(out: ImplOutputs) -> dict[str, torch.dtype]:
    return {k: v.dtype for k in OUTPUTS if isinstance(v := out.get(k), torch.Tensor)}


@functools.lru_cache(maxsize=64)
def _eager_errors(p: Problem) -> EagerErrors:
    """RMSE of eager (judgement (b)'s yardstick) against the oracle per output, with its output dtype (cached)."""
    t = build(p)
    return eager_errors(p, t, run_oracle(p, t, all_ignored="nan"))


def eager_errors(p: Problem, t: Tensors, ref: LinearCEResult) -> EagerErrors:
    """Run eager (:func:`numcheck.properties.linear_ce.harness.eager_yardstick`) on ``t`` and return its RMSE against
    the oracle ``ref`` per output, with eager's output dtype: judgement (b)'s yardstick for tensors that are not
    ``build(p)``'s."""
    out = run_impl(eager_yardstick(), p, t)
    res = {}
    for name, o in _oracle_outputs(ref).items():
        v = out.get(name)
        if v is None or o is None:
            continue
        res[name] = (_rms(v.to(torch.float64) - o), v.dtype)
    return res


def _oracle_outputs(ref) -> dict[str, torch.Tensor | None]:
    return {
        "loss": ref.loss,
        "z_loss": ref.z_loss,
        "grad_x": ref.grad_x,
        "grad_weight": ref.grad_weight,
        "grad_bias": ref.grad_bias,
    }


#: The outputs whose least precise dtype an impl declares (``LinearCESupport.loss_dtype``).
LOSS_OUTPUTS = ("loss", "z_loss")


def declared_loss_dtype(support: Any, p: Problem) -> torch.dtype:
    """The least precise dtype ``support`` lets the loss and z-loss of ``p`` come back in: the compute dtype under
    ``loss_dtype="compute"``, else the parameters' dtype (fp32 under autocast)."""
    return p.compute_dtype if getattr(support, "loss_dtype", "input") == "compute" else p.param_dtype


def _finer(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The more precise of two output dtypes (the smaller unit roundoff)."""
    return a if unit_roundoff(a) <= unit_roundoff(b) else b


def _rms(v: torch.Tensor) -> float:
    return float(v.to(torch.float64).nan_to_num(0.0).square().mean().sqrt())


def _not_judged_reason(impl: Any, p: Problem, n: str) -> str:
    """Why (b) records output ``n`` without judging it ("" when it judges it)."""
    if getattr(impl.support, "target_logit", "logits") == "rounded_products" and n == "loss":
        return "not judged: declares target_logit='rounded_products'"
    return ""


def declared_coarser(impl: Any, p: Problem, n: str) -> bool:
    """Whether the impl declares output ``n`` of ``p`` coarser than eager keeps it: grad_weight and grad_bias under
    a ``per_chunk_rounding`` or ``param_dtype`` accumulation, grad_x under such a ``grad_x_accumulation``, every
    gradient under a loss-scale upstream (formed before the scale is known, η·(1+|u|) in the bound). Its
    yardstick is then numcheck's evaluation of the declared path (:mod:`numcheck.properties.linear_ce.declared_path`),
    not eager."""
    s = impl.support
    if n in ("grad_weight", "grad_bias") and s.grad_accumulation != "fp32":
        return True
    if n == "grad_x" and getattr(s, "grad_x_accumulation", "fp32") != "fp32":
        return True
    return p.upstream == "loss_scale" and n.startswith("grad_")


@functools.lru_cache(maxsize=64)
def _cached_path_errors(path: Any, p: Problem) -> EagerErrors:
    """:func:`~numcheck.properties.linear_ce.declared_path.path_errors` on ``build(p)`` (cached)."""
    from numcheck.properties.linear_ce.declared_path import path_errors

    t = build(p)
    return path_errors(path, p, t, run_oracle(p, t, all_ignored="nan"))


def relative_judgement(
    output: str,
    value: torch.Tensor,
    oracle: torch.Tensor,
    yard: tuple[float, torch.dtype],
    expected: torch.Tensor,
    *,
    note: str = "",
    yardstick: str = "eager",
) -> RelativeJudgement:
    """Judgement (b) of one output (module docstring): ``value`` against ``oracle``, the yardstick's RMSE and dtype
    ``yard``, ``expected`` the expected-level bound (the slack's E and n_eff's weights). ``note``: recorded, not
    judged (with why)."""
    diff = value.to(device=oracle.device, dtype=torch.float64) - oracle
    # An element the impl returns non-finite where the exact value is finite is (a)'s to judge: a correct overflow
    # (the value reaches its format's overflow threshold, or an intermediate legitimately overflows: e.g. fp16
    # gradients under a large loss scale, which GradScaler then skips) passes it, anything else fails it there.
    # (b) measures the finite rest: an accepted ±inf would otherwise make the RMSE infinite.
    unjudged = torch.isfinite(oracle) & ~torch.isfinite(diff)
    kept = diff[~unjudged]
    rmse = _rms(kept) if kept.numel() else 0.0
    n_eff = effective_count(expected)
    k = ratio_multiplier(n_eff, value.dtype, RELATIVE_ALPHA)
    rms_e = _rms(expected)
    lam = rms_lambda(RELATIVE_ALPHA)
    allowed = k * yard[0] + lam * rms_e
    ok = (rmse <= allowed) or bool(note) or math.isnan(rmse) and math.isnan(yard[0])
    return RelativeJudgement(
        output,
        ok,
        not note,
        rmse,
        yard[0],
        allowed,
        note,
        n_eff=n_eff,
        multiplier=k,
        alpha=RELATIVE_ALPHA,
        rms_expected=rms_e,
        lam=lam,
        yardstick=yardstick,
    )


def _judge_relative(
    impl: Any,
    p: Problem,
    t: Tensors,
    ref: Any,
    out: ImplOutputs,
    names: list[str],
    eager_err: EagerErrors | None = None,
    bounds: BoundsFn | None = None,
) -> dict[str, RelativeJudgement]:
    """Judgement (b) of every output in ``names`` (see the module docstring); ``eager_err`` and ``bounds`` as in
    :func:`check_accuracy`. An output the impl declares coarser (:func:`declared_coarser`) is measured against
    numcheck's evaluation of the declared path instead of eager."""
    from numcheck.properties.linear_ce.declared_path import path_errors, single_device_path

    shared = eager_err is not None
    eager_err = eager_err if eager_err is not None else _eager_errors(p)
    bounds = bounds if bounds is not None else functools.partial(linear_ce_bounds, p, t, ref)
    refs = _oracle_outputs(ref)
    dtypes = _out_dtypes(out)
    yard, names_of = dict(eager_err), {n: "eager" for n in eager_err}
    coarser = [n for n in names if declared_coarser(impl, p, n)]
    if coarser:
        path = single_device_path(impl.support, p)
        got = path_errors(path, p, t, ref) if shared else _cached_path_errors(path, p)
        yard.update({n: got[n] for n in coarser if n in got})
        names_of.update({n: path.describe() for n in coarser if n in got})
    # The order half models an impl as precise as its yardstick but evaluated in another order: each output's last
    # rounding at the finer of the impl's and the yardstick's dtypes, so a coarser returned dtype is not allowed
    # for. The loss and z-loss are the exception: their returned dtype is a declaration (``loss_dtype``, enforced
    # by its own property), so one that comes back in it is judged at that rounding, as (a) does. Eager keeps the
    # z-loss in fp32 whatever the parameters (its lse is taken in fp32), an artifact of eager, not a yardstick:
    # per-row z-losses handed back in bf16 parameters' own dtype are what ``loss_dtype="input"`` allows.
    declared = declared_loss_dtype(impl.support, p)
    slack_dtypes = {
        n: d
        if n in LOSS_OUTPUTS and unit_roundoff(d) <= unit_roundoff(declared)
        else _finer(d, yard[n][1])
        if n in yard
        else d
        for n, d in dtypes.items()
    }
    expected = bounds(error_model(impl.support, p, slack_dtypes, "expected"))
    res = {}
    for n in names:
        v = out.get(n)
        if v is None or n not in yard:
            continue
        res[n] = relative_judgement(
            n, v, refs[n], yard[n], expected[n], note=_not_judged_reason(impl, p, n), yardstick=names_of[n]
        )
    return res


def check_accuracy(
    impl: Any,
    p: Problem,
    *,
    levels: tuple[Level, ...] = ("hard",),
    relative: bool = True,
    t: Tensors | None = None,
    layout: str = "contiguous",
    frozen: frozenset[str] = frozenset(),
    leaves: dict[str, torch.Tensor] | None = None,
    out: ImplOutputs | None = None,
    oracle: LinearCEResult | None = None,
    eager_err: EagerErrors | None = None,
    bounds: BoundsFn | None = None,
) -> AccuracyResult:
    """Run ``impl`` (its inputs laid out as ``layout``, see :func:`properties.core.tensors.strided_copy`; the inputs
    in ``frozen`` without gradients; the caller's ``leaves``, see :func:`properties.linear_ce.harness.run_impl`) and the
    oracle on ``p`` and judge every output (see the module docstring); the gradients of frozen inputs are not
    judged.

    For tensors ``t`` that are not ``build(p)``'s, or to share work between impls on one problem (the
    production-shape tier, :mod:`properties.production.tier`): ``out`` is the impl's outputs already run on ``t``;
    ``oracle`` the oracle on ``t`` (one with live rows: the all-ignored convention then does not matter);
    ``eager_err`` eager's errors on ``t`` (:func:`eager_errors`); ``bounds`` evaluates an error model's bounds on
    ``t`` (default :func:`properties.linear_ce.tolerance.linear_ce_bounds`)."""
    t = t if t is not None else build(p)
    out = out if out is not None else run_impl(impl, p, t, layout=layout, frozen=frozen, leaves=leaves)
    conv = impl.support.all_ignored or "nan"
    if oracle is not None and p.all_ignored:
        raise ValueError(
            "check_accuracy: a shared oracle needs a problem with live rows (all rows are ignored, so "
            "the impl's all-ignored convention decides the oracle)"
        )
    ref = oracle if oracle is not None else run_oracle(p, t, all_ignored=conv)
    bounds = bounds if bounds is not None else functools.partial(linear_ce_bounds, p, t, ref)
    refs = _oracle_outputs(ref)
    res = AccuracyResult(problem=p)
    dtypes = _out_dtypes(out)
    skip = {FROZEN_GRADS[k] for k in frozen}
    names = [
        n for n in OUTPUTS if refs.get(n) is not None and (n != "z_loss" or out.z_loss is not None) and n not in skip
    ]
    ranges = range_dtypes(p, dtypes)  # ±inf judged against the format each output was held in
    up_overflow = upstream_overflow(p, t)
    for level in dict.fromkeys(("hard",) + tuple(levels)):
        b = bounds(error_model(impl.support, p, dtypes, level))
        target = res.analytic if level == "hard" else res.expected
        for n in names:
            target[n] = compare(
                n,
                out.get(n),
                refs[n],
                b[n],
                range_dtype=ranges.get(n),
                overflow_upstream=up_overflow if n.startswith("grad_") else "",
            )
    if relative and not (p.all_ignored and p.reduction == "mean"):
        res.relative = _judge_relative(impl, p, t, ref, out, names, eager_err, bounds)
    return res
