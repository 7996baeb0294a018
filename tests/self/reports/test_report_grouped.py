"""``numcheck report``'s grouped FP8 rows: the grid's cases are declared ones (the rest counted), a correct impl's
rows pass, a mutant's fail with a repro line ``numcheck repro`` runs, the records reload and render, and numcheck
premerge's report check counts and lists them."""

from __future__ import annotations

import pytest

from numcheck.impls.builtin.grouped_fp8_linear import grouped_fp8_linear_impls
from numcheck.properties.fp8.grouped.cases import refusal
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report.command import build_report, write_report
from numcheck.reports.report.families.grouped_fp8_linear import grouped_cases
from numcheck.reports.report.grid import FULL, QUICK, SMOKE, reduction_length

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.mark.parametrize("spec", [QUICK, FULL, SMOKE], ids=lambda s: s.name)
def test_grouped_grid_runs_declared_cases_and_counts_the_others(spec):
    """Every grouped grid case lies inside the impl's declaration (the split rules included), and cases run plus
    cases counted per reason make the whole grid (recipes × dtypes × labels)."""
    for impl in grouped_fp8_linear_impls():
        cases, skipped = grouped_cases(spec, impl)
        s = impl.support
        kinds = len({r.kind for r in s.recipes})
        recipes = len(s.recipes) if spec.grouped_all_recipes else kinds
        dtypes = len(s.dtypes) if spec.fp8_all_dtypes else 1
        assert len(cases) + sum(skipped.values()) == recipes * dtypes * len(spec.grouped_cases)
        if "cpu" not in s.devices:  # the CUDA-only built-in: every CPU case refused, for the device
            assert not cases and all("device cpu not declared" in why for why in skipped)
            continue
        assert cases and all(refusal(s, gc.case) is None for gc in cases)
        assert all(reduction_length("wgrad", gc.case) == max(gc.case.m_splits) for gc in cases)


def test_report_has_grouped_rows_and_mutant_failures(tmp_path):
    """A report with a correct grouped impl and the grouped mutants: the impl's rows pass, the shared-scale mutant's
    rows fail with a numcheck repro line, the report reloads under the schema check and renders the grouped table,
    and premerge's report check counts the rows and lists the failures with their repro lines."""
    from numcheck.reports.premerge.command import check_report
    from numcheck.reports.repro import parse_case

    specs = ["grouped_fp8_linear[fused]", "numcheck.tests.self.helpers.grouped_fp8_mutants:MUTANTS"]
    rep = build_report(SMOKE, specs, "cpu", progress=False, memory=False, accumulation=False)
    good = [c for c in rep["cases"] if c["impl"] == "grouped_fp8_linear[fused]"]
    assert good and all(c["status"] == "pass" and c["kind"] == "grouped-fp8-linear" for c in good)
    assert all(set(c["outputs"]) == {"y", "dgrad", "wgrad", "bgrad"} for c in good if "@" not in "".join(c["outputs"]))
    bad = [c for c in rep["cases"] if c["impl"] == "mutant_grouped_shared_scale"]
    assert bad and any(c["status"] == "fail" for c in bad)
    failing = next(c for c in bad if c["status"] == "fail")
    assert "numcheck repro" in failing["repro"] and "GroupedCase(" in failing["repro"]
    assert type(parse_case(failing["case"])).__name__ == "GroupedCase"
    chk = check_report(rep, "smoke")
    assert not chk.ok and int(chk.figure.split("/")[1].split()[0]) == len(rep["cases"])
    assert any("mutant_grouped_shared_scale" in d and "numcheck repro" in d for d in chk.details)
    write_report(rep, tmp_path / "r", plots=False)
    back = report_schema.load(tmp_path / "r" / "report.json")
    assert any(c["kind"] == "grouped-fp8-linear" for c in back["cases"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert "### Grouped FP8 linear (mixture-of-experts)" in md and "`mutant_grouped_shared_scale`" in md
    assert "every scale per expert" in md


def test_an_impl_of_one_mode_runs_the_grid_in_it_and_skips_the_mode_comparison():
    """A grouped impl declaring only ``save_original_input=True`` (torchao's grouped GEMM; an H100 report had its
    fixed cases refused for the default False mode, then raised on the mode comparison's False calls): the grid's
    cases run in the declared mode (the edge splits among them), none raises, and the mode comparison is left out
    naming why, as the suite skips it."""
    from numcheck.tests.self.helpers.user_impls import grouped_saves_x

    spec = "numcheck.tests.self.helpers.user_impls:grouped_saves_x"
    rep = build_report(QUICK, [spec], "cpu", progress=False, memory=False, accumulation=False)
    mine = [c for c in rep["cases"] if c["impl"] == grouped_saves_x.name]
    assert mine and all(c["status"] == "pass" for c in mine), [(c["label"], c["status"]) for c in mine]
    groups = {c["group"] for c in mine}
    assert "suite:grouped_edge_splits_every_recipe" in groups and "grouped:soi" in groups, groups
    assert not [g for g in groups if "save_original_input_is_bitwise" in g]
    (info,) = [i for i in rep["impls"] if i["name"] == grouped_saves_x.name]
    named = [n for n in info.get("not_run") or [] if "save_original_input_is_bitwise" in n["group"]]
    assert named and all("declares only save_original_input=True" in n["reason"] for n in named), info.get("not_run")
