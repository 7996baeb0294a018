"""The linear-distill and linear-preference accuracy properties record each output's error/bound, (a) and (b), for
the seed sweep's tables and margins (as the linear+CE and FP8 families do): before, a sweep over these families
recorded nothing ("0 judgements recorded"), so their margins could not be read off it."""

from __future__ import annotations

import json

import pytest

from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.linear_distill import linear_distill_impls
from numcheck.impls.builtin.linear_preference import linear_preference_impls
from numcheck.properties.core import records
from numcheck.properties.linear_distill import props as distill
from numcheck.properties.linear_distill.cases import DistillCase
from numcheck.properties.linear_preference import props as preference
from numcheck.properties.linear_preference.cases import PreferenceCase
from numcheck.tests.self.helpers.preference_mutants import pref_swapped_halves


def _recorded(tmp_path, run) -> list[dict]:
    path = tmp_path / "records.jsonl"
    records.start(path)
    try:
        run()
    finally:
        records.stop()
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_distill_accuracy_records_both_judgements(tmp_path):
    impl = next(i for i in linear_distill_impls() if i.name == "linear_distill[chunked]")
    rows = _recorded(tmp_path, lambda: distill.accuracy(impl, DistillCase(N=6, H=4, V=8, dtype="bfloat16", seed=1)))
    outputs = {r["output"] for r in rows}
    assert {"loss", "grad_x", "grad_weight", "loss (b)"} <= outputs, outputs
    assert all(r["impl"] == impl.name and r["property"] == "accuracy" and r["dtype"] == "bfloat16" for r in rows)
    assert all(r["ok"] for r in rows), rows


def test_preference_accuracy_records_a_failing_case_before_raising(tmp_path):
    impl = next(i for i in linear_preference_impls() if i.name == "linear_preference_chunked[dpo]")
    case = PreferenceCase(P=2, T=3, H=4, V=8, bias=True, seed=2)
    rows = _recorded(tmp_path, lambda: preference.accuracy(impl, case))
    assert {"loss", "grad_x", "grad_weight", "grad_bias", "grad_x (b)"} <= {r["output"] for r in rows}, rows
    assert all(r["impl"] == impl.name and r["ok"] for r in rows), rows

    def failing():  # the chosen and rejected halves swapped: (a) fails, so (b) is not judged
        with pytest.raises(PropertyFailure):
            preference.accuracy(pref_swapped_halves, case.replace(beta=2.5))

    bad = _recorded(tmp_path / "mutant", failing)
    assert bad and not all(r["ok"] for r in bad) and not any(r["output"].endswith("(b)") for r in bad), bad
