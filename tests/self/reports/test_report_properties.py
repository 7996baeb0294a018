"""``numcheck report`` runs every property the suite runs on a kind, not only one-call accuracy
(:mod:`reports.report.property_grid`): the table reaches each suite property from the declaration, the quick report
fails a held-out single-defect impl of each property class that the one-call accuracy grid passed, the built-ins'
property cases pass, a property without a bound is a pass/fail record with its message, and ``--compare`` still reads
``numcheck-report/1`` reports.

The held-out impls are :mod:`numcheck.tests.self.helpers.report_property_impls` (in no mutant table).
"""

from __future__ import annotations

import json
import math

import pytest

from numcheck.impls import interpreter
from numcheck.impls.registry import discover
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report.command import build_report
from numcheck.reports.report.compare import compare_reports
from numcheck.reports.report.families import FAMILIES
from numcheck.reports.report.grid import QUICK
from numcheck.reports.report.run import plan, property_table, run_case

MOD = "numcheck.tests.self.helpers.report_property_impls"


def _suite_properties(kind: str) -> set[str]:
    """The properties (by the property library's names) the shipped suite runs on ``kind``, from its own tables."""
    if kind == "linear-ce":
        from numcheck.properties.linear_ce.suite import SUITE

        return {p.check.__name__ for p in SUITE.values()}
    if kind == "fp8-linear":
        from numcheck.properties.fp8.props import LAYER_PROPERTIES
        from numcheck.properties.fp8.suite import FP8_SUITE

        fixed = {"unit_scale_round_trip"}  # test_fp8_values_round_trip_under_unit_scale's judgement
        return {p.check.__name__ for p in FP8_SUITE.values()} | set(LAYER_PROPERTIES) | fixed
    if kind == "grouped-fp8-linear":
        from numcheck.properties.fp8.grouped.suite import GROUPED_SUITE

        return {p.check.__name__ for p in GROUPED_SUITE.values()}
    # the distributed kinds: every property of their tables (dist_accuracy and dist_same_scale: the accuracy records)
    return set(property_table(kind)) - {"dist_accuracy", "dist_same_scale"}


@pytest.mark.parametrize("kind", tuple(FAMILIES))
def test_every_suite_property_of_a_kind_has_a_row(kind):
    """Each property the suite runs on the kind is a row of the table, named as its property table names it."""
    rows = {r.prop for r in FAMILIES[kind].property_rows()} | {"accuracy"}
    assert _suite_properties(kind) <= rows, sorted(_suite_properties(kind) - rows)
    assert {r.prop for r in FAMILIES[kind].property_rows()} <= set(property_table(kind)) | {"accuracy"}


def _report(specs: list[str]) -> dict:
    interpreter.arrange()
    return build_report(QUICK, specs, "cpu", progress=False, memory=False, accumulation=False)


#: held-out impl → (the property whose case must fail, a word of the suite test that reaches it)
HELD_OUT = {
    "soi_backward_from_quantized": ("save_original_input", "save_original_input"),
    "zero_amax_nan": ("accuracy", "edge_inputs"),
    "delayed_scale_not_carried": ("accuracy", "delayed"),
    "grouped_main_grad_overwritten": ("wgrad_accumulation", "wgrad_accumulation"),
    "grouped_empty_expert_stale": ("empty_experts", "empty_experts"),
    "nondeterministic_ce": ("determinism", "determinism"),
}


@pytest.fixture(scope="module")
def held_out_report() -> dict:
    return _report([f"{MOD}:{name}" for name in HELD_OUT])


