"""``numcheck report``'s tensor-parallel FP8 rows: the grid's cases are declared ones (the rest counted), the
non-raising measurement (:func:`numcheck.properties.distributed.tp_fp8.props.measure`) holds for a correct impl and shows each
distributed FP8 mutant's bug, and the records render, reload and carry the repro line."""

from __future__ import annotations

import math

import pytest

import numcheck
from numcheck.impls.builtin.tp_fp8_linear import tp_fp8_linear_impls
from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
from numcheck.properties.distributed.tp_fp8.cases import TPFp8Case
from numcheck.properties.distributed.tp_fp8.cases import refusal as tp_refusal
from numcheck.properties.distributed.tp_fp8.props import measure
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report.command import build_report, write_report
from numcheck.reports.report.families.tp_fp8_linear import tp_cases
from numcheck.reports.report.grid import FULL, QUICK, SMOKE, TP_CASES, TP_WORLD_SIZES
from numcheck.tests.self.helpers.dist_declared import declared_tp_fp8
from numcheck.tests.self.helpers.dist_fp8_mutants import AmaxNotReduced, RowOutputNotReduced
from numcheck.tests.self.helpers.mutant_table import recipes_of

pytestmark = [
    pytest.mark.usefixtures("one_thread_per_module"),
    pytest.mark.skipif(
        world_size_unavailable(2, default_backend()) is not None,
        reason=f"needs P = 2: {world_size_unavailable(2, default_backend())}",
    ),
]

CURRENT = tp_fp8_linear_impls()[1]
RAISED = "tp_raises ran on this rank"


@numcheck.tp_fp8_linear_impl(
    name="tp_raises", recipes=CURRENT.support.recipes, world_sizes=(2,), dtypes=("bfloat16",), parallel=("column",)
)
def tp_raises(
    x,
    weight,
    bias=None,
    *,
    recipe,
    parallel,
    sequence_parallel,
    save_original_input,
    group,
    scale_log,
    scaling_state=None,
):
    """Raises :data:`RAISED` on every rank."""
    raise RuntimeError(RAISED)


def _case(recipe_kind: str = "current", **fields) -> TPFp8Case:
    """A P = 2 case of the grid's shapes for the built-in of ``recipe_kind`` (keywords: TPFp8Case fields)."""
    impl = next(i for i in tp_fp8_linear_impls() if i.recipe_kind == recipe_kind)
    kw = dict(world=2, parallel="column", sequence_parallel=False, bias=True, dtype="bfloat16", seed=5)
    kw.update(fields)
    K, N = (40, 24) if kw["parallel"] == "column" else (24, 24)
    return TPFp8Case(impl.support.recipes[0], 64, K, N, **kw)


@pytest.mark.parametrize("spec", [QUICK, FULL, SMOKE], ids=lambda s: s.name)
def test_tp_grid_runs_declared_cases_and_counts_the_others(spec):
    """Every tensor-parallel grid case lies inside the impl's declaration, and cases run plus cases counted per reason
    make the whole grid (recipes × dtypes × world sizes × both parallel modes × labels) for every impl."""
    for impl in tp_fp8_linear_impls() + [declared_tp_fp8]:
        cases, skipped = tp_cases(spec, impl)
        s = impl.support
        recipes = len(s.recipes) if spec.tp_all_recipes else 1
        dtypes = len(s.dtypes) if spec.fp8_all_dtypes else 1
        assert len(cases) + sum(skipped.values()) == recipes * dtypes * len(TP_WORLD_SIZES) * 2 * len(spec.tp_cases)
        assert cases and all(tp_refusal(s, gc.case) is None for gc in cases)
        assert all(gc.case.world in s.world_sizes and gc.case.parallel in s.parallel for gc in cases)
        assert len({gc.case for gc in cases}) == len(cases)
    _, skipped = tp_cases(QUICK, declared_tp_fp8)  # P = 4, row-parallel and bf16 are outside its declaration
    assert {"world size 4 not declared", "row-parallel not declared"} <= set(skipped), skipped
    _, skipped = tp_cases(QUICK, tp_fp8_linear_impls()[0])
    assert skipped == {"save_original_input=True not allowed by recipe delayed-hybrid": 2 * len(TP_WORLD_SIZES)}


