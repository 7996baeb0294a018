"""Every linear-distill property against every loaded linear-distill impl (built-in and plugged in).

Cases are drawn inside each impl's declaration (``properties/linear_distill/strategies.py``); the drawn tests are
:data:`numcheck.properties.linear_distill.suite.DISTILL_SUITE`, run by the suite's runner. Failures carry the impl,
the case, the output, error, bound, worst element and a repro command (``properties/linear_distill/props.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numcheck.properties.linear_distill.suite import DISTILL_SUITE
from numcheck.tests.suite.drawn import run_drawn

_FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@_FIXTURE_OK
@given(data=st.data())
def test_distill_accuracy(linear_distill_impl, data):
    """Loss, grad_x and grad_weight within the derived bound of the float64 oracle, and relative to eager."""
    run_drawn(DISTILL_SUITE["distill_accuracy"], linear_distill_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_distill_beta_endpoints(linear_distill_impl, data):
    """β = 0 and β = 1 give the two KLs the declaration names (beta_zero)."""
    run_drawn(DISTILL_SUITE["distill_beta_endpoints"], linear_distill_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_distill_chunk_invariance(linear_distill_impl, data):
    """Accuracy over three or more chunks (the last ragged), and with the rows reversed."""
    run_drawn(DISTILL_SUITE["distill_chunk_invariance"], linear_distill_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_distill_ignored_rows_change_nothing(linear_distill_impl, data):
    """Ignored rows' inputs change no output; their grad_x is 0."""
    run_drawn(DISTILL_SUITE["distill_ignored_rows_change_nothing"], linear_distill_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_distill_beta_symmetry(linear_distill_impl, data):
    """JSD_β(student, teacher) = JSD_{1−β}(teacher, student)."""
    run_drawn(DISTILL_SUITE["distill_beta_symmetry"], linear_distill_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_distill_temperature_scaling(linear_distill_impl, data):
    """T = 2 equals T = 1 on halved weights of the declared side(s), times T² where declared."""
    run_drawn(DISTILL_SUITE["distill_temperature_scaling"], linear_distill_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_distill_declared_options_take_effect(linear_distill_impl, data):
    """Each declared option changes the result when used."""
    run_drawn(DISTILL_SUITE["distill_declared_options_take_effect"], linear_distill_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_distill_teacher_frozen(linear_distill_impl, data):
    """No gradient reaches the teacher."""
    run_drawn(DISTILL_SUITE["distill_teacher_frozen"], linear_distill_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_distill_determinism(linear_distill_impl, data):
    """Two calls, bitwise equal outputs."""
    run_drawn(DISTILL_SUITE["distill_determinism"], linear_distill_impl, data)
