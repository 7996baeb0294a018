"""Hypothesis strategies of tensor-parallel FP8 cases (:class:`~numcheck.properties.distributed.tp_fp8.cases.TPFp8Case`),
drawn inside a declaration.

Shapes: every global dimension a rank shards is a multiple of 4·edge (edge: the recipe's block edge on a sharded
weight dimension, 1 for per-tensor recipes), so one case runs at P = 1, 2 and 4; the sequence M is a multiple of 4
drawn so that M/P is sometimes a multiple of 32 (MXFP8 columnwise blocks inside the shards) and sometimes not
(blocks that straddle ranks). Regimes: finite ones (``normal``, ``wide``, ``outlier``, ``scale_edge``); the
non-finite contract is the single-device suite's.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from numcheck.properties.distributed.tp_fp8.cases import SHARD_EDGE, TPFp8Case

_M = (4, 12, 36, 64, 132)
_FREE = (16, 40, 72, 128)
_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}
REGIMES: tuple[str, ...] = ("normal", "wide", "outlier", "scale_edge")


@st.composite
def tp_fp8_cases(
    draw: st.DrawFn,
    support: Any,
    *,
    world: int | None = None,
    parallel: str | None = None,
    sequence_parallel: bool | None = None,
    save_original_input: bool | None = None,
    kinds: tuple[str, ...] | None = None,
) -> TPFp8Case:
    """A :class:`TPFp8Case` inside ``support`` (the keywords pin a field)."""
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
    return TPFp8Case(
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
