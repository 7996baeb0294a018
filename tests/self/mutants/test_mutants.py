"""The suite's own sharpness: each in-repo mutant (tests/self/helpers/mutants.py) must fail the accuracy property."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st

from numcheck.errors import PropertyFailure, ProtocolViolation
from numcheck.properties.core.device import DEVICE
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.props import accuracy
from numcheck.properties.linear_ce.strategies import problems
from numcheck.tests.self.helpers.mutants import DIRECTED, MUTANTS


def _fails(impl, p) -> bool:
    try:
        accuracy(impl, p)
    except (PropertyFailure, ProtocolViolation):
        return True
    return False


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant):
    """Hypothesis finds a problem, inside what the mutant declares, on which the accuracy property fails."""
    from numcheck.impls.protocols.linear_ce import LINEAR_CE_OPTIONS

    every = frozenset(LINEAR_CE_OPTIONS)
    strategy = st.one_of(problems(mutant.support), problems(mutant.support, require=every, allow_all_ignored=False))
    found = find(
        strategy,
        lambda p: _fails(mutant, p),
        settings=settings(
            max_examples=200, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
    assert _fails(mutant, found)


def test_upstream_before_mean_is_caught_by_loss_scale_draws():
    """The loss-scale draws find where scaling p − y by 2^17 before dividing by N overflows fp16 (the scaled
    gradient itself fits): a held-out bug that every other draw passes."""
    from numcheck.properties.linear_ce.strategies import loss_scale_problems
    from numcheck.tests.self.helpers.mutants import upstream_before_mean

    found = find(
        loss_scale_problems(upstream_before_mean.support),
        lambda p: _fails(upstream_before_mean, p),
        settings=settings(
            max_examples=30, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
    assert _fails(upstream_before_mean, found)
    assert not _fails(upstream_before_mean, found.replace(upstream="scalar")), "the bug shows only under the scale"


@pytest.mark.parametrize("name", ["chunked_triton[split_fp32]", "recompute_triton[split_fp32]"])
def test_split_accumulator_dropping_its_low_half_is_caught(name, monkeypatch):
    """The split fp32 accumulator with its int16 lower half zeroed after every chunk (a bf16 running sum that
    still declares fp32 accumulation) fails the many-chunks accuracy property on its first bf16 draws."""
    from numcheck.impls.builtin import split_accum
    from numcheck.impls.registry import builtin
    from numcheck.properties.linear_ce.chunks import many_chunks
    from numcheck.properties.linear_ce.strategies import many_chunk_layout, many_chunk_problems, why_not_run

    layout = many_chunk_layout(builtin(name))
    impl, N = layout.impl, many_chunks("bfloat16", layout.rows)
    probe = Problem(N=N, H=1, V=2, dtype="bfloat16", device=DEVICE)
    why = why_not_run(impl, probe)
    if why:
        pytest.skip(why)
    add = split_accum.SplitAccumulator.add_

    def add_then_drop_low_half(self, G, x):
        add(self, G, x)
        self.lo.zero_()

    monkeypatch.setattr(split_accum.SplitAccumulator, "add_", add_then_drop_low_half)
    # Generate only (no shrinking: each draw runs N chunks, under the interpreter on CPU), and judge each draw once:
    # find runs the condition on the failing draw again to return it; the memo answers that run.
    verdicts: dict[Problem, bool] = {}

    def fails(p: Problem) -> bool:
        if p not in verdicts:
            verdicts[p] = _fails(impl, p)
        return verdicts[p]

    found = find(
        many_chunk_problems(impl.support, layout).filter(lambda p: p.dtype == "bfloat16"),
        fails,
        settings=settings(
            max_examples=5,
            phases=[Phase.generate],
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert verdicts[found], found


@pytest.mark.parametrize("mutant,prop,case", DIRECTED, ids=[m.name for m, _, _ in DIRECTED])
def test_directed_mutant_fails_its_property(mutant, prop, case):
    """A bug plain accuracy cannot see (it passes accuracy on the case) fails the property written for its
    class: a contiguity assumption, a wrong needs_input_grad index, a workspace shared across calls."""
    from numcheck.properties.linear_ce.props import PROPERTIES

    p = eval(case, {"__builtins__": {}}, {"Problem": Problem}).replace(device="cpu")  # noqa: S307 - a literal
    accuracy(mutant, p)
    with pytest.raises((PropertyFailure, ProtocolViolation)):
        PROPERTIES[prop](mutant, p)


def test_input_modified_in_place_is_named():
    """run_impl names an input that forward + backward changed in place (here the mutant's target), whatever
    the outputs: the caller's tensors must come back as given."""
    from numcheck.properties.linear_ce.harness import run_impl

    mutant = next(m for m in MUTANTS if m.name == "mutant_target_clamped_in_place")
    with pytest.raises(ProtocolViolation, match="modified its input 'target' in place"):
        run_impl(mutant, Problem(N=8, H=16, V=24, ignored=0.5, seed=1))


def test_upstream_gradient_modified_in_place_is_named():
    """run_impl names an upstream gradient that backward changed in place, though every output is right for the
    call (a caller reusing that tensor, as a loss scaler does, gets a wrong one)."""
    from numcheck.properties.linear_ce.harness import run_impl
    from numcheck.tests.self.helpers.mutants import upstream_divided_in_place

    p = Problem(N=8, H=16, V=24, ignored=0.25, upstream="scalar", seed=6)
    with pytest.raises(ProtocolViolation, match="modified its input 'upstream gradient' in place"):
        run_impl(upstream_divided_in_place, p)


# -- bug classes: each mutant is caught by the ci profile (numcheck.check, one property) ------------
from numcheck.tests.self.helpers import mutants as _m  # noqa: E402


def ci_verdict(mutant, prop: str):
    """``numcheck.check``'s verdict of suite property ``prop`` on ``mutant`` under the ci profile (same draws, same
    budget), without the shrink phase: the first failing draw decides, and shrinking it only costs time."""
    from hypothesis import settings

    from numcheck.properties.check import _run_drawn
    from numcheck.properties.linear_ce.suite import SUITE

    base = settings(settings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    return _run_drawn(SUITE[prop], mutant, base)


#: mutant → the property of the suite that catches it under the ci profile (the detection table, docs/detection.md).
CI_CATCHES = {
    _m.gw_bf16_sum: "accuracy_fp32_sharp",
    _m.gb_bf16_sum: "accuracy_fp32_sharp",
    _m.gx_bf16_sum: "accuracy_fp32_sharp",
    _m.loss_bf16_sum: "accuracy_fp32_sharp",
    _m.row_order_per_call: "determinism",
    _m.chunk_order_per_call: "determinism",
    _m.row_loss_bf16: "accuracy_fp32_sharp",
    _m.stats_bf16: "accuracy_fp32_sharp",
    # One-dtype declarations: their bound carries that dtype's logits and G; 257 one-row chunks on the post_norm
    # covering row make the running sum's K roundings show (chunks.MANY_CHUNKS).
    _m.gw_bf16_sum_bf16_only: "many_chunks",
    _m.gw_fp16_sum_fp16_only: "many_chunks",
    # grad_x's running sum over 128-class blocks: large_vocab's bf16 head row (a tokenizer's V ≥ 128256, ≥ 1002
    # blocks, past bf16's stagnation; rows sharing a mean direction: problems.HEAD_MEAN_RATIO, strategies.HEAD_V).
    _m.gx_bf16_sum_bf16_only: "large_vocab",
}


@pytest.mark.parametrize("mutant", list(CI_CATCHES), ids=[m.name for m in CI_CATCHES])
def test_ci_profile_catches_issue19_mutant(mutant):
    """The ci profile's run of the one property that judges the mutant's bug class fails it."""
    v = ci_verdict(mutant, CI_CATCHES[mutant])
    assert v.status == "failed", v


def test_chunk_order_per_call_is_caught_on_several_chunks():
    """What would catch the per-call chunk order: determinism on a layout of several chunks (4 rows a chunk)."""
    from numcheck.properties.linear_ce.props import determinism

    p = Problem(N=64, H=16, V=24, seed=1)  # 16 chunks: two calls share an order with probability 1/16!
    mutant = _m.chunk_order_per_call.with_chunk_rows(4)
    accuracy(mutant, p)
    with pytest.raises(PropertyFailure, match="differs between two identical runs"):
        determinism(mutant, p)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_unmutated_twin_is_the_builtin(reduction, dtype):
    """With no mutation, a mutant's twin gives the built-in's outputs bitwise (each mutant changes one thing)."""
    import torch

    from numcheck.impls.registry import builtin
    from numcheck.properties.linear_ce.harness import OUTPUTS, run_impl

    p = Problem(
        N=10,
        H=16,
        V=300,
        dtype=dtype,
        bias=True,
        reduction=reduction,
        ignored=0.25,
        upstream="per_row" if reduction == "none" else "scalar",
        seed=3,
    )
    for name, twin in (
        ("chunked[fp32_operands]", _m._builtin_twin("twin", _m.Mutation())),
        ("recompute", _m._builtin_twin("twin", _m.Mutation(), recompute=True)),
    ):
        ours, theirs = run_impl(twin.with_chunk_rows(3), p), run_impl(builtin(name).with_chunk_rows(3), p)
        assert twin.support == builtin(name).support
        for k in OUTPUTS:
            assert (ours.get(k) is None) == (theirs.get(k) is None), (name, k)
            if theirs.get(k) is not None:
                assert torch.equal(ours.get(k), theirs.get(k)), (name, k)
