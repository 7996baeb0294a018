"""The cases ``numcheck report`` sweeps: a documented grid plus seeded random draws over the same axes.

Linear+CE (:class:`~properties.linear_ce.cases.Problem`), for every dtype mode of the grid:

* **Size ladders** — one axis at a time around a base shape, so every output's reduction length spans at
  least two decades: N (the reduction of grad_weight, grad_bias and a reduced loss), H (the logits' dot
  products, felt by every output) and V (grad_x, and the log-sum-exp of each row's loss). Plain options.
* **Option cases** at an off-round shape: bias with ignored rows and ``sum``; label smoothing with class
  weights; softcap with z-loss and ``none`` (per-row upstream); every row ignored; and the value regimes
  ``confident``, ``large``, ``tiny`` and ``outlier_rows`` (scalar upstream).
* **Random cases** drawn by a seeded :class:`random.Random` (not hypothesis: the report must be the same on
  every run) over the same axes: edge-leaning N/H/V, dtype mode, bias, ignored fraction, reduction,
  label smoothing, class weights, softcap, z-loss, regime and upstream.
* **Declared cases**, per impl, from its declaration (:func:`declared_cases`): each declared option on its own
  (:data:`OPTION_VALUES`), each declared reduction on its own, all declared options together at every declared
  reduction (options a declaration excludes together go into further combined cases), and an all-ignored batch
  where declared; at :attr:`GridSpec.declared_shape`, in the option modes the impl declares (else the first mode of
  :data:`DECLARED_MODE_ORDER` it declares), leaving out a mode where a recorded known divergence of the impl covers
  the case. The fixed option cases combine options, so an impl missing one of a combination's options would
  otherwise never run the others (label smoothing only beside class weights); the quick grid keeps only the fixed
  regime cases (:data:`QUICK_OPTIONS`).

* **Many-chunk cases**, per impl, from its declared chunking (:func:`many_chunk_cases`, the layout of the suite's
  ``test_many_chunks``, :mod:`properties.linear_ce.chunks`): in each low-precision plain dtype and each declared reduction,
  post-norm rows whose count makes 2/u + 1 chunks of its declared ``chunk_rows`` or ``chunk_rule`` (257 for a
  ``slow`` impl, which runs them in its coarsest dtype and first reduction only, as the suite's draws do), or rows
  past any chunk size it may use undeclared; one row a chunk of its ``with_chunk_rows`` variant where it has one. A
  running sum across chunks kept in the compute dtype shows only there: the other cases span a few chunks at most.

Each impl runs every case its declaration admits (:func:`properties.linear_ce.strategies.refusal`); the others are
counted per impl with the reason and named (:class:`NotRun`), never dropped silently.

Quantized linear (:class:`~properties.fp8.cases.QuantCase`), per impl and recipe it declares: an (M, K, N)
ladder with the same span (K: y, N: dgrad, M: wgrad and bgrad), the input regimes ``wide`` and
``outlier`` at the base shape, and in the full grid every declared dtype, the edge regimes (``zeros``,
``tiny``, ``nan``, ``inf``), ``save_original_input=True`` and three delayed-scaling steps.

Distributed linear+CE (:class:`~properties.distributed.linear_ce.cases.DistCase`), per impl: the cases of :data:`DIST_CASES` (a
plain fp32 one, bf16 with bias, ignored rows and ``sum``, and label smoothing with targets on shard boundaries) at
world sizes 1, 2 and 4 on the default backend (gloo on CPU), each inside the impl's declaration; then the declared
cases (:func:`dist_declared`): each declared option and reduction on its own and all declared options together at
every declared reduction, at the largest of those world sizes the impl declares, and where it declares
``uneven_vocab`` all its declared options with targets on shard boundaries at V = :data:`DIST_UNEVEN_V` (uneven
shards at every world size above 1) at every declared world size above 1. The world sizes it does not declare or
the backend cannot run here are counted and named with the reason. About 0.1 s a case.

Tensor-parallel FP8 linear (:class:`~properties.distributed.tp_fp8.cases.TPQuantCase`), per impl and recipe it declares (the
first recipe of each impl in the quick grid, every recipe in the full one): the cases of :data:`TP_CASES` (plain;
bias; sequence parallel with bias; and that with ``save_original_input=True``) in both parallel modes, at world sizes
1, 2 and 4 on the default backend, M = 64 (M/P a multiple of MXFP8's 32-row blocks at P = 2, blocks straddling
ranks at P = 4) and a sharded dimension of 4·edge, times 6 for per-tensor recipes (whole blocks in every shard at
P = 4); delayed recipes run two steps. What a declaration leaves out (dtype, parallel mode, SP,
``save_original_input``, bias, world size) or the backend cannot run here is counted with the reason; the distributed
FP8 suite records no known divergence to leave out. About 0.2 s a case.

Grouped FP8 linear (mixture-of-experts, :class:`~properties.fp8.grouped.cases.GroupedCase`), per impl: the cases of
:data:`GROUPED_CASES` (uneven splits; empty experts with a bias; ``save_original_input=True`` where the recipe allows
it; experts of different binades with fused wgrad accumulation where declared) for the first recipe of each kind in
the quick grid and every recipe in the full one, each moved into the impl's split rules; what the declaration still
leaves out is counted with the reason. About 0.3 s a case.

**Property cases**, per impl (:mod:`reports.report.property_grid`, where :attr:`GridSpec.properties`): every
property the impl's kind's suite runs, on the cases reaching its regime from the declaration, judged by the property
library's own function (pass/fail records with the property's message; accuracy ones as above).

Presets: :data:`QUICK` (``--quick``: ≤ 8 minutes on a 2-core CPU with every built-in, results/reports/quick-budget.md), :data:`FULL` (the default) and
:data:`SMOKE` (a tiny grid for tests and trying things out; ladders still span two decades).
"""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from numcheck.impls.protocols.linear_ce import LINEAR_CE_OPTIONS, REDUCTIONS
from numcheck.properties.fp8.cases import QuantCase, QuantCaseFields, declared_mode
from numcheck.properties.linear_ce.cases import Problem, dtype_of

