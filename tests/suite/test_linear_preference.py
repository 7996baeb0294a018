"""Every linear+preference property against every loaded linear+preference impl (built-in and plugged in).

Cases are drawn inside each impl's declaration (``properties/linear_preference/strategies.py``); the drawn tests are
:data:`numcheck.properties.linear_preference.suite.PREFERENCE_SUITE`, run by the suite's runner. Failures carry the
impl, the case, the output, error, bound, worst element and a repro command
(``properties/linear_preference/props.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numcheck.properties.linear_preference.suite import PREFERENCE_SUITE, suite_examples
from numcheck.tests.suite.drawn import run_drawn

#: The profile's examples scaled down for the family's cost (properties/linear_preference/suite.py).
_EXAMPLES = suite_examples(settings().max_examples)
_FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=_EXAMPLES)

#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = [
    pytest.mark.usefixtures("one_thread_per_module"),
    pytest.mark.torch_versions_impls(
        "linear_preference_chunked[dpo]", reason="the torch ops every built-in of the family uses, on one impl"
    ),
]


@_FIXTURE_OK
@given(data=st.data())
def test_preference_accuracy(linear_preference_impl, data):
    """The loss and every gradient within the derived bound of the float64 oracle, and within eager's RMSE
    allowance (judgement (b))."""
    run_drawn(PREFERENCE_SUITE["preference_accuracy"], linear_preference_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_preference_ignored_positions(linear_preference_impl, data):
    """x changed at ignored positions changes no output bit; grad_x there is exactly 0."""
    run_drawn(PREFERENCE_SUITE["preference_ignored_positions"], linear_preference_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_preference_chunk_invariance(linear_preference_impl, data):
    """Accurate with one pair per chunk and with every pair in one chunk."""
    run_drawn(PREFERENCE_SUITE["preference_chunk_invariance"], linear_preference_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_preference_pair_permutation(linear_preference_impl, data):
    """Permuting the pairs permutes grad_x and leaves the loss and grad_weight within the bounds."""
    run_drawn(PREFERENCE_SUITE["preference_pair_permutation"], linear_preference_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_preference_options_honoured(linear_preference_impl, data):
    """Each declared option (β, γ, ε, α, the per-sequence mean) changes the result as the oracle says."""
    run_drawn(PREFERENCE_SUITE["preference_options_honoured"], linear_preference_impl, data)
