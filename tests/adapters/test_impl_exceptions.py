"""An exception raised inside an impl (liger-kernel 0.2.1's ZeroDivisionError on an all-ignored batch, a
third-party ``assert``) comes out of the suite's runner as the suite's failure: impl, property, case, the exception
with its innermost frame, and a repro line that reruns it; hypothesis still shrinks it. The suite's own verdicts
pass through untouched."""

from __future__ import annotations

import re
import shlex
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable, UnsatisfiedAssumption

from numcheck.errors import PropertyFailure
from numcheck.impls.registry import discover
from numcheck.properties.core.failures import raised_by_suite
from numcheck.properties.core.runner import run_example
from numcheck.properties.linear_ce import props
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.suite import LinearCEProperty
from numcheck.reports import cli

#: Right on every batch with a non-ignored row; divides by their count in Python, as liger-kernel 0.2.1's
#: wrapper does, so an all-ignored batch raises ZeroDivisionError where it should give zero.
RAISER = '''
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import linear_ce_impl

@linear_ce_impl(name="raises_on_all_ignored", dtypes=("float32",), autocast=(), options=("ignore_index",),
                logits_dtype="float32", all_ignored="zero")
def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """Mean CE, the division by the non-ignored count done in Python."""
    n = int((target != ignore_index).sum())
    total = F.cross_entropy(F.linear(x, weight).float(), target, reduction="sum", ignore_index=ignore_index)
    return total * (1.0 / n)
'''


@pytest.fixture(scope="module")
def raiser(tmp_path_factory):
    """The raising impl, loaded by spec from a module of its own (as an outside impl is)."""
    folder = tmp_path_factory.mktemp("raiser")
    (folder / "raising_impl.py").write_text(RAISER)
    sys.path.insert(0, str(folder))
    try:
        (entry,) = discover(["raising_impl:impl"])
        yield entry.impl
    finally:
        sys.path.remove(str(folder))


def _draw(impl, data) -> Problem:
    return data.draw(
        st.builds(
            Problem,
            N=st.integers(1, 6),
            H=st.just(2),
            V=st.just(3),
            ignored=st.sampled_from([0.0, 0.5, 1.0]),
            seed=st.integers(0, 3),
        )
    )


ACCURACY = LinearCEProperty(name="accuracy", check=props.accuracy, draw=_draw)


@pytest.fixture(scope="module")
def failure(raiser) -> PropertyFailure:
    """The failure the drawn accuracy test ends with for the raising impl (one search, shared)."""
    return _run(raiser)


def _run(impl) -> PropertyFailure:
    @settings(max_examples=60, database=None, derandomize=True, deadline=None)
    @given(st.data())
    def drawn(data):
        run_example(ACCURACY, impl, data)

    with pytest.raises(PropertyFailure) as info:
        drawn()
    return info.value


def test_impl_exception_becomes_the_suites_shrunk_failure(failure):
    """A ZeroDivisionError inside an impl comes out as a PropertyFailure naming impl, property, the shrunk case
    (N=1, all ignored), the exception and its innermost frame, chained from the original."""
    exc = failure
    text = str(exc)
    assert text.startswith("property 'accuracy' fails for impl 'raises_on_all_ignored'"), text
    assert "case: Problem(N=1, H=2, V=3" in text and "ignored=1.0" in text, text
    assert "the impl raised ZeroDivisionError: float division by zero" in text, text
    assert re.search(r"raised at .*raising_impl\.py:\d+ in impl: return total \* \(1\.0 / n\)", text), text
    assert "reproduce: " in text and isinstance(exc.__cause__, ZeroDivisionError)


def test_printed_repro_reruns_the_raising_case(failure, monkeypatch, capsys):
    """The repro line of a wrapped impl exception, run as printed, reruns it: exit 1, the exception named."""
    line = str(failure).split("reproduce: ", 1)[1].strip()
    words = shlex.split(line)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        monkeypatch.setenv(key, value)
    assert words[:2] == ["numcheck", "repro"], line
    assert cli.main(words[1:]) == 1
    assert "raised ZeroDivisionError" in capsys.readouterr().out


def test_suite_verdicts_pass_through_untouched():
    """PropertyFailure and numcheck's own AssertionErrors are verdicts (kept as raised); an AssertionError from
    outside numcheck (a third-party kernel's assert) and any other exception are not."""
    assert raised_by_suite(PropertyFailure("x"))

    def raise_in(module: str, exc_type: type[BaseException]) -> BaseException:
        scope = {"__name__": module, "exc_type": exc_type}
        exec("def f():\n    raise exc_type('boom')\n", scope)  # noqa: S102 - a frame of the named module
        try:
            scope["f"]()
        except BaseException as exc:  # noqa: BLE001
            return exc
        raise AssertionError("f did not raise")

    assert raised_by_suite(raise_in("numcheck.properties.assertions", AssertionError))
    assert not raised_by_suite(raise_in("liger_kernel.ops.fused_linear_cross_entropy", AssertionError))
    assert not raised_by_suite(raise_in("numcheck.impls.adapters.liger", ValueError))


def test_a_verdict_and_a_rejected_draw_are_not_wrapped():
    """run_example re-raises the property's PropertyFailure itself, and hypothesis' own exceptions unchanged (a
    rejection stays a rejection: every draw rejected is Unsatisfiable, not a failure)."""
    verdict = PropertyFailure("property 'accuracy' fails for impl 'x'")

    def failing(impl, p):
        raise verdict

    def rejecting(impl, p):
        raise UnsatisfiedAssumption()

    draw = lambda impl, data: Problem(N=1, H=1, V=1)  # noqa: E731
    impl = type("Impl", (), {"name": "eager"})()

    def drawn(check):
        @settings(max_examples=5, database=None, derandomize=True, deadline=None)
        @given(st.data())
        def run(data):
            run_example(LinearCEProperty(name="accuracy", check=check, draw=draw), impl, data)

        run()

    with pytest.raises(PropertyFailure) as info:
        drawn(failing)
    assert info.value is verdict
    with pytest.raises(Unsatisfiable):
        drawn(rejecting)
