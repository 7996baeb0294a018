"""Accuracy of every output against the float64 oracle, under two judgements.

(a) *Analytic*: every element within the bound of :mod:`properties.linear_ce.tolerance` (the hard ceiling gates; the
    expected level is recorded for reports).
(b) *Relative to eager*: RMSE(impl − oracle) ≤ k(n_eff)·RMSE(eager − oracle) + λ(α)·RMS(E), eager being the
    ``eager`` built-in on the same problem, E the expected-level bound (√n·u per reduction) of
    :mod:`properties.linear_ce.tolerance` for the impl's declaration with each output's last rounding at the finer of the
    impl's and eager's dtypes (the loss and z-loss at the returned one where the impl declares it: ``loss_dtype``).
    A correct impl fails it with probability at most α = :data:`~numcheck.properties.core.relative.RELATIVE_ALPHA`
    per output, whether it errs as eager does (the ratio half, k(n_eff)) or evaluates in another order (the order
    half, λ(α)): the derivation, shared by every family's judgement (b), is :mod:`numcheck.properties.core.relative`.

    The last rounding at the finer dtype is what makes (b) see a gradient handed back coarser than eager keeps it; (a)
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
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from numcheck.properties.core.compare import Comparison, compare
from numcheck.properties.core.relative import RelativeJudgement, relative_judgement, yardstick_error
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
        res[name] = yardstick_error(v, o)
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
