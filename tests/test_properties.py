"""Every linear+CE property against every registered impl (built-in and plugged in), on hypothesis-drawn problems.

Problems are drawn only inside what each impl declares; a property that needs a feature the impl does not
declare is skipped with the reason. Failures carry the impl, the case, the output, error, bound, worst element
and a one-line repro command (see properties/failures.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, target
from hypothesis import strategies as st

from properties import checks
from properties.strategies import problems


def _run(prop, impl, p) -> None:
    metrics = prop(impl, p)
    for label, value in metrics.items():
        target(float(value), label=label)


@given(data=st.data())
def test_accuracy(linear_ce_impl, data):
    """Every output of the impl is within the analytic bound of the float64 oracle and within k× eager's error."""
    p = data.draw(problems(linear_ce_impl.support), label="problem")
    _run(checks.accuracy, linear_ce_impl, p)


@given(data=st.data())
def test_accuracy_fp32_sharp(linear_ce_impl, data):
    """In fp32 (where bounds are tightest) every output is within bound, on every option combination declared."""
    if "float32" not in {str(d).replace("torch.", "") for d in linear_ce_impl.support.dtypes}:
        pytest.skip(f"{linear_ce_impl.name} declares no float32")
    p = data.draw(problems(linear_ce_impl.support, force={"dtype": "float32", "autocast": None}), label="problem")
    _run(checks.accuracy, linear_ce_impl, p)


@given(data=st.data())
def test_confident_rows(linear_ce_impl, data):
    """Confident predictions (p_target → 1) keep the true-class gradient accurate relative to itself."""
    p = data.draw(problems(linear_ce_impl.support, regimes=("confident",)), label="problem")
    _run(checks.accuracy, linear_ce_impl, p)


@given(data=st.data())
def test_ignored_rows(linear_ce_impl, data):
    """Ignored rows get exactly zero grad_x, and changing x in them changes nothing, bitwise."""
    if "ignore_index" not in linear_ce_impl.support.options:
        pytest.skip(f"{linear_ce_impl.name} declares no ignore_index")
    ign = data.draw(st.sampled_from([0.25, 0.5, 0.9]), label="ignored")
    p = data.draw(problems(linear_ce_impl.support, force={"ignored": ign}), label="problem")
    _run(checks.ignored_rows, linear_ce_impl, p)


@given(data=st.data())
def test_permutation(linear_ce_impl, data):
    """Permuting tokens permutes per-row outputs and leaves reductions and grad_W unchanged, within bounds."""
    p = data.draw(problems(linear_ce_impl.support, allow_all_ignored=False), label="problem")
    _run(checks.permutation, linear_ce_impl, p)


@given(data=st.data())
def test_shift_invariance(linear_ce_impl, data):
    """A constant added to every logit through the bias changes nothing, within bounds (no softcap)."""
    if "bias" not in linear_ce_impl.support.options:
        pytest.skip(f"{linear_ce_impl.name} declares no bias")
    p = data.draw(problems(linear_ce_impl.support, force={"bias": True, "softcap": None}), label="problem")
    _run(checks.shift_invariance, linear_ce_impl, p)


@given(data=st.data())
def test_option_identities(linear_ce_impl, data):
    """Neutral option values passed explicitly (ε=0, unit class weights, λ=0, softcap→∞) equal the plain call."""
    force = {"label_smoothing": 0.0, "class_weights": False, "z_loss": 0.0, "softcap": None}
    p = data.draw(problems(linear_ce_impl.support, force=force), label="problem")
    _run(checks.option_identities, linear_ce_impl, p)


@given(data=st.data())
def test_determinism(linear_ce_impl, data):
    """Two runs on the same inputs are bitwise equal."""
    p = data.draw(problems(linear_ce_impl.support), label="problem")
    _run(checks.determinism, linear_ce_impl, p)


@given(data=st.data())
def test_chunk_invariance(linear_ce_impl, data):
    """Chunk sizes 1, 3 and N+1 agree within bounds, where the impl exposes with_chunk_rows."""
    if not hasattr(linear_ce_impl, "with_chunk_rows"):
        pytest.skip(f"{linear_ce_impl.name} exposes no chunk size (with_chunk_rows)")
    p = data.draw(problems(linear_ce_impl.support), label="problem")
    _run(checks.chunk_invariance, linear_ce_impl, p)


@given(data=st.data())
def test_grad_dtypes(linear_ce_impl, data):
    """Gradients come back in the parameters' dtypes, under AMP too."""
    p = data.draw(problems(linear_ce_impl.support), label="problem")
    _run(checks.grad_dtypes, linear_ce_impl, p)
