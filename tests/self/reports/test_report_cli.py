"""``numcheck report`` / ``premerge`` / ``versions`` / ``repro`` as an installed tool: where reports are written
(under the current directory or ``--out``, never into the package), the exit codes, the validation of baselines,
the baselines shipped as package data, report.md's counts and the plots' legends and titles.

Runs on the smoke grid with one or two impls and no plots unless a plot is the subject: a few seconds each.
"""

from __future__ import annotations

import io
import json
import os
import sys
from importlib import resources
from pathlib import Path

import pytest

from numcheck.reports import baselines, cli, versions
from numcheck.reports.premerge import command as premerge
from numcheck.reports.report import md as report_md
from numcheck.reports.report import md_rows
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report.command import verdict

SMOKE = ["--grid", "smoke", "--no-progress", "--no-plots"]

OUTSIDE = """
from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport
import torch

def _needs_gpu():
    return "needs a GPU named Zeta (test impl)"

unavailable = FunctionImpl(name="needs_zeta", fn=lambda *a, **k: None, support=LinearCESupport(requires=_needs_gpu))

def _boom(x, w, t, b=None, **kw):
    raise RuntimeError("kernel exploded on purpose")

raising = FunctionImpl(name="raises", fn=_boom, support=LinearCESupport(dtypes=frozenset({torch.float32})))
not_an_impl = object()
"""


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An outside module of impls (unavailable, raising, not an impl) importable as ``outside_impls``."""
    (tmp_path / "outside_impls.py").write_text(OUTSIDE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "outside_impls"


def _package_tree() -> set[str]:
    root = Path(str(resources.files("numcheck.reports"))).resolve()
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


# -- where a report is written --------------------------------------------------------------------------------------
def test_report_writes_under_the_current_directory_and_never_into_the_package(tmp_path, monkeypatch, capsys):
    """Without --out the report goes to ./numcheck-report/<device>-torch<version>/ of the current directory, the
    package's folder is unchanged, and a second run refuses to replace it unless --force is given."""
    monkeypatch.chdir(tmp_path)
    before = _package_tree()
    assert cli.main(["report", *SMOKE, "--impl", "eager"]) == 0
    out = tmp_path / "numcheck-report" / baselines.report_dir_name("cpu")
    assert (out / "report.json").is_file() and (out / "report.md").is_file()
    assert report_schema.load(out / "report.json")["cases"], "the report holds no case"
    assert _package_tree() == before, "numcheck report wrote into the package folder"
    first = (out / "report.json").read_text()
    capsys.readouterr()
    assert cli.main(["report", *SMOKE, "--impl", "eager"]) == 2
    err = capsys.readouterr().err
    assert "already holds a report" in err and "--force" in err
    assert (out / "report.json").read_text() == first
    assert cli.main(["report", *SMOKE, "--impl", "eager", "--force"]) == 0


def test_out_inside_the_package_is_refused(tmp_path, capsys):
    """--out pointing into the installed package's folder is refused (exit 2) before anything runs."""
    target = Path(str(resources.files("numcheck.reports"))) / "cpu-torch-test-out"
    assert cli.main(["report", *SMOKE, "--impl", "eager", "--out", str(target)]) == 2
    assert "inside numcheck's package folder" in capsys.readouterr().err
    assert not target.exists()


def test_update_baseline_is_refused_by_an_installed_numcheck(monkeypatch, capsys):
    """--update-baseline outside a checkout (no pyproject.toml naming numcheck) exits 2 saying why."""
    monkeypatch.setattr(baselines, "checkout_root", lambda: None)
    assert cli.main(["report", *SMOKE, "--impl", "eager", "--update-baseline"]) == 2
    err = capsys.readouterr().err
    assert "--update-baseline" in err and "installed at" in err


def test_update_baseline_in_a_checkout_targets_its_reports_folder():
    """In a checkout --update-baseline writes reports/baselines/<name>/ of the checkout, the shipped folder for this device."""
    root = baselines.checkout_root()
    if root is None:
        pytest.skip("not a checkout of numcheck")
    target = baselines.baseline_dir_to_update("cpu")
    assert target.parent == root / "reports" / "baselines"
    shipped = baselines.baseline_for("cpu")
    assert target.name == (Path(str(shipped)).parent.name if shipped else baselines.report_dir_name("cpu"))


# -- exit codes -----------------------------------------------------------------------------------------------------
def test_exit_1_when_a_case_fails_or_an_impl_is_broken(outside, tmp_path, capsys):
    """A raising impl, an unloadable spec and an object that breaks the protocol each make report exit 1; the
    last line says FAIL and why."""
    for spec, needle in (
        (f"{outside}:raising", "fail or raise"),
        ("no_such_module_xyz:impl", "broken"),
        (f"{outside}:not_an_impl", "broken"),
    ):
        out = tmp_path / spec.replace(":", "_")
        assert cli.main(["report", *SMOKE, "--impl", spec, "--out", str(out)]) == 1, spec
        last = _last_line(capsys.readouterr().out)
        assert last.startswith("numcheck report: FAIL (exit 1)") and needle in last, last


