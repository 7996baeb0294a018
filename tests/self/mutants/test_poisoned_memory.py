"""Poisoned memory catches an uninitialised output that a fresh allocator hides.

The mutant (``uninitialised_empty_wgrad`` in tests/self/helpers/grouped_fp8_mutants.py) allocates the grouped
weight gradient with ``torch.empty`` and writes only the experts that got rows. Its buffer is a view into a 64 MiB
``torch.empty``: glibc's ``malloc`` serves every request above its mmap threshold (32 MiB at most, however it has
adapted) with a fresh ``mmap``, and the kernel hands fresh anonymous pages over zeroed. So without poisoning an empty
expert's gradient reads exactly zero — the right answer — on every call, and the bug passes; that is the contrast,
built on purpose rather than left to whatever a small allocation recycles (a leftover, sometimes zero). With
poisoning (numcheck.properties.core.poison, on by default for the grouped suite) the same memory is NaN, and the
suite's ``grouped_empty_experts_exact_zero`` test (property ``empty_experts``) fails it: "outputs ['wgrad'] hold
NaN or inf where the oracle's value is finite".
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, settings

import numcheck.properties.core.profiles  # noqa: F401 - registers numcheck-ci
from numcheck.errors import PropertyFailure
from numcheck.properties.check import _run_drawn
from numcheck.properties.core import poison
from numcheck.properties.core.rows import seeded_data
from numcheck.properties.core.runner import run_example
from numcheck.properties.fp8.grouped.suite import GROUPED_SUITE
from numcheck.tests.self.helpers.grouped_fp8_mutants import FRESH_PAGES_BYTES, uninitialised_empty_wgrad

#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")

SUITE_TEST = GROUPED_SUITE["grouped_empty_experts_exact_zero"]
#: The seeded draws of the suite's own strategy tried besides the ci profile's (each one example).
SEEDS = range(6)


def _ci_verdict():
    base = settings(settings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    return _run_drawn(SUITE_TEST, uninitialised_empty_wgrad, base)


def _seeded(seed: int) -> PropertyFailure | None:
    """The suite test's example drawn with ``seed``: its failure, or None when it passed."""
    try:
        with seeded_data(f"poisoned memory|seed {seed}") as data:
            run_example(SUITE_TEST, uninitialised_empty_wgrad, data)
    except PropertyFailure as exc:
        return exc
    return None


def test_poisoning_catches_the_uninitialised_empty_expert_wgrad(monkeypatch):
    """With the default (grouped: poisoned), the ci profile's test fails the mutant, and so does every seeded
    draw, each naming the NaN wgrad of an expert without rows."""
    monkeypatch.delenv(poison.ENV, raising=False)
    verdict = _ci_verdict()
    assert verdict.status == "failed", verdict
    assert "outputs ['wgrad'] hold NaN or inf" in verdict.message, verdict.message
    for seed in SEEDS:
        exc = _seeded(seed)
        assert exc is not None, f"seed {seed}: the mutant passed with poisoning on"
        assert "wgrad" in str(exc) and "have no rows" in str(exc), str(exc)


def test_without_poisoning_the_mutant_passes_on_fresh_pages(monkeypatch):
    """With poisoning off its buffer comes from fresh pages — zeros, checked here first, so the contrast is the
    allocator's documented behaviour and not luck — and the same test passes it under the ci profile and on every
    seeded draw."""
    monkeypatch.setenv(poison.ENV, "off")
    fresh = torch.empty(FRESH_PAGES_BYTES // 4)
    assert bool((fresh == 0).all()), "a 64 MiB torch.empty did not come from fresh (zeroed) pages here"
    del fresh
    verdict = _ci_verdict()
    assert verdict.status == "passed", verdict
    assert [s for s in SEEDS if _seeded(s) is not None] == []


@pytest.mark.parametrize("prop", ["accuracy", "empty_experts"])
def test_report_judges_the_grouped_rows_poisoned(monkeypatch, prop):
    """``numcheck report``'s grouped rows (its accuracy grid and its property cases) run poisoned by default: the
    mutant's record fails on a case with an empty expert; with ``NUMCHECK_POISON=off`` the same record passes."""
    from numcheck.properties.fp8.grouped.cases import GroupedCase
    from numcheck.reference.fp8_recipes import Fp8Recipe
    from numcheck.reports.report.grid import GridCase
    from numcheck.reports.report.run import run_case

    gc = GridCase(
        "suite:grouped", "bfloat16", GroupedCase(Fp8Recipe("current"), (16, 0, 24), 32, 16, seed=2), prop=prop
    )
    monkeypatch.delenv(poison.ENV, raising=False)
    assert run_case(uninitialised_empty_wgrad, gc)["status"] == "fail"
    monkeypatch.setenv(poison.ENV, "off")
    assert run_case(uninitialised_empty_wgrad, gc)["status"] == "pass"
