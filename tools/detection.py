"""The detection table: which of the suite's properties catch each in-repo mutant under the ci profile, by how
much, and how soon. A tool of numcheck's checkout (the mutants are numcheck's own tests, never shipped):
``python tools/detection.py [--mutant NAME ...] [--out DIR]``.

Every mutant (``tests/self/helpers/mutants.py``, ``tests/self/helpers/fp8_mutants.py``: a passing built-in with one bug of one
class, declared as the built-in is) is loaded by its spec, as ``--impl`` loads it, and each property of its
class (:data:`ROWS`) runs through the suite's own runner (:mod:`numcheck.properties.core.runner`, what both the pytest
suite and :func:`numcheck.check` run) under the ci profile, with ``numcheck.check``'s draws (same example
budget, same derandomized seed per property and impl), one fresh process per mutant. The shrink phase is left
out: the verdict is decided by the first failing draw, and shrinking it (which took minutes per property here)
would change neither the verdict nor how soon CI turns red. Per mutant it records the properties that failed,
the margin of each (the first error/bound of the failing draw's message, else the kind of failure: "differs
between two identical runs", "codes differ from the oracle", ...), the seconds from the start of its run to the
end of the first failing property, and whether it was caught at all; it prints a Markdown table and writes
``detection.json`` and ``detection.md``.

Each column of a row records the commit it ran at (``ran at``). ``--mutant NAME ... --update DIR`` runs only the
named mutants and replaces their rows in ``DIR/detection.json`` and ``DIR/detection.md``, keeping the others' rows
(and, with ``--no-suite`` or ``--no-report``, the updated rows' column not run); ``--doc PAGE.md`` writes the table
into the page's generated block (between :data:`TABLE_BEGIN` and :data:`TABLE_END`). A new family's mutants join
the committed table so, without a full rerun::

    python tools/detection.py --mutant NAME ... --update results/detection --doc docs/detection.md

The mutants are numcheck's own tests, which a wheel does not ship: the command needs a checkout (it names them
by spec and never imports them itself). ``--all-properties`` runs every drawn property of the suite per mutant
instead of its class's (much slower).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

HELP = "run every in-repo mutant through the suite under the ci profile and tabulate which properties catch it"

_LINEAR = "numcheck.tests.self.helpers.mutants"
_FP8 = "numcheck.tests.self.helpers.fp8_mutants"
_GROUPED = "numcheck.tests.self.helpers.grouped_fp8_mutants"
_DIST = "numcheck.tests.self.helpers.dist_mutants"
_DIST_REDUCE = "numcheck.tests.self.helpers.dist_reduce"
_TP = "numcheck.tests.self.helpers.dist_fp8_mutants"
_DISTILL = "numcheck.tests.self.helpers.distill_mutants"
_PREF = "numcheck.tests.self.helpers.preference_mutants"

#: The suite properties (names of numcheck.check) that judge what each bug class breaks.
#: (Kept to the two or three that matter per class: the whole run stays near 20 minutes on a loaded 2-core machine.)
_ACCUMULATOR = ("accuracy_fp32_sharp", "many_chunks")
_LOWP_ONLY = ("accuracy", "many_chunks", "large_vocab")
_NONDETERMINISM = ("determinism", "ignored_rows", "chunk_invariance")
_NARROW = ("accuracy", "accuracy_fp32_sharp")
_QUANTIZER = ("quantizer_bitwise_on_random_tensors", "accuracy_against_both_references")
_FP8_GRID = ("accuracy_against_both_references", "accuracy_on_scale_block_grids")
#: The grouped suite's drawn tests (properties/fp8/grouped/suite.py).
_G_ACC = "grouped_accuracy_against_both_references"
_G_ACCUM = "grouped_wgrad_accumulation_over_micro_batches"
_G_EMPTY = "grouped_empty_experts_exact_zero"
_G_SOI = "grouped_save_original_input_is_bitwise_identical"
_G_BYTES = "grouped_saved_bytes_measured"
_G_GRID = "grouped_accuracy_on_scale_block_grids"
#: The linear+preference suite's drawn tests (properties/linear_preference/suite.py).
_P_ACC = ("preference_accuracy",)
_P_CHUNKS = ("preference_chunk_invariance", "preference_accuracy")
_P_OPTIONS = ("preference_options_honoured", "preference_accuracy")
#: The distributed suites' tests: vocabulary-parallel ``PROPERTY[world_size=P]`` (tests/suite/test_distributed.py,
#: run at that world size under gloo), TP/SP FP8 by their drawn test (properties/distributed/tp_fp8/suite.py, at
#: every declared world size the backend runs here, as tests/suite/test_distributed_fp8.py runs them).
_VP = ("dist_accuracy[world_size=4]",)
_VP_RELATION = ("dist_world_size_invariance[world_size=2]", "dist_accuracy[world_size=2]")
_TP_ACC = ("dist_accuracy_and_same_scale",)
_TP_SOI = ("dist_accuracy_and_same_scale", "dist_save_original_input")

#: The family of each mutant module, as the table names it.
FAMILIES = {
    _LINEAR: "linear+CE",
    _FP8: "FP8 linear",
    _GROUPED: "grouped FP8",
    _DIST: "vocab-parallel",
    _DIST_REDUCE: "vocab-parallel",
    _TP: "TP/SP FP8",
    _DISTILL: "linear+JSD",
    _PREF: "linear+preference",
}


@dataclass(frozen=True)
class Row:
    """One mutant of the table: its bug class, its ``--impl`` spec, what it changes and the drawn tests run (by
    their names in its family's registry entry, :data:`~numcheck.properties.suites.SUITES` or ``RANKED``); its
    family as the table names it (``family``, else its module's in :data:`FAMILIES`, else the module's name)."""

    bug_class: str
    spec: str
    change: str
    select: tuple[str, ...]
    family: str = ""


#: The linear-distill mutants (tests/self/helpers/distill_mutants.py), each run through the drawn test that catches
#: it in tests/self/mutants/test_distill_mutants.py (its CAUGHT_BY), with accuracy beside it.
DISTILL_ROWS: tuple[Row, ...] = (
    Row(
        "narrow accumulator",
        f"{_DISTILL}:loss_bf16_sum",
        "the chunks' loss sums added in bf16",
        ("distill_chunk_invariance", "distill_accuracy"),
    ),
    Row(
        "narrow intermediate",
        f"{_DISTILL}:rounded_logits",
        "logits rounded to bf16 before the fp32 cast, declaring fp32 logits",
        ("distill_accuracy",),
    ),
    Row(
        "convention",
        f"{_DISTILL}:counts_ignored",
        "ignored rows counted in the denominator",
        ("distill_accuracy", "distill_ignored_rows_change_nothing"),
    ),
    Row(
        "convention",
        f"{_DISTILL}:student_temperature",
        "the temperature divides the student's logits only",
        ("distill_temperature_scaling", "distill_accuracy"),
    ),
    Row(
        "dropped option",
        f"{_DISTILL}:drops_temperature",
        "a wrapper that never passes the temperature on",
        ("distill_declared_options_take_effect", "distill_accuracy"),
    ),
    Row(
        "frozen input",
        f"{_DISTILL}:teacher_gets_grad",
        "the teacher's logits left in the graph",
        ("distill_teacher_frozen",),
    ),
    Row(
        "convention",
        f"{_DISTILL}:reverse_at_zero",
        "beta = 0 computes the reverse KL, declaring forward_kl",
        ("distill_beta_endpoints", "distill_accuracy"),
    ),
)

#: The grouped FP8 mutants (tests/self/helpers/grouped_fp8_mutants.py), each run through the grouped test that holds
#: its bug's regime (the one tests/self/mutants/test_grouped_fp8_mutants.py names for it; accuracy for four of them).
GROUPED_ROWS: tuple[Row, ...] = (
    Row("split", f"{_GROUPED}:shared_scale", "per-tensor scales from one amax over every expert's rows", (_G_ACC,)),
    Row(
        "split",
        f"{_GROUPED}:offsets_off_by_one",
        "each expert's first row taken as the previous expert's last",
        (_G_ACC,),
    ),
    Row("quantizer edge", f"{_GROUPED}:zero_amax_inf_scale", "fp8_max / amax without the amax = 0 case", (_G_ACC,)),
    Row(
        "state across calls",
        f"{_GROUPED}:wrong_expert_dy_quantizer",
        "backward quantizes expert i's dy with expert i+1's delayed quantizer",
        (_G_ACC,),
    ),
    Row(
        "narrow accumulator",
        f"{_GROUPED}:bf16_main_grad",
        "fused wgrad accumulation into main_grad rounded through bf16",
        (_G_ACCUM,),
    ),
    Row(
        "state across calls",
        f"{_GROUPED}:first_micro_batch_main_grad",
        "only the first micro-batch's wgrad reaches main_grad (Primus PR #1046)",
        (_G_ACCUM,),
    ),
    Row(
        "state across calls",
        f"{_GROUPED}:stale_wgrad_workspace",
        "wgrad workspace kept per shape, not cleared: an empty expert returns the previous call's slot",
        (_G_EMPTY,),
    ),
    Row(
        "save_original_input",
        f"{_GROUPED}:soi_whole_input",
        "save_original_input: backward re-quantizes the saved x as one tensor, forgetting the split",
        (_G_SOI,),
    ),
    Row(
        "held bytes",
        f"{_GROUPED}:saves_copy_of_x",
        "save_original_input keeps a private copy of x (no memory saved)",
        (_G_BYTES,),
    ),
    Row(
        "uninitialised memory",
        f"{_GROUPED}:uninitialised_empty_wgrad",
        "wgrad buffer from torch.empty, written only by experts with rows (caught with memory poisoned)",
        (_G_EMPTY,),
    ),
    Row(
        "format",
        f"{_GROUPED}:hybrid_dy_e4m3",
        "HYBRID backward quantizes dy as E4M3, not E5M2 (TE #3342)",
        (_G_ACC, _G_GRID),
    ),
    Row(
        "scale layout",
        f"{_GROUPED}:expert_dgrad_tile_scales_untransposed",
        "each expert's dgrad W tile scales read at the transposed tile index",
        (_G_ACC, _G_GRID),
    ),
)

#: The distributed mutants: vocabulary-parallel (tests/self/helpers/dist_mutants.py, dist_reduce.py) and TP/SP FP8
#: (tests/self/helpers/dist_fp8_mutants.py), under gloo.
DIST_ROWS: tuple[Row, ...] = (
    Row("normalisation", f"{_DIST}:local_vocab_smoothing", "label smoothing ε/V_r (the shard's) for ε/V", _VP),
    Row("collective", f"{_DIST}:no_grad_x_all_reduce", "grad_x left as the rank's partial (no all-reduce)", _VP),
    Row(
        "shard offset", f"{_DIST}:target_offset_off_by_one", "a target on the next shard's first class counted too", _VP
    ),
    Row("collective", f"{_DIST}:local_lse_z_loss", "z-loss from the rank's local lse, not the global one", _VP),
    Row(
        "uninitialised memory",
        f"{_DIST}:unowned_target_logit_uninitialised",
        "target-logit partial from torch.empty, written only at the rows whose target the rank owns "
        "(caught with the ranks' memory poisoned)",
        _VP,
    ),
    Row(
        "declared reduce dtype",
        f"{_DIST_REDUCE}:bf16_reduce_declared_fp32",
        "grad_x partials all-reduced in bf16, declaring float32",
        _VP_RELATION,
    ),
    Row("collective", f"{_TP}:amax_not_reduced", "per-tensor scales from each rank's own amax (current)", _TP_ACC),
    Row(
        "collective",
        f"{_TP}:amax_not_reduced_delayed",
        "per-tensor scales from each rank's own amax (delayed)",
        _TP_ACC,
    ),
    Row(
        "collective",
        f"{_TP}:sp_gather_local_scale",
        "column SP: x_r quantized with its own amax before the gather",
        _TP_ACC,
    ),
    Row(
        "save_original_input",
        f"{_TP}:soi_local_shard",
        "column SP, save_original_input: backward quantizes the local shard, not the gathered x (current)",
        _TP_SOI,
    ),
    Row(
        "save_original_input",
        f"{_TP}:soi_local_shard_mxfp8",
        "as soi_local_shard, MXFP8 (its own 32-blocks)",
        _TP_SOI,
    ),
    Row(
        "collective", f"{_TP}:row_output_not_reduced", "row-parallel partial y returned without the all-reduce", _TP_ACC
    ),
    Row(
        "declared reduce dtype",
        f"{_TP}:partials_in_output_declared_fp32",
        "partials of sharded reductions reduced in the output dtype, declaring float32",
        _TP_ACC,
    ),
)

#: The linear+preference mutants (tests/self/helpers/preference_mutants.py), each through the drawn test
#: tests/self/mutants/test_preference_mutants.py names for it (and accuracy beside the metamorphic ones).
PREFERENCE_ROWS: tuple[Row, ...] = (
    Row(
        "narrow accumulator",
        f"{_PREF}:pref_gw_bf16_sum",
        "grad_weight's running sum over chunks of pairs in bf16",
        _P_CHUNKS,
    ),
    Row("narrow accumulator", f"{_PREF}:pref_loss_bf16_sum", "the chunks' losses added in bf16", _P_CHUNKS),
    Row(
        "ignored positions",
        f"{_PREF}:pref_counts_ignored",
        "ORPO's per-sequence mean divides by ignored positions too",
        _P_ACC,
    ),
    Row(
        "convention",
        f"{_PREF}:pref_no_length_norm",
        "SimPO on summed log-probabilities (length normalisation missing)",
        _P_ACC,
    ),
    Row("convention", f"{_PREF}:pref_swapped_halves", "first half taken as rejected, second as chosen", _P_ACC),
    Row("option dropped", f"{_PREF}:pref_beta_dropped", "a wrapper that drops beta (its default 0.1 used)", _P_OPTIONS),
    Row("option dropped", f"{_PREF}:pref_smoothing_dropped", "a wrapper that drops label smoothing", _P_OPTIONS),
    Row(
        "convention", f"{_PREF}:pref_ref_ignored", "robust DPO with the reference log-probabilities taken as 0", _P_ACC
    ),
    Row("option dropped", f"{_PREF}:pref_kto_kl_dropped", "KTO's reference point kl dropped by a wrapper", _P_OPTIONS),
)

ROWS: tuple[Row, ...] = (
    Row(
        "narrow accumulator", f"{_LINEAR}:gw_bf16_sum", "grad_weight's running sum across chunks in bf16", _ACCUMULATOR
    ),
    Row("narrow accumulator", f"{_LINEAR}:gb_bf16_sum", "grad_bias's running sum across chunks in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gx_bf16_sum", "grad_x summed over 128-class blocks in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:loss_bf16_sum", "the chunks' loss sums added in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gw_bf16_sum_bf16_only", "as gw_bf16_sum, declaring bf16 only", _LOWP_ONLY),
    Row(
        "narrow accumulator",
        f"{_LINEAR}:gw_fp16_sum_fp16_only",
        "grad_weight's running sum in fp16, declaring fp16 only",
        _LOWP_ONLY,
    ),
    Row("narrow accumulator", f"{_LINEAR}:gx_bf16_sum_bf16_only", "as gx_bf16_sum, declaring bf16 only", _LOWP_ONLY),
    Row(
        "narrow accumulator",
        f"{_LINEAR}:bf16_grad_weight_accum",
        "eager-based: grad_weight summed over 4-row chunks in bf16 (an older mutant)",
        _ACCUMULATOR,
    ),
    Row(
        "nondeterminism",
        f"{_LINEAR}:chunk_order_per_call",
        "full chunks processed in a per-call random order",
        _NONDETERMINISM,
    ),
    Row(
        "nondeterminism",
        f"{_LINEAR}:row_order_per_call",
        "rows assigned to chunks in a per-call random order",
        _NONDETERMINISM,
    ),
    Row(
        "narrow intermediate",
        f"{_LINEAR}:row_loss_bf16",
        "each per-row loss rounded to bf16 before the reduction",
        _NARROW,
    ),
    Row("narrow intermediate", f"{_LINEAR}:stats_bf16", "recompute's per-row (max, log-sum) kept in bf16", _NARROW),
    Row(
        "narrow intermediate",
        f"{_LINEAR}:loss_bf16",
        "eager-based: the loss rounded through bf16 (an older mutant)",
        _NARROW,
    ),
    Row("quantizer edge", f"{_FP8}:mx_scale_wrong_way", "E8M0 RCEIL floors, FLOOR ceils (an older mutant)", _QUANTIZER),
    Row("quantizer edge", f"{_FP8}:mx_rceil_log2", "E8M0 RCEIL code through an fp32 log2", _QUANTIZER),
    Row(
        "quantizer edge",
        f"{_FP8}:mx_rceil_nonstrict",
        "E8M0 RCEIL rounds exact powers of two up (>= for >)",
        _QUANTIZER,
    ),
    Row(
        "quantizer edge", f"{_FP8}:pow2_scale_log2_current", "power-of-2 current scale through an fp32 log2", _QUANTIZER
    ),
    Row(
        "quantizer edge", f"{_FP8}:pow2_scale_log2_blockwise", "power-of-2 block scale through an fp32 log2", _QUANTIZER
    ),
    Row(
        "quantizer edge", f"{_FP8}:no_saturation_mxfp8", "no saturation at the format maximum (MXFP8 FLOOR)", _QUANTIZER
    ),
    Row("quantizer edge", f"{_FP8}:no_saturation_delayed", "no saturation at the format maximum (delayed)", _QUANTIZER),
    Row(
        "scale layout",
        f"{_FP8}:dgrad_tile_scales_untransposed",
        "dgrad's W tile scales read at the transposed tile index (power-of-2 blockwise)",
        _FP8_GRID,
    ),
    Row(
        "scale layout",
        f"{_FP8}:w_k_tail_previous_scale",
        "W's partial last K-tile takes the previous tile's scale (K assumed a multiple of 128)",
        _FP8_GRID,
    ),
    Row("scale layout", f"{_FP8}:w_k_block_scale_shifted", "fprop's W scale of K-block b read from b + 1", _FP8_GRID),
    Row(
        "scale layout",
        f"{_FP8}:rowwise_scales_wrong_axis",
        "rowwise recipes: fprop's x scaled per column (over M), not per row (over K)",
        _FP8_GRID,
    ),
    Row(
        "scale layout",
        f"{_FP8}:rowwise_one_scale",
        "rowwise recipes: fprop's x scaled with one scale for the whole tensor",
        _FP8_GRID,
    ),
    Row(
        "accumulation",
        f"{_FP8}:hopper_restart_dropped",
        "Hopper's fast-accumulation chain where 128-long chains are declared (use_fast_accum=True meant False)",
        ("accuracy_against_both_references", "accuracy_on_long_same_sign_chains"),
    ),
    *GROUPED_ROWS,
    *DIST_ROWS,
    *DISTILL_ROWS,
    *PREFERENCE_ROWS,
)

_RATIO = re.compile(r"error/bound (inf|nan|[0-9.]+(?:e[+-]?\d+)?)", re.IGNORECASE)


@dataclass
class Catch:
    """One failing property: its name, the margin (error/bound, ``None`` when the failure states none) and the
    failure's first line after the case."""

    property: str
    ratio: float | None
    kind: str


@dataclass
class ReportCatch:
    """The report's failing cases of one property: how many of how many, and the worst (the failing case's output
    with the largest error/bound, or the failure's first line where the property states none)."""

    property: str
    failing: int
    cases: int
    case: str = ""
    output: str = ""
    ratio: float | None = None
    message: str = ""


@dataclass
class ReportRun:
    """What ``numcheck report --quick --impl SPEC`` did for one mutant: its exit status, the properties whose
    cases failed or raised (read from its report.json), its case count and seconds; ``caught`` when it exited 1 with
    a failing case of the mutant."""

    exit_status: int | None
    caught: bool
    catches: list[ReportCatch] = field(default_factory=list)
    cases: int = 0
    seconds: float = 0.0
    note: str = ""
    commit: str = ""


@dataclass
class Detection:
    """What the run of one mutant found: the suite's properties of its class (``catches``, ``passed``) and the
    quick report (``report``; ``report_before``: the report column of an earlier run, ``--report-before``)."""

    mutant: str
    bug_class: str
    change: str
    spec: str
    select: list[str]
    caught: bool
    catches: list[Catch] = field(default_factory=list)
    seconds_to_first_failure: float | None = None
    passed: list[str] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0
    note: str = ""
    family: str = ""
    report: ReportRun | None = None
    report_before: ReportRun | None = None
    commit: str = ""


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return text.replace("|", "\\|")


def _failure_kind(text: str) -> str:
    """The line after ``case:`` of a suite failure message (what went wrong), else the exception's last line."""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, ln in enumerate(lines):
        if ln.startswith("case:") and i + 1 < len(lines):
            return lines[i + 1][:160]
    errors = [ln for ln in lines if re.match(r"^E\s+\S", ln)]
    return (errors[0][1:].strip() if errors else (lines[-1] if lines else ""))[:160]


def _margin(text: str) -> float | None:
    """The first error/bound a failure message states (the worst output's, as the suite writes it)."""
    m = _RATIO.search(text)
    return float(m.group(1)) if m else None


def _run_one(impl: Any, name: str, base: Any) -> tuple[str, str]:
    """One drawn test ``name`` of ``impl``'s kind through its family's own runner (a suite of
    :data:`~numcheck.properties.suites.SUITES` by its table's entry, a family whose draws run on ranks by its
    :data:`~numcheck.properties.suites.RANKED` entry, under the ci profile without shrinking): status, message."""
    from numcheck.properties.check import _run_drawn
    from numcheck.properties.suites import RANKED

    if impl.kind in RANKED:
        return RANKED[impl.kind].run(impl, name, "numcheck-ci", False)
    v = _run_drawn(_suite(impl).table[name], impl, base)
    return v.status, v.message


def _suite(impl: Any) -> Any:
    """The :class:`~numcheck.properties.core.family.SuiteFamily` of ``impl``'s kind; ``ValueError`` naming the kind
    where no registry has its drawn tests."""
    from numcheck.properties.suites import RANKED, SUITES

    if impl.kind not in SUITES:
        raise ValueError(
            f"detection: {impl.name}'s kind {impl.kind!r} has no drawn tests in numcheck.properties.suites "
            f"(SUITES: {sorted(SUITES)}; RANKED: {sorted(RANKED)})"
        )
    return SUITES[impl.kind]


def _all_properties(impl: Any) -> list[str]:
    """Every drawn test of ``impl``'s kind (``--all-properties``)."""
    from numcheck.properties.suites import RANKED

    return RANKED[impl.kind].names(impl) if impl.kind in RANKED else list(_suite(impl).table)


def detect_in_process(spec: str, properties: tuple[str, ...] | None) -> dict[str, Any]:
    """Run ``properties`` (all of the impl's kind when ``None``) on the one impl ``spec`` loads, under the ci
    profile without shrinking, each through the suite's runner of its kind (:func:`_run_one`); the raw findings as
    a dict (``name``, ``kind``, per property status, message, seconds)."""
    from hypothesis import Phase, settings

    from numcheck.properties.check import _load

    impl = _load(spec)
    names = list(properties) if properties is not None else _all_properties(impl)
    base = settings(settings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    out = []
    for name in names:
        t0 = time.monotonic()
        status, message = _run_one(impl, name, base)
        out.append({"property": name, "status": status, "message": message, "seconds": round(time.monotonic() - t0, 2)})
    return {"name": impl.name, "kind": impl.kind, "results": out}


def family_of(row: Row) -> str:
    """The family of ``row``'s mutant: its own, else its module's (:data:`FAMILIES`), else the module's name."""
    module = row.spec.split(":", 1)[0]
    return row.family or FAMILIES.get(module) or module.rsplit(".", 1)[-1]


def _detection(row: Row, raw: dict[str, Any], seconds: float, select: list[str]) -> Detection:
    """The table row of one mutant from :func:`detect_in_process`'s findings."""
    det = Detection(
        mutant=raw["name"],
        bug_class=row.bug_class,
        change=row.change,
        spec=row.spec,
        select=select,
        caught=False,
        seconds=round(seconds, 1),
        family=family_of(row),
    )
    elapsed = 0.0
    for r in raw["results"]:
        elapsed += r["seconds"]
        if r["status"] == "failed":
            det.catches.append(Catch(r["property"], _margin(r["message"]), _failure_kind(r["message"])))
            if det.seconds_to_first_failure is None:
                det.seconds_to_first_failure = round(elapsed, 1)
        elif r["status"] == "passed":
            det.passed.append(r["property"])
        else:
            det.skipped += 1
    det.caught = bool(det.catches)
    return det


def run_mutant(row: Row, *, all_properties: bool, timeout: float) -> Detection:
    """One mutant in a fresh process (``python tools/detection.py --one SPEC [PROPERTY ...]``)."""
    select = [] if all_properties else list(row.select)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", row.spec, *select]
    env = {k: v for k, v in os.environ.items() if k not in ("NUMCHECK_HYPOTHESIS_PROFILE", "NUMCHECK_CI_EXAMPLES")}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Detection(
            row.spec.rsplit(":", 1)[1],
            row.bug_class,
            row.change,
            row.spec,
            select,
            caught=False,
            seconds=round(time.monotonic() - t0, 1),
            note=f"timed out after {timeout:.0f} s",
            family=family_of(row),
        )
    seconds = time.monotonic() - t0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return Detection(
            row.spec.rsplit(":", 1)[1],
            row.bug_class,
            row.change,
            row.spec,
            select,
            caught=False,
            seconds=round(seconds, 1),
            note=f"exit {proc.returncode}: {tail}"[:300],
            family=family_of(row),
        )
    return _detection(row, json.loads(lines[-1]), seconds, select or ["(all)"])


def report_command(spec: str, out: Path) -> list[str]:
    """``numcheck report --quick --impl SPEC`` as a user runs it (the console script's entry point), written to
    ``out`` (replaced), without plots or progress bar."""
    cli = "import sys; from numcheck.reports.cli import main; sys.exit(main())"
    return [sys.executable, "-c", cli, "report", "--quick", "--impl", spec, "--out", str(out), "--force"] + [
        "--no-plots",
        "--no-progress",
    ]


def _first_line(text: str) -> str:
    """The first non-empty line of ``text``, shortened for a table cell."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:200]


def _worst_output(case: dict[str, Any]) -> tuple[str, float | None]:
    """The output of a report case with the largest error/bound (``ratio_hard``), and that ratio; ``("", None)``
    where no output states one (a pass/fail property record, an impl that raised)."""
    best: tuple[str, float | None] = ("", None)
    for name, rec in (case.get("outputs") or {}).items():
        r = rec.get("ratio_hard") if isinstance(rec, dict) else None
        if isinstance(r, (int, float)) and r == r and (best[1] is None or r > best[1]):
            best = (name, float(r))
    return best


def report_catches(cases: list[dict[str, Any]]) -> list[ReportCatch]:
    """Per property (``property`` of schema /2; accuracy for /1's records), in the report's order: how many of its
    cases failed or raised, and the worst failing case (largest error/bound, else the first failing one)."""
    by: dict[str, ReportCatch] = {}
    for c in cases:
        prop = c.get("property", "accuracy")
        rc = by.setdefault(prop, ReportCatch(prop, 0, 0))
        rc.cases += 1
        if c.get("status") not in ("fail", "error"):
            continue
        rc.failing += 1
        output, ratio = _worst_output(c)
        if rc.failing == 1 or (ratio is not None and (rc.ratio is None or ratio > rc.ratio)):
            why = c.get("error") or "\n".join(str(f) for f in c.get("failures") or [])
            why = _failure_kind(str(why)) if "case:" in str(why) else _first_line(str(why))
            rc.case, rc.output, rc.ratio, rc.message = c.get("label", ""), output, ratio, why
    return [rc for rc in by.values() if rc.failing]


def run_report(spec: str, out: Path, timeout: float) -> ReportRun:
    """The quick report of one mutant in its own process (:func:`report_command`), read back from its
    report.json through the report's own loader."""
    from numcheck.reports.report import schema

    t0 = time.monotonic()
    try:
        proc = subprocess.run(report_command(spec, out), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ReportRun(None, False, seconds=round(time.monotonic() - t0, 1), note=f"timed out after {timeout:.0f} s")
    seconds = round(time.monotonic() - t0, 1)
    last = (proc.stdout.strip().splitlines() or proc.stderr.strip().splitlines() or [""])[-1][:300]
    if not (out / "report.json").exists():
        return ReportRun(proc.returncode, False, seconds=seconds, note=f"no report.json: {last}")
    cases = schema.load(out / "report.json")["cases"]
    catches = report_catches(cases)
    caught = proc.returncode == 1 and bool(catches)
    return ReportRun(proc.returncode, caught, catches, len(cases), seconds, "" if caught else last)


def _fmt_ratio(r: float | None) -> str:
    return "—" if r is None else (f"{r:.3g}" if r < 1e6 else f"{r:.2e}")


def _suite_cell(d: Detection) -> str:
    """The suite's catches of one mutant: each failing property with its margin (or the failure)."""
    return "<br>".join(
        f"`{c.property}` {_fmt_ratio(c.ratio)}" + ("" if c.ratio is not None else f" ({_cell(c.kind)})")
        for c in d.catches
    ) or ("**NO**" + (f" ({_cell(d.note)})" if d.note else ""))


def report_cell(r: ReportRun | None) -> str:
    """The quick report's column for one mutant: exit status, then each property whose cases failed (how many of
    its cases) with the worst failing case's output and error/bound, or the failure's first line."""
    if r is None:
        return "not run"
    if not r.caught:
        return f"exit {r.exit_status}: **not caught** ({r.cases} cases)" + (f"; {_cell(r.note)}" if r.note else "")
    parts = []
    for c in r.catches:
        worst = f"{c.output} {_fmt_ratio(c.ratio)}" if c.ratio is not None else _cell(c.message)
        parts.append(f"`{c.property}` {c.failing}/{c.cases} ({worst})")
    return f"exit {r.exit_status}: " + "<br>".join(parts)


def ran_at(d: Detection) -> str:
    """The commits the row's suite and report columns ran at (``—`` where a run recorded none)."""
    return f"{d.commit or '—'} / {(d.report.commit if d.report else '') or '—'}"


def _short_report(r: ReportRun | None) -> str:
    """The earlier report column of a mutant, in one word."""
    if r is None:
        return "—"
    return f"caught (exit {r.exit_status})" if r.caught else f"**not caught** (exit {r.exit_status})"


def summary_lines(dets: list[Detection]) -> list[str]:
    """Per family and overall: mutants, caught by the suite, caught by the report (and before, where kept)."""
    before = any(d.report_before is not None for d in dets)
    head = "| family | mutants | caught by the suite | caught by `report --quick` |" + (" before |" if before else "")
    out = [head, "|" + " --- |" * (5 if before else 4)]
    for fam in [*dict.fromkeys(d.family for d in dets), "all"]:
        ds = [d for d in dets if fam in ("all", d.family)]
        row = f"| {fam} | {len(ds)} | {sum(d.caught for d in ds)} | {sum(bool(d.report and d.report.caught) for d in ds)} |"
        out.append(row + (f" {sum(bool(d.report_before and d.report_before.caught) for d in ds)} |" if before else ""))
    return out


def to_markdown(dets: list[Detection], header: str) -> str:
    """The detection table: one row per mutant, the suite's column and the quick report's, then the summary."""
    before = any(d.report_before is not None for d in dets)
    lines = [
        header,
        "",
        "| family | class | mutant | change | suite: caught by (margin: error/bound of the first failing draw, or "
        "the failure) | s to first failure | passed (ran, did not catch it) | `report --quick`: exit, failing "
        "property cases/all (worst output error/bound) | ran at (suite / report) |"
        + (" report before |" if before else ""),
        "|" + " --- |" * (10 if before else 9),
    ]
    for d in dets:
        first = "—" if d.seconds_to_first_failure is None else f"{d.seconds_to_first_failure:.1f}"
        lines.append(
            f"| {d.family} | {d.bug_class} | `{d.mutant}` | {d.change} | {_suite_cell(d)} | {first} | "
            f"{', '.join(f'`{p}`' for p in d.passed) or '—'} | {report_cell(d.report)} | {ran_at(d)} |"
            + (f" {_short_report(d.report_before)} |" if before else "")
        )
    missed = [d for d in dets if not d.caught]
    ran = [d for d in dets if d.report is not None]
    by_report = sum(bool(d.report.caught) for d in ran)
    report = f"; {by_report} of {len(ran)} by `numcheck report --quick`" if ran else ""
    lines += ["", f"{len(dets) - len(missed)} of {len(dets)} mutants caught by the ci profile{report}.", ""]
    return "\n".join(lines + summary_lines(dets))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mutant",
        action="append",
        default=[],
        metavar="NAME",
        help="only this mutant (its spec's attribute, e.g. gw_bf16_sum; repeatable)",
    )
    p.add_argument(
        "--all-properties",
        action="store_true",
        help="run every drawn property of the suite per mutant, not only its class's",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's run (default 600)")
    p.add_argument("--no-report", action="store_true", help="leave out the report column")
    p.add_argument("--no-suite", action="store_true", help="leave out the suite column (run the report column alone)")
    for flag, what in (
        ("--suite-from", "the suite column: these earlier runs' (nothing run for it)"),
        ("--report-from", "the report column: these earlier runs' (nothing run for it; a mutant none has: not run)"),
        ("--report-before", "a 'report before' column: these earlier runs' report column (e.g. before a change)"),
    ):
        p.add_argument(
            flag,
            type=Path,
            action="append",
            default=[],
            metavar="DETECTION.json",
            help=f"{what}; repeatable, a later file's row replacing an earlier one's",
        )
    p.add_argument(
        "--update",
        type=Path,
        metavar="DIR",
        help="replace the rows of the mutants run (--mutant) in DIR/detection.json and DIR/detection.md, keeping "
        "the other rows (e.g. results/detection); a column not run (--no-suite, --no-report) keeps its cells",
    )
    p.add_argument(
        "--doc",
        type=Path,
        metavar="PAGE.md",
        help="also write the table into PAGE.md between its generated-table markers (e.g. docs/detection.md)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("numcheck-detection"),
        metavar="DIR",
        help="where detection.json and detection.md go, and each mutant's report under reports/ "
        "(default ./numcheck-detection)",
    )


def _from_json(d: dict[str, Any]) -> Detection:
    """A :class:`Detection` as :func:`run` wrote it into detection.json."""

    def report(r: dict[str, Any] | None) -> ReportRun | None:
        return None if r is None else ReportRun(**{**r, "catches": [ReportCatch(**c) for c in r["catches"]]})

    d = {**d, "catches": [Catch(**c) for c in d["catches"]]}
    return Detection(**{**d, "report": report(d.get("report")), "report_before": report(d.get("report_before"))})


def _select_rows(args: argparse.Namespace) -> list[Row] | str:
    """The rows ``--mutant`` names (all without it), or the error naming the unknown ones."""
    known = {r.spec.rsplit(":", 1)[1]: r for r in ROWS}
    unknown = [m for m in args.mutant if m not in known]
    if unknown:
        return f"detection: unknown mutant(s) {unknown}; known: {sorted(known)}"
    return [known[m] for m in args.mutant] if args.mutant else list(ROWS)


def _earlier(paths: list[Path]) -> dict[str, Detection]:
    """The rows of earlier runs' detection.json files by spec, a later file's replacing an earlier one's."""
    rows: dict[str, Detection] = {}
    for path in paths:
        rows.update({d["spec"]: _from_json(d) for d in json.loads(path.read_text())["mutants"]})
    return rows


#: The markers of a page's generated table (``--doc``): what lies between them is replaced, the prose kept.
TABLE_BEGIN = "<!-- tools/detection.py: table begins -->"
TABLE_END = "<!-- tools/detection.py: table ends -->"


def with_table(page: str, md: str, where: str) -> str:
    """``page`` with the text between :data:`TABLE_BEGIN` and :data:`TABLE_END` replaced by ``md``; ``SystemExit``
    naming ``where`` and the markers when it lacks them (or has them out of order)."""
    i, j = page.find(TABLE_BEGIN), page.find(TABLE_END)
    if i < 0 or j < i:
        raise SystemExit(
            f"detection: {where} has no generated table to replace: put the lines {TABLE_BEGIN!r} and "
            f"{TABLE_END!r} around it"
        )
    return page[: i + len(TABLE_BEGIN)] + "\n\n" + md.strip() + "\n\n" + page[j:]


def _updated_rows(out: Path) -> dict[str, Detection] | str:
    """The rows of ``out``/detection.json by spec (``--update``), or the error naming why they cannot be updated:
    no such file, or a run on another torch than this one (a table's rows come from one torch)."""
    import torch

    path = out / "detection.json"
    if not path.exists():
        return f"detection: --update {out}: no {path} to update (a first run writes it: --out {out})"
    payload = json.loads(path.read_text())
    if payload.get("torch") != torch.__version__:
        return (
            f"detection: --update {out}: {path} ran on torch {payload.get('torch')}, this is torch "
            f"{torch.__version__}: rerun every mutant here (--out, no --update) or update it from that torch"
        )
    return {d["spec"]: _from_json(d) for d in payload["mutants"]}


def merged(ran: list[Detection], kept: dict[str, Detection]) -> list[Detection]:
    """The updated table: in :data:`ROWS`' order, each row this run made, else the kept one (a mutant neither
    ran nor kept has no row yet, a kept row no longer in :data:`ROWS` goes; both said on stderr)."""
    new = {d.spec: d for d in ran}
    out = []
    for row in ROWS:
        d = new.get(row.spec) or kept.get(row.spec)
        if d is None:
            name = row.spec.rsplit(":", 1)[1]
            print(f"detection: {name} has no row yet (run it: --mutant {name})", file=sys.stderr)
        else:
            out.append(d)
    gone = sorted(set(kept) - {r.spec for r in ROWS})
    if gone:
        print(f"detection: rows no longer in ROWS dropped: {gone}", file=sys.stderr)
    return out


def checkout_commit() -> str:
    """The commit of the checkout numcheck runs from (short hash, ``+dirty`` where tracked files differ from it),
    recorded with each column a run makes; ``""`` outside a git checkout."""
    import numcheck

    root = Path(numcheck.__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _one_row(row: Row, args: argparse.Namespace, earlier: dict[str, dict[str, Detection]]) -> Detection:
    """One mutant's suite column and report column, each run or taken from earlier runs (:func:`add_arguments`);
    with ``--update``, a column not run (``--no-suite``, ``--no-report``) is the updated table's."""
    prev = earlier["update"].get(row.spec)
    if args.suite_from and row.spec not in earlier["suite_from"]:
        raise SystemExit(f"detection: {args.suite_from} have no row for {row.spec}")
    if args.suite_from:
        d = earlier["suite_from"][row.spec]
    elif args.no_suite:
        name = row.spec.rsplit(":", 1)[1]
        d = Detection(name, row.bug_class, row.change, row.spec, [], False, note="suite not run", family=family_of(row))
        d = replace(prev, report=None, report_before=None) if prev else d
    else:
        d = run_mutant(row, all_properties=args.all_properties, timeout=args.timeout)
        d.commit = args.commit
    before = earlier["report_before"].get(row.spec)
    d.report_before = before.report if before else None
    if prev and not args.report_before:
        d.report_before = prev.report_before
    if args.report_from:
        d.report = earlier["report_from"][row.spec].report if row.spec in earlier["report_from"] else None
    elif not args.no_report:
        d.report = run_report(row.spec, args.out / "reports" / row.spec.rsplit(":", 1)[1], args.timeout)
        d.report.commit = args.commit
    else:
        d.report = prev.report if prev else None
    rep = "" if d.report is None else f"; report {'caught' if d.report.caught else 'NOT caught'}"
    suite = "caught by " + ", ".join(c.property for c in d.catches) if d.caught else "NOT caught"
    print(f"{d.mutant}: suite {suite}{rep} ({d.seconds:.0f} s)", file=sys.stderr, flush=True)
    return d


def _write(dets: list[Detection], out: Path, doc: Path | None = None) -> str:
    """detection.md and detection.json under ``out`` (and the table into ``doc``'s generated block); the Markdown."""
    import torch

    header = (
        f"Detection under the ci profile (numcheck-ci: derandomized, 12 examples, numcheck.check's draws; the "
        f"shrink phase left out), torch {torch.__version__}, "
        f"{'CUDA' if os.environ.get('NUMCHECK_DEVICE') == 'cuda' else 'CPU'}; one process per mutant, each "
        "running the properties of its class, then `numcheck report --quick --impl SPEC` in its own process "
        "(`python tools/detection.py`)."
    )
    md = to_markdown(dets, header)
    out.mkdir(parents=True, exist_ok=True)
    (out / "detection.md").write_text(md + "\n")
    if doc is not None:
        doc.write_text(with_table(doc.read_text(), md, str(doc)))
    payload = {"torch": torch.__version__, "profile": "numcheck-ci", "mutants": [asdict(d) for d in dets]}
    (out / "detection.json").write_text(json.dumps(payload, indent=1) + "\n")
    return md


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec(_LINEAR) is None:
        print(
            f"detection: {_LINEAR} is not importable: the mutants are numcheck's own tests, shipped only "
            "in a checkout (run from one with numcheck installed from it: pip install -e .)",
            file=sys.stderr,
        )
        return 2
    rows = _select_rows(args)
    if isinstance(rows, str):
        print(rows, file=sys.stderr)
        return 2
    earlier = {k: _earlier(getattr(args, k)) for k in ("suite_from", "report_from", "report_before")}
    kept = _updated_rows(args.update) if args.update else {}
    if isinstance(kept, str):
        print(kept, file=sys.stderr)
        return 2
    if args.doc and args.doc.exists():
        with_table(args.doc.read_text(), "", str(args.doc))  # its markers checked before anything runs
    earlier["update"] = kept
    args.commit = checkout_commit()
    dets = [_one_row(row, args, earlier) for row in rows]
    print(_write(merged(dets, kept) if args.update else dets, args.update or args.out, args.doc))
    caught = all(d.caught and (d.report is None or d.report.caught) for d in dets)
    return 0 if caught else 1


def main(argv: list[str]) -> int:
    """``--one SPEC [PROPERTY ...]``: one mutant, in the process :func:`run_mutant` starts (its findings as one JSON
    line); otherwise the table (:func:`add_arguments`)."""
    from numcheck.impls import interpreter

    interpreter.arrange()
    if argv[:1] == ["--one"]:
        print(json.dumps(detect_in_process(argv[1], tuple(argv[2:]) or None)))
        return 0
    p = argparse.ArgumentParser(prog="python tools/detection.py", description=__doc__.split("\n")[0])
    add_arguments(p)
    from numcheck.properties.core import matmul_precision

    with matmul_precision.pinned():
        return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
