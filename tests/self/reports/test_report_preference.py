"""The report's linear+preference family (reports/report/families/linear_preference.py): its grid fits each
built-in's declaration and passes, a mutant's case fails both in its record and through the repro line it prints,
and the repro's ``--problem`` parses back to the case."""

from __future__ import annotations

from numcheck.impls.builtin.linear_preference import linear_preference_impls
from numcheck.impls.protocols.linear_preference import PREFERENCE_KIND
from numcheck.reports.report.families import FAMILIES
from numcheck.reports.report.grid import GridSpec
from numcheck.reports.repro import parse_case
from numcheck.tests.self.helpers.preference_mutants import pref_swapped_halves


def _spec() -> GridSpec:
    from numcheck.reports.report.grid import QUICK

    return QUICK


def test_grid_passes_on_builtins_and_fails_a_mutant():
    """Two built-ins pass every case of the quick grid; the swapped-halves mutant fails its first, with a repro."""
    fam = FAMILIES[PREFERENCE_KIND]
    impls = {i.name: i for i in linear_preference_impls()}
    for name in ("linear_preference_chunked[simpo]", "linear_preference_eager[dpo_robust]"):
        info: dict = {}
        planned = fam.plan(_spec(), impls[name], "cpu", info)
        assert len(planned) == 6, planned  # two cases in each of three dtypes
        for impl, gc in planned:
            rec = fam.measure(impl, gc, 0.0)
            assert rec["status"] == "pass", rec
    impl, gc = fam.plan(_spec(), pref_swapped_halves, "cpu", {})[0]
    rec = fam.measure(impl, gc, 0.0)
    assert rec["status"] == "fail" and "loss" in rec["failures"][0], rec
    assert "--problem" in rec["repro"]
    assert parse_case(rec["case"]) == gc.case
