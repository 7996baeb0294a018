"""The drawn tensor-parallel FP8 tests, as data: each test's property and pins over the cases of
:mod:`numcheck.properties.distributed.tp_fp8.strategies`, and one runner shared by the suite
(``tests/suite/test_distributed_fp8.py``) and the mutant self tests.
"""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import given, settings

from numcheck.impls.protocols.tp_fp8_linear import TP_KIND
from numcheck.properties.core.draw_isolation import isolated_draws
from numcheck.properties.core.drawn_log import fingerprint, log_example
from numcheck.properties.core.family import RankedSuite
from numcheck.properties.distributed.pool.pool import FailureLatch
from numcheck.properties.distributed.tp_fp8 import props
from numcheck.properties.distributed.tp_fp8.cases import TPFp8Case
from numcheck.properties.distributed.tp_fp8.strategies import tp_fp8_cases


def accuracy_and_scale(impl: Any, case: TPFp8Case, latch: FailureLatch) -> None:
    """One run judged twice: :func:`~properties.distributed.tp_fp8.props.dist_accuracy` and ``dist_same_scale``."""
    res = props.run_case(impl, case, "dist_accuracy", latch)
    if res is not None:
        props.dist_accuracy(impl, case, res)
        props.dist_same_scale(impl, case, res)


def _invariance(impl: Any, case: TPFp8Case, latch: FailureLatch) -> None:
    props.world_size_invariance(impl, case)


def _soi(impl: Any, case: TPFp8Case, latch: FailureLatch) -> None:
    props.dist_save_original_input(impl, case)


#: name → (the strategy's pinned fields, the example body, examples in the ci profile). Examples are few: a case
#: costs 0.3–1.5 s of rank time at P = 4 on the loaded 2-core machine (blockwise's 512-wide shards the most).
DRAWN: dict[str, tuple[dict[str, Any], Callable[[Any, TPFp8Case, FailureLatch], None], int]] = {
    "dist_accuracy_and_same_scale": ({}, accuracy_and_scale, 8),
    "world_size_invariance": ({}, _invariance, 3),
    "dist_save_original_input": (
        {"sequence_parallel": True, "parallel": "column", "save_original_input": True},
        _soi,
        3,
    ),
}


def run_drawn(impl: Any, name: str, *, base: settings | None = None, **pinned: Any) -> None:
    """Run the drawn test ``name`` on ``impl`` under ``base`` (the loaded profile when ``None``) with its ci
    example count; raises the first (shrunk, unless ``base`` says otherwise) failure, or a latched timeout. Every
    case drawn is logged under ``NUMCHECK_DRAWN_LOG`` (:mod:`numcheck.properties.core.drawn_log`)."""
    fixed, body, n = DRAWN[name]
    kw = {**fixed, **pinned}
    if name == "dist_save_original_input" and True not in impl.support.save_original_input:
        return
    latch = FailureLatch()
    strategy = tp_fp8_cases(impl.support, **kw)

    @settings(base or settings(), max_examples=n, deadline=None)
    @given(case=strategy)
    def inner(case: TPFp8Case) -> None:
        log_example(name, impl, [fingerprint(case)])
        body(impl, case, latch)

    # One derandomized seed per (test, impl), free of the loaded modules' constants, as the linear+CE family's
    # run_property keys its draws.
    inner.hypothesis.inner_test._hypothesis_internal_add_digest = f"numcheck.tp|{name}|{impl.name}".encode()
    with isolated_draws():
        inner()
    latch.raise_if_failed()


def run_named(impl: Any, name: str, profile: str, shrink: bool) -> tuple[str, str]:
    """The drawn test ``name`` on ``impl`` under ``profile`` at its declared world sizes the backend runs here
    (pinned to the largest where some cannot run, as tests/suite/test_distributed_fp8.py does): status, message."""
    from hypothesis import Phase

    from numcheck.errors import PropertyFailure
    from numcheck.properties.distributed.pool.pool import RankFailure, default_backend, world_size_unavailable

    declared = list(impl.support.world_sizes)
    sizes = [p for p in declared if world_size_unavailable(p, default_backend()) is None]
    if not sizes:
        return "skipped", str(world_size_unavailable(min(declared), default_backend()))
    base = settings.get_profile(profile)
    base = base if shrink else settings(base, phases=[p for p in base.phases if p is not Phase.shrink])
    try:
        run_drawn(impl, name, base=base, **({} if sizes == declared else {"world": max(sizes)}))
    except (PropertyFailure, RankFailure) as exc:
        return "failed", str(exc)
    return "passed", ""


#: The family's drawn tests by name, registered in :data:`numcheck.properties.suites.RANKED`.
RANKED = RankedSuite(TP_KIND, lambda impl: list(DRAWN), run_named)
