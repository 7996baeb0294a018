"""The report's property cases: for every property the shipped suite runs on a kind, the cases that reach its
regime from an impl's declaration alone, judged by the property library's own function for that property (the
suite's). Each kind's rows (``linear_ce_rows``, ``fp8_rows``, ...; its family names them, :mod:`reports.report.families`);
each :class:`PropertyRow` names the property as
``numcheck repro`` does, says how to build its cases from a declaration, and why an impl's declaration leaves it
out. The rows follow the suite's tests (``tests/suite/*.py``) and their regimes (``properties/**/suite.py``):

* accuracy in the regimes the suite's fixed tests pin (FP8 edge inputs: zero, non-finite, tiny and wide amax;
  multi-tile blocks whose scales differ; long same-sign chains where an accumulation with chains is declared; six
  delayed-scaling steps; ``save_original_input=True``; grouped edge splits;
  linear+CE's pinned cases, a large vocabulary, a wide hidden size, a long batch, the loss scale): accuracy records;
* every other property (bitwise mode equality, held bytes, quantizer codes, refusals, several calls sharing state or
  accumulation, empty experts after a call with rows, permutations, invariances, determinism by a second call):
  property records, pass/fail with the property's message (:func:`reports.report.schema.property_record`).

Nothing here knows any defect: a row is a property and the regime its suite test reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from numcheck.reports.report.grid import MODES, GridCase, GridSpec, NotRun, in_declared_reduction

#: (label, case) pairs a row builds for one impl.
Built = Iterable[tuple[str, Any]]


@dataclass(frozen=True)
class PropertyRow:
    """One property of a kind's suite in the report.

    Attributes:
        prop: the property as ``numcheck repro`` names it (its key in the kind's property table), ``accuracy`` for
            the accuracy rows.
        test: the suite test whose regime the row reaches (the group of its cases: ``suite:<test>``).
        build: ``(impl, spec, device)`` → the (label, case) pairs in the impl's declaration (may be empty).
        skip: ``impl`` → why its declaration leaves the property out (``None``: it runs).
    """

    prop: str
    test: str
    build: Callable[[Any, GridSpec, str], Built]
    skip: Callable[[Any], str | None] = lambda impl: None


# -- quantized linear (tests/suite/test_fp8_impls.py) -----------------------------------------------------------
def _first_dtype(support: Any, order: tuple[str, ...] = ("float32", "bfloat16", "float16")) -> str:
    names = {str(d).removeprefix("torch.") for d in support.dtypes}
    return next(n for n in order if n in names)


def _quant(impl: Any, recipe: Any, M: int, K: int, N: int, device: str, fit: bool = True, **kw: Any) -> Any:
    """The case, moved into the impl's declared shapes (``dim_multiple``: each dimension rounded up) unless ``fit`` is
    off (a shape regime it cannot reach: :func:`fp8_refused` names why)."""
    from numcheck.properties.fp8.cases import Fp8Case, declared_mode
    from numcheck.properties.fp8.shapes import fitted

    kw.setdefault("dtype", _first_dtype(impl.support))
    kw.setdefault("bias", bool(impl.support.bias))
    kw.setdefault("steps", 2 if recipe.kind == "delayed" else 1)
    kw.setdefault("save_original_input", declared_mode(impl.support))
    case = Fp8Case(recipe, M, K, N, device=device, **kw)
    return fitted(impl.support, case) if fit else case


def _recipes(impl: Any, every: bool) -> list[Any]:
    """The impl's declared recipes: all of them (``every``), else the first of each recipe kind (the quick grid's)."""
    recipes = list(impl.support.recipes)
    if every:
        return recipes
    return [next(r for r in recipes if r.kind == k) for k in dict.fromkeys(r.kind for r in recipes)]


def _edge_inputs(impl: Any, spec: GridSpec, device: str) -> Built:
    from numcheck.properties.fp8.cases import EDGE_INPUT_REGIMES

    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        for regime in EDGE_INPUT_REGIMES:
            yield f"{r.name} {regime}", _quant(impl, r, 33, 40, 24, device, regime=regime, seed=11)


def _multi_tile(impl: Any, spec: GridSpec, device: str) -> Built:
    from numcheck.properties.fp8.cases import LARGE_CASES

    low = "bfloat16" if torch.bfloat16 in impl.support.dtypes else _first_dtype(impl.support)
    cap = spec.property_max_macs or float("inf")
    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        for M, K, N, which, regime in (c for c in LARGE_CASES if c[0] * c[1] * c[2] <= cap):
            dtype = low if which == "low" else _first_dtype(impl.support)
            yield (
                f"{r.name} M{M}K{K}N{N} {regime}",
                _quant(impl, r, M, K, N, device, dtype=dtype, regime=regime, seed=12),
            )


def _grid_shapes(support: Any, recipe: Any) -> Iterator[tuple[int, int, int, bool]]:
    """``(M, K, N, fits)`` of the suite's scale-block grids for ``recipe`` in ``support``'s declared shapes
    (:func:`properties.fp8.strategies.grid_sizes`): rows of more than one block, and two K: the first that is m·2^j
    below the block (a ragged last block) and the first that is block × odd (whole blocks, more than two). A form the
    declared ``dim_multiple`` leaves no K of comes as the suite's own K, ``fits`` false (refused, with the reason)."""
    from numcheck.properties.fp8.cases import scale_block
    from numcheck.properties.fp8.shapes import SHAPE_REGIMES
    from numcheck.properties.fp8.strategies import SCALE_K, grid_sizes

    b = scale_block(recipe)
    rows, ks, cols = grid_sizes(support, recipe)
    M, N = next((m for m in rows if m > b), rows[-1]), next((n for n in cols if n > b), cols[-1])
    for form in ("K_below_block", "K_block_times_odd"):
        holds = SHAPE_REGIMES[form].holds
        K = next((k for k in ks if holds(recipe, M, k, N)), None)
        yield (M, K, N, True) if K is not None else (M, next(k for k in SCALE_K[b] if holds(recipe, M, k, N)), N, False)


