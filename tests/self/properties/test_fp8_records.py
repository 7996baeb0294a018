"""The single-device FP8 and grouped accuracy properties record each output's error/bound (both references) for
the seed sweep's tables and margins, as the linear+CE and distributed families do: before, a sweep over the FP8
built-ins recorded nothing, so their margins could not be read off a sweep."""

from __future__ import annotations

import json

from numcheck.impls.registry import builtin
from numcheck.properties.core import records
from numcheck.properties.fp8 import props as fp8
from numcheck.properties.fp8.cases import Fp8Case
from numcheck.properties.fp8.grouped import props as grouped
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.reference.fp8_recipes import Fp8Recipe


def _recorded(tmp_path, run) -> list[dict]:
    path = tmp_path / "records.jsonl"
    records.start(path)
    try:
        run()
    finally:
        records.stop()
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_single_linear_accuracy_records_both_references(tmp_path):
    impl = builtin("fp8_linear[current]")
    case = Fp8Case(Fp8Recipe("current"), 32, 64, 16, dtype="bfloat16", seed=1)
    rows = _recorded(tmp_path, lambda: fp8.accuracy(impl, case))
    outputs = {r["output"] for r in rows}
    assert {"y", "dgrad", "wgrad", "y (original operands)"} <= outputs, outputs
    assert all(r["impl"] == impl.name and r["property"] == "accuracy" and r["dtype"] == "bfloat16" for r in rows)
    assert all(r["ok"] and 0 <= r["ratio"] <= 1 for r in rows), rows


def test_grouped_accuracy_records_every_output(tmp_path):
    impl = builtin("grouped_fp8_linear[loop]")
    case = GroupedCase(Fp8Recipe("current"), (0, 16, 0, 9), 24, 16, seed=3)
    rows = _recorded(tmp_path, lambda: grouped.accuracy(impl, case))
    assert rows and all(r["impl"] == impl.name and r["ok"] for r in rows), rows
    assert any(r["output"].endswith("(original operands)") for r in rows)