def test_tp_grid_covers_every_label_layout_and_world_size():
    """The quick grid runs, per impl, every label of TP_CASES in both parallel modes at P = 1, 2 and 4."""
    cases, _ = tp_cases(QUICK, CURRENT)
    got = {(gc.group, gc.case.parallel, gc.case.world) for gc in cases}
    assert got == {(f"tp:{label}", par, P) for label in TP_CASES for par in ("column", "row") for P in TP_WORLD_SIZES}


@pytest.mark.parametrize(
    "fields",
    [dict(parallel="column", sequence_parallel=False), dict(parallel="row", sequence_parallel=True)],
    ids=["column", "row-sp"],
)
def test_measurement_of_a_correct_impl_is_within_bound_with_one_scale(fields):
    """A correct impl's measured record: every output and rank within both bounds (ratio ≤ 1), no failure line and
    every rank on the unsharded tensor's scales; replicated copies and partial bias gradients have a row per rank."""
    m = measure(CURRENT, _case(**fields))
    assert m.same_scale and not m.accuracy_lines and not m.scale_lines
    assert all(d.ratio <= 1 and t.ratio <= 1 for d, t in m.outputs.values())
    per_rank = {"dgrad@rank1"} if fields["parallel"] == "column" else {"bgrad@rank0", "bgrad@rank1"}
    assert per_rank <= set(m.outputs)


@pytest.mark.parametrize(
    "mutant,fields",
    [
        (AmaxNotReduced("mutant_tp_amax_not_reduced", recipes_of("current")), dict(parallel="row")),
        (
            AmaxNotReduced("mutant_tp_amax_not_reduced[delayed]", recipes_of("delayed")),
            dict(recipe_kind="delayed", steps=2),
        ),
        (RowOutputNotReduced("mutant_tp_row_output_not_reduced", recipes_of("current")), dict(parallel="row")),
    ],
    ids=lambda v: getattr(v, "name", ""),
)
def test_measurement_shows_each_distributed_fp8_mutant(mutant, fields):
    """Each distributed FP8 mutant's measured record shows its bug: a ratio above 1 on some output or rank, a
    ranks' line (replicated copies that differ), or a rank off the unsharded scale."""
    m = measure(mutant, _case(**fields))
    assert m.outputs
    worst = max(max(d.ratio, t.ratio) for d, t in m.outputs.values())
    assert worst > 1 or m.accuracy_lines or not m.same_scale
    if isinstance(mutant, AmaxNotReduced):  # its bug is the scale itself (delayed: and the amax it records)
        assert not m.same_scale and any("all-reduced amax" in line for line in m.scale_lines)
        assert mutant.support.recipes[0].kind != "delayed" or any("recorded amax" in x for x in m.accuracy_lines)
    if isinstance(mutant, RowOutputNotReduced):  # partial sums returned as y: far beyond the bound
        assert worst > 1