def _scale_grids(impl: Any, spec: GridSpec, device: str) -> Built:
    """The suite's ``accuracy_on_scale_block_grids``: the ``block_exponents`` regime (every row, K-block and tile
    its own exponent, so a block scale read from the wrong block, the transposed tile or the previous K-block lands
    on a different exponent) on a grid of at least two blocks each way (:data:`properties.fp8.strategies.SCALE_ROWS`)
    at both K forms of :func:`_grid_shapes`, per recipe kind."""
    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        for M, K, N, fits in _grid_shapes(impl.support, r):
            yield (
                f"{r.name} M{M}K{K}N{N} block_exponents",
                _quant(impl, r, M, K, N, device, fit=fits, regime="block_exponents", seed=31),
            )


def _same_sign_chains(impl: Any, spec: GridSpec, device: str) -> Built:
    """The suite's ``accuracy_on_long_same_sign_chains`` where the impl declares on ``device`` an accumulation with
    chains (:func:`properties.fp8.strategies.declares_chain`: truncating ``accum_block`` steps or promotion every
    ``accum_chunk`` products; nothing otherwise, as the suite skips it): the ``same_sign`` regime at both K of
    :func:`~properties.fp8.strategies.chain_k` (five and six declared chains, each with a partial last step), M and N
    of the suite's chain draws (16 × 17: the oracle and a Python GEMM model stay cheap), in the first declared dtype
    (float32 first: there a chain that runs longer than declared errs most against the bound; Hopper's
    fast-accumulation chain where chains of 128 are declared at 2.4–3.4× on y, the impls computing as declared at ≤ 0.3)."""
    from numcheck.properties.fp8.strategies import CHAIN_COLS, CHAIN_ROWS, chain_k, declares_chain

    if not declares_chain(impl.support, device):
        return
    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        for K in chain_k(impl.support, device):
            case = _quant(impl, r, CHAIN_ROWS[1], K, CHAIN_COLS[-1], device, regime="same_sign", seed=41)
            yield f"{r.name} M{case.M}K{case.K}N{case.N} same_sign", case


def _delayed_steps(impl: Any, spec: GridSpec, device: str) -> Built:
    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        if r.kind == "delayed":
            yield f"{r.name} 6 steps", _quant(impl, r, 48, 64, 40, device, bias=False, steps=6, seed=2)


def _soi_recipes(impl: Any) -> list[Any]:
    if True not in impl.support.save_original_input:
        return []
    return [r for r in impl.support.recipes if r.allows_save_original_input]


def _soi_accuracy(impl: Any, spec: GridSpec, device: str) -> Built:
    for r in (r for r in _recipes(impl, spec.fp8_all_recipes_ladder) if r in _soi_recipes(impl)):
        yield f"{r.name} soi", _quant(impl, r, 33, 40, 24, device, save_original_input=True, seed=300)


def _soi_bitwise(impl: Any, spec: GridSpec, device: str) -> Built:
    for r in _recipes(impl, spec.fp8_all_recipes_ladder):  # a delayed recipe: the property checks that True is refused
        for regime in ("wide", "outlier", "zeros", "inf", "nan") if r.allows_save_original_input else ("normal",):
            yield f"{r.name} {regime}", _quant(impl, r, 64, 72, 40, device, regime=regime, seed=5, steps=1)


def _saved_tensors(impl: Any, spec: GridSpec, device: str) -> Built:
    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        yield r.name, _quant(impl, r, 33, 40, 24, device, seed=13, steps=1)


