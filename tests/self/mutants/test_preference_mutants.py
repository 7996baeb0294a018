"""The linear+preference suite's sharpness: each mutant of tests/self/helpers/preference_mutants.py fails the drawn
test meant to catch it under the ci profile's draws at the shipped module's budget (error/bound ≥ 2 where the
failure is a bound's; the others fail an exact or metamorphic check), and the chunked built-in it was made from
passes the same draws."""

from __future__ import annotations

import re

import pytest
from hypothesis import Phase
from hypothesis import settings as hsettings

from numcheck.impls.builtin.linear_preference import linear_preference_impls
from numcheck.properties.check import _run_drawn
from numcheck.properties.linear_preference.suite import PREFERENCE_SUITE, suite_examples
from numcheck.tests.self.helpers.preference_mutants import CAUGHT_BY, MUTANTS

#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")

_RATIO = re.compile(r"error/bound ([0-9.]+(?:e[+-]?\d+)?|inf)")


def _ci() -> hsettings:
    """The ci profile at the shipped module's budget (tests/suite/test_linear_preference.py), no shrinking."""
    ci = hsettings.get_profile("numcheck-ci")
    return hsettings(
        ci, max_examples=suite_examples(ci.max_examples), phases=[p for p in Phase if p is not Phase.shrink]
    )


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_ci_profile_catches_preference_mutant(mutant):
    """The shipped suite's drawn test fails the mutant, by a margin of at least 2 where a bound judged it; the
    correct chunked built-in of the same loss passes that test's draws."""
    prop = PREFERENCE_SUITE[f"preference_{CAUGHT_BY[mutant.name]}"]
    verdict = _run_drawn(prop, mutant, _ci())
    assert verdict.status == "failed" and not verdict.impl_raised, verdict
    ratios = [float(r) for r in _RATIO.findall(verdict.message)]
    assert not ratios or max(ratios) >= 2, verdict.message
    twin = next(i for i in linear_preference_impls() if i.name == f"linear_preference_chunked[{mutant.support.loss}]")
    assert _run_drawn(prop, twin, _ci()).status == "passed"


def test_preference_mutants_load_as_outside_impls():
    """The mutants load through the registry's spec path like any outside impl."""
    from numcheck.impls.registry import ImplEntry, load_spec

    entries = load_spec("numcheck.tests.self.helpers.preference_mutants:MUTANTS", "--impl")
    assert entries and all(isinstance(e, ImplEntry) and e.kind == "linear-preference" for e in entries), entries
