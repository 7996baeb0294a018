"""Hypothesis strategies for the FP8 properties: cases inside an impl's declaration, tensors, amaxes.

Sizes are drawn from edge-heavy lists (K not a multiple of 16, 32 or 128, partial blocks in every
dimension) capped by ``NUMCHECK_FP8_MAX_DIM`` (default 208) to keep the float64 oracle cheap, each rounded up to the
multiple the impl declares for its dimension (``dim_multiple``, :mod:`~numcheck.properties.fp8.shapes`): the
draws keep every edge the multiple allows (33 rows stay a partial 32-block under 16, not under 32).
"""

from __future__ import annotations

import os

import torch
from hypothesis import strategies as st

from numcheck.properties.core.device import DEVICE
from numcheck.properties.fp8.cases import QUANT_REGIMES, DrawnTensor, Fp8Case, scale_block
from numcheck.properties.fp8.shapes import fitted_sizes, multiples
from numcheck.reference.fp8_formats import FP32_MAX

MAX_DIM = int(os.environ.get("NUMCHECK_FP8_MAX_DIM", "208"))
if MAX_DIM < 16:
    raise ValueError(f"NUMCHECK_FP8_MAX_DIM={MAX_DIM} must be at least 16")

#: Dimension edges: 1, below/at/above 16, 32 and 128, and odd sizes.
_M_EDGES = (1, 3, 16, 31, 32, 33, 64, 127, 128, 130, 160)
_K_EDGES = (8, 16, 24, 32, 40, 48, 72, 96, 128, 136, 160, 200)
_N_EDGES = (1, 8, 16, 17, 32, 48, 96, 128, 129, 144)
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
#: The ``block_exponents`` regime's sizes, by the recipe's scale block b (:func:`~properties.fp8.cases.scale_block`):
#: rows (M, N) of two or three blocks, so block grids are at least 2×2 and a transposed scale index is another
#: block; K = b × odd (96, 160; 384 = 3 × 128) and K = m·2^j with m odd and 2^j < b (48, 80, 112; 144, 160, 192,
#: 208: a multiple of every split below the block, not of the block: FBGEMM #6159). A few blocks each, past
#: ``NUMCHECK_FP8_MAX_DIM`` only for 384 (three 128-blocks), so the oracle stays cheap.
SCALE_ROWS: dict[int, tuple[int, ...]] = {32: (40, 65, 95), 128: (136, 200)}
SCALE_K: dict[int, tuple[int, ...]] = {32: (48, 80, 96, 112, 160), 128: (144, 160, 192, 208, 384)}


def _sizes(edges: tuple[int, ...], m: int) -> tuple[int, ...]:
    """The edges at most ``NUMCHECK_FP8_MAX_DIM``, rounded up to multiples of ``m`` (the declared ``dim_multiple``)."""
    return fitted_sizes(tuple(e for e in edges if e <= MAX_DIM) or (MAX_DIM,), m, MAX_DIM)


def grid_sizes(support, recipe) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The ``(M, K, N)`` sizes the ``block_exponents`` regime draws for ``recipe`` inside ``support``'s shapes: rows of
    :data:`SCALE_ROWS` rounded up to the declared multiples, K of :data:`SCALE_K` that are multiples of the declared
    one (each K keeps its form, b × odd or m·2^j below b), or, where none is, rounded up."""
    m, b = multiples(support), scale_block(recipe)
    ks = tuple(k for k in SCALE_K[b] if k % m["K"] == 0) or fitted_sizes(SCALE_K[b], m["K"])
    return fitted_sizes(SCALE_ROWS[b], m["M"]), ks, fitted_sizes(SCALE_ROWS[b], m["N"])


def drawn_shapes(support, recipe) -> list[tuple[int, int, int]]:
    """Every ``(M, K, N)`` :func:`fp8_cases` can draw for ``recipe`` inside ``support``'s shapes."""
    m = multiples(support)
    edges = (_sizes(_M_EDGES, m["M"]), _sizes(_K_EDGES, m["K"]), _sizes(_N_EDGES, m["N"]))
    return [
        (a, b, c)
        for sizes in (edges, grid_sizes(support, recipe))
        for a in sizes[0]
        for b in sizes[1]
        for c in sizes[2]
    ]


