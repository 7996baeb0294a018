"""Running one distributed property under hypothesis for an impl, as the suite and the mutant self tests do:
the impl's budget of examples, each one :class:`~numcheck.properties.dist_linear_ce.DistCase`, a timeout or a
killed rank latched (:class:`~numcheck.properties.dist_harness.FailureLatch`) and raised once after hypothesis'
loop, so hypothesis never shrinks through timeouts. Draws a known divergence covers are rejected
(:data:`DIST_KNOWN`)."""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from numcheck.properties.dist_harness import FailureLatch
from numcheck.properties.dist_linear_ce import DistCase, dist_world_size_invariance, invariance_cases
from numcheck.properties.dist_strategies import draw_case

#: Known divergences of distributed impls: ``(impl name, reason, covers(case) -> bool)``; the evidence is named in
#: the reason.
DIST_KNOWN: tuple[tuple[str, str, Callable[[DistCase], bool]], ...] = (
    ("megatron_vocab_parallel",
     "megatron-core 0.16.1's vocab_parallel_cross_entropy smooths with the local shard's size and mean "
     "(vocab_size = exp_logits.size(-1), log_probs.mean(-1), never all-reduced): at world size > 1 with "
     "label_smoothing each rank returns a different loss (docs/evidence/megatron_smoothing.txt)",
     lambda c: c.world_size > 1 and c.problem.label_smoothing > 0),
)


def known_divergence(impl: Any, case: DistCase) -> str | None:
    """The reason of a known divergence covering ``case`` for ``impl``, or ``None``."""
    return next((why for name, why, covers in DIST_KNOWN if name == impl.name and covers(case)), None)


def run_property(prop: Callable[..., dict[str, float]], impl: Any, world_size: int, profile: str,
                 share: float = 1.0, shrink: bool = True) -> None:
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
        case = draw_case(impl, data, world_size)
        runs = invariance_cases(impl, case) if prop is dist_world_size_invariance else [case]
        assume(all(known_divergence(impl, c) is None for c in runs))
        prop(impl, case, latch)

    body()
    latch.raise_if_failed()