#: dtype modes: (parameter dtype, autocast dtype or None).
MODES: dict[str, tuple[str, str | None]] = {
    "float32": ("float32", None),
    "bfloat16": ("bfloat16", None),
    "float16": ("float16", None),
    "amp-bfloat16": ("float32", "bfloat16"),
    "amp-float16": ("float32", "float16"),
}

#: Option cases: label → Problem fields (at :attr:`GridSpec.option_shape`).
OPTION_CASES: dict[str, dict[str, Any]] = {
    "bias+ignored+sum": dict(bias=True, ignored=0.25, reduction="sum"),
    "smoothing+class_weights": dict(label_smoothing=0.1, class_weights=True),
    "softcap+z_loss+none": dict(softcap=30.0, z_loss_scale=1e-4, reduction="none", upstream="per_row"),
    "all_ignored": dict(ignored=1.0),
    "confident": dict(regime="confident"),
    "large+bias": dict(regime="large", bias=True),
    "tiny": dict(regime="tiny"),
    "outlier_rows+scalar": dict(regime="outlier_rows", upstream="scalar"),
}

#: Axes of the random draws.
RANDOM_SIZES = {
    "N": (1, 2, 7, 8, 9, 17, 33, 64, 65, 96, 130),
    "H": (1, 3, 16, 17, 33, 48, 63, 64, 80),
    "V": (1, 2, 3, 7, 31, 61, 64, 65, 127, 129, 160),
}
RANDOM_IGNORED = (0.0, 0.0, 0.1, 0.5, 0.9)
RANDOM_REGIMES = ("ordinary", "ordinary", "confident", "large", "tiny", "outlier_rows")

#: Distributed cases: label → (Problem fields at :data:`DIST_SHAPE`, target placement). V = 52 is divisible by 1, 2
#: and 4, so impls that need even shards run every world size; uneven shards come from :data:`DIST_UNEVEN_V`.
DIST_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "plain": (dict(dtype="float32"), "as_built"),
    "bias+ignored+sum": (dict(dtype="bfloat16", bias=True, ignored=0.25, reduction="sum"), "as_built"),
    "smoothing+boundary": (dict(dtype="float32", label_smoothing=0.1), "boundary"),
}
DIST_SHAPE: tuple[int, int, int] = (33, 24, 52)
DIST_WORLD_SIZES: tuple[int, ...] = (1, 2, 4)
#: The vocabulary of the uneven-shard cases: prime, so no world size from 2 to 52 divides it (shards differ by one).
DIST_UNEVEN_V = 53

#: The value each declared option takes in the declared cases (:func:`declared_cases`, :func:`dist_declared`).
OPTION_VALUES: dict[str, dict[str, Any]] = {
    "bias": dict(bias=True),
    "ignore_index": dict(ignored=0.25),
    "label_smoothing": dict(label_smoothing=0.1),
    "class_weights": dict(class_weights=True),
    "softcap": dict(softcap=5.0),
    "z_loss": dict(z_loss_scale=1e-2),
}
#: The upstream gradient of a declared case at each reduction.
REDUCTION_UPSTREAM: dict[str, str] = {"mean": "one", "sum": "scalar", "none": "per_row"}
#: The dtype mode of an impl's declared cases when it declares none of the grid's option modes: the first it declares.
DECLARED_MODE_ORDER: tuple[str, ...] = ("bfloat16", "amp-bfloat16", "float16", "amp-float16", "float32")

#: Tensor-parallel FP8 cases: label → TPQuantCase fields (:func:`tp_cases`).
TP_CASES: dict[str, dict[str, Any]] = {
    "plain": dict(bias=False, sequence_parallel=False, save_original_input=False),
    "bias": dict(bias=True, sequence_parallel=False, save_original_input=False),
    "sp+bias": dict(bias=True, sequence_parallel=True, save_original_input=False),
    "sp+bias+soi": dict(bias=True, sequence_parallel=True, save_original_input=True),
}
TP_WORLD_SIZES: tuple[int, ...] = (1, 2, 4)
#: Tokens M, and the unsharded dimension (K of a column-parallel layer, N of a row-parallel one).
TP_M = 64
TP_FREE: dict[str, int] = {"column": 40, "row": 24}

#: Grouped FP8 cases: label → (m_splits, K, N, GroupedCase fields) (:func:`grouped_cases`), each moved into the impl's
#: split rules (:func:`properties.fp8.grouped.cases.fitted`): uneven splits around the 32-row blocks, empty experts
#: first and between with a 130-row one, save_original_input (where the recipe allows it) on 32-row multiples, and
#: experts of different binades.
GROUPED_CASES: dict[str, tuple[tuple[int, ...], int, int, dict[str, Any]]] = {
    "uneven": ((5, 37, 16, 64), 40, 48, {}),
    "empty+bias": ((0, 33, 1, 0, 130), 40, 24, dict(bias=True)),
    "soi": ((32, 64, 0, 32), 64, 32, dict(save_original_input=True)),
    "wide+main_grad": ((17, 40, 3), 72, 40, dict(regime="wide", main_grad=True)),
}

#: Which reduction each output's error accumulates over, by problem field (see :func:`reduction_length`).
QUANT_REDUCTION_AXIS = {"y": "K", "dgrad": "N", "wgrad": "M", "bgrad": "M"}


