"""The detection table (tools/detection.py, a tool of the checkout): its table covers every mutant class, reads the
suite runner's verdicts right and gives numcheck.check's verdict."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_TOOL = Path(__file__).resolve().parents[3] / "tools" / "detection.py"
_spec = importlib.util.spec_from_file_location("numcheck_tools_detection", _TOOL)
detection = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = detection  # its dataclasses look their module up by name
_spec.loader.exec_module(detection)


#: Impls of the mutant modules outside the table, and why: each is judged by its own self test, not by a suite
#: property of its bug class under the ci profile.
NOT_IN_TABLE = {
    "mutant_upstream_before_mean": "found by hypothesis over the loss-scale draws (tests/self/mutants/test_mutants.py)",
    "mutant_upstream_divided_in_place": "named by run_impl's in-place check on any call, no property's regime",
    "vp_fp32_reduce": "a correct twin (float32 partials, declaring float32)",
    "vp_bf16_reduce_declared_input": "a correct twin (bf16 partials, declaring the input dtype)",
}


def _module_impls(module) -> dict[str, str]:
    """The impls a mutant module binds at module level (each loadable alone by ``MODULE:ATTR``): name → attribute."""
    return {
        v.name: k
        for k, v in vars(module).items()
        if not k.startswith("_") and hasattr(v, "kind") and hasattr(v, "name")
    }


def test_rows_cover_every_mutant_and_load():
    """Every mutant of every family (linear+CE, FP8 edges, layouts and rowwise scales, grouped FP8, vocab-parallel,
    TP/SP FP8) has a row, and each row's spec loads that one impl; so does every impl a mutant module of the table
    (of :data:`FAMILIES`, or named by a row) binds at module level (a mutant added there without a row fails here),
    but those :data:`NOT_IN_TABLE` names."""
    import importlib

    from numcheck.impls.registry import ImplEntry, load_spec
    from numcheck.tests.self.helpers import (
        dist_fp8_mutants,
        dist_mutants,
        dist_reduce,
        fp8_mutants,
        grouped_fp8_mutants,
        mutants,
    )

    names = {e.impl.name for r in detection.ROWS for e in load_spec(r.spec, "test") if isinstance(e, ImplEntry)}
    assert all(len(load_spec(r.spec, "test")) == 1 for r in detection.ROWS)
    wanted = {m.name for ms in mutants.CLASSES.values() for m in ms}
    wanted |= {m.name for m in fp8_mutants.EDGE_MUTANTS} | {fp8_mutants.mx_scale_wrong_way.name}
    wanted |= {m.name for m in fp8_mutants.LAYOUT_MUTANTS} | {m.name for m in fp8_mutants.ROWWISE_MUTANTS}
    wanted |= {m.name for m in grouped_fp8_mutants.HYBRID_MUTANTS}
    wanted |= {m.name for m in grouped_fp8_mutants.MUTANTS} | {m.name for m in dist_mutants.dist_impls()}
    wanted |= {m.name for m in dist_fp8_mutants.MUTANTS + dist_fp8_mutants.DTYPE_MUTANTS}
    wanted |= {dist_reduce.bf16_reduce_declared_fp32.name}
    for module in {*detection.FAMILIES, *(r.spec.split(":", 1)[0] for r in detection.ROWS)}:
        wanted |= set(_module_impls(importlib.import_module(module))) - set(NOT_IN_TABLE)
    assert wanted <= names, sorted(wanted - names)
    assert {detection.family_of(r) for r in detection.ROWS} >= set(detection.FAMILIES.values())


def test_every_kind_has_drawn_tests_a_row_can_name():
    """Every kind of the registry has its drawn tests in one registry of numcheck.properties.suites (SUITES, or
    RANKED for a family whose draws run on ranks), which the tool runs a row's tests through; each row names
    drawn tests of its mutant's kind, and a row's family defaults to its module's, then to the module's name."""
    from numcheck.impls.protocols.kinds import NAMES
    from numcheck.impls.registry import load_spec
    from numcheck.properties.suites import RANKED, SUITES

    assert not set(SUITES) & set(RANKED) and set(SUITES) | set(RANKED) == set(NAMES)
    for r in detection.ROWS:
        (entry,) = load_spec(r.spec, "test")
        impl = entry.impl
        names = RANKED[impl.kind].names(impl) if impl.kind in RANKED else list(SUITES[impl.kind].table)
        assert set(r.select) <= set(names), (r.spec, sorted(set(r.select) - set(names)))
    row = detection.Row("k", "numcheck.tests.self.helpers.unlabelled_mutants:x", "c", ())  # a module with no label
    assert detection.family_of(row) == "unlabelled_mutants"
    assert detection.family_of(detection.Row("k", row.spec, "c", (), family="linear distill")) == "linear distill"


def test_findings_give_properties_margins_and_time():
    """Failed properties give their margin (the first error/bound of the message, else the failure's line) and
    the seconds to the end of the first failed property in run order; passed and skipped ones are kept apart."""
    msg = (
        "property 'frozen_weight' fails for impl 'mut'\n  case: Problem(N=1, H=1, V=1)\n  (a) analytic bound: grad_x "
        "(torch.float32): 1 / 1 elements beyond bound (error/bound 12.5); max abs error 1\n  reproduce: numcheck repro"
    )
    det_msg = (
        "property 'determinism' fails for impl 'mut'\n  case: Problem(N=2, H=1, V=1)\n  grad_weight differs "
        "between two identical runs: max |difference| 6e-08"
    )
    raw = {
        "name": "mut",
        "results": [
            {"property": "accuracy", "status": "passed", "message": "", "seconds": 2.0},
            {"property": "frozen_inputs[weight]", "status": "failed", "message": msg, "seconds": 1.5},
            {"property": "loss_scale", "status": "skipped", "message": "no AMP", "seconds": 0.0},
            {"property": "determinism", "status": "failed", "message": det_msg, "seconds": 3.0},
        ],
    }
    row = detection.ROWS[0]
    d = detection._detection(row, raw, 7.0, list(row.select))
    assert d.caught and d.mutant == "mut" and d.passed == ["accuracy"] and d.skipped == 1
    assert [(c.property, c.ratio) for c in d.catches] == [("frozen_inputs[weight]", 12.5), ("determinism", None)]
    assert d.catches[1].kind.startswith("grad_weight differs between two identical runs")
    assert d.seconds_to_first_failure == 3.5
    md = detection.to_markdown([d], "head")
    assert "max \\|difference\\|" in md  # a table cell's pipes escaped


def test_markdown_marks_a_missed_mutant():
    """A mutant no property caught is marked NO in the table and counted in the summary line."""
    d = detection.Detection(
        "m", "nondeterminism", "order", "x:y", ["determinism"], caught=False, passed=["determinism"]
    )
    md = detection.to_markdown([d], "head")
    assert "**NO**" in md and "0 of 1 mutants caught" in md


def test_in_process_run_matches_numcheck_check():
    """One property of one mutant in process: the same verdict numcheck.check gives on the same draws."""
    import numcheck

    spec = "numcheck.tests.self.helpers.mutants:row_order_per_call"
    raw = detection.detect_in_process(spec, ("determinism",))
    assert raw["name"] == "mutant_row_order_per_call"
    assert raw["results"][0]["status"] == numcheck.check(spec, ["determinism"]).verdicts["determinism"].status


def _case(prop: str, status: str, **fields):
    return {"label": f"{prop}-{status}", "property": prop, "status": status, **fields}


def test_report_column_reads_each_property_and_its_worst_case():
    """The report column groups the failing cases of report.json by property (schema /1's records, without one, are
    accuracy), counts them against the property's cases, and keeps the worst: the failing case's output of the
    largest error/bound, else the first failure's first line (a pass/fail property, an impl that raised)."""
    cases = [
        {"label": "a", "status": "pass", "outputs": {"loss": {"ratio_hard": 0.1}}},
        {"label": "b", "status": "fail", "outputs": {"loss": {"ratio_hard": 3.0}, "grad_x": {"ratio_hard": 8.0}}},
        {"label": "c", "status": "fail", "outputs": {"grad_x": {"ratio_hard": 20.0}}, "failures": ["x"]},
        _case("determinism", "fail", ratio_hard=float("nan"), failures=["y differs between two calls\n  more"]),
        _case("determinism", "pass"),
        _case("refusal", "error", error="ValueError: raised"),
        _case("saved_bytes", "pass"),
    ]
    got = detection.report_catches(cases)
    assert [(c.property, c.failing, c.cases) for c in got] == [
        ("accuracy", 2, 3),
        ("determinism", 1, 2),
        ("refusal", 1, 1),
    ]
    assert (got[0].case, got[0].output, got[0].ratio) == ("c", "grad_x", 20.0)
    assert got[1].ratio is None and got[1].message == "y differs between two calls"
    assert got[2].message == "ValueError: raised"
    run = detection.ReportRun(1, True, got, len(cases))
    cell = detection.report_cell(run)
    assert cell.startswith("exit 1: `accuracy` 2/3 (grad_x 20)") and "`determinism` 1/2 (y differs" in cell
    assert "**not caught**" in detection.report_cell(detection.ReportRun(0, False, [], 47))


def test_summary_counts_each_column_per_family_and_rows_round_trip():
    """The summary counts, per family and overall, the mutants the suite and the report caught (and the report
    before, where kept); a row written to detection.json reads back equal (``--suite-from`` and the like)."""
    import json
    from dataclasses import asdict

    caught = detection.ReportRun(1, True, [detection.ReportCatch("accuracy", 1, 2, "c", "y", 5.0)], 2)
    missed = detection.ReportRun(0, False, [], 2)
    rows = [
        detection.Detection("a", "k", "", "m:a", [], True, family="F", report=caught, report_before=missed),
        detection.Detection("b", "k", "", "m:b", [], True, family="F", report=missed, report_before=missed),
        detection.Detection("c", "k", "", "m:c", [], False, family="G", report=missed),
    ]
    lines = detection.summary_lines(rows)
    assert "| F | 2 | 2 | 1 | 0 |" in lines and "| G | 1 | 0 | 0 | 0 |" in lines and "| all | 3 | 2 | 1 | 0 |" in lines
    back = [detection._from_json(json.loads(json.dumps(asdict(d)))) for d in rows]
    assert back == rows
    assert "report before" in detection.to_markdown(rows, "head")


#: The suite column's caught-by sets of the table committed before the table covered every family (docs/detection.md
#: at fffe50b): issue 46 asks that a regenerated table catch each mutant by the same properties or more.
BEFORE: dict[str, tuple[str, ...]] = {
    "mutant_gw_bf16_sum": ("accuracy_fp32_sharp", "many_chunks"),
    "mutant_gb_bf16_sum": ("accuracy_fp32_sharp", "many_chunks"),
    "mutant_gx_bf16_sum": ("accuracy_fp32_sharp", "many_chunks"),
    "mutant_loss_bf16_sum": ("accuracy_fp32_sharp", "many_chunks"),
    "mutant_gw_bf16_sum[bf16_only]": ("many_chunks",),
    "mutant_gw_fp16_sum[fp16_only]": ("many_chunks",),
    "mutant_gx_bf16_sum[bf16_only]": ("large_vocab",),
    "mutant_bf16_grad_weight_accum": ("accuracy_fp32_sharp", "many_chunks"),
    "mutant_chunk_order_per_call": ("determinism",),
    "mutant_row_order_per_call": ("determinism", "ignored_rows"),
    "mutant_row_loss_bf16": ("accuracy", "accuracy_fp32_sharp"),
    "mutant_stats_bf16": ("accuracy", "accuracy_fp32_sharp"),
    "mutant_loss_bf16": ("accuracy", "accuracy_fp32_sharp"),
    "mutant_mx_scale_wrong_way": ("quantizer_bitwise_on_random_tensors", "accuracy_against_both_references"),
    "mutant_mx_rceil_log2": ("quantizer_bitwise_on_random_tensors", "accuracy_against_both_references"),
    "mutant_mx_rceil_nonstrict": ("quantizer_bitwise_on_random_tensors", "accuracy_against_both_references"),
    "mutant_pow2_scale_log2[current]": ("quantizer_bitwise_on_random_tensors",),
    "mutant_pow2_scale_log2[blockwise]": ("quantizer_bitwise_on_random_tensors",),
    "mutant_no_saturation[mxfp8]": ("quantizer_bitwise_on_random_tensors", "accuracy_against_both_references"),
    "mutant_no_saturation[delayed]": ("quantizer_bitwise_on_random_tensors", "accuracy_against_both_references"),
}
COMMITTED = Path(__file__).resolve().parents[3] / "results" / "detection" / "detection.json"


def test_committed_table_covers_every_row_and_catches_no_less():
    """The committed run (results/detection/detection.json, what docs/detection.md shows) has a row for every
    mutant of ROWS, the suite caught each, and each mutant of the earlier table by the same properties or more."""
    import json

    rows = {d["spec"]: d for d in json.loads(COMMITTED.read_text())["mutants"]}
    assert set(rows) == {r.spec for r in detection.ROWS}
    assert [s for s, d in rows.items() if not d["caught"]] == []
    by_name = {d["mutant"]: {c["property"] for c in d["catches"]} for d in rows.values()}
    less = {m: sorted(set(props) - by_name.get(m, set())) for m, props in BEFORE.items()}
    assert not {m: p for m, p in less.items() if p}, less


def _table(path: Path, rows: list, torch_version: str | None = None) -> Path:
    """A detection.json under ``path`` holding ``rows``, as a run on this torch (or ``torch_version``) writes it."""
    import json
    from dataclasses import asdict

    import torch

    path.mkdir(parents=True, exist_ok=True)
    payload = {
        "torch": torch_version or torch.__version__,
        "profile": "numcheck-ci",
        "mutants": [asdict(d) for d in rows],
    }
    (path / "detection.json").write_text(json.dumps(payload))
    return path / "detection.json"


def _row(i: int, commit: str, prop: str) -> "detection.Detection":
    r = detection.ROWS[i]
    report = detection.ReportRun(1, True, [detection.ReportCatch(prop, 1, 2)], 2, commit=commit)
    name = r.spec.rsplit(":", 1)[1]
    catch = [detection.Catch(prop, 2.0, "")]
    return detection.Detection(name, r.bug_class, r.change, r.spec, [prop], True, catch, commit=commit, report=report)


def test_update_replaces_the_named_rows_and_keeps_the_others(tmp_path):
    """``--mutant NAME --update DIR`` replaces that mutant's row in DIR's detection.json and detection.md and keeps
    every other row as it was, each with the commit it ran at; ``--doc`` rewrites only the page's generated block."""
    import json

    kept = _table(tmp_path / "committed", [_row(0, "aaaaaaa", "accuracy"), _row(1, "aaaaaaa", "accuracy")])
    new = _table(tmp_path / "new", [_row(1, "bbbbbbb", "many_chunks")])
    page = tmp_path / "page.md"
    page.write_text(f"prose before\n{detection.TABLE_BEGIN}\nold table\n{detection.TABLE_END}\nprose after\n")
    name = detection.ROWS[1].spec.rsplit(":", 1)[1]
    status = detection.main(
        ["--mutant", name, "--update", str(kept.parent), "--suite-from", str(new), "--report-from", str(new)]
        + ["--out", str(tmp_path / "runs"), "--doc", str(page)]
    )
    assert status == 0
    rows = json.loads(kept.read_text())["mutants"]
    assert [(d["spec"], d["commit"], d["report"]["commit"]) for d in rows] == [
        (detection.ROWS[0].spec, "aaaaaaa", "aaaaaaa"),
        (detection.ROWS[1].spec, "bbbbbbb", "bbbbbbb"),
    ]
    assert [c["property"] for c in rows[1]["catches"]] == ["many_chunks"]
    md = (kept.parent / "detection.md").read_text()
    assert "| aaaaaaa / aaaaaaa |" in md and "| bbbbbbb / bbbbbbb |" in md and "2 of 2 mutants caught" in md
    text = page.read_text()
    assert text.startswith("prose before\n") and text.endswith("prose after\n") and "old table" not in text
    assert "bbbbbbb / bbbbbbb" in text


def test_update_refuses_another_torch_and_a_page_without_markers(tmp_path, capsys):
    """A table of another torch is not updated (its rows would mix two torches), and a page without the generated
    block's markers is refused before anything runs, naming the page and the markers."""
    import pytest

    kept = _table(tmp_path / "old", [_row(0, "aaaaaaa", "accuracy")], torch_version="1.0.0")
    name = detection.ROWS[0].spec.rsplit(":", 1)[1]
    args = ["--mutant", name, "--suite-from", str(kept), "--report-from", str(kept), "--out", str(tmp_path / "r")]
    assert detection.main([*args, "--update", str(kept.parent)]) == 2
    assert "ran on torch 1.0.0" in capsys.readouterr().err
    page = tmp_path / "page.md"
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="page.md has no generated table"):
        detection.main([*args, "--doc", str(page)])
