"""The linear+preference properties (:data:`PROPERTIES`), each ``fn(impl, case)`` raising
:class:`~numcheck.errors.PropertyFailure` with the impl, the case, the output, error, bound, worst element and a
repro command:

* ``accuracy``: the loss and every gradient within the bound of :mod:`~properties.linear_preference.tolerance`
  (judgement (a)), and judgement (b), RMSE against eager in the same dtype
  (:mod:`numcheck.properties.core.relative`; the yardstick is :mod:`reference.numerics.linear_preference` run on
  the same tensors; an output the impl declares coarser than eager keeps it, grad_weight and grad_bias under a
  ``grad_weight_accumulation`` other than ``fp32``, is recorded, not judged, by (b));
* ``ignored_positions``: the inputs at ignored positions changed (x there redrawn): the loss and the weight and bias
  gradients bitwise the same, grad_x the same at kept positions and exactly 0 at ignored ones;
* ``chunk_invariance``: (impls declaring ``chunking``) accurate with one pair per chunk and with all pairs in one;
* ``pair_permutation``: the pairs permuted (chosen and rejected together, with their reference log-probabilities):
  the loss and grad_weight within the two runs' bounds of each other, grad_x permuted likewise;
* ``options_honoured``: β and one other declared option (γ, ε, α, κ, the per-sequence mean; the case's seed picks
  it) changed in turn: the impl follows
  the oracle with the new value, and a loss bitwise unchanged by the change (an option a wrapper dropped) is named
  as such in the failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from numcheck.properties.core import records
from numcheck.properties.core.compare import Comparison, compare
from numcheck.properties.core.failures import fail
from numcheck.properties.core.relative import relative_judgement, yardstick_error
from numcheck.properties.linear_preference.cases import PreferenceCase, PreferenceTensors, build
from numcheck.properties.linear_preference.tolerance import preference_bounds
from numcheck.reference.linear_preference import PreferenceReference, linear_preference, pair_rows
from numcheck.reference.numerics.linear_preference import chunk_loss

OUTPUTS: tuple[str, ...] = ("loss", "grad_x", "grad_weight", "grad_bias")


@dataclass(frozen=True)
class Outputs:
    """One forward + backward of an impl (detached), or of the eager yardstick."""

    loss: torch.Tensor
    grad_x: torch.Tensor | None
    grad_weight: torch.Tensor | None
    grad_bias: torch.Tensor | None

    def get(self, name: str) -> torch.Tensor | None:
        return getattr(self, name)


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone().requires_grad_(True)


def run(impl: Any, case: PreferenceCase, t: PreferenceTensors) -> Outputs:
    """The impl's loss and gradients on ``t`` (upstream gradient 1)."""
    x, w, b = _leaf(t.x), _leaf(t.weight), _leaf(t.bias)
    loss = impl(x, w, t.target, b, ref_logps=t.ref_logps, params=case.params)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        fail(
            impl,
            "protocol",
            case,
            f"the call returned {type(loss).__name__} {getattr(loss, 'shape', '')}, not a scalar loss",
        )
    if loss.requires_grad:
        loss.reshape(()).backward()
    return Outputs(loss.detach().reshape(()), x.grad, w.grad, b.grad if b is not None else None)


def yardstick(case: PreferenceCase, conv: Any, t: PreferenceTensors) -> Outputs:
    """Eager in the case's dtype (:mod:`reference.numerics.linear_preference`): judgement (b)'s yardstick."""
    from numcheck.reference.linear_preference import denominators

    x, w, b = _leaf(t.x), _leaf(t.weight), _leaf(t.bias)
    ci, ri = pair_rows(conv.layout, x.shape[0])
    part = lambda rows: (x[rows], t.target[rows], None if t.ref_logps is None else t.ref_logps[rows])  # noqa: E731
    dens = denominators(conv, len(ci), float((t.target[ci] != case.params.ignore_index).sum()))
    loss = chunk_loss(part(ci), part(ri), w, b, conv, case.params, dens)
    loss.backward()
    return Outputs(loss.detach(), x.grad, w.grad, b.grad if b is not None else None)


def oracle(impl: Any, case: PreferenceCase, t: PreferenceTensors) -> PreferenceReference:
    """The float64 oracle of ``t`` under the impl's declared conventions."""
    return linear_preference(t.x, t.weight, t.target, t.bias, t.ref_logps, impl.support.conventions, case.params)


