"""Running one distributed property under hypothesis for an impl, as the suite and the mutant self tests do:
the impl's budget of examples, each one :class:`~numcheck.properties.distributed.linear_ce.cases.DistCase`, a timeout or a
killed rank latched (:class:`~numcheck.properties.distributed.pool.pool.FailureLatch`) and raised once after hypothesis'
loop, so hypothesis never shrinks through timeouts. Draws a known divergence of every output covers are rejected
(:data:`~numcheck.properties.distributed.linear_ce.known.DIST_KNOWN`). Every draw is logged under ``NUMCHECK_DRAWN_LOG``
(:mod:`numcheck.properties.core.drawn_log`)."""

from __future__ import annotations

import re
from typing import Any, Callable

from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

import numcheck.properties.core.profiles  # noqa: F401 - registers the profiles run_property names
from numcheck.impls.protocols.dist_linear_ce import DIST_KIND
from numcheck.properties.core.draw_isolation import isolated_draws
from numcheck.properties.core.drawn_log import recorded
from numcheck.properties.core.family import RankedSuite
from numcheck.properties.distributed.linear_ce.cases import DistCase
from numcheck.properties.distributed.linear_ce.known import whole_case_divergence
from numcheck.properties.distributed.linear_ce.props import dist_world_size_invariance, invariance_cases
from numcheck.properties.distributed.linear_ce.strategies import draw_case
from numcheck.properties.distributed.pool.pool import FailureLatch


class EveryDrawKnown(Exception):
    """No case was judged: every draw hypothesis kept was covered by a known divergence (``reasons``, the entries
    of :data:`~numcheck.properties.distributed.linear_ce.known.DIST_KNOWN` that rejected them); the suite skips
    the test with them, as the single-device suite skips a test every draw of which is a known divergence."""

    def __init__(self, impl_name: str, world_size: int, reasons: list[str]) -> None:
        self.reasons = reasons
        listed = "; ".join(reasons)
        super().__init__(
            f"every case drawn for {impl_name} at world size {world_size} is a known divergence "
            f"(numcheck.properties.distributed.linear_ce.known): {listed}"
        )


def known_divergence(impl: Any, case: DistCase) -> str | None:
    """The reason of a known divergence of every output covering ``case`` for ``impl``, or ``None``."""
    d = whole_case_divergence(impl, case)
    return d.reason if d is not None else None


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
    hypothesis' loop). A draw is rejected where a known divergence covers any world size the property runs; when
    no draw was judged and known divergences rejected them, raises :class:`EveryDrawKnown`. ``shrink=False`` leaves
    out hypothesis' shrink phase (a self test that only asserts a failure is found)."""
    latch = FailureLatch()
    reasons: dict[str, None] = {}  # the known divergences that rejected draws, in order
    judged: list[bool] = []
    base = settings.get_profile(profile)
    phases = base.phases if shrink else tuple(p for p in base.phases if p is not Phase.shrink)

    @settings(base, max_examples=max(2, int(base.max_examples * share)), phases=phases)
    @given(data=st.data())
    def body(data: Any) -> None:
        with recorded(data, f"{prop.__name__}[world_size={world_size}]", impl) as drawing:
            case = draw_case(impl, drawing, world_size, cancelling=prop is dist_world_size_invariance)
        runs = invariance_cases(impl, case) if prop is dist_world_size_invariance else [case]
        covered = [r for c in runs if (r := known_divergence(impl, c)) is not None]
        if covered:
            reasons.setdefault(covered[0], None)
        assume(not covered)
        judged.append(True)
        prop(impl, case, latch)

    # One derandomized seed per (property, impl, world size), as numcheck.check keys its runs: every property
    # runs this same function, so they would otherwise all draw one sequence; and no constant of the loaded local
    # modules mixed into the draws (numcheck's own, in a checkout, would pick a choice list's index 2 far more often).
    body.hypothesis.inner_test._hypothesis_internal_add_digest = (
        f"numcheck.dist|{prop.__name__}|{impl.name}|{world_size}".encode()
    )
    with isolated_draws():
        try:
            body()
        except Unsatisfiable:
            if judged or not reasons:
                raise
            raise EveryDrawKnown(impl.name, world_size, list(reasons)) from None
    latch.raise_if_failed()


_WORLD = re.compile(r"^(\w+)\[world_size=(\d+)\]$")
#: The drawn tests a tool runs by name (:data:`RANKED`): each property at the world sizes the suite runs it.
NAMED = tuple(f"{p}[world_size={P}]" for p in ("dist_accuracy", "dist_world_size_invariance") for P in (2, 4))


def run_named(impl: Any, name: str, profile: str, shrink: bool) -> tuple[str, str]:
    """``PROPERTY[world_size=P]`` on ``impl`` under ``profile`` (tests/suite/test_distributed.py's run): its status
    and message; skipped where P cannot run here or ``impl`` does not declare it, or every draw is known."""
    from numcheck.errors import PropertyFailure
    from numcheck.properties.distributed.linear_ce.props import PROPERTIES
    from numcheck.properties.distributed.pool.pool import RankFailure, default_backend, world_size_unavailable

    m = _WORLD.match(name)
    if m is None or m.group(1) not in PROPERTIES:
        raise ValueError(f"{name!r} is no PROPERTY[world_size=P] of {sorted(PROPERTIES)}")
    P = int(m.group(2))
    why = world_size_unavailable(P, default_backend())
    if why or P not in impl.dist.world_sizes:
        return "skipped", why or f"{impl.name} declares world sizes {impl.dist.world_sizes}"
    try:
        run_property(PROPERTIES[m.group(1)], impl, P, profile, shrink=shrink)
    except (PropertyFailure, RankFailure) as exc:
        return "failed", str(exc)
    except EveryDrawKnown as exc:
        return "skipped", str(exc)
    return "passed", ""


#: The family's drawn tests by name, registered in :data:`numcheck.properties.suites.RANKED`.
RANKED = RankedSuite(DIST_KIND, lambda impl: list(NAMED), run_named)
