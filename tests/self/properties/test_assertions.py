"""numcheck.assert_linear_ce / assert_fp8_linear: one property on one case, the suite's message, arguments checked first."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import numcheck
from numcheck import Fp8Case, Problem, assert_fp8_linear, assert_linear_ce
from numcheck.errors import InvalidAssertion, PropertyFailure
from numcheck.impls import protocols
from numcheck.impls.builtin.fp8_linear import Fp8Linear
from numcheck.impls.protocols.fp8_linear import Fp8FunctionImpl
from numcheck.properties import assertions
from numcheck.properties.linear_ce.props import accuracy
from numcheck.reference.fp8_recipes import Fp8Recipe


@numcheck.linear_ce_impl(name="assert_fp32", dtypes=("float32",), autocast=())
def fp32(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """fp32 logits and F.cross_entropy."""
    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)


@numcheck.linear_ce_impl(name="assert_loss_off", dtypes=("float32",), autocast=())
def loss_off(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """The loss 0.1% too large: far past fp32's bound."""
    return fp32(x, weight, target, bias, reduction=reduction, ignore_index=ignore_index) * 1.001


CASE = dict(N=8, H=16, V=32, bias=True, seed=3)
CURRENT = Fp8Recipe("current")
FP8 = Fp8Linear("assert_fp8", (CURRENT,))