def judged(impl: Any, case: PreferenceCase, t: PreferenceTensors, got: Outputs) -> tuple[PreferenceReference, list]:
    """``(oracle, comparisons)``: each output against the oracle under the hard bound (judgement (a))."""
    o = oracle(impl, case, t)
    bounds = preference_bounds(case, impl.support.conventions, impl.support.grad_weight_accumulation, t, o, "hard")
    out = []
    for name in OUTPUTS:
        exp = o.loss if name == "loss" else getattr(o, name)
        if exp is not None:
            out.append(compare(name, got.get(name), exp.to(torch.float64), bounds[name]))
    return o, out


def _where(c: Comparison) -> str:
    """Which pair, completion and position an index of grad_x names (the other outputs' index is enough)."""
    if c.output != "grad_x" or not c.worst:
        return ""
    return f"  (row {c.worst[0]}, position {c.worst[1]}, feature {c.worst[2]})"


def relative_judgements(
    impl: Any, case: PreferenceCase, t: PreferenceTensors, got: Outputs, o: PreferenceReference
) -> list:
    """Judgement (b) for each output: against eager in the same dtype, slack at the expected-level bound."""
    conv = impl.support.conventions
    eager = yardstick(case, conv, t)
    expected = preference_bounds(case, conv, impl.support.grad_weight_accumulation, t, o, "expected")
    coarser = impl.support.grad_weight_accumulation != "fp32"
    out = []
    for name in OUTPUTS:
        exp, value = (o.loss if name == "loss" else getattr(o, name)), got.get(name)
        if exp is None or value is None or value.shape != exp.shape:
            continue
        note = (
            "declared coarser than eager (grad_weight_accumulation)"
            if coarser and name != "grad_x" and name != "loss"
            else ""
        )
        yard = yardstick_error(eager.get(name), exp.double())
        out.append(relative_judgement(name, value, exp.double(), yard, expected[name], note=note))
    return out


def accuracy(impl: Any, case: PreferenceCase) -> dict[str, float]:
    """Every output within its bound of the float64 oracle (a), and no further from it than eager allows (b). Each
    judgement is recorded for the seed sweep (:mod:`numcheck.properties.core.records`), a failing one before the
    failure is raised."""
    t = build(case, impl.support.conventions)
    got = run(impl, case, t)
    o, comps = judged(impl, case, t, got)
    bad = [c for c in comps if not c.ok]
    rel = [] if bad else relative_judgements(impl, case, t, got, o)
    records.note_judgements(
        impl.name, "accuracy", case.dtype, repr(case), {c.output: c for c in comps}, {j.output: j for j in rel}
    )
    if bad:
        fail(impl, "accuracy", case, *(c.describe() + _where(c) for c in bad), ratio=max(c.ratio for c in bad))
    rel_bad = [j for j in rel if not j.ok]
    if rel_bad:
        fail(
            impl,
            "accuracy",
            case,
            "judgement (b), relative to eager in the same dtype:",
            *(j.describe() for j in rel_bad),
        )
    return {f"{c.output} error/bound": c.ratio for c in comps}


def ignored_positions(impl: Any, case: PreferenceCase) -> dict[str, float]:
    """x redrawn at the ignored positions changes no output bit (grad_x there exactly 0)."""
    t = build(case, impl.support.conventions)
    ignored = t.target == case.params.ignore_index
    if not bool(ignored.any()):
        return {}
    g = torch.Generator().manual_seed(case.seed + 1)
    fresh = (torch.randn(t.x.shape, generator=g, dtype=torch.float64) * 3).to(t.x.dtype).to(t.x.device)
    t2 = t._replace(x=torch.where(ignored.unsqueeze(-1), fresh, t.x))
    a, b = run(impl, case, t), run(impl, case, t2)
    diffs = [n for n in ("loss", "grad_weight", "grad_bias") if not _same(a.get(n), b.get(n))]
    if a.grad_x is not None and b.grad_x is not None:
        if not torch.equal(a.grad_x[~ignored], b.grad_x[~ignored]):
            diffs.append("grad_x at kept positions")
        if bool((b.grad_x[ignored] != 0).any()):
            diffs.append(
                f"grad_x at ignored positions (max |value| {b.grad_x[ignored].abs().max().item():.3g}, must be 0)"
            )
    if diffs:
        fail(
            impl,
            "ignored_positions",
            case,
            f"changing x at the {int(ignored.sum())} ignored positions changed: {', '.join(diffs)}",
        )
    return {}


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def chunk_invariance(impl: Any, case: PreferenceCase) -> dict[str, float]:
    """Accurate with one pair per chunk and with every pair in one chunk (impls declaring ``chunking``)."""
    if not impl.support.chunking:
        return {}
    out: dict[str, float] = {}
    for size in sorted({1, case.P}):
        for k, v in accuracy(impl, case.replace(chunk_pairs=size)).items():
            out[k] = max(out.get(k, 0.0), v)
    return out