def _quantizer_codes(impl: Any, spec: GridSpec, device: str) -> Built:
    """Every code of both formats (plain and transposed), and a tensor whose every 32-element block has its amax a few
    ulps beside format_max·2^k of each format (the drawn property's planted edges, where a scale's log2 lands beside
    an integer), in the first declared dtype."""
    from numcheck.properties.fp8.cases import DrawnTensor, FormatCodes, QuantizerCase

    dtype = _first_dtype(impl.support)
    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        for fmt_max in (448.0, 57344.0):
            t = DrawnTensor(64, 96, 29, 20, 0, (), "every block", fmt_max, None, dtype)
            yield f"{r.name} block amaxes at {fmt_max:g}·2^k", QuantizerCase(r, t, dtype=dtype, device=device)

    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        for fmt in ("e4m3", "e5m2"):
            for transposed in (False, True):
                case = QuantizerCase(r, FormatCodes(fmt, transposed), device=device)
                yield f"{r.name} {fmt}{'ᵀ' if transposed else ''}", case


def _round_trip(impl: Any, spec: GridSpec, device: str) -> Built:
    from numcheck.properties.fp8.cases import FormatCodes, QuantizerCase

    for r in _recipes(impl, spec.fp8_all_recipes_ladder):
        if r.kind == "current" and not r.power_of_2_scales:
            yield r.name, QuantizerCase(r, FormatCodes(r.format_of("x").name), device=device)


def _layer(impl: Any, spec: GridSpec, device: str) -> Built:
    for soi in sorted(impl.support.save_original_input):
        for r in _recipes(impl, spec.fp8_all_recipes_ladder):
            if r.kind != "delayed" and (r.allows_save_original_input or not soi):
                case = _quant(impl, r, 33, 40, 24, device, seed=13, save_original_input=soi, steps=1)
                yield f"{r.name} {'original' if soi else 'copy'}", case


def _no_soi(impl: Any) -> str | None:
    return (
        None if True in impl.support.save_original_input else f"{impl.name} does not declare save_original_input=True"
    )


def _no_mode_pair(impl: Any) -> str | None:
    """Why the save_original_input mode comparison says nothing about ``impl`` (the suite's own skip)."""
    from numcheck.properties.fp8.suite import mode_comparison_refusal

    return mode_comparison_refusal(impl)


def _no_quantize(impl: Any) -> str | None:
    return None if impl.support.exposes_quantize else f"{impl.name} does not expose quantize"


def fp8_rows() -> tuple[PropertyRow, ...]:
    layer = tuple(PropertyRow(p, f"usage_as_a_layer_every_recipe[{p}]", _layer) for p in _LAYER)
    return (
        PropertyRow("accuracy", "edge_inputs_every_recipe", _edge_inputs),
        PropertyRow("accuracy", "multi_tile_and_long_reduction_every_recipe", _multi_tile),
        PropertyRow("accuracy", "accuracy_on_scale_block_grids", _scale_grids),
        PropertyRow("accuracy", "accuracy_on_long_same_sign_chains", _same_sign_chains),
        PropertyRow("accuracy", "delayed_scaling_over_steps", _delayed_steps),
        PropertyRow("accuracy", "accuracy_against_both_references[save_original_input]", _soi_accuracy),
        PropertyRow("save_original_input", "save_original_input_on_edge_regimes", _soi_bitwise, _no_mode_pair),
        PropertyRow("saved_tensors", "saved_tensor_aliasing_and_bytes", _saved_tensors),
        PropertyRow("quantizer", "quantizer_bitwise_on_all_256_codes", _quantizer_codes, _no_quantize),
        PropertyRow("unit_scale_round_trip", "fp8_values_round_trip_under_unit_scale", _round_trip, _no_quantize),
        *layer,
    )


_LAYER = ("accumulate", "optimizer_step", "two_layers", "strided")


# -- grouped FP8 linear (tests/suite/test_grouped_fp8.py) -------------------------------------------------------
def _grouped(impl: Any, recipe: Any, splits: tuple[int, ...], K: int, N: int, device: str, **kw: Any) -> Any:
    """The grouped case moved into the impl's split rules, or ``None`` where its declaration still excludes it."""
    from numcheck.properties.fp8.grouped.cases import GroupedCase, fitted, refusal

    kw.setdefault("dtype", _first_dtype(impl.support, ("bfloat16", "float32", "float16")))
    kw.setdefault("steps", 2 if recipe.kind == "delayed" else 1)
    case = fitted(impl.support, GroupedCase(recipe, splits, K, N, device=device, **kw))
    return None if refusal(impl.support, case) else case


def _fitted(pairs: Iterable[tuple[str, Any]]) -> Built:
    return ((label, c) for label, c in pairs if c is not None)


def _grouped_edge(impl: Any, spec: GridSpec, device: str) -> Built:
    from numcheck.properties.fp8.grouped.cases import EDGE_SPLIT_CASES

    return _fitted(
        (f"{r.name} {regime}", _grouped(impl, r, splits, K, N, device, bias=True, regime=regime, seed=17))
        for r in _recipes(impl, spec.grouped_all_recipes)
        for splits, K, N, regime in EDGE_SPLIT_CASES
    )


def _grouped_delayed(impl: Any, spec: GridSpec, device: str) -> Built:
    return _fitted(
        (f"{r.name} 6 steps", _grouped(impl, r, (48, 0, 17, 64), 64, 40, device, steps=6, seed=2))
        for r in _recipes(impl, spec.grouped_all_recipes)
        if r.kind == "delayed"
    )


