"""The detection table's report column held in CI: one mutant per regime class, each through ``numcheck report
--quick --impl SPEC``'s own functions (the sweep of ``build_report`` over the quick grid and the command's ``verdict``,
in process; the accumulation and memory sections, which judge no impl, left out), must give exit status 1 with the
expected property among the mutant's failing cases. The full column is docs/detection.md's (tools/detection.py).

The FP8 quantizer-edge and grouped state-across-calls classes were strict xfails while the report judged accuracy
only, one call per case; they passed once the report ran every property of the kind's suite (issue 44 item 5), by the
``quantizer`` and ``empty_experts`` properties. The trained-head and declared-reduce-dtype classes passed the report
until it ran the suite's V=151936 head row in bf16 and the world-size relation on a cancelling head.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from numcheck.reports.report.command import build_report, verdict
from numcheck.reports.report.grid import QUICK

_TOOL = Path(__file__).resolve().parents[3] / "tools" / "detection.py"
_spec = importlib.util.spec_from_file_location("numcheck_tools_detection_report", _TOOL)
detection = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = detection  # its dataclasses look their module up by name
_spec.loader.exec_module(detection)

_H = "numcheck.tests.self.helpers"

#: (regime class, mutant spec, the property the report must name among its failing cases).
CASES = [
    pytest.param(f"{_H}.mutants:bf16_grad_weight_accum", "accuracy", id="linear_ce-narrow-accumulator"),
    pytest.param(
        f"{_H}.fp8_mutants:mx_rceil_nonstrict",
        "quantizer",
        id="fp8-quantizer-edge",
    ),
    pytest.param(
        f"{_H}.grouped_fp8_mutants:stale_wgrad_workspace",
        "empty_experts",
        id="grouped-state-across-calls",
    ),
    pytest.param(f"{_H}.dist_mutants:no_grad_x_all_reduce", "accuracy", id="vocab-parallel-collective"),
    pytest.param(f"{_H}.mutants:chunk_order_per_call", "determinism", id="linear_ce-nondeterminism"),
    pytest.param(f"{_H}.mutants:gx_bf16_sum_bf16_only", "accuracy", id="linear_ce-trained-head"),
    pytest.param(
        f"{_H}.dist_reduce:bf16_reduce_declared_fp32",
        "dist_world_size_invariance",
        id="vocab-parallel-declared-reduce-dtype",
    ),
]


@pytest.mark.parametrize("spec, prop", CASES)
def test_quick_report_catches_the_mutant(spec, prop):
    """The quick report of the mutant alone exits 1, its last line naming the mutant, and ``prop`` is among the
    properties whose cases failed (as the detection table's report column reads them)."""
    report = build_report(QUICK, [spec], "cpu", progress=False, memory=False, accumulation=False)
    status, line = verdict(report)
    (impl,) = [i["name"] for i in report["impls"]]
    failing = {c.property for c in detection.report_catches(report["cases"])}
    assert status == 1 and impl in line, line
    assert prop in failing, (prop, sorted(failing))