#: The ``same_sign`` regime's sizes where the impl declares a truncating or promoted accumulation on the device:
#: K spans five and six chains of its ``accum_chunk`` (of 128 where it declares one chain: a chain that long), each
#: K with a partial last step (40 and 8 past a multiple of 32), so a chain restart dropped shows on y: Hopper's
#: fast-accumulation chain run where 128-long chains are declared errs 1.3–2.9× their bound at K = 680 (1.1–1.8× at
#: 520); M and N small (the oracle and a pure-Python GEMM model stay cheap), so dgrad and wgrad reduce briefly.
CHAIN_ROWS, CHAIN_COLS = (3, 16, 31), (8, 17)


def chain_k(support, device: str) -> tuple[int, ...]:
    """The ``same_sign`` regime's K for ``support`` on ``device`` (:data:`CHAIN_ROWS`)."""
    _, chunk = support.accumulation(device)
    c = chunk or 128
    return (5 * c + 40, 6 * c + 8)


def declares_chain(support, device: str) -> bool:
    """Whether ``support`` declares on ``device`` an accumulation whose chains the ``same_sign`` sizes test: truncating
    block steps (``accum_block``) or promotion to fp32 every ``accum_chunk`` products."""
    return support.accumulation_block(device) is not None or support.accumulation(device)[1] is not None


@st.composite
def fp8_cases(
    draw: st.DrawFn,
    support,
    *,
    regimes: tuple[str, ...] = QUANT_REGIMES,
    device: str | None = None,
    save_original_input: bool | None = None,
    require_soi: bool = False,
) -> Fp8Case:
    """A :class:`Fp8Case` inside ``support`` (recipe, dtype, bias, mode all declared).

    ``require_soi`` draws only recipes that allow save_original_input (for the mode-comparison properties).
    ``device``: where the case's tensors live; the suite's device (``NUMCHECK_DEVICE``) when not given.
    """
    device = device or DEVICE
    recipes = [r for r in support.recipes if not require_soi or r.allows_save_original_input]
    if not recipes:
        raise ValueError("fp8_cases: the support declares no recipe that allows save_original_input")
    recipe = draw(st.sampled_from(recipes), label="recipe")
    dtypes = sorted((d for d in support.dtypes if d in _DTYPE_NAMES), key=str)
    dtype = draw(st.sampled_from([_DTYPE_NAMES[d] for d in dtypes]), label="dtype")
    m = multiples(support)
    M = draw(st.sampled_from(_sizes(_M_EDGES, m["M"])), label="M")
    K = draw(st.sampled_from(_sizes(_K_EDGES, m["K"])), label="K")
    N = draw(st.sampled_from(_sizes(_N_EDGES, m["N"])), label="N")
    bias = draw(st.booleans(), label="bias") if support.bias else False
    regime = draw(st.sampled_from(regimes), label="regime")
    if regime == "block_exponents":  # a grid of a few blocks each way, K = b × odd or m·2^j (SCALE_K)
        rows, ks, cols = grid_sizes(support, recipe)
        M, N = draw(st.sampled_from(rows), label="M_blocks"), draw(st.sampled_from(cols), label="N_blocks")
        K = draw(st.sampled_from(ks), label="K_blocks")
    if regime == "same_sign" and declares_chain(support, device):  # several chains along K (CHAIN_ROWS)
        M = draw(st.sampled_from(fitted_sizes(CHAIN_ROWS, m["M"])), label="M_chain")
        N = draw(st.sampled_from(fitted_sizes(CHAIN_COLS, m["N"])), label="N_chain")
        K = draw(st.sampled_from(fitted_sizes(chain_k(support, device), m["K"])), label="K_chains")
    seed = draw(st.integers(0, 2**16), label="seed")
    if save_original_input is None:
        modes = [m for m in sorted(support.save_original_input) if not m or recipe.allows_save_original_input]
        soi = draw(st.sampled_from(modes), label="save_original_input")
    else:
        soi = save_original_input
    steps = draw(st.integers(1, 3), label="steps") if recipe.kind == "delayed" else 1
    return Fp8Case(
        recipe,
        M,
        K,
        N,
        dtype=dtype,
        bias=bias,
        regime=regime,
        seed=seed,
        save_original_input=soi,
        steps=steps,
        device=device,
    )