@dataclass(frozen=True)
class GridSpec:
    """One preset of the report grid.

    Attributes:
        name: ``quick``, ``full`` or ``smoke``.
        ladder: sizes of each axis's ladder (min to max must span ≥ 100×).
        base: (N, H, V) of the ladders.
        ladder_modes: dtype modes (keys of :data:`MODES`) the ladders run in.
        option_shape: (N, H, V) of the option cases.
        option_modes: dtype modes of the option cases.
        options: labels of :data:`OPTION_CASES` to run.
        n_random: random cases (the first ``n_random`` of one seeded sequence: quick ⊂ full).
        quant_ladder: (M, K, N) values of the quantized ladder; ``quant_base`` its base.
        quant_all_recipes_ladder: run the ladder for every recipe (else the first recipe of each impl).
        quant_all_dtypes: every declared dtype (else bfloat16, or the first declared).
        quant_regimes: regimes at the base shape for every recipe.
        quant_extras: add ``save_original_input=True`` and 3-step delayed cases.
        dist_cases: labels of :data:`DIST_CASES` to run.
        tp_cases: labels of :data:`TP_CASES` to run.
        tp_all_recipes: tensor-parallel cases for every recipe (else the first recipe of each impl).
        declared: add each impl's declared cases (:func:`declared_cases`, :func:`dist_declared`).
        declared_shape: (N, H, V) of the linear+CE declared cases (small: an interpreted kernel's time grows with
            the rows, and the options' semantics show at any size).
        many_chunks: add each linear+CE impl's many-chunk cases (:func:`many_chunk_cases`).
        grouped_cases: labels of :data:`GROUPED_CASES` to run.
        grouped_all_recipes: grouped cases for every declared recipe (else the first of each recipe kind).
        properties: add each impl's property cases (:mod:`reports.report.property_grid`: every property its kind's
            suite runs, on cases reaching that property's regime from the declaration).
        property_max_macs: leave out the suite's fixed FP8 shapes of more than this many multiply-adds (M·K·N)
            from the property cases (0: none left out). The quick grid keeps the multi-tile block layouts and the
            K = 1040 reduction, ~1 s each on a loaded 2-core CPU, and leaves the 2–5 M ones (5–15 s each) to the
            full grid and the suite.
        seed: seed of the random cases.
    """

    name: str
    ladder: tuple[int, ...]
    base: tuple[int, int, int]
    ladder_modes: tuple[str, ...]
    option_shape: tuple[int, int, int]
    option_modes: tuple[str, ...]
    options: tuple[str, ...]
    n_random: int
    quant_ladder: tuple[int, ...]
    quant_base: tuple[int, int, int]
    quant_all_recipes_ladder: bool
    quant_all_dtypes: bool
    quant_regimes: tuple[str, ...]
    quant_extras: bool
    dist_cases: tuple[str, ...] = tuple(DIST_CASES)
    tp_cases: tuple[str, ...] = tuple(TP_CASES)
    tp_all_recipes: bool = False
    declared: bool = True
    declared_shape: tuple[int, int, int] = (17, 16, 24)
    many_chunks: bool = False
    grouped_cases: tuple[str, ...] = tuple(GROUPED_CASES)
    grouped_all_recipes: bool = False
    properties: bool = True
    property_max_macs: int = 0
    seed: int = 20250601
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for label, values in (("ladder", self.ladder), ("quant_ladder", self.quant_ladder)):
            if not values or min(values) < 1 or max(values) / min(values) < 100:
                raise ValueError(f"GridSpec.{label}={values} must span at least two decades (max/min ≥ 100)")
        bad = [m for m in self.ladder_modes + self.option_modes if m not in MODES]
        if bad:
            raise ValueError(f"GridSpec modes {bad} unknown; known: {sorted(MODES)}")
        bad = [o for o in self.dist_cases if o not in DIST_CASES]
        if bad:
            raise ValueError(f"GridSpec.dist_cases {bad} unknown; known: {sorted(DIST_CASES)}")
        bad = [o for o in self.tp_cases if o not in TP_CASES]
        if bad:
            raise ValueError(f"GridSpec.tp_cases {bad} unknown; known: {sorted(TP_CASES)}")
        bad = [o for o in self.grouped_cases if o not in GROUPED_CASES]
        if bad:
            raise ValueError(f"GridSpec.grouped_cases {bad} unknown; known: {sorted(GROUPED_CASES)}")
        bad = [o for o in self.options if o not in OPTION_CASES]
        if bad:
            raise ValueError(f"GridSpec.options {bad} unknown; known: {sorted(OPTION_CASES)}")

    def describe(self) -> str:
        """One paragraph for the report: what this grid holds."""
        n, h, v = self.base
        return (
            f"`{self.name}` grid — size ladders N, H, V ∈ {list(self.ladder)} (one axis at a time around "
            f"N={n}, H={h}, V={v}) in {', '.join(self.ladder_modes)}; option cases {', '.join(self.options)} at "
            f"N,H,V={self.option_shape} in {', '.join(self.option_modes)}; {self.n_random} seeded random cases "
            f"(seed {self.seed}). Quantized linear: (M, K, N) ladder {list(self.quant_ladder)} around "
            f"{self.quant_base} for {'every recipe' if self.quant_all_recipes_ladder else 'the first recipe of each impl'}"
            f", regimes {', '.join(self.quant_regimes)} for every recipe"
            f"{', every declared dtype' if self.quant_all_dtypes else ', bfloat16'}"
            f"{', save_original_input=True and 3-step delayed cases' if self.quant_extras else ''}. Distributed "
            f"linear+CE: {', '.join(self.dist_cases)} at N,H,V={DIST_SHAPE}, world sizes "
            f"{', '.join(map(str, DIST_WORLD_SIZES))}. Tensor-parallel FP8: {', '.join(self.tp_cases)} for "
            f"{'every recipe' if self.tp_all_recipes else 'the first recipe of each impl'}, column- and "
            f"row-parallel, world sizes {', '.join(map(str, TP_WORLD_SIZES))}. Grouped FP8 (mixture-of-experts): "
            f"{', '.join(self.grouped_cases)} for "
            f"{'every recipe' if self.grouped_all_recipes else 'the first recipe of each kind'}."
            + (
                " Per impl, from its declaration: each declared option and reduction on its own and all together "
                f"(linear+CE at N,H,V={self.declared_shape}; distributed also with uneven shards, "
                f"V={DIST_UNEVEN_V})."
                if self.declared
                else " No declared cases."
            )
            + (
                f" Per linear+CE impl, many chunks as it declares them: {', '.join(MANY_CHUNK_DTYPES)}, each declared "
                "reduction, post-norm rows (the coarsest dtype and first reduction only for a slow impl)."
                if self.many_chunks
                else ""
            )
            + (
                " Per impl, every other property its kind's suite runs (bitwise modes, held bytes, quantizer codes, "
                "refusals, layer use over several calls, micro-batch accumulation, empty experts after a call with "
                "rows, permutations, invariances, determinism by a second call) and the suite's fixed accuracy "
                "regimes (FP8 edge inputs, multi-tile blocks"
                + (f" up to {self.property_max_macs:,} multiply-adds" if self.property_max_macs else "")
                + ", 6 delayed steps, save_original_input; grouped edge splits; linear+CE pinned cases, large V, "
                "a trained head's V=151936 in bf16, wide H, long N, loss scale; distributed world-size relation on "
                "a cancelling head in the narrowest declared dtype), each on a case built from the declaration "
                "(reports/report/property_grid.py): pass/fail records with the property's message."
                if self.properties
                else ""
            )
        )