def _grouped_uneven(regime: str, **kw: Any) -> Callable[[Any, GridSpec, str], Built]:
    def build(impl: Any, spec: GridSpec, device: str) -> Built:
        return _fitted(
            (f"{r.name} {regime}", _grouped(impl, r, (5, 37, 16, 64), 40, 48, device, regime=regime, seed=21, **kw))
            for r in _recipes(impl, spec.grouped_all_recipes)
        )

    return build


def _grouped_empty(impl: Any, spec: GridSpec, device: str) -> Built:
    return _fitted(
        (
            f"{r.name} outlier",
            _grouped(impl, r, (0, 33, 1, 0, 130), 40, 24, device, bias=True, regime="outlier", seed=17),
        )
        for r in _recipes(impl, spec.grouped_all_recipes)
    )


def _grouped_soi(impl: Any, spec: GridSpec, device: str) -> Built:
    return _fitted(
        (f"{r.name} {regime}", _grouped(impl, r, (32, 64, 0, 32), 64, 32, device, regime=regime, seed=23, steps=1))
        for r in _recipes(impl, spec.grouped_all_recipes)
        for regime in (("wide", "outlier", "nan_expert") if r.allows_save_original_input else ("normal",))
    )


def _grouped_scale_grids(impl: Any, spec: GridSpec, device: str) -> Built:
    """The suite's ``grouped_accuracy_on_scale_block_grids``: ``block_exponents`` (each expert, row and K-block its
    own exponent) with an expert of exactly one scale block of tokens beside one of a block and a bit
    (:data:`properties.fp8.grouped.strategies.SCALE_SPLITS`), at both K forms (m·2^j below the block, block × odd)
    inside the declared ``feature_alignment`` (:func:`properties.fp8.grouped.strategies.grid_ks`), per recipe kind;
    a form the alignment rules out comes unfitted, refused with the reason (:func:`grouped_refused`)."""
    from numcheck.properties.fp8.cases import scale_block
    from numcheck.properties.fp8.grouped.cases import GroupedCase
    from numcheck.properties.fp8.grouped.strategies import SCALE_SPLITS, grid_ks
    from numcheck.properties.fp8.shapes import SHAPE_REGIMES
    from numcheck.properties.fp8.strategies import SCALE_K, SCALE_ROWS

    for r in _recipes(impl, spec.grouped_all_recipes):
        b = scale_block(r)
        N = next(m for m in SCALE_ROWS[b] if m > b)
        for form in ("K_below_block", "K_block_times_odd"):
            holds = SHAPE_REGIMES[form].holds
            K = next((k for k in grid_ks(impl.support, r) if holds(r, b, k, N)), None)
            if K is None:  # refused, named (grouped_refused)
                k0 = next(k for k in SCALE_K[b] if holds(r, b, k, N))
                yield f"{r.name} K{k0}N{N} block_exponents", GroupedCase(r, SCALE_SPLITS[b], k0, N, device=device)
                continue
            case = _grouped(impl, r, SCALE_SPLITS[b], K, N, device, regime="block_exponents", seed=31)
            if case is not None:
                yield f"{r.name} K{K}N{N} block_exponents", case


def grouped_refused(impl: Any, prop: str, case: Any) -> str | None:
    """Why a grouped impl does not run a built case: its declaration excludes it (only a scale-grid K form its
    ``feature_alignment`` rules out reaches here; the other builders fit the declaration), or a recorded known
    divergence of the impl covers it (:mod:`~numcheck.properties.fp8.grouped.known_torchao`)."""
    from numcheck.properties.fp8.grouped.cases import refusal
    from numcheck.properties.fp8.grouped.known_torchao import known_grouped_divergence

    why = refusal(impl.support, case)
    if why:
        return f"a shape regime its declaration leaves out: {why}"
    divergence = known_grouped_divergence(impl.name, prop, case)
    return divergence and f"known divergence: {divergence.reason}"


def _grouped_accumulation(impl: Any, spec: GridSpec, device: str) -> Built:
    fused = sorted(impl.support.fused_wgrad_accumulation)
    return _fitted(
        (
            f"{r.name} {'main_grad' if mg else 'weight.grad'}",
            _grouped(impl, r, (17, 40, 3), 72, 40, device, regime="wide", main_grad=mg, seed=25),
        )
        for r in _recipes(impl, spec.grouped_all_recipes)
        if r.kind != "delayed"
        for mg in fused
    )


def _no_empty(impl: Any) -> str | None:
    return None if impl.support.empty_splits else f"{impl.name} does not declare empty splits (empty_splits=False)"


