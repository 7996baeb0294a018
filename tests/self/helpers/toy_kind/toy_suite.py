"""The toy family's suite module (copied as ``test_toy.py``): its drawn tests take the kind's fixture, which
numcheck's plugin parametrizes over the loaded impls of the kind."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toykind.properties.suite import TOY_SUITE

from numcheck.properties.core.runner import run_example


@settings(max_examples=5, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_accuracy(toy_impl, data):
    run_example(TOY_SUITE["accuracy"], toy_impl, data)


@settings(max_examples=3, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_determinism(toy_impl, data):
    run_example(TOY_SUITE["determinism"], toy_impl, data)