#: The option cases of the quick grid: the value regimes. Its declared cases hold every declared option alone and
#: all together at every declared reduction, and an all-ignored batch, so the fixed combinations (which full keeps)
#: would only repeat them for the impls declaring their options.
QUICK_OPTIONS: tuple[str, ...] = ("confident", "large+bias", "tiny", "outlier_rows+scalar")

QUICK = GridSpec(
    name="quick",
    ladder=(4, 40, 400),
    base=(40, 40, 40),
    ladder_modes=("float32", "bfloat16", "amp-bfloat16"),
    option_shape=(33, 24, 50),
    option_modes=("amp-bfloat16",),
    options=QUICK_OPTIONS,
    n_random=4,
    quant_ladder=(4, 40, 400),
    quant_base=(40, 40, 40),
    quant_all_recipes_ladder=False,
    quant_all_dtypes=False,
    quant_regimes=("wide", "outlier"),
    quant_extras=False,
    many_chunks=True,
    property_max_macs=1_100_000,
)
FULL = GridSpec(
    name="full",
    ladder=(4, 16, 64, 256, 1024),
    base=(48, 48, 48),
    ladder_modes=tuple(MODES),
    option_shape=(33, 24, 50),
    option_modes=tuple(MODES),
    options=tuple(OPTION_CASES),
    n_random=40,
    quant_ladder=(4, 16, 64, 256, 1024),
    quant_base=(40, 40, 40),
    quant_all_recipes_ladder=True,
    quant_all_dtypes=True,
    quant_regimes=("normal", "wide", "outlier", "zeros", "tiny", "nan", "inf"),
    quant_extras=True,
    tp_all_recipes=True,
    grouped_all_recipes=True,
    many_chunks=True,
)
SMOKE = GridSpec(
    name="smoke",
    ladder=(2, 200),
    base=(6, 6, 6),
    ladder_modes=("float32",),
    option_shape=(9, 5, 7),
    option_modes=("bfloat16",),
    options=("bias+ignored+sum",),
    n_random=1,
    quant_ladder=(2, 200),
    quant_base=(8, 8, 8),
    quant_all_recipes_ladder=False,
    quant_all_dtypes=False,
    quant_regimes=(),
    quant_extras=False,
    dist_cases=("plain",),
    tp_cases=("sp+bias",),
    declared=False,
    grouped_cases=("empty+bias",),
    properties=False,
)
GRIDS: dict[str, GridSpec] = {g.name: g for g in (QUICK, FULL, SMOKE)}


@dataclass(frozen=True)
class GridCase:
    """One case of the grid and the part of the grid it comes from (``ladder:N``, ``options:tiny``, ...)."""

    group: str
    mode: str
    case: Any  # Problem or QuantCase
    #: What the case's rows make of the impl's chunks, where the case is built from them (a many-chunk case).
    chunks: str = field(default="", compare=False)
    #: The property the case is judged by (as ``numcheck repro`` names it): ``accuracy`` (an error/bound record), or
    #: another property of the kind's suite (:mod:`reports.report.property_grid`, a pass/fail record).
    prop: str = "accuracy"


def _problem(N: int, H: int, V: int, mode: str, seed: int, device: str, **fields: Any) -> Problem:
    dtype, autocast = MODES[mode]
    return Problem(N=N, H=H, V=V, dtype=dtype, autocast=autocast, seed=seed, device=device, **fields)


#: The order in which a case's reduction is replaced by one the impl declares (:func:`in_declared_reduction`).
REDUCTION_ORDER: tuple[str, ...] = ("mean", "sum", "none")


def in_declared_reduction(p: Problem, reductions: Any) -> Problem:
    """``p`` in a reduction of ``reductions`` (an impl's declared ones): itself when its own is declared, else the
    first declared of :data:`REDUCTION_ORDER`, its upstream kept in kind (a scalar for a per-row one and back, 1 for
    1). The grid's cases are mostly ``mean``: an impl that offers only per-row losses (TransformerEngine's
    ``reduce_loss=False``) is judged on the same shapes, options and regimes instead of on none of them."""
    if p.reduction in reductions or not any(r in reductions for r in REDUCTION_ORDER):
        return p
    red = next(r for r in REDUCTION_ORDER if r in reductions)
    varied = p.upstream in ("scalar", "per_row")
    upstream = ("per_row" if red == "none" else "scalar") if varied else p.upstream
    if upstream == "loss_scale" and red != "mean":
        upstream = "one"
    return p.replace(reduction=red, upstream=upstream)


def linear_ce_cases(spec: GridSpec, device: str = "cpu") -> list[GridCase]:
    """Every linear+CE case of ``spec`` (before any impl's declaration filters them), in a fixed order."""
    out: list[GridCase] = []
    seen: set[Problem] = set()

    def add(group: str, mode: str, p: Problem) -> None:
        if p not in seen:
            seen.add(p)
            out.append(GridCase(group, mode, p))

    n0, h0, v0 = spec.base
    for mode in spec.ladder_modes:
        for axis in ("N", "H", "V"):
            for size in spec.ladder:
                shape = {"N": n0, "H": h0, "V": v0, axis: size}
                group = "ladder:base" if (shape["N"], shape["H"], shape["V"]) == spec.base else f"ladder:{axis}"
                add(group, mode, _problem(shape["N"], shape["H"], shape["V"], mode, 1000 + size, device))
    n, h, v = spec.option_shape
    for mode in spec.option_modes:
        for i, label in enumerate(spec.options):
            add(f"options:{label}", mode, _problem(n, h, v, mode, 2000 + i, device, **OPTION_CASES[label]))
    for mode, p in random_problems(spec.n_random, spec.seed, device):
        add("random", mode, p)
    return out