def grouped_rows() -> tuple[PropertyRow, ...]:
    return (
        PropertyRow("accuracy", "grouped_edge_splits_every_recipe", _grouped_edge),
        PropertyRow("accuracy", "grouped_delayed_scaling_per_gemm_histories", _grouped_delayed),
        PropertyRow("accuracy", "grouped_accuracy_on_scale_block_grids", _grouped_scale_grids),
        PropertyRow("per_expert_linear", "grouped_equals_the_linear_per_expert", _grouped_uneven("outlier")),
        PropertyRow("empty_experts", "grouped_empty_experts_exact_zero", _grouped_empty, _no_empty),
        PropertyRow("split_rules", "grouped_split_rules_refused_outside", _grouped_uneven("normal")),
        PropertyRow("expert_permutation", "grouped_expert_permutation", _grouped_uneven("wide")),
        PropertyRow(
            "save_original_input", "grouped_save_original_input_is_bitwise_identical", _grouped_soi, _no_mode_pair
        ),
        PropertyRow("saved_bytes", "grouped_saved_bytes_measured", _grouped_uneven("normal", steps=1), _no_soi),
        PropertyRow("wgrad_accumulation", "grouped_wgrad_accumulation_over_micro_batches", _grouped_accumulation),
    )


# -- tensor-parallel FP8 linear (tests/suite/test_distributed_fp8.py) --------------------------------------------
def _tp_worlds(impl: Any) -> list[int]:
    from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable

    return [p for p in impl.support.world_sizes if world_size_unavailable(p, default_backend()) is None]


def _tp_case(impl: Any, recipe: Any, parallel: str, P: int, **kw: Any) -> Any:
    """The suite's determinism shape (``test_determinism``) for ``parallel`` at ``P`` ranks, or ``None`` where the
    declaration or the shape excludes it."""
    from numcheck.properties.distributed.tp_fp8.cases import SHARD_EDGE, TPFp8Case
    from numcheck.properties.distributed.tp_fp8.cases import refusal as tp_refusal

    s = impl.support
    edge = 4 * SHARD_EDGE[recipe.kind]
    split = edge * 3 if edge == 4 else edge
    K, N = (40, split) if parallel == "column" else (split, 24)
    dtype = "bfloat16" if torch.bfloat16 in s.dtypes else _first_dtype(s)
    kw.setdefault("sequence_parallel", True in s.sequence_parallel)
    kw.setdefault("save_original_input", False)
    try:
        case = TPFp8Case(
            recipe, 36, K, N, dtype=dtype, bias=s.bias, regime="normal", seed=7,
            steps=2 if recipe.kind == "delayed" else 1, world=P, parallel=parallel, **kw,
        )  # fmt: skip
    except ValueError:
        return None
    return None if tp_refusal(s, case) else case


def _tp_recipes(impl: Any, spec: GridSpec) -> list[Any]:
    return list(impl.support.recipes) if spec.tp_all_recipes else list(impl.support.recipes[:1])


def _tp_build(**kw: Any) -> Callable[[Any, GridSpec, str], Built]:
    parallels = kw.pop("parallels", ("column", "row"))

    def build(impl: Any, spec: GridSpec, device: str) -> Built:
        worlds = [p for p in _tp_worlds(impl) if p > 1]
        if not worlds:
            return []
        P = max(worlds)
        recipes = [
            r for r in _tp_recipes(impl, spec) if r.allows_save_original_input or not kw.get("save_original_input")
        ]
        pairs = ((f"{r.name} P={P} {par}", _tp_case(impl, r, par, P, **kw)) for r in recipes for par in parallels)
        return [(label, c) for label, c in pairs if c is not None and par_declared(impl, c)]

    return build


def par_declared(impl: Any, case: Any) -> bool:
    return case.parallel in impl.support.parallel


def _tp_two_worlds(impl: Any) -> str | None:
    return None if len(_tp_worlds(impl)) >= 2 else f"fewer than two of world sizes {impl.support.world_sizes} run here"


def _tp_deterministic(impl: Any) -> str | None:
    return None if impl.support.deterministic else f"{impl.name} does not declare deterministic"


def _tp_soi(impl: Any) -> str | None:
    if True in impl.support.save_original_input and any(r.allows_save_original_input for r in impl.support.recipes):
        return None
    return f"{impl.name} declares no recipe with save_original_input=True"


def tp_rows() -> tuple[PropertyRow, ...]:
    return (
        PropertyRow("world_size_invariance", "world_size_invariance", _tp_build(), _tp_two_worlds),
        PropertyRow(
            "dist_save_original_input",
            "save_original_input_bitwise_under_sp",
            _tp_build(parallels=("column",), sequence_parallel=True, save_original_input=True),
            _tp_soi,
        ),
        PropertyRow("dist_determinism", "determinism", _tp_build(), _tp_deterministic),
    )


# -- distributed linear+CE (tests/suite/test_distributed.py) -----------------------------------------------------
#: Rows of the cancelling world-size case (:func:`_dist_build`): fewer than DIST_SHAPE's H, as ``anisotropic_head``
#: needs.
DIST_HEAD_N = 8