@pytest.mark.parametrize("attr", sorted(HELD_OUT))
def test_quick_report_fails_each_held_out_defect_by_its_property(held_out_report, attr):
    """The quick report fails the defect on a case of the property that reaches it, with the property's message
    and a repro line; its one-call accuracy cases of the old grid (groups other than ``suite:``) all pass."""
    prop, test = HELD_OUT[attr]
    impl = getattr(__import__(MOD, fromlist=[attr]), attr).name
    mine = [c for c in held_out_report["cases"] if c["impl"] == impl]
    failing = [c for c in mine if c["status"] != "pass"]
    assert failing, f"{impl}: the quick report passes it"
    hit = [c for c in failing if c["property"] == prop and test in c["group"]]
    assert hit, f"{impl}: no failing {prop} case of a {test} group: {[(c['property'], c['group']) for c in failing]}"
    assert all(c["failures"] and c["repro"] for c in hit)
    old = [c for c in mine if not c["group"].startswith("suite:")]
    assert old and all(c["status"] == "pass" for c in old), [c["label"] for c in old if c["status"] != "pass"]


BUILTINS = ("eager", "chunked[lowp_accum]", "fp8_linear[current]", "fp8_linear[delayed]", "grouped_fp8_linear[fused]")


def test_builtins_pass_their_property_cases():
    """The built-ins of each single-device family pass every property case of the quick grid."""
    interpreter.arrange()
    infos, work = plan(discover(list(BUILTINS)), QUICK, "cpu")
    cases = [(impl, gc) for impl, gc in work if gc.group.startswith("suite:")]
    assert {impl.kind for impl, _ in cases} == {"linear-ce", "fp8-linear", "grouped-fp8-linear"}
    bad = [r for r in (run_case(impl, gc) for impl, gc in cases) if r["status"] != "pass"]
    assert not bad, [(r["impl"], r["property"], r["label"], r.get("failures")) for r in bad]


def test_a_property_without_a_bound_is_a_pass_fail_record(held_out_report):
    """A bitwise property's record: its property, pass/fail, its message as failures, ratio_hard NaN, no outputs."""
    rec = next(c for c in held_out_report["cases"] if c["property"] == "save_original_input" and c["status"] == "fail")
    assert math.isnan(rec["ratio_hard"]) and rec["outputs"] == {}
    assert rec["verdicts"] == {"save_original_input": False}
    assert any("differs bitwise" in line for line in rec["failures"])
    assert "numcheck repro" in rec["repro"] and "--property save_original_input" in rec["repro"]
    assert all(c["property"] == "accuracy" for c in held_out_report["cases"] if not c["group"].startswith("suite:"))


def test_compare_reads_a_schema_1_report(held_out_report, tmp_path):
    """A ``numcheck-report/1`` baseline (no ``property`` field) is read, its records matched as accuracy records;
    the property records of the new report are listed as cases without a baseline, never matched to them."""
    assert report_schema.SCHEMA == "numcheck-report/3"
    new = held_out_report
    old = {**new, "schema": "numcheck-report/1"}
    old["cases"] = [
        {k: v for k, v in c.items() if k != "property"} for c in new["cases"] if c["property"] == "accuracy"
    ]
    path = tmp_path / "base.json"
    path.write_text(json.dumps(report_schema._encode(old)))
    base = report_schema.load(path)
    assert {c["property"] for c in base["cases"]} == {"accuracy"}
    diff = compare_reports(base, report_schema.load(_written(new, tmp_path)))
    assert not diff.regressions
    assert any("have no baseline" in f.message for f in diff.findings)


def _written(report: dict, tmp_path) -> str:
    path = tmp_path / "new.json"
    path.write_text(json.dumps(report_schema._encode(report)))
    return str(path)


def test_quantizer_cases_reach_block_amaxes_at_scale_edges():
    """The quantizer property's report cases include a tensor whose every block's amax sits beside format_max·2^k:
    a power-of-2 scale computed through a rounded log2 (the in-repo mutant the all-codes cases pass) fails there."""
    interpreter.arrange()
    spec = "numcheck.tests.self.helpers.fp8_mutants:pow2_scale_log2_current"
    _, work = plan(discover([spec]), QUICK, "cpu")
    cases = [(impl, gc) for impl, gc in work if gc.prop == "quantizer"]
    records = [run_case(impl, gc) for impl, gc in cases]
    failing = [r for r in records if r["status"] == "fail"]
    assert failing and all("block amaxes" in r["group"] or "DrawnTensor" in r["case"] for r in failing)
    assert any("FormatCodes" in r["case"] and r["status"] == "pass" for r in records)