def _y_off(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
    return (
        FP8(x, weight, bias, recipe=recipe, save_original_input=save_original_input, scaling_state=scaling_state) * 1.01
    )


FP8_OFF = Fp8FunctionImpl(
    name="assert_fp8_y_off",
    fn=_y_off,
    support=FP8.support.__class__(
        recipes=(CURRENT,), dtypes=frozenset({torch.float32}), accum_unit_roundoff=FP8.support.accum_unit_roundoff
    ),
)


def test_holding_property_returns_its_metrics():
    """A correct impl passes, and a Problem or its fields as keywords give the same metrics."""
    a = assert_linear_ce(fp32, **CASE)
    b = assert_linear_ce(fp32, Problem(**CASE), prop="accuracy")
    assert a == b and 0.0 <= a["error/bound"] <= 1.0


def test_failing_property_raises_the_suites_message():
    """A wrong loss raises PropertyFailure carrying exactly the message the suite's own property raises."""
    with pytest.raises(PropertyFailure) as got:
        assert_linear_ce(loss_off, **CASE)
    with pytest.raises(PropertyFailure) as suite:
        accuracy(loss_off, Problem(**CASE))
    assert str(got.value) == str(suite.value)
    assert "property 'accuracy' fails for impl 'assert_loss_off'" in str(got.value) and "loss" in str(got.value)


def test_quant_linear_holds_and_fails():
    """The built-in current-scaling FP8 linear passes on one case (a recipe kind name accepted); y 1% off fails it."""
    assert assert_fp8_linear(FP8, recipe="current", M=16, K=32, N=8, bias=True).ok
    with pytest.raises(PropertyFailure, match="property 'accuracy' fails for impl 'assert_fp8_y_off'"):
        assert_fp8_linear(FP8_OFF, Fp8Case(CURRENT, 16, 32, 8))


@pytest.mark.parametrize(
    "call,words",
    [
        (
            lambda: assert_linear_ce(fp32, prop="acuracy", **CASE),
            ("unknown property 'acuracy'", "Did you mean 'accuracy'?"),
        ),
        (lambda: assert_linear_ce(fp32, n=8, H=16, V=32), ("'n' is not a field of Problem", "Did you mean 'N'?")),
        (lambda: assert_linear_ce(fp32, Problem(**CASE), N=4), ("a Problem and the fields ['N']",)),
        (lambda: assert_linear_ce(fp32), ("no case given",)),
        (lambda: assert_linear_ce(fp32, H=16, V=32), ("missing", "N")),
        (lambda: assert_linear_ce(fp32, "Problem(N=1, H=1, V=1)"), ("must be a Problem, got str",)),
        (
            lambda: assert_linear_ce(fp32, N=8, H=16, V=32, dtype="bfloat16"),
            ("does not declare this case", "dtype torch.bfloat16"),
        ),
        (
            lambda: assert_linear_ce(fp32, prop="shift_invariance", N=8, H=16, V=32),
            ("says nothing about this case", "bias=True"),
        ),
        (lambda: assert_linear_ce(fp32, prop="ignored_rows", N=8, H=16, V=32), ("says nothing", "ignored rows")),
        (lambda: assert_linear_ce(FP8, **CASE), ("fp8-linear impl", "numcheck.assert_fp8_linear")),
        (lambda: assert_linear_ce(object(), **CASE), ("non-empty string attribute 'name'",)),
        (
            lambda: assert_linear_ce(fp32.with_support(requires=lambda: "needs fastce"), **CASE),
            ("cannot run here: needs fastce",),
        ),
        (
            lambda: assert_fp8_linear(fp32, recipe="current", M=4, K=8, N=4),
            ("linear-ce impl", "numcheck.assert_linear_ce"),
        ),
        (
            lambda: assert_fp8_linear(FP8, recipe="mxfp8", M=4, K=32, N=4),
            ("does not declare this case", "recipe mxfp8"),
        ),
        (lambda: assert_fp8_linear(FP8, recipe="mx", M=4, K=32, N=4), ("Fp8Recipe.kind='mx'",)),
        (
            lambda: assert_fp8_linear(FP8_OFF, prop="quantizer", recipe="current", M=4, K=32, N=4),
            ("exposes_quantize=False",),
        ),
    ],
    ids=[
        "prop_typo",
        "field_typo",
        "case_and_fields",
        "no_case",
        "missing_field",
        "case_type",
        "undeclared",
        "inapplicable",
        "inapplicable_ignored",
        "fp8_linear_impl",
        "not_an_impl",
        "unavailable",
        "linear_impl",
        "quant_undeclared",
        "bad_recipe",
        "no_quantizer",
    ],
)
def test_bad_arguments_are_refused_before_running(call, words):
    """Each misuse raises InvalidAssertion (a ValueError and TypeError) saying what was wrong and how to fix it."""
    with pytest.raises(InvalidAssertion) as excinfo:
        call()
    assert isinstance(excinfo.value, ValueError) and isinstance(excinfo.value, TypeError)
    for w in words:
        assert w in str(excinfo.value), f"{str(excinfo.value)!r} lacks {w!r}"


#: The modules whose >>> examples are the public API's: the assertions, numcheck's namespace, and every kind's
#: protocol module (its decorator and declaration; ``impls/protocols/``, found by listing the package so a new kind's
#: examples run too). The decorators' examples showed the kinds' names of before their rename until this ran them.
_PROTOCOLS = [
    importlib.import_module(f"{protocols.__name__}.{m.name}")
    for m in sorted(pkgutil.iter_modules(protocols.__path__), key=lambda m: m.name)
]
_DOCTESTED = {"assertions": assertions, "numcheck": numcheck} | {m.__name__.rsplit(".", 1)[1]: m for m in _PROTOCOLS}


@pytest.mark.parametrize("module", list(_DOCTESTED.values()), ids=list(_DOCTESTED))
def test_public_examples_run_as_doctests(module):
    """The public API's >>> examples run and give what they show (a protocol module without any passes)."""
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, result
    assert result.attempted > 0 or module in _PROTOCOLS, result


def _modules_with_examples() -> list[str]:
    """Every numcheck module (its tests aside) whose source holds a ``>>>`` example, found by listing the package's
    files, not named here: an example added anywhere runs, and one that goes stale fails."""
    found = []
    for sub in ("reference", "impls", "properties", "reports"):
        pkg = importlib.import_module(f"numcheck.{sub}")
        for info in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}."):
            origin = None if info.ispkg else getattr(importlib.util.find_spec(info.name), "origin", None)
            if origin and origin.endswith(".py") and ">>> " in Path(origin).read_text(encoding="utf-8"):
                found.append(info.name)
    return sorted(found)


_EXAMPLED = [m for m in _modules_with_examples() if m not in {d.__name__ for d in _DOCTESTED.values()}]


@pytest.mark.parametrize("name", _EXAMPLED)
def test_every_module_example_runs(name):
    """The >>> examples of every other module run and give what they show (two had gone stale before this ran them:
    a float64 zero shown as 0.0 that came out -6e-17, a function reached through a package that does not export
    it)."""
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0, (name, result)
