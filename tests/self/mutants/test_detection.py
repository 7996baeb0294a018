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


def test_rows_cover_every_mutant_and_load():
    """Every mutant of every bug class (linear+CE and FP8 edges) has a row, and each row's spec loads one impl."""
    from numcheck.impls.registry import ImplEntry, load_spec
    from numcheck.tests.self.helpers import fp8_mutants, mutants

    names = {e.impl.name for r in detection.ROWS for e in load_spec(r.spec, "test") if isinstance(e, ImplEntry)}
    assert all(len(load_spec(r.spec, "test")) == 1 for r in detection.ROWS)
    wanted = {m.name for ms in mutants.CLASSES.values() for m in ms}
    wanted |= {m.name for m in fp8_mutants.EDGE_MUTANTS} | {fp8_mutants.mx_scale_wrong_way.name}
    assert wanted <= names, sorted(wanted - names)


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