def _dist_build(worlds: tuple[int, ...], cancelling: bool = False) -> Callable[[Any, GridSpec, str], Built]:
    """Cases at :data:`~reports.report.grid.DIST_SHAPE` in float32 where declared (else the first declared dtype),
    one per world size of ``worlds`` that runs here. ``cancelling`` adds, per world size, the world-size relation's
    cancelling draw (``properties.distributed.linear_ce.strategies.draw_case``): the ``anisotropic_head`` regime in
    the narrowest declared dtype, whose shards' grad_x partials carry the head's mean direction that their sum
    cancels, so partials reduced in a dtype narrower than ``grad_x_reduce_dtype`` declares show (in float32, or on
    uncorrelated partials, rounding them changes nothing the bound sees)."""

    def build(impl: Any, spec: GridSpec, device: str) -> Built:
        from numcheck.properties.distributed.linear_ce.cases import DistCase
        from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
        from numcheck.properties.linear_ce.cases import HEAD_REGIME, Problem
        from numcheck.reports.report.grid import DIST_SHAPE, in_declared_reduction

        backend = default_backend()
        N, H, V = DIST_SHAPE
        dtype = "float32" if torch.float32 in impl.support.dtypes else _first_dtype(impl.support)
        narrow = _first_dtype(impl.support, ("bfloat16", "float16", "float32"))
        problems = [(dtype, Problem(N=N, H=H, V=V, dtype=dtype, seed=4200, device=device))]
        if cancelling:
            head = Problem(N=DIST_HEAD_N, H=H, V=V, dtype=narrow, regime=HEAD_REGIME, seed=4201, device=device)
            problems.append((f"{narrow} cancelling", head))
        for P in worlds:
            if P in impl.dist.world_sizes and backend in impl.dist.backends and not world_size_unavailable(P, backend):
                for label, p in problems:
                    p = in_declared_reduction(p, impl.support.reductions)
                    yield f"P={P} {label}", DistCase(p, P, backend, "boundary")

    return build


def _dist_deterministic(impl: Any) -> str | None:
    return None if impl.dist.deterministic else f"{impl.name} does not declare deterministic"


def dist_rows() -> tuple[PropertyRow, ...]:
    return (
        PropertyRow("dist_world_size_invariance", "dist_world_size_invariance", _dist_build((2, 4), cancelling=True)),
        PropertyRow("dist_determinism", "dist_determinism", _dist_build((4,)), _dist_deterministic),
    )


# -- linear + cross-entropy (tests/suite/test_properties.py) -----------------------------------------------------
def _modes(impl: Any) -> list[str]:
    """The grid's dtype modes the impl declares, coarsest first (the order of the grid's declared cases)."""
    from numcheck.reports.report.grid import DECLARED_MODE_ORDER

    s = impl.support
    names = {str(d).removeprefix("torch.") for d in s.dtypes}
    amp = {str(d).removeprefix("torch.") for d in s.autocast}
    return [m for m in DECLARED_MODE_ORDER if MODES[m][0] in names and (MODES[m][1] is None or MODES[m][1] in amp)]


def _problem(impl: Any, spec: GridSpec, device: str, prefer: tuple[str, ...] = (), **fields: Any) -> Any:
    """A problem at the grid's declared shape in the first of ``prefer`` the impl declares (else its first mode), with
    each option of ``fields`` kept only where the impl declares it (``bias``, ``ignored``), in a declared reduction
    (:func:`~reports.report.grid.in_declared_reduction`)."""
    from numcheck.properties.linear_ce.cases import Problem

    modes = _modes(impl)
    mode = next((m for m in prefer if m in modes), modes[0] if modes else "float32")
    dtype, autocast = MODES[mode]
    opts = impl.support.options
    if "bias" not in opts:
        fields.pop("bias", None)
    if "ignore_index" not in opts:
        fields.pop("ignored", None)
    N, H, V = spec.declared_shape
    shape = {"N": N, "H": H, "V": V, **{k: fields.pop(k) for k in ("N", "H", "V") if k in fields}}
    p = Problem(**shape, dtype=dtype, autocast=autocast, seed=fields.pop("seed", 4300), device=device, **fields)
    return in_declared_reduction(p, impl.support.reductions)


_AMP = ("amp-bfloat16", "amp-float16")


def _one(prefer: tuple[str, ...] = (), **fields: Any) -> Callable[[Any, GridSpec, str], Built]:
    def build(impl: Any, spec: GridSpec, device: str) -> Built:
        p = _problem(impl, spec, device, prefer, **dict(fields))
        return [(p.short(), p)]

    return build


def _long_batch(impl: Any, spec: GridSpec, device: str) -> Built:
    """The suite's long-batch row: in bf16 where declared (plain, then under autocast), else fp16, the fewest rows
    past the compute dtype's exact integers (:data:`properties.linear_ce.strategies.LONG_N_BY_COMPUTE`: 257 in bf16,
    2049 in fp16; 257 where neither is declared), post-norm rows with a bias where declared."""
    from numcheck.properties.linear_ce.strategies import LONG_N_BY_COMPUTE

    modes = _modes(impl)
    mode = next((m for m in ("bfloat16", "amp-bfloat16", "float16") if m in modes), modes[0] if modes else "float32")
    dtype, autocast = MODES[mode]
    N = LONG_N_BY_COMPUTE.get(autocast or dtype, (257,))[0]
    p = _problem(impl, spec, device, (mode,), N=N, H=8, bias=True, regime="post_norm")
    return [(p.short(), p)]


