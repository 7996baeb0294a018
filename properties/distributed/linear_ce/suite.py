"""Running one distributed property under hypothesis for an impl, as the suite and the mutant self tests do:
the impl's budget of examples, each one :class:`~numcheck.properties.distributed.linear_ce.props.DistCase`, a timeout or a
killed rank latched (:class:`~numcheck.properties.distributed.pool.pool.FailureLatch`) and raised once after hypothesis'
loop, so hypothesis never shrinks through timeouts. Draws a known divergence covers are rejected
(:data:`DIST_KNOWN`). Every draw is logged under ``NUMCHECK_DRAWN_LOG``
(:mod:`numcheck.properties.core.drawn_log`)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

import numcheck.properties.core.profiles  # noqa: F401 - registers the profiles run_property names
from numcheck.properties.core.draw_isolation import isolated_draws
from numcheck.properties.distributed.pool.pool import FailureLatch
from numcheck.properties.distributed.linear_ce.props import DistCase, dist_world_size_invariance, invariance_cases
from numcheck.properties.distributed.linear_ce.strategies import draw_case
from numcheck.properties.core.drawn_log import recorded
from numcheck.properties.core.problems import build
from numcheck.properties.distributed.linear_ce.known import CASE_KNOWN

#: Known divergences of distributed impls: ``(impl name, reason, covers(case) -> bool)``; the evidence is named in
#: the reason.
DIST_KNOWN: tuple[tuple[str, str, Callable[[DistCase], bool]], ...] = (
    (
        "megatron_vocab_parallel",
        "megatron-core 0.16.1's vocab_parallel_cross_entropy smooths with the local shard's size and mean "
        "(vocab_size = exp_logits.size(-1), log_probs.mean(-1), never all-reduced): at world size > 1 with "
        "label_smoothing each rank returns a different loss (docs/evidence/megatron_smoothing.txt)",
        lambda c: c.world_size > 1 and c.problem.label_smoothing > 0,
    ),
    (
        "megatron_vocab_parallel",
        "megatron-core 0.16.1's vocab_parallel_cross_entropy smooths with torch.log of its fp32 softmax: a class whose "
        "probability underflows to 0 gives log 0 = -inf and an infinite loss, where Σ −log p_j = Σ (lse − z_j) is "
        "finite (docs/evidence/megatron_smoothing_underflow.txt)",
        lambda c: c.problem.label_smoothing > 0 and softmax_underflows(c),
    ),
    *((d.impl, d.reason, d.holds) for d in CASE_KNOWN),  # third-party release ranges, each checked strictly
)


def softmax_underflows(case: DistCase) -> bool:
    """Whether a non-ignored row of ``case``'s logits (in the compute dtype, upcast to fp32 as the adapter does) has
    a class whose fp32 softmax probability is exactly 0."""
    t = build(case.problem)
    z = torch.nn.functional.linear(t.x, t.weight, t.bias.to(t.weight.dtype) if t.bias is not None else None).float()
    valid = t.target != t.options.ignore_index
    return bool((torch.softmax(z[valid], dim=-1) == 0).any())


def known_divergence(impl: Any, case: DistCase) -> str | None:
    """The reason of a known divergence covering ``case`` for ``impl``, or ``None``."""
    return next((why for name, why, covers in DIST_KNOWN if name == impl.name and covers(case)), None)


def run_property(
    prop: Callable[..., dict[str, float]],
    impl: Any,
    world_size: int,
    profile: str,
    share: float = 1.0,
    shrink: bool = True,
) -> None:
    """``prop`` on ``share`` of hypothesis profile ``profile``'s examples (at least 2) at ``world_size`` (for
    world-size invariance: the layout its targets follow); raises the first failure (a latched one after
    hypothesis' loop). A draw is rejected where a known divergence covers any world size the property runs.
    ``shrink=False`` leaves out hypothesis' shrink phase (a self test that only asserts a failure is found)."""
    latch = FailureLatch()
    base = settings.get_profile(profile)
    phases = base.phases if shrink else tuple(p for p in base.phases if p is not Phase.shrink)

    @settings(base, max_examples=max(2, int(base.max_examples * share)), phases=phases)
    @given(data=st.data())
    def body(data: Any) -> None:
        with recorded(data, f"{prop.__name__}[world_size={world_size}]", impl) as drawing:
            case = draw_case(impl, drawing, world_size, cancelling=prop is dist_world_size_invariance)
        runs = invariance_cases(impl, case) if prop is dist_world_size_invariance else [case]
        assume(all(known_divergence(impl, c) is None for c in runs))
        prop(impl, case, latch)

    # One derandomized seed per (property, impl, world size), as numcheck.check keys its runs: every property
    # runs this same function, so they would otherwise all draw one sequence; and no constant of the loaded local
    # modules mixed into the draws (numcheck's own, in a checkout, would pick a choice list's index 2 far more often).
    body.hypothesis.inner_test._hypothesis_internal_add_digest = (
        f"numcheck.dist|{prop.__name__}|{impl.name}|{world_size}".encode()
    )
    with isolated_draws():
        body()
    latch.raise_if_failed()