def test_unavailable_impl_is_listed_not_a_failure(outside, tmp_path, capsys):
    """An impl whose declared requirement is unmet here is listed, exit 0, and the last line says so."""
    assert cli.main(["report", *SMOKE, "--impl", f"{outside}:unavailable", "--out", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    assert "UNAVAILABLE needs_zeta: needs a GPU named Zeta" in text
    last = _last_line(text)
    assert last.startswith("numcheck report: PASS (exit 0)") and "unavailable here" in last and "needs_zeta" in last


def test_verdict_counts_regressions():
    """--compare regressions alone make the verdict exit 1."""
    rep = {"impls": [{"name": "m", "kind": "linear-ce", "status": "ran"}], "cases": []}
    assert verdict(rep)[0] == 0
    status, line = verdict(rep, regressions=2)
    assert status == 1 and "2 regression(s)" in line


# -- baselines: validation and where they come from -----------------------------------------------------------------
def _small_report(tmp_path: Path) -> Path:
    case = {
        "impl": "m",
        "kind": "linear-ce",
        "case": "P()",
        "label": "L",
        "group": "g",
        "mode": "float32",
        "status": "pass",
        "verdicts": {"analytic": True},
        "ratio_hard": 0.1,
        "outputs": {"grad_x": {"ratio_hard": 0.1, "verdicts": {"analytic": True}}},
    }
    rep = {
        "schema": report_schema.SCHEMA,
        "environment": {"device": "cpu", "torch": "2.0"},
        "impls": [{"name": "m", "kind": "linear-ce", "status": "ran", "reason": ""}],
        "cases": [case],
    }
    p = tmp_path / "good.json"
    p.write_text(report_schema.dumps(rep))
    return p


def test_incomplete_baseline_is_a_clear_error_with_exit_2(tmp_path, capsys):
    """A baseline whose case lacks its 'impl' key exits 2 with the file, the case and the key named, no traceback
    — with --current and when a new report would be run."""
    good = _small_report(tmp_path)
    data = json.loads(good.read_text())
    del data["cases"][0]["impl"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"bad\.json.*cases\[0\] \(L\) lacks the key\(s\) 'impl'"):
        report_schema.load(bad)
    for argv in (
        ["report", "--compare", str(bad), "--current", str(good)],
        ["report", *SMOKE, "--impl", "eager", "--compare", str(bad), "--out", str(tmp_path / "o")],
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "bad.json" in err and "'impl'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists(), "nothing may run on bad input"
    assert cli.main(["report", "--compare", str(good), "--current", str(good)]) == 0


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d.pop("cases"), "lacks the 'cases' section"),
        (lambda d: d["impls"][0].pop("status"), "impls[0] (m) lacks the key(s) 'status'"),
        (lambda d: d["cases"][0].update(status="maybe"), "status 'maybe'"),
        (lambda d: d["cases"][0].update(outputs={"grad_x": {}}), "'ratio_hard'"),
    ],
)
def test_malformed_reports_are_named(tmp_path, edit, needle):
    """Each missing section, missing key or bad value is refused with what is wrong."""
    data = json.loads(_small_report(tmp_path).read_text())
    edit(data)
    p = tmp_path / "edited.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="edited.json") as info:
        report_schema.load(p)
    assert needle in str(info.value)


def test_shipped_baselines_are_package_data_and_load():
    """The baselines are found through importlib.resources inside numcheck.reports, each a complete report, and
    versions reads exactly those."""
    shipped = baselines.shipped_baselines()
    assert shipped, "no baseline ships with numcheck"
    root = Path(str(resources.files("numcheck.reports.baselines")))
    for b in shipped:
        assert Path(str(b)).parent.parent == root
        report_schema.load(b)
    assert versions.committed_reports() == [Path(str(b)) for b in shipped]


def test_baseline_for_matches_device_and_torch_release():
    """baseline_for picks a shipped report made on this device type under this torch release, or None."""
    found = baselines.baseline_for("cpu")
    for b in baselines.shipped_baselines():
        rep = report_schema.load(b)
        if baselines.matches_here(rep, "cpu"):
            assert found is not None
            break
    else:
        assert found is None
    assert not baselines.matches_here({"environment": {"device": "cpu", "torch": "0.0.1"}}, "cpu")


def test_premerge_without_a_baseline_says_so_as_information():
    """No baseline for this device is ✅ and says 'no baseline for this device'."""
    c = premerge.check_baseline({"environment": {"device": "cpu", "torch": "9.9"}}, None, 2.0, 0.25)
    assert c.ok and "no baseline for this device" in c.figure


