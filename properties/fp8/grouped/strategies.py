"""Hypothesis strategies for the grouped FP8 properties: cases inside an impl's declaration.

Split sizes are drawn one expert at a time from edge-heavy lists (1, block edges ± 1 for the 32- and 128-row
columnwise blocks, odd sizes) rounded up to the declared ``split_alignment``, with empty experts where declared, so
uneven and unaligned splits meet every recipe; G from 1 to :data:`MAX_EXPERTS` (and the declared
``max_experts``); K and N from the single linear's edges, multiples of ``feature_alignment``. The total rows stay
at most :data:`MAX_ROWS` so the float64 oracle stays cheap (``NUMCHECK_FP8_MAX_DIM`` caps the single sizes). A shape
regime the alignments rule out (:data:`GROUPED_SHAPE_REGIMES`) is skipped by the suite naming the field.
"""

from __future__ import annotations

from hypothesis import strategies as st

from numcheck.properties.core.device import DEVICE
from numcheck.properties.fp8.cases import scale_block
from numcheck.properties.fp8.grouped.cases import GROUPED_REGIMES, GroupedCase
from numcheck.properties.fp8.shapes import SHAPE_REGIMES, ShapeRegime
from numcheck.properties.fp8.strategies import _K_EDGES, _N_EDGES, MAX_DIM, SCALE_K, SCALE_ROWS
from numcheck.reference.fp8_recipes import Fp8Recipe

