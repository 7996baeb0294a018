"""The property suite in-process, without pytest: :func:`check` (exported as :func:`numcheck.check`) and the
:class:`CheckResult` it returns.

Each drawn test of the impl's family's suite (its table in :data:`numcheck.properties.suites.SUITES`: linear+CE,
quantized linear, grouped quantized linear) runs through the same runner
as the pytest suite (:mod:`numcheck.properties.core.runner`: the impl's example budget, the skips, the known divergences' rejection),
under one of numcheck's hypothesis profiles, so its verdict is the suite's verdict on the same draws;
``pinned_cases`` runs every pinned case of its family the impl declares (linear+CE has them). (The FP8 suites'
fixed-case tests run under pytest only.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from hypothesis import given, settings, target
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from numcheck.errors import PropertyFailure, grouped
from numcheck.impls import interpreter
from numcheck.impls.registry import BrokenImpl, discover
from numcheck.properties.core import profiles
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.draw_isolation import isolated_draws
from numcheck.properties.core.family import SuiteFamily
from numcheck.properties.core.runner import (
    SuiteProperty,
    budget,
    judge,
    run_example,
    run_rows,
    skip_reason,
    target_scores,
    unsatisfiable_reason,
)
from numcheck.properties.suites import SUITES

#: The verdict name of the pinned cases (the suite's ``test_pinned_cases``).
PINNED_CASES = "pinned_cases"


def property_names(kind: str) -> tuple[str, ...]:
    """Every property :func:`check` knows for an impl of ``kind``, in the suite's order (``pinned_cases`` last, for
    a family with pinned cases), read from :data:`numcheck.properties.suites.SUITES` when asked (a family registered
    after this module was imported counts)."""
    family = SUITES[kind]
    return (*family.table, *((PINNED_CASES,) if family.pinned else ()))


Status = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True)
class Verdict:
    """One property's outcome for one impl.

    ``status``: ``passed``, ``failed`` or ``skipped``. ``examples``: how many cases were judged (the impl returned
    and the property judged what it returned; a case the impl raised on, or one the property could not judge, is
    not counted; a failing judgement is). ``worst_ratio``: for a passed property the largest error/bound any
    judged case reached, for a failed one the failing judgement's own (``None`` where it has none: a bitwise
    property, an impl that raised); ``worst_case`` the case it was reached on (for a failure: the failing case).
    ``impl_raised``: the failure is the impl raising, not a judgement. ``message``: the failure message (as the
    suite prints it, repro line included) or the reason for the skip."""

    property: str
    status: Status
    examples: int = 0
    worst_ratio: float | None = None
    worst_case: Any = None
    message: str = ""
    impl_raised: bool = False

    def __str__(self) -> str:
        judged = f"{self.examples} case{'' if self.examples == 1 else 's'} judged"
        if self.status == "failed" and self.impl_raised:
            summary = f"the impl raised; {judged}"
        elif self.status == "failed":
            own = "" if self.worst_ratio is None else f", the failing case's error/bound {self.worst_ratio:.3g}"
            summary = f"{judged}{own}"
        else:
            summary = judged + ("" if self.worst_ratio is None else f", worst error/bound {self.worst_ratio:.3g}")
        head = f"{self.property}: {self.status}" + ("" if self.status == "skipped" else f" ({summary})")
        return f"{head}\n  {self.message}" if self.message and self.status != "passed" else head


@dataclass(frozen=True)
class CheckResult:
    """What :func:`check` found: one :class:`Verdict` per property, by name. ``ok`` when none failed."""

    impl: str
    profile: str
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether no property failed (skipped ones do not count against the impl)."""
        return not self.failed

    @property
    def failed(self) -> list[Verdict]:
        """The failed verdicts."""
        return [v for v in self.verdicts.values() if v.status == "failed"]

    def __str__(self) -> str:
        lines = [
            f"numcheck.check({self.impl!r}, profile={self.profile!r}): "
            f"{'ok' if self.ok else f'{len(self.failed)} failed'}"
        ]
        return "\n".join([*lines, *(f"  {v}" for v in self.verdicts.values())])