def test_premerge_runs_the_installed_suite_and_streams_it():
    """The suite command names the installed suite (--pyargs, no checkout path); stream() forwards each line as
    the child prints it and returns its status."""
    cmd = premerge.suite_command(["mymod:impl"], 2, Path("j.xml"))
    assert cmd[1:5] == ["-m", "pytest", "--pyargs", *premerge.SUITE_MODULES]
    assert ["--impl", "mymod:impl"] == cmd[cmd.index("--impl") : cmd.index("--impl") + 2] and "-n" in cmd
    sink = io.StringIO()
    code = "import sys, time; print('first', flush=True); time.sleep(0.2); print('second'); sys.exit(3)"
    rc, lines = premerge.stream([sys.executable, "-c", code], env=dict(os.environ), prefix="> ", sink=sink)
    assert rc == 3 and lines == ["first", "second"] and sink.getvalue() == "> first\n> second\n"
    dots = "import sys, time\nfor _ in range(3):\n    sys.stdout.write('.'); sys.stdout.flush(); time.sleep(0.1)\nprint(' [100%]')"
    sink = io.StringIO()
    rc, lines = premerge.stream([sys.executable, "-c", dots], env=dict(os.environ), prefix="> ", sink=sink)
    assert rc == 0 and lines == ["... [100%]"] and sink.getvalue() == "> ... [100%]\n", "pytest's dots are one line"


# -- what a reviewer reads ------------------------------------------------------------------------------------------
def test_summary_counts_only_judged_outputs_as_relative_passes():
    """An output not judged on 'relative' counts neither as a pass nor as judged: 1/1, no ❌, where the old count
    said 2/1 ❌ while every case passed."""

    def case(label: str, rel: bool | None) -> dict:
        verdicts = {"analytic": True} if rel is None else {"analytic": True, "relative": rel}
        o = {"ratio_hard": 0.1, "ratio_expected": 0.2, "max_ulp": 1.0, "verdicts": verdicts}
        return {
            "impl": "m",
            "kind": "linear-ce",
            "case": label,
            "label": label,
            "mode": "bfloat16",
            "status": "pass",
            "verdicts": verdicts,
            "outputs": {"grad_weight": o},
        }

    rep = {"impls": [{"name": "m"}], "cases": [case("a", True), case("b", None)]}
    (row,) = report_md.output_summary(rep, "linear-ce")
    assert row["passes"] == {"analytic": 2, "relative": 1} and row["judged"] == {"analytic": 2, "relative": 1}
    assert md_rows.all_judged_pass(row)
    table = "\n".join(report_md._summary_tables(rep))
    assert "❌" not in table and "| 2/2 | 1/1 |" in table


def test_plots_are_titled_and_explain_every_mark(tmp_path, monkeypatch):
    """Every plot has a title; error_vs_length's legend names every impl and what filled and hollow marks mean;
    no two impls share a colour; ratio_distribution has one panel per dtype and output."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from numcheck.reports.report import plots

    seen: dict[str, Figure] = {}
    real = Figure.savefig

    def record(fig: Figure, fname, *a, **k):
        seen[Path(fname).name] = fig
        return real(fig, fname, *a, **k)

    monkeypatch.setattr(Figure, "savefig", record)
    monkeypatch.setattr(plots._plt(), "close", lambda fig=None: None)
    full = report_schema.load(baselines.shipped_baselines()[0])
    keep = {i["name"] for i in full["impls"][:8]} | {i["name"] for i in full["impls"] if i["kind"] == "fp8-linear"}
    rep = dict(
        full,
        impls=[i for i in full["impls"] if i["name"] in keep],
        cases=[c for c in full["cases"] if c["impl"] in keep],
    )
    names, _ = plots.write_plots(rep, tmp_path)
    assert set(names) == set(seen)
    for name, fig in seen.items():
        title = fig._suptitle.get_text() if fig._suptitle else " ".join(a.get_title() for a in fig.axes)
        assert title.strip(), f"{name} has no title"
    fig = seen["error_vs_length.png"]
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert any(t.startswith("filled") for t in legend) and any(t.startswith("hollow") for t in legend)
    drawn = list(
        dict.fromkeys(c["impl"] for c in rep["cases"] if c["kind"] == "linear-ce" and c["group"].startswith("ladder"))
    )
    assert set(drawn) <= set(legend), set(drawn) - set(legend)
    styles = plots.impl_styles([i["name"] for i in rep["impls"]])
    colours = [tuple(round(c, 4) for c in s.color) for s in styles.values()]
    assert len(set(colours)) == len(colours), "two impls share a colour"
    panels = [a.get_title() for a in seen["ratio_distribution.png"].axes if a.get_visible()]
    assert "grad_weight — float32" in panels and "grad_x — bfloat16" in panels
