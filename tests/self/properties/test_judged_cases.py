"""No property passes, and no case is counted, unless the impl returned and was judged: an impl that raises fails
every property it is run on (a strided-input "refusal" included) and none counts a case; a case a property cannot
judge is not counted (a drawn bias whose shift the dtype cannot hold); a failure reports its own error/bound.

The impls are user-style declarations (tests/self/helpers/user_impls.py), run through :func:`numcheck.check`,
the same runner as the pytest suite.
"""

from __future__ import annotations

import re

import pytest

import numcheck
from numcheck.errors import PropertyFailure
from numcheck.properties.core.failures import NOT_JUDGED
from numcheck.properties.core.runner import judge, run_rows
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.suite import LinearCEProperty
from numcheck.tests.self.helpers import user_impls

#: Properties whose early returns (a case they cannot judge) or refusal path an impl that raises once slipped
#: through, and a plain one.
RAISING_PROPERTIES = ("accuracy", "strided_inputs", "shift_invariance", "ignored_rows", "determinism", "pinned_cases")


def test_an_impl_that_raises_passes_nothing_and_counts_nothing():
    """Every property run on an impl that raises on every call fails, as the impl raising (numcheck's message:
    the exception, where it was raised, the case, the repro line), with no case judged."""
    result = numcheck.check(user_impls.always_raises, RAISING_PROPERTIES, max_examples=2)
    for name in RAISING_PROPERTIES:
        v = result.verdicts[name]
        assert v.status == "failed" and v.impl_raised and v.examples == 0, v
        assert v.worst_ratio is None and "the impl raised; 0 cases judged" in str(v), v
        assert f"the impl raised RuntimeError: {user_impls.RAISED}" in v.message, v
        assert re.search(r"raised at .*user_impls\.py:\d+ in always_raises", v.message), v
        assert "reproduce: " in v.message and "case: Problem(" in v.message, v


def test_a_case_counts_once_per_judged_call():
    """shift_invariance judges a case with two calls of the impl: its count of cases is half the calls made (a
    case whose drawn bias the dtype cannot shift exactly is not judged, and is not counted), and every count is
    a judged call's."""
    user_impls.CALLS.clear()
    result = numcheck.check(user_impls.counted, ["shift_invariance", "ignored_rows"], max_examples=3)
    shift, ignored = result.verdicts["shift_invariance"], result.verdicts["ignored_rows"]
    assert shift.status == ignored.status == "passed", result
    # ignored_rows calls the impl twice per judged case as well
    assert 2 * (shift.examples + ignored.examples) == len(user_impls.CALLS), (result, len(user_impls.CALLS))
    assert shift.examples >= 3 and ignored.examples >= 3, result


def test_a_failure_reports_its_own_error_bound():
    """A failed property's verdict carries the failing case's error/bound (above 1) and case, not the worst of the
    cases that passed before it."""
    v = numcheck.check(user_impls.loss_off, ["accuracy"], max_examples=2).verdicts["accuracy"]
    assert v.status == "failed" and not v.impl_raised, v
    shown = re.search(r"error/bound ([0-9.e+]+)", v.message)
    assert shown and v.worst_ratio is not None and v.worst_ratio > 1, v
    assert v.worst_ratio == pytest.approx(
        max(float(x) for x in re.findall(r"error/bound ([0-9.e+]+)", v.message)), rel=1e-2
    ), v
    assert v.worst_case is not None and repr(v.worst_case) in v.message, v
    assert f"the failing case's error/bound {v.worst_ratio:.3g}" in str(v), v


def test_a_case_the_property_cannot_judge_is_rejected_not_counted():
    """A property that returns NOT_JUDGED on every case counts none: its covering rows all come back rejected, and
    a check that judges nothing raises nothing either (it is not a failure)."""
    calls = []

    def never_judges(impl, p):
        calls.append(p)
        return NOT_JUDGED

    prop = LinearCEProperty(
        "accuracy", never_judges, lambda impl, data: Problem(N=2, H=2, V=3), dimensions=("reduction",)
    )
    run = run_rows(prop, user_impls.counted)
    assert not run.results and run.rejected and calls, run
    assert judge(never_judges, user_impls.counted, Problem(N=2, H=2, V=3)) is NOT_JUDGED


def test_an_impl_raising_in_a_judge_is_the_suites_failure():
    """What the impl raises inside a property becomes a PropertyFailure marked ``raised``, with the case."""
    from numcheck.properties.linear_ce import props

    p = Problem(N=4, H=3, V=5, bias=True)
    with pytest.raises(PropertyFailure) as info:
        judge(props.strided_inputs, user_impls.always_raises, p)
    assert info.value.raised and info.value.case == p and info.value.ratio is None
    assert "property 'strided_inputs' fails for impl 'user_always_raises'" in str(info.value)
