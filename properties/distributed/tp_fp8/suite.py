"""The drawn tensor-parallel FP8 tests, as data: cases inside a declaration, and one runner shared by the suite
(``tests/suite/test_distributed_fp8.py``) and the mutant self tests.

Shapes: every global dimension a rank shards is a multiple of 4·edge (edge: the recipe's block edge on a sharded
weight dimension, 1 for per-tensor recipes), so one case runs at P = 1, 2 and 4; the sequence M is a multiple of 4
drawn so that M/P is sometimes a multiple of 32 (MXFP8 columnwise blocks inside the shards) and sometimes not
(blocks that straddle ranks). Regimes: finite ones (``normal``, ``wide``, ``outlier``, ``scale_edge``); the
non-finite contract is the single-device suite's.
"""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from numcheck.properties.core.draw_isolation import isolated_draws
from numcheck.properties.distributed.tp_fp8 import props as checks
from numcheck.properties.distributed.tp_fp8.cases import SHARD_EDGE, TPQuantCase
from numcheck.properties.core.drawn_log import fingerprint, log_example
from numcheck.properties.distributed.pool.pool import FailureLatch

_M = (4, 12, 36, 64, 132)
_FREE = (16, 40, 72, 128)
_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}
REGIMES: tuple[str, ...] = ("normal", "wide", "outlier", "scale_edge")


@st.composite
def tp_quant_cases(
    draw: st.DrawFn,
    support: Any,
    *,
    world: int | None = None,
    parallel: str | None = None,
    sequence_parallel: bool | None = None,
    save_original_input: bool | None = None,
    kinds: tuple[str, ...] | None = None,
) -> TPQuantCase:
    """A :class:`TPQuantCase` inside ``support`` (the keywords pin a field)."""
    recipes = [
        r
        for r in support.recipes
        if (kinds is None or r.kind in kinds) and (not save_original_input or r.allows_save_original_input)
    ]
    recipe = draw(st.sampled_from(recipes), label="recipe")
    par = parallel or draw(st.sampled_from(sorted(support.parallel)), label="parallel")
    sp = (
        sequence_parallel
        if sequence_parallel is not None
        else draw(st.sampled_from(sorted(support.sequence_parallel)), label="sp")
    )
    soi_modes = [m for m in sorted(support.save_original_input) if not m or recipe.allows_save_original_input]
    soi = save_original_input if save_original_input is not None else draw(st.sampled_from(soi_modes), label="soi")
    P = world or draw(
        st.sampled_from([p for p in support.world_sizes if p > 1] or list(support.world_sizes)), label="world"
    )
    edge = 4 * SHARD_EDGE[recipe.kind]
    split = edge * draw(st.sampled_from((1, 2) if edge > 4 else (3, 6, 10)), label="split")
    free = draw(st.sampled_from(_FREE if par == "column" else (8, 24, 40)), label="free")
    M = draw(st.sampled_from(_M), label="M")
    K, N = (free, split) if par == "column" else (split, free)
    dtype = draw(st.sampled_from(sorted(_DTYPES[str(d)] for d in support.dtypes)), label="dtype")
    bias = draw(st.booleans(), label="bias") if support.bias else False
    return TPQuantCase(
        recipe,
        M,
        K,
        N,
        dtype,
        bias,
        draw(st.sampled_from(REGIMES), label="regime"),
        draw(st.integers(0, 2**16), label="seed"),
        soi,
        2 if recipe.kind == "delayed" else 1,
        world=P,
        parallel=par,
        sequence_parallel=sp,
    )


def accuracy_and_scale(impl: Any, case: TPQuantCase, latch: FailureLatch) -> None:
    """One run judged twice: :func:`~properties.distributed.tp_fp8.props.dist_accuracy` and ``dist_same_scale``."""
    res = checks.run_case(impl, case, "dist_accuracy", latch)
    if res is not None:
        checks.dist_accuracy(impl, case, res)
        checks.dist_same_scale(impl, case, res)


def _invariance(impl: Any, case: TPQuantCase, latch: FailureLatch) -> None:
    checks.world_size_invariance(impl, case)


def _soi(impl: Any, case: TPQuantCase, latch: FailureLatch) -> None:
    checks.dist_save_original_input(impl, case)


#: name → (the strategy's pinned fields, the example body, examples in the ci profile). Examples are few: a case
#: costs 0.3–1.5 s of rank time at P = 4 on the loaded 2-core machine (blockwise's 512-wide shards the most).
DRAWN: dict[str, tuple[dict[str, Any], Callable[[Any, TPQuantCase, FailureLatch], None], int]] = {
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
    strategy = tp_quant_cases(impl.support, **kw)

    @settings(base or settings(), max_examples=n, deadline=None)
    @given(case=strategy)
    def inner(case: TPQuantCase) -> None:
        log_example(name, impl, [fingerprint(case)])
        body(impl, case, latch)

    # One derandomized seed per (test, impl), free of the loaded modules' constants, as the linear+CE family's
    # run_property keys its draws.
    inner.hypothesis.inner_test._hypothesis_internal_add_digest = f"numcheck.tp|{name}|{impl.name}".encode()
    with isolated_draws():
        inner()
    latch.raise_if_failed()