@st.composite
def fp8_tensor_specs(draw: st.DrawFn, *, max_rows: int = 64, max_cols: int = 96, dtype: str = "float32") -> DrawnTensor:
    """The :class:`~numcheck.properties.fp8.cases.DrawnTensor` of a 2-D float32 tensor (exact in ``dtype``, which it
    will be cast to, where edge values are planted) whose rows span many binades, with zeros, signed zeros, ties
    and specials, and in two draws of three values a few ulps either side of an FP8 format's largest finite value
    times a power of two (448·2^k, 57344·2^k): one element, or one in every 32-element run of every row with the
    rest of the row below half of it (:func:`numcheck.properties.fp8.cases.plant_scale_edges`: every block's amax
    at an edge). As a block's amax such a value lands a scale's log2 just beside an integer, where an E8M0 or
    power-of-2 scale computed through a rounded log2 or a division picks the wrong exponent, and amax·scale on or
    just past the format maximum, where the cast must saturate. A printable value, so a failure's repro line
    rebuilds the very tensor (:meth:`DrawnTensor.build`)."""
    R = draw(st.integers(1, max_rows), label="rows")
    C = draw(st.integers(1, max_cols), label="cols")
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    spread = draw(st.sampled_from([0, 6, 20, 60]), label="binade_spread")
    magnitude = draw(st.integers(-140, 120), label="magnitude_exp")
    n_special = draw(st.integers(0, 3), label="n_special")
    values = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-40, 448.0, 464.0, 57344.0, 61440.0]
    specials = []
    for _ in range(n_special):
        v = draw(st.sampled_from(values), label="special")
        specials.append((draw(st.integers(0, R - 1)), draw(st.integers(0, C - 1)), v))
    edges = draw(st.sampled_from(["none", "one element", "every block"]), label="amax_at_scale_boundary")
    fmt_max, boundary = 448.0, None
    if edges != "none":
        fmt_max = draw(st.sampled_from([448.0, 57344.0]), label="boundary_format_max")
    if edges == "one element":
        exp = draw(st.integers(-20, 20), label="boundary_exp")
        ulps = draw(st.sampled_from([-2, -1, 1, 2]), label="boundary_ulps")
        i, j = draw(st.integers(0, R - 1), label="boundary_row"), draw(st.integers(0, C - 1), label="boundary_col")
        boundary = (exp, ulps, i, j, draw(st.sampled_from([1.0, -1.0]), label="boundary_sign"))
    return DrawnTensor(R, C, seed, spread, magnitude, tuple(specials), edges, fmt_max, boundary, dtype)


def fp8_test_tensors(
    *, max_rows: int = 64, max_cols: int = 96, dtype: str = "float32"
) -> st.SearchStrategy[torch.Tensor]:
    """The tensors of :func:`fp8_tensor_specs` (the same draws), built."""
    return fp8_tensor_specs(max_rows=max_rows, max_cols=max_cols, dtype=dtype).map(DrawnTensor.build)


def amaxes() -> st.SearchStrategy[float]:
    """amax values for the scale rules: 0, inf, NaN, binary32 subnormals, and positive binary32 floats."""
    return st.one_of(
        st.sampled_from(
            [0.0, float("inf"), float("nan"), 1e-45, 2.0**-149, 2.0**-127, 1.17e-38, FP32_MAX, 448.0, 57344.0]
        ),
        st.floats(min_value=0.0, max_value=FP32_MAX, allow_nan=False, allow_infinity=False, width=32),
    )