def pair_permutation(impl: Any, case: PreferenceCase) -> dict[str, float]:
    """The pairs permuted: the loss and the weight and bias gradients within both runs' bounds of each other,
    grad_x permuted the same way."""
    conv = impl.support.conventions
    t = build(case, conv)
    ci, ri = pair_rows(conv.layout, t.x.shape[0])
    perm = torch.roll(torch.arange(case.P), 1).flip(0)
    rows = torch.arange(t.x.shape[0])
    rows[ci], rows[ri] = ci[perm], ri[perm]
    take = lambda v: None if v is None else v[rows.to(v.device)]  # noqa: E731
    t2 = PreferenceTensors(take(t.x), t.weight, take(t.target), t.bias, take(t.ref_logps))
    a, b = run(impl, case, t), run(impl, case, t2)
    o = oracle(impl, case, t)
    bounds = preference_bounds(case, conv, impl.support.grad_weight_accumulation, t, o, "hard")
    bad = []
    for name in OUTPUTS:
        va, vb = a.get(name), b.get(name)
        if va is None or vb is None:
            continue
        if name == "grad_x":
            vb = torch.empty_like(vb).index_copy_(0, rows.to(vb.device), vb)
        c = compare(name, vb, va.cpu().double(), 2 * bounds[name])  # float64 on the CPU, as the bounds
        if not c.ok:
            bad.append(c)
    if bad:
        fail(
            impl,
            "pair_permutation",
            case,
            f"pairs permuted by {perm.tolist()}: outputs differ from the unpermuted run's beyond twice the bound",
            *(c.describe() for c in bad),
            ratio=max(c.ratio for c in bad),
        )
    return {}


def _variants(impl: Any, case: PreferenceCase) -> list[tuple[str, PreferenceCase]]:
    """Each declared option of ``case`` set to another value."""
    s = impl.support
    out = [("beta", case.replace(beta=case.beta * 2 if case.beta < 2 else case.beta / 4))]
    if s.margin:
        out.append(("gamma", case.replace(gamma=0.0 if case.gamma else 1.0)))
    if s.label_smoothing:
        out.append(("label_smoothing", case.replace(label_smoothing=0.0 if case.label_smoothing else 0.25)))
    if s.nll:
        out.append(("nll_weight", case.replace(nll_weight=0.0 if case.nll_weight else 1.0)))
    if s.reference_point:
        out.append(("kl", case.replace(kl=0.0 if case.kl else 1.0)))
    if len(s.average_log_prob) > 1:
        out.append(("average_log_prob", case.replace(average_log_prob=not case.average_log_prob)))
    return out


def options_honoured(impl: Any, case: PreferenceCase) -> dict[str, float]:
    """β and one other declared option changed in turn: the impl follows the oracle with the new value; an impl
    whose loss stays bitwise the same when the option changes is named as dropping it."""
    worst = 0.0
    conv = impl.support.conventions
    before = run(impl, case, build(case, conv))
    variants = _variants(impl, case)
    # β and one other declared option per case (the case's seed picks which): every option is met across the draws,
    # at a third of the cost of all of them on each.
    chosen = variants[:1] + variants[1:][case.seed % max(1, len(variants) - 1) :][:1]
    for option, changed in chosen:
        t = build(changed, conv)
        got = run(impl, changed, t)
        _, comps = judged(impl, changed, t, got)
        bad = [c for c in comps if not c.ok]
        if bad:
            old, new = getattr(case, option), getattr(changed, option)
            same = torch.equal(got.loss, before.loss)
            why = f": the loss is bitwise the same as with {option}={old!r}, the option is dropped" if same else ""
            fail(
                impl,
                "options_honoured",
                case,
                f"{option} changed from {old!r} to {new!r}{why}",
                *(c.describe() for c in bad),
                ratio=max(c.ratio for c in bad),
            )
        worst = max(worst, *(c.ratio for c in comps))
    return {"error/bound": worst}


PROPERTIES: dict[str, Callable[[Any, PreferenceCase], Any]] = {
    f.__name__: f for f in (accuracy, ignored_positions, chunk_invariance, pair_permutation, options_honoured)
}
