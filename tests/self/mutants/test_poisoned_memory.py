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

The distributed suites' ranks are poisoned alike (the judging process decides and tells the ranks): the
vocabulary-parallel mutant ``unowned_target_logit_uninitialised`` (tests/self/helpers/dist_mutants.py) takes its
target-logit partial from the same kind of fresh 64 MiB ``torch.empty`` and writes only the rows whose target its
shard owns (a rank that owns no target writes none): zeros, the right partial, unpoisoned; a NaN loss poisoned. A TP/SP
FP8 probe adds ``0 ·`` such a buffer to its y.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import Phase, settings

import numcheck.properties.core.profiles  # noqa: F401 - registers numcheck-ci
from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.tp_fp8_linear import TPFp8Linear
from numcheck.properties.check import _run_drawn
from numcheck.properties.core import poison
from numcheck.properties.core.rows import seeded_data
from numcheck.properties.core.runner import run_example
from numcheck.properties.distributed.linear_ce.cases import DistCase
from numcheck.properties.distributed.linear_ce.props import dist_accuracy, load_impl
from numcheck.properties.distributed.linear_ce.props import run_case as dist_run_case
from numcheck.properties.distributed.linear_ce.suite import run_property
from numcheck.properties.distributed.tp_fp8.cases import TPFp8Case
from numcheck.properties.distributed.tp_fp8.props import dist_accuracy as tp_accuracy
from numcheck.properties.fp8.grouped.suite import GROUPED_SUITE
from numcheck.properties.linear_ce.cases import Problem
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.tests.self.helpers.dist_mutants import unowned_target_logit_uninitialised
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


# -- the distributed suites' ranks ------------------------------------------------------------------------------
def _two_ranks() -> None:
    from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable

    why = world_size_unavailable(2, default_backend())
    if why:
        pytest.skip(why)


#: Every target in rank 0's shard: rank 1 owns none, so its whole target-logit partial is the unwritten buffer.
DIST_CASE = DistCase(Problem(N=6, H=5, V=9, dtype="float32", seed=4), world_size=2, placement="one_rank", owner=0)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_vocab_parallel_ranks_run_poisoned(monkeypatch, mode):
    """The ranks of the vocabulary-parallel suite run the impl's forward and backward poisoned as the process
    judging them decides (``NUMCHECK_POISON``, set here after the ranks started): the mutant whose unowned
    target-logit rows come from ``torch.empty`` fails dist_accuracy on its NaN loss when poisoned, and passes on
    fresh pages (zeros, the right partial) when not; dist_determinism's runs stay outside (a finite loss)."""
    _two_ranks()
    monkeypatch.setenv(poison.ENV, mode)
    mutant = unowned_target_logit_uninitialised
    if mode == "off":
        dist_accuracy(mutant, DIST_CASE)
        return
    with pytest.raises(PropertyFailure, match=r"(?s)mutant_dist\[UnownedTargetLogitUninitialised\].*loss") as info:
        dist_accuracy(mutant, DIST_CASE)
    spec = re.search(r'--impl "([^"]+)"', str(info.value)).group(1)
    assert load_impl(spec).name == mutant.name  # the repro line's spec loads it (it is outside dist_impls())
    outside = dist_run_case(mutant, DIST_CASE, prop="dist_determinism")
    assert bool(outside.assembled()["loss"].isfinite().all())


def test_vocab_parallel_ci_profile_catches_the_unwritten_target_logit(monkeypatch):
    """Under the default (the vocabulary-parallel family poisoned), the ci profile's dist_accuracy at world size 2
    fails the mutant, naming its loss (stops at the first failing draw: no shrinking)."""
    _two_ranks()
    monkeypatch.delenv(poison.ENV, raising=False)
    with pytest.raises(PropertyFailure, match="loss"):
        run_property(dist_accuracy, unowned_target_logit_uninitialised, 2, "numcheck-ci", shrink=False)


class _TPUnwrittenTimesZero(TPFp8Linear):
    """Adds ``0 ·`` a buffer it never wrote to its y (a view into a fresh 64 MiB ``torch.empty``): zeros unpoisoned,
    NaN poisoned. Module level: the ranks unpickle it."""

    def __call__(self, x, weight, bias=None, **kw):
        y = super().__call__(x, weight, bias, **kw)
        fresh = torch.empty(max(y.numel(), FRESH_PAGES_BYTES // 4))[: y.numel()].view(y.shape)
        return y + fresh.to(y.dtype) * 0


@pytest.mark.parametrize("mode", ["on", "off"])
def test_tp_fp8_ranks_run_poisoned(monkeypatch, mode):
    """The TP/SP FP8 ranks run the impl under the same decision: an unwritten buffer in y fails dist_accuracy
    poisoned and passes unpoisoned."""
    _two_ranks()
    monkeypatch.setenv(poison.ENV, mode)
    impl = _TPUnwrittenTimesZero("tp_unwritten_times_zero", (Fp8Recipe("current"),))
    case = TPFp8Case(Fp8Recipe("current"), 8, 16, 8, "float32", world=2, parallel="row")
    if mode == "off":
        tp_accuracy(impl, case)
        return
    with pytest.raises(PropertyFailure, match="y"):
        tp_accuracy(impl, case)