def _two_calls(impl: Any, spec: GridSpec, device: str) -> Built:
    s = impl.support
    red = "mean" if "mean" in s.reductions else "sum"
    p = _problem(impl, spec, device, N=16, reduction=red, ignored=0.25 if red == "mean" else 0.0, bias=True)
    return [(p.short(), p)]


#: Chunks the report's determinism case spans: an order of chunks that changes between calls shows only where at
#: least three full chunks' partial sums are added in some order (two addends commute exactly, so the suite's least
#: draw of :data:`properties.linear_ce.chunks.SEVERAL_CHUNKS` chunks, two full and one ragged, cannot show it; its draws
#: reach more rows, the report's one case must).
DETERMINISM_CHUNKS = 6


def _chunked_shape(layout: Any, min_v: int = 1, count: int | None = None) -> dict[str, int]:
    """N, H, V spanning ``count`` (default :data:`properties.linear_ce.chunks.SEVERAL_CHUNKS`) chunks of ``layout`` (a
    declared rule's cheapest shape, else the fewest rows that make that many chunks), V ≥ ``min_v``."""
    from numcheck.properties.linear_ce import chunks

    count = count or chunks.SEVERAL_CHUNKS
    if layout is None:
        return {"V": max(24, min_v)}
    if layout.rule is not None:
        N, H, V = chunks.rule_shapes(layout.rule, count, min_v=max(2, min_v))[0]
        return {"N": N, "H": H, "V": V}
    return {"N": layout.n_range(count)[0], "H": 16, "V": max(24, min_v)}


def _determinism(impl: Any, spec: GridSpec, device: str) -> Built:
    from numcheck.properties.linear_ce.strategies import determinism_layout

    variant, layout, min_v = determinism_layout(impl)
    p = _problem(impl, spec, device, ("float32",), **_chunked_shape(layout, min_v, DETERMINISM_CHUNKS))
    return [(p.short(), p, variant)]


def _chunk_invariance(impl: Any, spec: GridSpec, device: str) -> Built:
    from numcheck.properties.linear_ce.chunks import layout

    shape = {} if hasattr(impl, "with_chunk_rows") else _chunked_shape(layout(impl))
    p = _problem(impl, spec, device, ignored=0.25, **shape)
    return [(p.short(), p)]


def _pinned(impl: Any, spec: GridSpec, device: str) -> Built:
    from numcheck.properties.linear_ce.suite import PINNED

    return [(key, p.replace(device=device)) for key, p in PINNED.items()]


def _loss_scale(impl: Any, spec: GridSpec, device: str) -> Built:
    from numcheck.properties.linear_ce.strategies import loss_scale_available

    if not loss_scale_available(impl.support):
        return []
    p = _problem(impl, spec, device, ("amp-float16",), N=16, reduction="mean", upstream="loss_scale", ignored=0.1)
    return [(p.short(), p)] if p.autocast == "float16" else []


def _head(impl: Any, spec: GridSpec, device: str) -> Built:
    """The suite's trained-head row (coverage dimension ``head``): V = the largest of
    :data:`properties.linear_ce.strategies.HEAD_V` in the ``anisotropic_head`` regime, in bf16 where declared. Over its
    ~1200 blocks of 128 classes a bf16 running sum of grad_x = Σ_c G_ic·W_c stalls (each late block's share falls
    under half an ulp of the sum; docs/detection.md derives it), which no smaller vocabulary shows. N < H as the
    regime needs; the float64 oracle costs O(N·V·H)."""
    from numcheck.properties.linear_ce.cases import HEAD_REGIME
    from numcheck.properties.linear_ce.strategies import HEAD_H, HEAD_N, HEAD_V

    fields = dict(N=HEAD_N[-1], H=HEAD_H[-1], V=max(HEAD_V), bias=True, regime=HEAD_REGIME)
    p = _problem(impl, spec, device, ("bfloat16", "amp-bfloat16"), **fields)
    return [(p.short(), p)]


def _unless(cond: Callable[[Any], bool], why: str) -> Callable[[Any], str | None]:
    return lambda impl: None if cond(impl) else why.format(name=impl.name)