class _Worst:
    """The running count and worst error/bound of one property's judged cases."""

    def __init__(self) -> None:
        self.examples = 0
        self.ratio: float | None = None
        self.case: Any = None

    def add(self, p: Any, metrics: dict[str, float]) -> None:
        """Count one judged case and keep it if its error/bound (the largest of its ``error/bound`` metrics) is
        the worst so far."""
        self.examples += 1
        ratios = [float(v) for k, v in metrics.items() if "error/bound" in k and not math.isnan(v)]
        if ratios and (self.ratio is None or max(ratios) > self.ratio):
            self.ratio, self.case = max(ratios), p


def _verdict(name: str, worst: _Worst, status: Status, message: str = "") -> Verdict:
    """A verdict carrying ``worst``'s count and worst case."""
    return Verdict(name, status, worst.examples, worst.ratio, worst.case, message)


def _failure(name: str, impl: Any, worst: _Worst, exc: BaseException) -> Verdict:
    """The failed verdict for ``exc``: the property's message (of each failure hypothesis found, for a group of
    distinct ones), or what the impl raised. The failing case counts as judged unless the impl raised on it; the
    verdict carries the failure's own error/bound and case, not the passing cases' worst."""
    parts = grouped(exc)
    failures = [e for e in parts if isinstance(e, PropertyFailure)]
    if not failures:
        return Verdict(
            name,
            "failed",
            worst.examples,
            None,
            None,
            f"impl {impl.name!r} raised {type(exc).__name__}: {exc}",
            impl_raised=True,
        )
    first = failures[0]
    message = (
        "\n\n".join(str(e) for e in failures)
        if len(failures) == len(parts)
        else "\n\n".join(
            [*(str(e) for e in failures), *(f"{type(e).__name__}: {e}" for e in parts if e not in failures)]
        )
    )
    judged_failures = sum(not e.raised for e in failures)
    return Verdict(
        name, "failed", worst.examples + judged_failures, first.ratio, first.case, message, impl_raised=first.raised
    )


def _run_drawn(prop: SuiteProperty, impl: Any, base: settings) -> Verdict:
    """``prop`` on ``impl`` under ``base``'s settings (and the impl's budget), through the suite's runner."""
    why = skip_reason(prop, impl)
    worst = _Worst()
    if why:
        return _verdict(prop.name, worst, "skipped", why)

    @settings(base, max_examples=budget(impl, base.max_examples, prop))
    @given(data=st.data())
    def run(data: Any) -> None:
        results = run_example(prop, impl, data)
        for p, metrics in results:
            worst.add(p, metrics)
        for label, value in target_scores(results).items():
            target(value, label=label)

    # One example-database key and derandomized seed per (property, impl): every property runs this same
    # function, so without it they would share draws and replay each other's saved failures. The mechanism is
    # the one hypothesis' pytest plugin uses for parametrized tests.
    run.hypothesis.inner_test._hypothesis_internal_add_digest = f"numcheck.check|{prop.name}|{impl.name}".encode()
    try:
        with isolated_draws():  # the plugin's draws do not depend on the loaded modules either
            for p, metrics in run_rows(prop, impl).results:  # the covering rows first, as the pytest suite runs them
                worst.add(p, metrics)
            run()
    except Unsatisfiable:
        return _verdict(prop.name, worst, "skipped", unsatisfiable_reason(impl))
    except Exception as exc:  # noqa: BLE001 - a failing property or a raising impl is the verdict
        return _failure(prop.name, impl, worst, exc)
    return _verdict(prop.name, worst, "passed")


