"""The linear-distill declaration: every bad field is one InvalidDeclaration naming the declaring line, what was
wrong and how to fix it; a function that cannot take the call is refused where it is decorated."""

from __future__ import annotations

import pytest

from numcheck.errors import InvalidDeclaration
from numcheck.impls.protocols.linear_distill import (
    LinearDistillSupport,
    linear_distill_impl,
    validate_linear_distill_impl,
)


def _fn(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    return None


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"beta_zero": "forward"}, r"beta_zero='forward' is not one of .* Did you mean 'forward_kl'"),
        ({"denominator": "batchmean"}, r"denominator='batchmean' .* Did you mean 'rows'"),
        ({"temperature_on": "all"}, r"temperature_on='all' .* Did you mean 'both'"),
        ({"grad_accumulation": "float32"}, r"grad_accumulation='float32' .* Did you mean 'fp32'"),
        ({"options": ("T",)}, r"options=\('T',\) has unknown entries .* Did you mean 'temperature'"),
        ({"dtypes": ("bf16",)}, r"Did you mean 'bfloat16'"),
        ({"devices": ("gpu",)}, r"Did you mean 'cuda'"),
        ({"chunk_rows": 0}, r"chunk_rows must be an int >= 1"),
        ({"chunk_rows": 8, "chunk_rule": lambda N, H, V: 8}, r"both chunk_rows=8 and chunk_rule"),
        ({"temperature_squared": "yes"}, r"temperature_squared must be True or False"),
        ({"divergence_dtype": "bf16"}, r"divergence_dtype='bf16' is not one of"),
    ],
)
def test_bad_field_names_the_line_and_the_fix(fields, match):
    with pytest.raises(InvalidDeclaration, match="(?s)" + match) as info:
        LinearDistillSupport(**fields)
    assert "test_distill_declaration.py:" in str(info.value).split("\n")[0]


def test_decorator_refuses_unknown_keyword_and_a_function_without_the_keywords():
    with pytest.raises(
        InvalidDeclaration, match=r"(?s)unknown keyword argument 'temprature'.*Did you mean 'temperature_on'"
    ):
        linear_distill_impl(name="x", temprature="both")
    with pytest.raises(InvalidDeclaration, match=r"(?s)beta=\.\.\., temperature=\.\.\., ignore_index=\.\.\."):

        @linear_distill_impl(name="x")
        def no_keywords(sx, sw, tx, tw, target):
            return None


def test_decorated_function_conforms_and_states_its_conventions():
    impl = linear_distill_impl(name="mine", dtypes=("float32",), beta_zero="reverse_kl", temperature_squared=True)(_fn)
    validate_linear_distill_impl(impl, "here")
    conv = impl.support.convention
    assert (conv.beta_zero, conv.temperature_squared, conv.denominator) == ("reverse_kl", True, "tokens")
    assert impl.support.refuses(dtype=impl.support.dtypes.__iter__().__next__(), device="cpu", beta=0.0) is None
    assert "beta_endpoints=False" in LinearDistillSupport(beta_endpoints=False).refuses(
        dtype=next(iter(impl.support.dtypes)), device="cpu", beta=1.0
    )
    with pytest.raises(TypeError, match="needs 'support'"):
        validate_linear_distill_impl(type("Bare", (), {"name": "bare", "support": None, "__call__": _fn})(), "here")


def test_plugin_runs_the_kinds_suite_tests_under_impl():
    """Under ``--impl``, the plugin leaves out the shipped suite's tests that take no impl; a test taking the
    linear-distill fixture (a kind whose fixture the plugin does not define) takes impls and must stay."""
    from types import SimpleNamespace

    from numcheck.impls.protocols.linear_distill import KIND
    from numcheck.tests import plugin

    path = plugin._SUITE_DIR / "test_linear_distill.py"
    assert not plugin._own_protocol_test(SimpleNamespace(path=path, fixturenames=[KIND.fixture, "data"]))
    assert plugin._own_protocol_test(SimpleNamespace(path=path, fixturenames=["data"]))
