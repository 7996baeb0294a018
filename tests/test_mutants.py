"""The suite's own sharpness: each in-repo mutant (tests/mutants.py) must fail the accuracy property."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st

from properties.checks import accuracy
from properties.failures import PropertyFailure
from properties.strategies import problems
from tests.mutants import MUTANTS


def _fails(impl, p) -> bool:
    try:
        accuracy(impl, p)
    except PropertyFailure:
        return True
    return False


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant):
    """Hypothesis finds a problem, inside what the mutant declares, on which the accuracy property fails."""
    from impls.protocol import LINEAR_CE_OPTIONS

    every = frozenset(LINEAR_CE_OPTIONS)
    strategy = st.one_of(problems(mutant.support), problems(mutant.support, require=every, allow_all_ignored=False))
    found = find(strategy, lambda p: _fails(mutant, p),
                 settings=settings(max_examples=200, derandomize=True, database=None, deadline=None,
                                   suppress_health_check=list(HealthCheck)))
    assert _fails(mutant, found)