#: Per-expert row counts before alignment: around the 32- and 128-row columnwise blocks, and small odd ones.
SPLIT_EDGES: tuple[int, ...] = (1, 3, 16, 31, 32, 33, 64, 127, 128, 129)
#: The ``block_exponents`` regime's expert sizes by the recipe's scale block b: exactly one block of tokens (an
#: expert of exactly 128 rows: DeepGEMM #365) and a block and a bit.
SCALE_SPLITS: dict[int, tuple[int, ...]] = {32: (32, 40), 128: (128, 136)}
MAX_EXPERTS = 5
#: The most rows a drawn case has in all.
MAX_ROWS = 320
_DTYPE_NAMES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def _aligned(edges: tuple[int, ...], a: int, cap: int) -> tuple[int, ...]:
    """``edges`` rounded up to multiples of ``a``, at most ``cap`` (at least one: ``a`` itself)."""
    out = sorted({-(-e // a) * a for e in edges if -(-e // a) * a <= cap})
    return tuple(out) or (a,)


def grid_ks(support, recipe: Fp8Recipe) -> tuple[int, ...]:
    """The ``block_exponents`` regime's K for ``recipe``: those of :data:`SCALE_K` that are multiples of the declared
    ``feature_alignment`` (each keeps its form, block × odd or m·2^j below the block), or, where none is, rounded up."""
    b, fa = scale_block(recipe), support.feature_alignment
    return tuple(k for k in SCALE_K[b] if k % fa == 0) or _aligned(SCALE_K[b], fa, max(SCALE_K[b]))


def grouped_drawn_shapes(support, recipe: Fp8Recipe) -> list[tuple[int, int, int]]:
    """Every ``(m_i, K, N)`` :func:`grouped_cases` can draw for one expert under ``recipe`` inside ``support``'s rules
    (an expert's rows as M; empty experts left out)."""
    a, fa, b = support.split_alignment, support.feature_alignment, scale_block(recipe)
    ks, ns = _aligned(_K_EDGES, fa, MAX_DIM), _aligned(_N_EDGES, fa, MAX_DIM)
    grid = (_aligned(SCALE_SPLITS[b], a, MAX_ROWS), grid_ks(support, recipe), _aligned(SCALE_ROWS[b], fa, MAX_DIM))
    return [
        (m, k, n)
        for ms, kk, nn in ((_aligned(SPLIT_EDGES, a, MAX_DIM), ks, ns), grid)
        for m in ms
        for k in kk
        for n in nn
    ]


def grouped_multiples(support) -> dict[str, tuple[str, int]]:
    """Each dimension's declared multiple with the grouped declaration field that sets it (an expert's rows as M)."""
    fa = ("feature_alignment", support.feature_alignment)
    return {"M": ("split_alignment", support.split_alignment), "K": fa, "N": fa}


#: The grouped family's shape regimes: the single linear's, an expert's rows as M, and an expert of exactly one
#: scale block of tokens (DeepGEMM #365) on the scale-block grids.
GROUPED_SHAPE_REGIMES: dict[str, ShapeRegime] = {
    **SHAPE_REGIMES,
    "expert_of_one_block": ShapeRegime(
        "an expert of exactly one scale block of tokens on the scale-block grids (DeepGEMM #365)",
        lambda r: True,
        lambda r, M, K, N: M == scale_block(r),
        ("M",),
    ),
}


@st.composite
def split_sizes(
    draw: st.DrawFn,
    support,
    *,
    empty: bool | None = None,
    max_rows: int = MAX_ROWS,
    edges: tuple[int, ...] = SPLIT_EDGES,
) -> tuple[int, ...]:
    """``m_splits`` inside ``support``'s rules from ``edges``, at most ``max_rows`` in all (about: each size is
    capped at ``max_rows // G``, G at most ``max_rows // min(edges)``); ``empty``: ``True`` at least one empty expert
    (only where declared), ``False`` none, ``None`` drawn."""
    a = support.split_alignment
    g_max = min(MAX_EXPERTS, support.max_experts or MAX_EXPERTS, max(1, max_rows // min(edges)))
    G = draw(st.integers(1 if empty is not True else 2, max(g_max, 2 if empty else 1)), label="G")
    cap = max(a, max_rows // G) if edges == SPLIT_EDGES else max(a, max_rows // G, min(edges))
    sizes = _aligned(edges, a, min(MAX_DIM, cap) if edges == SPLIT_EDGES else cap)
    allow_empty = support.empty_splits and empty is not False
    choices = ((0,) if allow_empty else ()) + sizes
    splits = [draw(st.sampled_from(choices), label=f"m_{i}") for i in range(G)]
    if empty and support.empty_splits and 0 not in splits:
        splits[draw(st.integers(0, G - 1), label="empty_expert")] = 0
    if not any(splits):
        splits[-1] = sizes[0]
    return tuple(splits)


@st.composite
def grouped_cases(
    draw: st.DrawFn,
    support,
    *,
    regimes: tuple[str, ...] = GROUPED_REGIMES,
    device: str | None = None,
    save_original_input: bool | None = None,
    require_soi: bool = False,
    empty: bool | None = None,
    main_grad: bool | None = None,
    max_rows: int = MAX_ROWS,
) -> GroupedCase:
    """A :class:`GroupedCase` inside ``support`` (recipe, dtype, splits, dimensions, bias, weight form, mode and
    ``main_grad`` all declared). ``require_soi`` draws only recipes that allow save_original_input; ``empty`` as for
    :func:`split_sizes`; ``main_grad`` forces fused wgrad accumulation on or off (where declared)."""
    recipes = [r for r in support.recipes if not require_soi or r.allows_save_original_input]
    if not recipes:
        raise ValueError("grouped_cases: the support declares no recipe that allows save_original_input")
    recipe = draw(st.sampled_from(recipes), label="recipe")
    dtype = draw(st.sampled_from(sorted(_DTYPE_NAMES[str(d)] for d in support.dtypes)), label="dtype")
    m_splits = draw(split_sizes(support, empty=empty, max_rows=max_rows), label="m_splits")
    fa = support.feature_alignment
    K = draw(st.sampled_from(_aligned(_K_EDGES, fa, MAX_DIM)), label="K")
    N = draw(st.sampled_from(_aligned(_N_EDGES, fa, MAX_DIM)), label="N")
    bias = draw(st.booleans(), label="bias") if support.bias else False
    regime = draw(st.sampled_from(regimes), label="regime")
    if regime == "block_exponents":  # experts of one block of tokens, a few blocks each way (strategies.SCALE_K)
        b = scale_block(recipe)
        m_splits = draw(split_sizes(support, empty=empty, max_rows=max_rows, edges=SCALE_SPLITS[b]), label="m_blocks")
        K = draw(st.sampled_from(grid_ks(support, recipe)), label="K_blocks")
        N = draw(st.sampled_from(_aligned(SCALE_ROWS[b], fa, max(SCALE_ROWS[b]))), label="N_blocks")
    seed = draw(st.integers(0, 2**16), label="seed")
    if save_original_input is None:
        modes = [m for m in sorted(support.save_original_input) if not m or recipe.allows_save_original_input]
        soi = draw(st.sampled_from(modes), label="save_original_input")
    else:
        soi = save_original_input
    steps = draw(st.integers(1, 3), label="steps") if recipe.kind == "delayed" else 1
    weights = draw(st.sampled_from(sorted(support.weight_layouts)), label="weights")
    mg_modes = sorted(support.fused_wgrad_accumulation)
    if main_grad is not None:
        mg_modes = [main_grad] if main_grad in mg_modes else mg_modes
    mg = draw(st.sampled_from(mg_modes), label="main_grad")
    return GroupedCase(
        recipe,
        m_splits,
        K,
        N,
        dtype=dtype,
        bias=bias,
        regime=regime,
        seed=seed,
        save_original_input=soi,
        steps=steps,
        weights=weights,
        main_grad=mg,
        device=device or DEVICE,
    )