def random_problems(n: int, seed: int, device: str = "cpu") -> list[tuple[str, Problem]]:
    """The first ``n`` problems of the seeded random sequence (mode, problem)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        mode = rng.choice(tuple(MODES))
        N, H, V = (rng.choice(RANDOM_SIZES[a]) for a in ("N", "H", "V"))
        reduction = rng.choice(("mean", "sum", "none"))
        upstream = rng.choice(("one", "per_row")) if reduction == "none" else rng.choice(("one", "scalar"))
        fields = dict(
            bias=rng.random() < 0.5,
            ignored=rng.choice(RANDOM_IGNORED),
            reduction=reduction,
            label_smoothing=rng.choice((0.0, 0.0, 0.1, 0.5)),
            class_weights=rng.random() < 0.3,
            softcap=rng.choice((None, None, 5.0, 30.0)),
            z_loss_scale=rng.choice((0.0, 0.0, 1e-4, 1e-2)),
            upstream=upstream,
            regime=rng.choice(RANDOM_REGIMES),
        )
        out.append((mode, _problem(N, H, V, mode, 3000 + len(out), device, **fields)))
    return out


class NotRun(Counter):
    """The grid cases an impl does not run: reason → count (``report.json``'s ``not_declared``), and :attr:`named`,
    every such case with its group, mode and reason (``report.json``'s ``not_run``)."""

    def __init__(self) -> None:
        super().__init__()
        self.named: list[dict[str, str]] = []

    def add(self, group: str, mode: str, label: str, reason: str) -> None:
        """Count one case not run, and name it."""
        self[reason] += 1
        self.named.append({"group": group, "mode": mode, "case": label, "reason": reason})

    def merge(self, other: "NotRun") -> None:
        """Count and name the cases ``other`` holds as well."""
        self.update(other)
        self.named.extend(other.named)


def option_groups(support: Any) -> list[tuple[str, ...]]:
    """The declared options in combined groups: as many together as ``option_combinations_excluded`` allows,
    every declared option in at least one group (one group unless the declaration excludes a combination)."""
    declared = [o for o in LINEAR_CE_OPTIONS if o in support.options]
    excluded = support.option_combinations_excluded
    groups: list[tuple[str, ...]] = []
    left = list(declared)
    while left:
        group: list[str] = []
        for o in [*left, *(d for d in declared if d not in left)]:
            if not any(combo <= {*group, o} for combo in excluded):
                group.append(o)
        if not set(group) & set(left):  # left[0] is excluded on its own: no case can hold it
            left = left[1:]
            continue
        groups.append(tuple(o for o in declared if o in group))
        left = [o for o in left if o not in group]
    return groups


def declared_option_cases(support: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, Problem fields) of the declared cases of a linear+CE declaration (module docstring): each declared
    option alone (at the first declared reduction), each other declared reduction alone, every combined group of
    :func:`option_groups` of two or more options at every declared reduction, and an all-ignored batch where
    declared."""
    reductions = [r for r in REDUCTIONS if r in support.reductions]
    base = reductions[0]

    def at(r: str) -> dict[str, Any]:
        return dict(reduction=r, upstream=REDUCTION_UPSTREAM[r])

    out = [(o, {**OPTION_VALUES[o], **at(base)}) for o in LINEAR_CE_OPTIONS if o in support.options]
    out += [(f"reduction={r}", at(r)) for r in reductions if r != base]
    for group in option_groups(support):
        if len(group) > 1:
            fields = {k: v for o in group for k, v in OPTION_VALUES[o].items()}
            out += [(f"{'+'.join(group)}+{r}", {**fields, **at(r)}) for r in reductions]
    if support.all_ignored is not None and "ignore_index" in support.options:
        out.append(("all_ignored", dict(ignored=1.0, **at(base))))
    return out


def _label_seed(base: int, label: str) -> int:
    """A seed fixed by a declared case's label (the same case for every impl that declares it)."""
    return base + zlib.crc32(label.encode()) % 1000


def _declared_modes(spec: GridSpec, impl: Any, p: Problem) -> tuple[str, ...]:
    """The dtype modes a declared case ``p`` runs in for ``impl``: the grid's option modes in which the declaration
    admits it and no recorded known divergence of the impl covers it (:mod:`properties.linear_ce.known`, left out of the
    suite's draws too), else the first such mode of :data:`DECLARED_MODE_ORDER`, else the first mode it declares,
    else the option modes (in those two the plan names it as not run, with the reason)."""
    from numcheck.properties.linear_ce.known import known
    from numcheck.properties.linear_ce.strategies import refusal

    def declared(mode: str) -> bool:
        return refusal(impl.support, p.replace(dtype=MODES[mode][0], autocast=MODES[mode][1])) is None

    def runs(mode: str) -> bool:
        q = p.replace(dtype=MODES[mode][0], autocast=MODES[mode][1])
        return declared(mode) and known(impl.name, "accuracy", q) is None

    modes = tuple(m for m in spec.option_modes if runs(m))
    order = (*spec.option_modes, *DECLARED_MODE_ORDER)
    return modes or next(((m,) for f in (runs, declared) for m in order if f(m)), spec.option_modes)


def declared_cases(spec: GridSpec, impl: Any, device: str = "cpu") -> list[GridCase]:
    """An impl's declared linear+CE cases (module docstring), at the grid's declared shape, each in
    :func:`_declared_modes`."""
    if not spec.declared:
        return []
    n, h, v = spec.declared_shape
    out = []
    for label, fields in declared_option_cases(impl.support):
        p = _problem(n, h, v, "float32", _label_seed(6000, label), device, **fields)
        out += [
            GridCase(f"declared:{label}", mode, p.replace(dtype=MODES[mode][0], autocast=MODES[mode][1]))
            for mode in _declared_modes(spec, impl, p)
        ]
    return out


#: The dtypes of the many-chunk cases (:func:`many_chunk_cases`): those whose running sum across chunks, kept in
#: the compute dtype, drops increments within a draw (bf16 after about 128–256 chunks, fp16 2048–4096:
#: :data:`properties.linear_ce.chunks.MANY_CHUNKS_BY_DTYPE`); fp32 needs 2^24 of them.
MANY_CHUNK_DTYPES: tuple[str, ...] = ("bfloat16", "float16")
#: The upstream gradient of a many-chunk case at each reduction: one that reaches every chunk alike, so the chunks'
#: partial sums of grad_weight share a sign on post-norm rows and a narrow running sum's roundings add up (a per-row
#: upstream gives partials of either sign, where one can pass: properties.linear_ce.suite's covering rows).
MANY_CHUNK_UPSTREAM: dict[str, str] = {"mean": "one", "sum": "scalar", "none": "one"}


def many_chunk_shape(layout: Any, chunks_wanted: int) -> tuple[int, int, int]:
    """(N, H, V) of a many-chunk case of ``chunks_wanted`` chunks of ``layout``
    (:class:`properties.linear_ce.chunks.Layout`): a declared rule's cheapest shape (:func:`~properties.linear_ce.chunks.
    rule_shapes`), else the fewest rows of :meth:`~properties.linear_ce.chunks.Layout.n_range` with the largest V and H the
    suite's draws take at that N (:func:`~properties.linear_ce.chunks.v_cap`, at least
    :data:`~properties.linear_ce.chunks.MANY_CHUNK_MIN_V` and :data:`~properties.linear_ce.chunks.MANY_CHUNK_MIN_H`): few
    classes and hidden features, so grad_weight's error comes from the sum across chunks."""
    from numcheck.properties.linear_ce import chunks

    if layout.rule is not None:
        return chunks.rule_shapes(layout.rule, chunks_wanted, chunks.MANY_CHUNK_MIN_H, chunks.MANY_CHUNK_MIN_V)[0]
    N = layout.n_range(chunks_wanted)[0]
    V = max(chunks.MANY_CHUNK_MIN_V, chunks.v_cap(N))
    return N, max(chunks.MANY_CHUNK_MIN_H, min(chunks.MAX_H, V // 3)), V


def many_chunk_cases(spec: GridSpec, impl: Any, device: str = "cpu") -> tuple[list[tuple[Any, GridCase]], NotRun]:
    """A linear+CE impl's many-chunk cases (module docstring) as ``(impl to run, case)``: the impl's
    ``with_chunk_rows`` variant where the layout takes it (:func:`properties.linear_ce.strategies.many_chunk_layout`, as
    the suite's ``test_many_chunks``), else the impl; and the cases it does not run, named with the reason (a dtype or
    reduction it does not declare, a recorded known divergence of its ``many_chunks`` draws, or, for a slow impl, a
    dtype past its coarsest or a reduction past its first)."""
    from numcheck.properties.linear_ce import chunks
    from numcheck.properties.linear_ce.known import known
    from numcheck.properties.linear_ce.strategies import many_chunk_layout, refusal

    not_run = NotRun()
    if not spec.many_chunks:
        return [], not_run
    s = impl.support
    lay = many_chunk_layout(impl)
    slow = bool(s.slow)
    coarsest = next((d for d in MANY_CHUNK_DTYPES if dtype_of(d) in s.dtypes), None)
    first = next((r for r in REDUCTION_ORDER if r in s.reductions), None)
    out: list[tuple[Any, GridCase]] = []
    for dtype in MANY_CHUNK_DTYPES:
        k = chunks.many_chunks(dtype, lay.rows, slow)
        N, H, V = many_chunk_shape(lay, k)
        for red in [r for r in REDUCTION_ORDER if r in s.reductions]:
            p = Problem(
                N=N,
                H=H,
                V=V,
                dtype=dtype,
                reduction=red,
                upstream=MANY_CHUNK_UPSTREAM[red],
                regime="post_norm",
                seed=_label_seed(7000, f"{dtype}+{red}"),
                device=device,
            )
            divergence = known(lay.impl.name, "many_chunks", p)
            why = (
                refusal(s, p)
                or (divergence and f"known divergence: {divergence.reason}")
                or (
                    f"declared slow: its many-chunk cases run in {coarsest} and {first!r} only, {k} chunks "
                    "(numcheck.properties.linear_ce.chunks.many_chunks), as the suite's draws"
                    if slow and (dtype, red) != (coarsest, first)
                    else None
                )
            )
            gc = GridCase("many_chunks", dtype, p, chunks=lay.describe(N, H, V))
            if why:
                not_run.add(gc.group, gc.mode, p.short(), why)
            else:
                out.append((lay.impl, gc))
    return out, not_run


_DT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _quant_ladder(spec: GridSpec, recipe: Any, dtype: str, bias: bool, device: str) -> Iterator[tuple[str, QuantCase]]:
    """The size ladder of one recipe and dtype: each of M, K, N walked over ``spec.quant_ladder`` from the base."""
    m0, k0, n0 = spec.quant_base
    for axis in ("M", "K", "N"):
        for size in spec.quant_ladder:
            shape = {"M": m0, "K": k0, "N": n0, axis: size}
            base = (shape["M"], shape["K"], shape["N"]) == spec.quant_base
            case = QuantCase(
                recipe, shape["M"], shape["K"], shape["N"], dtype=dtype, bias=bias, seed=100 + size, device=device
            )
            yield ("ladder:base" if base else f"ladder:{axis}"), case


def _quant_extras(
    support: Any, recipe: Any, base: tuple[int, int, int], dtype: str, bias: bool, device: str
) -> Iterator[tuple[str, QuantCase]]:
    """The declared extras of one recipe and dtype: save_original_input, and three steps of delayed scaling."""
    m0, k0, n0 = base
    if recipe.allows_save_original_input and True in support.save_original_input:
        yield (
            "save_original_input",
            QuantCase(recipe, m0, k0, n0, dtype=dtype, bias=bias, seed=300, save_original_input=True, device=device),
        )
    if recipe.kind == "delayed":
        yield "delayed_steps", QuantCase(recipe, m0, k0, n0, dtype=dtype, bias=bias, seed=301, steps=3, device=device)


def quant_cases(spec: GridSpec, support: Any, device: str = "cpu") -> list[GridCase]:
    """Every quantized-linear case of ``spec`` for an impl declaring ``support``, in a fixed order."""
    declared = [name for d, name in _DT.items() if d in support.dtypes]
    if not declared:
        raise ValueError(f"support declares no dtype numcheck can build: {support.dtypes}")
    dtypes = declared if spec.quant_all_dtypes else (["bfloat16"] if "bfloat16" in declared else declared[:1])
    bias = bool(support.bias)
    out: list[GridCase] = []
    seen: set[QuantCase] = set()

    only_original = declared_mode(support)  # an impl declaring only save_original_input=True runs in that mode

    def add(group: str, c: QuantCase) -> None:
        c = c.replace(save_original_input=True) if only_original else c
        if c not in seen:
            seen.add(c)
            out.append(GridCase(group, c.dtype, c))

    m0, k0, n0 = spec.quant_base
    for r_i, recipe in enumerate(support.recipes):
        for dtype in dtypes:
            if spec.quant_all_recipes_ladder or r_i == 0:
                for group, case in _quant_ladder(spec, recipe, dtype, bias, device):
                    add(group, case)
            else:
                add("base", QuantCase(recipe, m0, k0, n0, dtype=dtype, bias=bias, seed=100 + k0, device=device))
            for regime in spec.quant_regimes:
                add(
                    f"regime:{regime}",
                    QuantCase(
                        recipe, m0 - 7, k0, n0 - 8, dtype=dtype, bias=bias, regime=regime, seed=200, device=device
                    ),
                )
            if spec.quant_extras:
                for group, case in _quant_extras(support, recipe, spec.quant_base, dtype, bias, device):
                    add(group, case)
    return out


def dist_declared(spec: GridSpec, impl: Any) -> list[tuple[str, dict[str, Any], str, int, int]]:
    """(group, Problem fields, placement, V, world size) of a distributed impl's declared cases (module docstring):
    its declared options and reductions alone and combined at the largest world size of :data:`DIST_WORLD_SIZES` it
    declares, and each combined group with targets on shard boundaries at V = :data:`DIST_UNEVEN_V` at every world
    size above 1 (refused, with the reason, where ``uneven_vocab`` or the world size is not declared)."""
    s = impl.support
    dtype = next((d for d in ("float32", "bfloat16", "float16") if dtype_of(d) in s.dtypes), None)
    if not spec.declared or dtype is None:
        return []
    top = max((P for P in DIST_WORLD_SIZES if P in impl.dist.world_sizes), default=max(DIST_WORLD_SIZES))
    V = DIST_SHAPE[2]
    out = [
        (f"dist:declared:{label}", dict(dtype=dtype, **fields), "as_built", V, top)
        for label, fields in declared_option_cases(s)
    ]
    base = [r for r in REDUCTIONS if r in s.reductions][0]
    for group in option_groups(s) or [()]:
        fields = {k: v for o in group for k, v in OPTION_VALUES[o].items()}
        label = f"dist:uneven:{'+'.join(group) or 'plain'}+{base}"
        out += [
            (
                label,
                dict(dtype=dtype, reduction=base, upstream=REDUCTION_UPSTREAM[base], **fields),
                "boundary",
                DIST_UNEVEN_V,
                P,
            )
            for P in DIST_WORLD_SIZES
            if P > 1
        ]
    return out


def dist_cases(spec: GridSpec, impl: Any, device: str = "cpu") -> tuple[list[GridCase], NotRun]:
    """The distributed cases of ``spec`` an impl's declaration admits at each of :data:`DIST_WORLD_SIZES` and its
    declared cases (:func:`dist_declared`), and the others counted and named per reason (an undeclared option or
    dtype, world size, backend or uneven shards, ranks the backend cannot run here, or a recorded known divergence
    of the impl, :data:`properties.distributed.linear_ce.known.DIST_KNOWN`)."""
    from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
    from numcheck.properties.distributed.linear_ce.cases import DistCase
    from numcheck.properties.distributed.linear_ce.suite import known_divergence
    from numcheck.properties.linear_ce.strategies import refusal

    backend = default_backend()
    out: list[GridCase] = []
    not_run = NotRun()
    N, H, V0 = DIST_SHAPE
    planned = [
        (f"dist:{label}", DIST_CASES[label][0], DIST_CASES[label][1], V0, P, 4000 + i)
        for P in DIST_WORLD_SIZES
        for i, label in enumerate(spec.dist_cases)
    ]
    planned += [(g, f, pl, V, P, _label_seed(4100, g)) for g, f, pl, V, P in dist_declared(spec, impl)]
    for group, fields, placement, V, P, seed in planned:
        p = in_declared_reduction(Problem(N=N, H=H, V=V, seed=seed, device=device, **fields), impl.support.reductions)
        why = (
            refusal(impl.support, p)
            or (f"world size {P} not declared" if P not in impl.dist.world_sizes else None)
            or (f"backend {backend} not declared" if backend not in impl.dist.backends else None)
            or (
                f"uneven shards (V={V} over {P} ranks) not declared (uneven_vocab=False)"
                if V % P and not impl.dist.uneven_vocab
                else None
            )
            or world_size_unavailable(P, backend)
        )
        case = None if why else DistCase(p, P, backend, placement)
        known = known_divergence(impl, case) if case is not None else None
        mode = f"P={P} {p.dtype}"
        if why:
            not_run.add(group, mode, p.short(), why)
        elif known:  # a recorded defect of the impl, as the suite leaves it out of its draws: counted, not run
            not_run.add(group, mode, p.short(), f"known divergence: {known}")
        else:
            out.append(GridCase(group, mode, case))
    return out, not_run


def _tp_dtypes(spec: GridSpec, support: Any) -> list[str]:
    declared = [name for d, name in _DT.items() if d in support.dtypes]
    if not declared:
        raise ValueError(f"support declares no dtype numcheck can build: {support.dtypes}")
    return declared if spec.quant_all_dtypes else (["bfloat16"] if "bfloat16" in declared else declared[:1])


def tp_cases(spec: GridSpec, impl: Any) -> tuple[list[GridCase], NotRun]:
    """The tensor-parallel cases of ``spec`` an impl's declaration admits (module docstring), and the others
    counted and named per reason (:func:`properties.distributed.tp_fp8.cases.refusal`, a world size the backend
    cannot run here, a shape the recipe's blocks do not fit)."""
    from numcheck.properties.distributed.tp_fp8.cases import refusal as tp_case_refusal

    from numcheck.properties.distributed.tp_fp8.cases import SHARD_EDGE, TPQuantCase
    from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable

    backend = default_backend()
    support = impl.support
    out: list[GridCase] = []
    not_run = NotRun()
    for recipe in support.recipes if spec.tp_all_recipes else support.recipes[:1]:
        split = 4 * SHARD_EDGE[recipe.kind] * (6 if SHARD_EDGE[recipe.kind] == 1 else 1)
        for dtype in _tp_dtypes(spec, support):
            for P in TP_WORLD_SIZES:
                for parallel in ("column", "row"):
                    K, N = (TP_FREE["column"], split) if parallel == "column" else (split, TP_FREE["row"])
                    for i, label in enumerate(spec.tp_cases):
                        try:
                            case = TPQuantCase(
                                recipe,
                                TP_M,
                                K,
                                N,
                                dtype=dtype,
                                regime="normal",
                                seed=5000 + i,
                                steps=2 if recipe.kind == "delayed" else 1,
                                world=P,
                                parallel=parallel,
                                **TP_CASES[label],
                            )
                        except ValueError as exc:
                            why: str | None = f"shape not buildable: {exc}"
                        else:
                            why = tp_case_refusal(support, case) or world_size_unavailable(P, backend)
                        sp = " SP" if TP_CASES[label]["sequence_parallel"] else ""
                        mode = f"P={P} {parallel}{sp} {dtype}"
                        if why:
                            not_run.add(f"tp:{label}", mode, f"{recipe.name} M{TP_M}K{K}N{N}", why)
                        else:
                            out.append(GridCase(f"tp:{label}", mode, case))
    return out, not_run


def grouped_cases(spec: GridSpec, impl: Any, device: str = "cpu") -> tuple[list[GridCase], dict[str, int]]:
    """The grouped cases of ``spec`` (:data:`GROUPED_CASES`, module docstring) an impl's declaration admits, for each
    recipe (the first of each kind in the quick grid) and dtype, and the others counted per reason
    (:func:`properties.fp8.grouped.cases.refusal`)."""
    from numcheck.properties.fp8.grouped.cases import GroupedCase, fitted, refusal

    support = impl.support
    declared = [name for d, name in _DT.items() if d in support.dtypes]
    if not declared:
        raise ValueError(f"support declares no dtype numcheck can build: {support.dtypes}")
    dtypes = declared if spec.quant_all_dtypes else (["bfloat16"] if "bfloat16" in declared else declared[:1])
    recipes = (
        list(support.recipes)
        if spec.grouped_all_recipes
        else [next(r for r in support.recipes if r.kind == k) for k in dict.fromkeys(r.kind for r in support.recipes)]
    )
    out: list[GridCase] = []
    skipped: dict[str, int] = {}
    for recipe in recipes:
        for dtype in dtypes:
            for i, label in enumerate(spec.grouped_cases):
                splits, K, N, fields = GROUPED_CASES[label]
                if fields.get("save_original_input") and not recipe.allows_save_original_input:
                    fields = {**fields, "save_original_input": False}
                case = fitted(
                    support,
                    GroupedCase(
                        recipe,
                        splits,
                        K,
                        N,
                        dtype=dtype,
                        seed=6000 + i,
                        device=device,
                        steps=2 if recipe.kind == "delayed" else 1,
                        **fields,
                    ),
                )
                why = refusal(support, case)
                if why:
                    skipped[why] = skipped.get(why, 0) + 1
                else:
                    out.append(GridCase(f"grouped:{label}", dtype, case))
    return out, skipped


def reduction_length(output: str, case: Any) -> int:
    """The length of the reduction an output's error grows with.

    Linear+CE: grad_x sums over V; grad_weight and grad_bias over the N rows; a reduced loss (and z-loss)
    over N rows, a per-row (``none``) one over V (its log-sum-exp). Quantized linear: y over K, dgrad over N,
    wgrad and bgrad over M, of the global (unsharded) tensors for a tensor-parallel case; for a grouped case the
    largest expert's rows. (H, the logits' dot-product length, enters every linear+CE output.)
    """
    base = output.split("@", 1)[0]
    case = getattr(case, "problem", case)  # a DistCase: its problem's lengths
    if hasattr(case, "m_splits"):  # a GroupedCase: y over K, dgrad over N, wgrad and bgrad over the largest split
        lengths = {"y": case.K, "dgrad": case.N, "wgrad": max(case.m_splits), "bgrad": max(case.m_splits)}
        if base not in lengths:
            raise ValueError(f"unknown grouped-linear output {output!r}")
        return int(lengths[base])
    if isinstance(case, QuantCaseFields):  # a QuantCase, or a TPQuantCase: its global lengths
        try:
            return int(getattr(case, QUANT_REDUCTION_AXIS[base]))
        except KeyError:
            raise ValueError(f"unknown quantized-linear output {output!r}") from None
    if base == "grad_x":
        return case.V
    if base in ("grad_weight", "grad_bias"):
        return case.N
    if base in ("loss", "z_loss"):
        return case.V if case.reduction == "none" else case.N
    raise ValueError(f"unknown linear+CE output {output!r}")


def span_decades(lengths: Iterable[int]) -> float:
    """log10(max/min) of some reduction lengths (0 for fewer than two)."""
    vals = [v for v in lengths if v > 0]
    return math.log10(max(vals) / min(vals)) if len(vals) > 1 else 0.0