def _run_pinned(family: SuiteFamily, impl: Any) -> Verdict:
    """Every pinned case of ``family`` ``impl`` declares, under its pinned property (linear+CE's accuracy: the suite's
    ``test_pinned_cases``)."""
    worst = _Worst()
    for case in family.pinned.values():
        p = case.replace(device=DEVICE)
        if family.pinned_refusal(impl, p):
            continue
        try:
            worst.add(p, judge(family.pinned_property, impl, p))
        except Exception as exc:  # noqa: BLE001 - as in _run_drawn
            return _failure(PINNED_CASES, impl, worst, exc)
    if not worst.examples:
        return _verdict(PINNED_CASES, worst, "skipped", f"{impl.name} declares no pinned case")
    return _verdict(PINNED_CASES, worst, "passed")


def _load(impl: Any) -> Any:
    """``impl`` itself, or the one impl a spec string (built-in name or ``module:attr``) names."""
    if not isinstance(impl, str):
        return impl
    entries = discover([impl])
    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    if broken:
        raise ValueError(f"numcheck.check: impl {impl!r} could not be loaded: {broken[0].error}")
    if len(entries) != 1:
        raise ValueError(
            f"numcheck.check: impl spec {impl!r} yields {len(entries)} impls "
            f"({[e.name for e in entries]}); pass one of them"
        )
    return entries[0].impl


def _selected(properties: Iterable[str] | str | None, kind: str) -> list[str]:
    """The property names to run for an impl of ``kind``; ValueError naming unknown ones."""
    known_names = property_names(kind)
    if properties is None:
        return list(known_names)
    names = [properties] if isinstance(properties, str) else list(properties)
    unknown = [n for n in names if n not in known_names]
    if unknown:
        raise ValueError(f"numcheck.check: unknown properties {unknown} for a {kind} impl; known: {list(known_names)}")
    return names


def check(
    impl: Any,
    properties: Iterable[str] | str | None = None,
    *,
    profile: str = profiles.DEFAULT_PROFILE,
    max_examples: int | None = None,
) -> CheckResult:
    """Run the property suite on ``impl`` in this process, without pytest, and return the verdicts.

    ``impl``: a linear+CE impl (e.g. made with :func:`numcheck.linear_ce_impl`) or a quantized-linear one, or its
    spec, a built-in name or ``package.module:attr``. ``properties``: names from :func:`property_names` for its
    kind (the suite's drawn tests without ``test_``, e.g. ``"accuracy"``, ``"frozen_inputs[x]"``,
    ``"pinned_cases"``; ``"accuracy_against_both_references"`` for quantized linear); ``None`` runs them all.
    ``profile``: one of numcheck's hypothesis profiles (``numcheck-ci``, ``numcheck-dev``, ... or ``ci``,
    ``dev``, ...); ``max_examples`` overrides its example count (slow impls still get a quarter, at least 2).
    Failures do not raise: each is a ``failed`` verdict carrying the suite's message and repro line; use
    ``assert result.ok, result`` in a test. Where there is no CUDA, Triton kernels are set to run under
    Triton's interpreter first (``TRITON_INTERPRET=1``, unless already set).

    >>> import numcheck
    >>> result = numcheck.check("eager", ["determinism"], max_examples=2)
    >>> result.ok, result.verdicts["determinism"].status
    (True, 'passed')
    """
    interpreter.arrange()
    loaded = _load(impl)
    kind = getattr(loaded, "kind", None)
    if kind not in SUITES:
        raise ValueError(
            f"numcheck.check: {getattr(loaded, 'name', loaded)!r} is not an impl (kind {kind!r}); "
            f"make one with numcheck.linear_ce_impl or the quantized-linear protocol"
        )
    name = profiles.numcheck_name(profile)
    names = _selected(properties, kind)
    base = settings.get_profile(name)
    if max_examples is not None:
        base = settings(base, max_examples=max_examples)
    reason = loaded.support.unavailable_reason()
    verdicts: dict[str, Verdict] = {}
    for n in names:
        if reason:
            verdicts[n] = Verdict(n, "skipped", message=f"impl {loaded.name!r} unavailable here: {reason}")
        elif n == PINNED_CASES:
            verdicts[n] = _run_pinned(SUITES[kind], loaded)
        else:
            verdicts[n] = _run_drawn(SUITES[kind].table[n], loaded, base)
    return CheckResult(loaded.name, name, verdicts)
