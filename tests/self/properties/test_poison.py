"""Poisoned memory (numcheck.properties.core.poison): inside a judgement every uninitialised allocation is filled on
this torch, the caller's deterministic-algorithms settings come back afterwards (also when the impl raised), the
determinism properties run outside it, and ``NUMCHECK_POISON`` / ``--numcheck-poison`` choose the families."""

from __future__ import annotations

import types

import pytest
import torch
import torch.utils.deterministic

import numcheck
from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.fp8_linear import Fp8Linear
from numcheck.properties.core import poison
from numcheck.properties.core.runner import judge
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.tests import plugin
from numcheck.tests.self.helpers.grouped_fp8_mutants import FRESH_PAGES_BYTES


def _settings() -> tuple[bool, bool, bool]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )


@pytest.mark.torch_versions(reason="the fill is torch's own (fill_uninitialized_memory): checked on every release")
def test_filled_fills_every_empty_kind():
    """NaN in floating dtypes (FP8's byte 0x7f is NaN too), the integer maximum in integer ones, for torch.empty,
    empty_like, new_empty, empty_strided and resize_; nothing set after the block."""
    before = _settings()
    with poison.filled():
        floats = [
            torch.empty(5),
            torch.empty(5, dtype=torch.bfloat16),
            torch.empty_like(torch.ones(5)),
            torch.ones(1).new_empty(5),
            torch.empty_strided((2, 3), (1, 2)),
            torch.zeros(0).resize_(5),
            torch.empty(5, dtype=torch.float8_e4m3fn).float(),
        ]
        ints = torch.empty(5, dtype=torch.int64)
    assert all(bool(t.isnan().all()) for t in floats), floats
    assert bool((ints == torch.iinfo(torch.int64).max).all()), ints
    assert _settings() == before


def test_filled_restores_the_callers_settings_also_on_raise():
    """The caller's mode (deterministic with warn_only off, the fill switched off) comes back after an exception."""
    det = torch.utils.deterministic
    saved = _settings()
    try:
        torch._C._set_deterministic_algorithms(True, warn_only=False)  # the public call imports torch._inductor
        det.fill_uninitialized_memory = False
        with pytest.raises(ZeroDivisionError), poison.filled():
            assert _settings() == (True, True, True)
            raise ZeroDivisionError
        assert _settings() == (True, False, False)
    finally:
        torch._C._set_deterministic_algorithms(saved[0], warn_only=saved[1])
        det.fill_uninitialized_memory = saved[2]
    assert not torch.are_deterministic_algorithms_enabled()


def test_families_and_the_variable(monkeypatch):
    """Default: the kinds of DEFAULT_ON (every registered kind; a kind outside it, a toy's, off); ``on`` / ``off``
    for every kind; the determinism properties never; a bad value is one error naming the variable."""
    from numcheck.impls.protocols.kinds import NAMES

    monkeypatch.delenv(poison.ENV, raising=False)
    assert all(poison.enabled(kind) for kind in NAMES) and not poison.enabled("toy-sum")
    assert not poison.enabled("dist-linear-ce", "dist_determinism")
    monkeypatch.setenv(poison.ENV, "on")
    assert poison.enabled("toy-sum") and not poison.enabled("linear-ce", "determinism")
    assert not poison.enabled("tp-fp8-linear", "dist_determinism")
    monkeypatch.setenv(poison.ENV, "off")
    assert not poison.enabled("grouped-fp8-linear")
    monkeypatch.setenv(poison.ENV, "sometimes")
    with pytest.raises(ValueError, match="NUMCHECK_POISON must be on, off or default"):
        poison.enabled("fp8-linear")


def _empty_is_nan(impl, case) -> bool:
    return bool(torch.empty(4).isnan().all())


@pytest.mark.parametrize(
    "kind, prop, expected",
    [("grouped-fp8-linear", None, True), ("fp8-linear", None, True), ("fp8-linear", "determinism", False)],
)
def test_judge_runs_the_property_poisoned(monkeypatch, kind, prop, expected):
    """The suite's runner (every drawn and fixed test, numcheck.check, the report's property cases) judges inside
    the block for a poisoned family, outside it for the determinism property."""
    monkeypatch.delenv(poison.ENV, raising=False)
    impl = types.SimpleNamespace(name="probe", kind=kind)
    assert judge(_empty_is_nan, impl, None, name=prop) is expected
    assert not torch.are_deterministic_algorithms_enabled()


def test_plugin_option_sets_the_variable(monkeypatch):
    """``--numcheck-poison`` / ``--no-numcheck-poison`` set NUMCHECK_POISON for the session; the caller's value is
    back at unconfigure; without either nothing is set."""
    monkeypatch.setenv(poison.ENV, "default")
    for flag, value in ((True, "on"), (False, "off"), (None, "default")):
        config = types.SimpleNamespace(getoption=lambda name, default=None, f=flag: f, stash=pytest.Stash())
        plugin._set_poison(config)
        assert poison.setting() is {"on": True, "off": False, "default": None}[value]
        plugin.pytest_unconfigure(config)
        assert poison.setting() is None


class _UnwrittenTimesZero(Fp8Linear):
    """Adds ``0 ·`` a buffer it never wrote to y: zeros from fresh pages (a view into a 64 MiB ``torch.empty``),
    NaN once memory is poisoned."""

    def __call__(self, x, weight, bias=None, **kw):
        y = super().__call__(x, weight, bias, **kw)
        fresh = torch.empty(max(y.numel(), FRESH_PAGES_BYTES // 4))[: y.numel()].view(y.shape)
        return y + fresh.to(y.dtype) * 0


def test_public_assertion_judges_poisoned(monkeypatch):
    """``numcheck.assert_fp8_linear`` (a user's own tests) poisons as the suite does: an output that read memory
    it never wrote fails by default, and passes with ``NUMCHECK_POISON=off``."""
    impl = _UnwrittenTimesZero("unwritten", (Fp8Recipe("current"),))
    monkeypatch.delenv(poison.ENV, raising=False)
    with pytest.raises(PropertyFailure):
        numcheck.assert_fp8_linear(impl, recipe="current", M=16, K=32, N=8)
    monkeypatch.setenv(poison.ENV, "off")
    assert numcheck.assert_fp8_linear(impl, recipe="current", M=16, K=32, N=8).ok