def test_report_has_tp_rows_mutant_failures_and_error_rows(tmp_path, monkeypatch):
    """A report with a correct TP impl, the mutants and an impl that raises: the correct impl's rows pass at every
    world size with same_scale, a mutant's rows fail with a numcheck repro line whose impl numcheck repro finds, the
    raising impl's rows are error rows and the others still ran; the report writes, reloads under the schema check
    and renders the TP table; numcheck premerge's report check counts and lists them."""
    from numcheck.reports.premerge.command import check_report
    from numcheck.reports.report.families.tp_fp8_linear import find_tp_impl

    specs = [
        "tp_fp8_linear[current]",
        "numcheck.tests.self.helpers.dist_fp8_mutants:MUTANTS",
        "numcheck.tests.self.reports.test_report_tp:tp_raises",
    ]
    rep = build_report(SMOKE, specs, "cpu", progress=False, memory=False, accumulation=False)
    good = [c for c in rep["cases"] if c["impl"] == "tp_fp8_linear[current]"]
    assert sorted(c["world_size"] for c in good) == [1, 1, 2, 2, 4, 4]
    assert all(c["status"] == "pass" and c["same_scale"] and c["ratio_hard"] <= 1 for c in good)
    assert all(
        {"ratio_dq", "ratio_true", "worst_index", "worst_vs"} <= set(o) for c in good for o in c["outputs"].values()
    )
    bad = [c for c in rep["cases"] if c["impl"] == "mutant_tp_amax_not_reduced"]
    assert any(c["status"] == "fail" and not c["verdicts"]["same_scale"] for c in bad)
    failing = next(c for c in bad if c["status"] == "fail")
    line = failing["repro"]
    # The mutant as loaded in this process: through NUMCHECK_IMPLS and its name (this report's spec names several),
    # or by the module-level name bound to it where an earlier test of this worker loaded it by that spec
    # (registry.spec_of keeps the first). No PYTHONPATH: the editable numcheck is found without it, and
    # PYTHONPATH=<checkout> would shadow it with the bare numcheck/ folder.
    direct = "--impl numcheck.tests.self.helpers.dist_fp8_mutants:amax_not_reduced "
    assert line.startswith(("NUMCHECK_IMPLS=", "numcheck repro")) and "numcheck repro" in line, line
    assert "NUMCHECK_IMPLS=" in line or direct in line, line
    assert "TPFp8Case(" in failing["repro"] and failing["failures"]
    monkeypatch.setenv("NUMCHECK_IMPLS", "numcheck.tests.self.helpers.dist_fp8_mutants:MUTANTS")
    assert find_tp_impl("mutant_tp_amax_not_reduced").name == "mutant_tp_amax_not_reduced"
    raised = [c for c in rep["cases"] if c["impl"] == "tp_raises"]
    assert raised and all(c["status"] == "error" and RAISED in c["error"] for c in raised)
    assert {c["impl"] for c in rep["cases"]} >= {"tp_fp8_linear[current]", "mutant_tp_row_output_not_reduced"}
    info = next(i for i in rep["impls"] if i["name"] == "tp_raises")
    assert info["status"] == "ran" and sum(info["not_declared"].values()) == 6 - len(raised)
    chk = check_report(rep, "smoke")  # numcheck premerge's report line: the TP rows counted, the failures listed
    assert not chk.ok and sum(c["kind"] == "tp-fp8-linear" for c in rep["cases"]) == int(
        chk.figure.split("/")[1].split()[0]
    )
    assert any("mutant_tp_amax_not_reduced" in d and "numcheck repro" in d for d in chk.details)
    write_report(rep, tmp_path / "r", plots=False)
    back = report_schema.load(tmp_path / "r" / "report.json")
    assert any(c["kind"] == "tp-fp8-linear" and math.isnan(c["ratio_expected"]) for c in back["cases"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert "### Tensor-parallel FP8 linear" in md and "`mutant_tp_amax_not_reduced`" in md


def test_a_rank_whose_replicated_copy_differs_gets_its_own_failing_row():
    """Column-parallel dgrad is replicated: a rank 1 copy pushed off the oracle shows as ``dgrad@rank1`` beyond its
    bound and as a ranks' line, while rank 0's ``dgrad`` row stays within bound (the suite fails on the line)."""
    from numcheck.properties.distributed.tp_fp8.props import run_case, step_judgements

    case = _case(parallel="column", sequence_parallel=False)
    results = run_case(CURRENT, case, "dist_accuracy")
    results[1][0]["dgrad"] = results[1][0]["dgrad"] * 2 + 1
    judged, problems = step_judgements(CURRENT, case, results, strict=False, per_rank=True)
    rows = {label: (d, t) for label, d, t in judged}
    assert rows["dgrad"][0].ok and not rows["dgrad@rank1"][0].ok
    assert any("rank 1 holds other values than rank 0" in p for p in problems)
