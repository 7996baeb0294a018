"""Hypothesis strategies for the grouped FP8 properties: cases inside an impl's declaration.

Split sizes are drawn one expert at a time from edge-heavy lists (1, block edges ± 1 for the 32- and 128-row
columnwise blocks, odd sizes) rounded up to the declared ``split_alignment``, with empty experts where declared, so
uneven and unaligned splits meet every recipe; G from 1 to :data:`MAX_EXPERTS` (and the declared
``max_experts``); K and N from the single linear's edges, multiples of ``feature_alignment``. The total rows stay
at most :data:`MAX_ROWS` so the float64 oracle stays cheap (``NUMCHECK_FP8_MAX_DIM`` caps the single sizes). A shape
regime the alignments rule out (:data:`GROUPED_SHAPE_REGIMES`) is skipped by the suite naming the field.

On CUDA the shapes come from a small fixed set instead (:data:`CUDA_SPLITS`: per recipe block, two expert multisets of
five, drawn in any order, and two ``(K, N)``), where every shape regime above still lies, empty experts and experts of
exactly one block included: a GPU impl's Triton kernels autotune per new token count, expert count, K and N. The CPU
draws are as before, draw for draw.
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


#: On CUDA the draws take a fixed set of shapes (:func:`cuda_splits`, :func:`cuda_features`): a GPU impl's Triton kernels
#: (torchao's MoE grouped GEMM) compile and autotune per new token count, expert count, K and N (its kernels' autotune
#: keys), 105 s for a worker's first call on an H100 and again for each new shape, so the CPU's edge-heavy draws would
#: spend a GPU run autotuning. Per the recipe's scale block b, two expert multisets of the same G, drawn in any order:
#: an exactly-one-block expert (b: DeepGEMM #365), a block and a bit (b + 8), a partial block (33), one row, and an
#: empty expert where declared or b − 1 rows; each size rounded up to ``split_alignment`` (an undeclared empty expert
#: gets ``split_alignment`` rows), the first ``max_experts`` where declared (the first two hold the one-block expert and
#: the empty one).
CUDA_SPLITS: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {
    b: ((b, 0, 33, b + 8, 1), (b, b - 1, 33, b + 8, 1)) for b in (32, 128)
}


def on_cuda(device: str | None) -> bool:
    """Whether draws for ``device`` (the suite's device when ``None``) take :data:`CUDA_SPLITS` and
    :func:`cuda_features`."""
    return str(device or DEVICE).split(":", 1)[0] == "cuda"


def cuda_splits(support, recipe: Fp8Recipe, empty: bool | None) -> tuple[tuple[int, ...], ...]:
    """The expert multisets CUDA draws take for ``recipe`` inside ``support``'s split rules (:data:`CUDA_SPLITS`):
    the one with an empty expert where ``empty`` is ``True`` and the rules allow it, the other where ``empty`` is
    ``False`` or they do not, either one where ``empty`` is ``None``."""
    a, g = support.split_alignment, support.max_experts or MAX_EXPERTS
    with_empty, without = (tuple(-(-m // a) * a for m in ms[:g]) for ms in CUDA_SPLITS[scale_block(recipe)])
    if not support.empty_splits or g < 2 or empty is False:
        return (without,)
    return (with_empty,) if empty else (with_empty, without)


@st.composite
def cuda_shapes(draw: st.DrawFn, support, recipe: Fp8Recipe, empty: bool | None) -> tuple[tuple[int, ...], int, int]:
    """``(m_splits, K, N)`` from the fixed set CUDA draws take (:data:`CUDA_SPLITS` in a drawn order,
    :func:`cuda_features`)."""
    splits = draw(st.sampled_from(cuda_splits(support, recipe, empty)), label="cuda_splits")
    order = draw(st.permutations(range(len(splits))), label="cuda_expert_order")
    K, N = draw(st.sampled_from(cuda_features(support, recipe)), label="cuda_K_N")
    return tuple(splits[i] for i in order), K, N


def cuda_features(support, recipe: Fp8Recipe) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two ``(K, N)`` CUDA draws take for ``recipe``: K of the ``block_exponents`` regime's two forms
    (:func:`grid_ks`: m·2^j below the block, then block × odd; the first and last where the declared
    ``feature_alignment`` leaves a form none), each with another N of its rows (:data:`SCALE_ROWS`, aligned), so
    K ≠ N and the scale-block grids keep every form."""
    ks = grid_ks(support, recipe)
    below = next((k for k in ks if SHAPE_REGIMES["K_below_block"].holds(recipe, 1, k, 1)), ks[0])
    odd = next((k for k in ks if SHAPE_REGIMES["K_block_times_odd"].holds(recipe, 1, k, 1)), ks[-1])
    b = scale_block(recipe)
    ns = _aligned(SCALE_ROWS[b], support.feature_alignment, max(SCALE_ROWS[b]))
    return (below, ns[-1]), (odd, ns[0])


def grouped_drawn_shapes(support, recipe: Fp8Recipe, device: str | None = None) -> list[tuple[int, int, int]]:
    """Every ``(m_i, K, N)`` :func:`grouped_cases` can draw on ``device`` (the suite's when ``None``) for one expert
    under ``recipe`` inside ``support``'s rules (an expert's rows as M; empty experts left out)."""
    if on_cuda(device):
        sizes = sorted({m for ms in cuda_splits(support, recipe, None) for m in ms if m})
        return [(m, K, N) for m in sizes for K, N in cuda_features(support, recipe)]
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


def _recipes(support, require_soi: bool) -> list[Fp8Recipe]:
    """The declared recipes (those that allow save_original_input where ``require_soi``); none is an error."""
    recipes = [r for r in support.recipes if not require_soi or r.allows_save_original_input]
    if not recipes:
        raise ValueError("grouped_cases: the support declares no recipe that allows save_original_input")
    return recipes


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
    :func:`split_sizes`; ``main_grad`` forces fused wgrad accumulation on or off (where declared). On CUDA, splits, K
    and N of :func:`cuda_shapes` for every regime (``max_rows`` aside: at most 425 rows, a GPU's oracle is quick)."""
    recipe = draw(st.sampled_from(_recipes(support, require_soi)), label="recipe")
    dtype = draw(st.sampled_from(sorted(_DTYPE_NAMES[str(d)] for d in support.dtypes)), label="dtype")
    fa, cuda = support.feature_alignment, on_cuda(device)
    if cuda:  # a fixed set (CUDA_SPLITS): a GPU impl's kernels autotune per new shape
        m_splits, K, N = draw(cuda_shapes(support, recipe, empty), label="cuda_shape")
    else:
        m_splits = draw(split_sizes(support, empty=empty, max_rows=max_rows), label="m_splits")
        K = draw(st.sampled_from(_aligned(_K_EDGES, fa, MAX_DIM)), label="K")
        N = draw(st.sampled_from(_aligned(_N_EDGES, fa, MAX_DIM)), label="N")
    bias = draw(st.booleans(), label="bias") if support.bias else False
    regime = draw(st.sampled_from(regimes), label="regime")
    if regime == "block_exponents" and not cuda:  # experts of one block of tokens, a few blocks each way (SCALE_K)
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
    mg_all = sorted(support.fused_wgrad_accumulation)
    mg_modes = [main_grad] if main_grad in mg_all else mg_all
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