def linear_ce_rows() -> tuple[PropertyRow, ...]:
    from numcheck.properties.linear_ce.chunks import declares_chunks

    opts = lambda *o: _unless(lambda i: set(o) <= set(i.support.options), "{name} declares no " + "/".join(o))  # noqa: E731
    return (
        PropertyRow("accuracy", "pinned_cases", _pinned),
        PropertyRow("accuracy", "large_vocab", _one(N=12, V=1025, regime="outlier_rows")),
        PropertyRow("accuracy", "large_vocab_head", _head),
        PropertyRow("accuracy", "wide_hidden", _one(N=8, H=257, bias=True)),
        PropertyRow("accuracy", "long_batch", _long_batch),
        PropertyRow("accuracy", "loss_scale", _loss_scale),
        PropertyRow("strided_inputs", "strided_inputs", _one(bias=True, ignored=0.25, upstream="scalar")),
        PropertyRow("frozen_weight", "frozen_inputs[weight]", _one(bias=True)),
        PropertyRow("frozen_x", "frozen_inputs[x]", _one(bias=True)),
        PropertyRow(
            "two_calls",
            "two_calls",
            _two_calls,
            _unless(lambda i: {"sum", "mean"} & set(i.support.reductions), "{name} declares neither 'sum' nor 'mean'"),
        ),
        PropertyRow("earlier_calls", "earlier_calls", _one(_AMP)),
        PropertyRow("ignored_rows", "ignored_rows", _one(ignored=0.5), opts("ignore_index")),
        PropertyRow("permutation", "permutation", _one(ignored=0.25)),
        PropertyRow("shift_invariance", "shift_invariance", _one(bias=True), opts("bias")),
        PropertyRow("option_identities", "option_identities", _one()),
        PropertyRow(
            "reduction_consistency",
            "reduction_consistency",
            _one(),
            _unless(
                lambda i: {"mean", "sum", "none"} <= set(i.support.reductions),
                "{name} does not declare all three reductions",
            ),
        ),
        PropertyRow(
            "determinism",
            "determinism",
            _determinism,
            _unless(lambda i: i.support.deterministic, "{name} declares deterministic=False"),
        ),
        PropertyRow(
            "chunk_invariance",
            "chunk_invariance",
            _chunk_invariance,
            _unless(declares_chunks, "{name} declares no chunking"),
        ),
        PropertyRow("grad_dtypes", "grad_dtypes", _one(_AMP)),
        PropertyRow("loss_dtype", "loss_dtype", _one(_AMP)),
    )


def linear_ce_refused(impl: Any, prop: str, case: Any) -> str | None:
    """Why a linear+CE impl's declaration, or a recorded known divergence of the impl (as the suite leaves it out of
    its draws), excludes ``case``."""
    from numcheck.properties.linear_ce.known import known
    from numcheck.properties.linear_ce.strategies import refusal

    divergence = known(impl.name, prop, case)
    return refusal(impl.support, case) or (divergence and f"known divergence: {divergence.reason}")


def dist_refused(impl: Any, prop: str, case: Any) -> str | None:
    """Why a distributed impl's declaration, or a recorded known divergence of the impl, excludes ``case``."""
    from numcheck.properties.distributed.linear_ce.suite import known_divergence
    from numcheck.properties.linear_ce.strategies import refusal

    known = known_divergence(impl, case)
    return refusal(impl.support, case.problem) or (known and f"known divergence: {known}")


def fp8_refused(impl: Any, prop: str, case: Any) -> str | None:
    """Why a recorded known divergence of a quantized linear excludes ``case`` (the builders fit the declaration)."""
    from numcheck.properties.fp8.known_torchao import known_fp8_divergence

    shape = impl.support.shape_refusal(case.M, case.K, case.N) if hasattr(case, "M") else None
    if shape:
        return f"a shape regime its declaration leaves out: {shape}"
    divergence = known_fp8_divergence(impl.name, prop, case)
    return divergence and f"known divergence: {divergence.reason}"


#: ``refused(impl, property, case)``: why a kind's impl does not run a built case, or ``None``.
Refused = Callable[[Any, str, Any], "str | None"]


def property_cases(
    spec: GridSpec, impl: Any, rows: tuple[PropertyRow, ...], refused: Refused | None, device: str = "cpu"
) -> tuple[list[tuple[Any, GridCase]], NotRun]:
    """The (impl or its chunk variant, case) pairs of every row of ``rows`` (its kind's, from its family) the impl's
    declaration admits, each a :class:`GridCase` with its ``property`` and the group ``suite:<test>``; a row its
    declaration leaves out, and a case it refuses (``refused``: none for the kinds whose builders fit the
    declaration and record no known divergence), are counted and named with the reason."""
    out: list[tuple[Any, GridCase]] = []
    not_run = NotRun()
    for row in rows:
        group = f"suite:{row.test}"
        why = row.skip(impl)
        if why:
            not_run.add(group, "", row.prop, why)
            continue
        for built in row.build(impl, spec, device):
            label, case, runner = (*built, impl) if len(built) == 2 else built
            why_not = refused(impl, row.prop, case) if refused else None
            if why_not:
                not_run.add(group, "", label, why_not)
            else:
                out.append((runner, GridCase(group, _mode(case), case, prop=row.prop)))
    return out, not_run


def _mode(case: Any) -> str:
    problem = getattr(case, "problem", case)
    if getattr(problem, "autocast", None):
        return f"amp-{problem.autocast}"
    return str(getattr(problem, "dtype", ""))
