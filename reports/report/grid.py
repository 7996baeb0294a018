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
* **Declared cases**, per impl, from its declaration (:func:`~reports.report.families.linear_ce.declared_cases`): each declared option on its own
  (:data:`OPTION_VALUES`), each declared reduction on its own, all declared options together at every declared
  reduction (options a declaration excludes together go into further combined cases), and an all-ignored batch
  where declared; at :attr:`GridSpec.declared_shape`, in the option modes the impl declares (else the first mode of
  :data:`DECLARED_MODE_ORDER` it declares), leaving out a mode where a recorded known divergence of the impl covers
  the case. The fixed option cases combine options, so an impl missing one of a combination's options would
  otherwise never run the others (label smoothing only beside class weights); the quick grid keeps only the fixed
  regime cases (:data:`QUICK_OPTIONS`).

* **Many-chunk cases**, per impl, from its declared chunking (:func:`~reports.report.families.linear_ce.many_chunk_cases`, the layout of the suite's
  ``test_many_chunks``, :mod:`properties.linear_ce.chunks`): in each low-precision plain dtype and each declared reduction,
  post-norm rows whose count makes 2/u + 1 chunks of its declared ``chunk_rows`` or ``chunk_rule`` (257 for a
  ``slow`` impl, which runs them in its coarsest dtype and first reduction only, as the suite's draws do), or rows
  past any chunk size it may use undeclared; one row a chunk of its ``with_chunk_rows`` variant where it has one. A
  running sum across chunks kept in the compute dtype shows only there: the other cases span a few chunks at most.

Each impl runs every case its declaration admits (:func:`properties.linear_ce.strategies.refusal`); the others are
counted per impl with the reason and named (:class:`NotRun`), never dropped silently.

Each other family's cases are built in its module of :mod:`reports.report.families` from the case tables
below (:data:`DIST_CASES`, :data:`TP_CASES`, :data:`GROUPED_CASES`, the quantized ladder of :class:`GridSpec`).

**Property cases**, per impl (:mod:`reports.report.property_grid`, where :attr:`GridSpec.properties`): every
property the impl's kind's suite runs, on the cases reaching its regime from the declaration, judged by the property
library's own function (pass/fail records with the property's message; accuracy ones as above).

Presets: :data:`QUICK` (``--quick``: ≤ 8 minutes on a 2-core CPU with every built-in, results/reports/quick-budget.md), :data:`FULL` (the default) and
:data:`SMOKE` (a tiny grid for tests and trying things out; ladders still span two decades).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from numcheck.properties.fp8.cases import Fp8CaseFields
from numcheck.properties.linear_ce.cases import Problem

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

#: The value each declared option takes in the declared cases (:func:`~reports.report.families.linear_ce.declared_cases`, :func:`~reports.report.families.dist_linear_ce.dist_declared`).
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

#: Tensor-parallel FP8 cases: label → TPFp8Case fields (:func:`reports.report.families.tp_fp8_linear.tp_cases`).
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

#: Grouped FP8 cases: label → (m_splits, K, N, GroupedCase fields) (:func:`reports.report.families.grouped_fp8_linear.grouped_cases`), each moved into the impl's
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
        fp8_ladder: (M, K, N) values of the quantized ladder; ``fp8_base`` its base.
        fp8_all_recipes_ladder: run the ladder for every recipe (else the first recipe of each impl).
        fp8_all_dtypes: every declared dtype (else bfloat16, or the first declared).
        fp8_regimes: regimes at the base shape for every recipe.
        fp8_extras: add ``save_original_input=True`` and 3-step delayed cases.
        dist_cases: labels of :data:`DIST_CASES` to run.
        tp_cases: labels of :data:`TP_CASES` to run.
        tp_all_recipes: tensor-parallel cases for every recipe (else the first recipe of each impl).
        declared: add each impl's declared cases (:func:`~reports.report.families.linear_ce.declared_cases`, :func:`~reports.report.families.dist_linear_ce.dist_declared`).
        declared_shape: (N, H, V) of the linear+CE declared cases (small: an interpreted kernel's time grows with
            the rows, and the options' semantics show at any size).
        many_chunks: add each linear+CE impl's many-chunk cases (:func:`~reports.report.families.linear_ce.many_chunk_cases`).
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
    fp8_ladder: tuple[int, ...]
    fp8_base: tuple[int, int, int]
    fp8_all_recipes_ladder: bool
    fp8_all_dtypes: bool
    fp8_regimes: tuple[str, ...]
    fp8_extras: bool
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
        for label, values in (("ladder", self.ladder), ("fp8_ladder", self.fp8_ladder)):
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
            f"(seed {self.seed}). Quantized linear: (M, K, N) ladder {list(self.fp8_ladder)} around "
            f"{self.fp8_base} for {'every recipe' if self.fp8_all_recipes_ladder else 'the first recipe of each impl'}"
            f", regimes {', '.join(self.fp8_regimes)} for every recipe"
            f"{', every declared dtype' if self.fp8_all_dtypes else ', bfloat16'}"
            f"{', save_original_input=True and 3-step delayed cases' if self.fp8_extras else ''}. Distributed "
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
    fp8_ladder=(4, 40, 400),
    fp8_base=(40, 40, 40),
    fp8_all_recipes_ladder=False,
    fp8_all_dtypes=False,
    fp8_regimes=("wide", "outlier"),
    fp8_extras=False,
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
    fp8_ladder=(4, 16, 64, 256, 1024),
    fp8_base=(40, 40, 40),
    fp8_all_recipes_ladder=True,
    fp8_all_dtypes=True,
    fp8_regimes=("normal", "wide", "outlier", "zeros", "tiny", "nan", "inf"),
    fp8_extras=True,
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
    fp8_ladder=(2, 200),
    fp8_base=(8, 8, 8),
    fp8_all_recipes_ladder=False,
    fp8_all_dtypes=False,
    fp8_regimes=(),
    fp8_extras=False,
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
    case: Any  # Problem or Fp8Case
    #: What the case's rows make of the impl's chunks, where the case is built from them (a many-chunk case).
    chunks: str = field(default="", compare=False)
    #: The property the case is judged by (as ``numcheck repro`` names it): ``accuracy`` (an error/bound record), or
    #: another property of the kind's suite (:mod:`reports.report.property_grid`, a pass/fail record).
    prop: str = "accuracy"


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


def label_seed(base: int, label: str) -> int:
    """A seed fixed by a declared case's label (the same case for every impl that declares it)."""
    return base + zlib.crc32(label.encode()) % 1000


#: The dtypes of the many-chunk cases (:func:`~reports.report.families.linear_ce.many_chunk_cases`): those whose running sum across chunks, kept in
#: the compute dtype, drops increments within a draw (bf16 after about 128–256 chunks, fp16 2048–4096:
#: :data:`properties.linear_ce.chunks.MANY_CHUNKS_BY_DTYPE`); fp32 needs 2^24 of them.
MANY_CHUNK_DTYPES: tuple[str, ...] = ("bfloat16", "float16")


#: The dtypes a quantized case is built in, by name (the declared ones of an impl, in this order).
DTYPE_NAMES: dict[torch.dtype, str] = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


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
    if isinstance(case, Fp8CaseFields):  # a Fp8Case, or a TPFp8Case: its global lengths
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
