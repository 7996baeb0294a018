"""``numcheck report``: the grid, the schema, the Markdown and plots, atomic writes and overwrite protection,
and ``--compare`` catching an injected regression (an impl switched to bf16 grad_weight accumulation while
still declaring fp32).

Reports here run on tiny grids (:data:`reports.report.grid.SMOKE` or smaller) and few impls, so the module
costs a few seconds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from numcheck.reports import cli
from numcheck.reports.report import compare as report_compare
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report.command import build_report, resolve_out_dir, write_atomically, write_report
from numcheck.reports.report.families.fp8_linear import fp8_cases
from numcheck.reports.report.families.linear_ce import declared_cases, linear_ce_cases, random_problems
from numcheck.reports.report.grid import FULL, GRIDS, QUICK, SMOKE, GridSpec, reduction_length, span_decades

OUTPUT_FIELDS = (
    "max_abs",
    "max_rel",
    "rmse",
    "max_ulp",
    "ratio_hard",
    "ratio_expected",
    "verdicts",
    "reduction_length",
)

#: A grid smaller than SMOKE, in bf16 where a bf16 grad_weight accumulator shows.
TINY_BF16 = GridSpec(
    name="smoke",
    ladder=(2, 200),
    base=(6, 6, 6),
    ladder_modes=("bfloat16",),
    option_shape=(9, 5, 7),
    option_modes=(),
    options=(),
    n_random=0,
    fp8_ladder=(2, 200),
    fp8_base=(8, 8, 8),
    fp8_all_recipes_ladder=False,
    fp8_all_dtypes=False,
    fp8_regimes=(),
    fp8_extras=False,
    properties=False,  # accuracy records only: the compare tests edit and match their outputs' error/bound
)

IMPL_MODULE = """
import dataclasses
from numcheck.impls.builtin.chunked import ChunkedLinearCE
from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport

# fp32 grad_weight accumulation over chunks of 4 rows: the baseline impl.
good = ChunkedLinearCE("acc_impl", path="fp32_operands", chunk_rows=4)
_lowp = ChunkedLinearCE("inner", path="lowp_accum", chunk_rows=4)
# The injected regression: the same name, now accumulating grad_weight in bf16, still declaring fp32.
regressed = FunctionImpl(name="acc_impl", fn=lambda x, w, t, b=None, **kw: _lowp(x, w, t, b, **kw),
                         support=dataclasses.replace(_lowp.support, grad_accumulation="fp32"))

def _needs_gpu():
    return "needs a GPU named Zeta (test impl)"

unavailable = FunctionImpl(name="needs_zeta", fn=lambda *a, **k: None, support=LinearCESupport(requires=_needs_gpu))

def _boom(x, w, t, b=None, **kw):
    raise RuntimeError("kernel exploded on purpose")

raising = FunctionImpl(name="raises", fn=_boom, support=LinearCESupport(dtypes=frozenset({__import__("torch").float32})))
"""


@pytest.fixture(scope="module")
def impl_module(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("impls")
    (d / "report_test_impls.py").write_text(IMPL_MODULE)
    import sys

    sys.path.insert(0, str(d))
    yield "report_test_impls"
    sys.path.remove(str(d))


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory) -> Path:
    """One smoke report (eager and one FP8 impl) written by the CLI, shared by the tests that read it."""
    out = tmp_path_factory.mktemp("report") / "out"
    rc = cli.main(
        [
            "report",
            "--grid",
            "smoke",
            "--impl",
            "eager",
            "--impl",
            "fp8_linear[current]",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0, "numcheck report --grid smoke exited non-zero on correct built-ins"
    return out


# -- the grid ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GRIDS))
def test_every_output_reduction_length_spans_two_decades(name):
    """In every preset each linear+CE and FP8 output's reduction length spans at least two decades."""
    spec = GRIDS[name]
    cases = [gc.case for gc in linear_ce_cases(spec)]
    for out in ("loss", "grad_x", "grad_weight"):
        span = span_decades(reduction_length(out, p) for p in cases)
        assert span >= 2.0, f"grid {name}: {out} reduction lengths span only {span:.2f} decades"
    from numcheck.impls.protocols.fp8_linear import Fp8LinearSupport
    from numcheck.reference.fp8_recipes import Fp8Recipe

    support = Fp8LinearSupport(recipes=(Fp8Recipe("current"), Fp8Recipe("mxfp8")))
    q = [gc.case for gc in fp8_cases(spec, support)]
    for out in ("y", "dgrad", "wgrad", "bgrad"):
        span = span_decades(reduction_length(out, c) for c in q if c.recipe == support.recipes[0])
        assert span >= 2.0, f"grid {name}: FP8 {out} reduction lengths span only {span:.2f} decades"


def test_grid_is_deterministic_and_quick_is_part_of_full():
    """The grid is the same on every call, random cases come from one seeded sequence, and quick's are full's first."""
    assert linear_ce_cases(QUICK) == linear_ce_cases(QUICK)
    full = [p for _, p in random_problems(FULL.n_random, FULL.seed)]
    quick = [p for _, p in random_problems(QUICK.n_random, QUICK.seed)]
    assert quick == full[: len(quick)]
    labels = {gc.case.short() for gc in linear_ce_cases(QUICK)}
    assert {"N400H40V40-float32-mean-plain-ordinary-s1400", "N40H40V400-bfloat16-mean-plain-ordinary-s1400"} <= labels


def test_grid_spec_rejects_a_ladder_under_two_decades():
    """A ladder spanning less than 100× is refused with the field named."""
    with pytest.raises(ValueError, match="ladder"):
        GridSpec(
            name="x",
            ladder=(4, 40),
            base=(4, 4, 4),
            ladder_modes=("float32",),
            option_shape=(4, 4, 4),
            option_modes=(),
            options=(),
            n_random=0,
            fp8_ladder=(2, 200),
            fp8_base=(8, 8, 8),
            fp8_all_recipes_ladder=False,
            fp8_all_dtypes=False,
            fp8_regimes=(),
            fp8_extras=False,
        )


# -- what a report holds --------------------------------------------------------------------------------------------
def test_report_json_has_environment_and_every_metric(smoke_dir):
    """report.json is strict JSON of the versioned schema with the environment and, per case and output, every metric."""
    text = (smoke_dir / "report.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"report.json holds the non-JSON constant {c}"))
    rep = report_schema.load(smoke_dir / "report.json")
    assert rep["schema"] == report_schema.SCHEMA
    env = rep["environment"]
    for key in ("device", "torch", "triton", "python", "numcheck", "git_commit"):
        assert key in env, f"environment lacks {key}"
    assert env["torch"] and env["python"]
    kinds = {c["kind"] for c in rep["cases"]}
    assert kinds == {"linear-ce", "fp8-linear"}, f"expected both kinds of case, got {kinds}"
    for c in rep["cases"]:
        assert c["status"] == "pass", f"{c['impl']} on {c['label']}: {c.get('failures')}"
        assert c["outputs"], f"{c['impl']} on {c['label']} recorded no outputs"
        want = {"analytic", "relative"} if c["kind"] == "linear-ce" else {"accumulation", "total"}
        assert set(c["verdicts"]) == want, f"{c['label']}: verdicts {c['verdicts']}"
        for name, o in c["outputs"].items():
            missing = [f for f in OUTPUT_FIELDS if f not in o]
            assert not missing, f"{c['impl']} {c['label']} {name} lacks {missing}"
            assert 0 <= o["ratio_hard"] <= 1, f"{c['label']} {name}: ratio {o['ratio_hard']}"


def test_report_md_reads_on_its_own(smoke_dir):
    """report.md explains how to read it and holds the verdicts, per-output tables, accumulation and memory tables."""
    md = (smoke_dir / "report.md").read_text()
    for heading in (
        "How to read this",
        "## Verdict per impl",
        "per impl × dtype × output",
        "## grad_weight accumulation",
        "## Memory",
        "## Coverage",
    ):
        assert heading in md, f"report.md lacks {heading!r}"
    assert "`eager`" in md and "`fp8_linear[current]`" in md
    for path in ("addmm_out_dtype", "fallback", "fp32_operands", "lowp_accum"):
        assert f"| `{path}` |" in md, f"accumulation/memory tables lack the {path} row"


def test_render_rewrites_markdown_and_plots_from_json(smoke_dir, tmp_path):
    """--render writes the same report.md and the plots from a report.json alone; a bad JSON is a clear error."""
    out = tmp_path / "rendered"
    assert cli.main(["report", "--render", str(smoke_dir / "report.json"), "--out", str(out)]) == 0
    assert (out / "report.md").read_text() == (smoke_dir / "report.md").read_text()
    assert sorted(p.name for p in out.glob("*.png")) == sorted(p.name for p in smoke_dir.glob("*.png"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert cli.main(["report", "--render", str(bad), "--out", str(tmp_path / "x")]) == 2


def test_render_in_place_keeps_the_folders_other_files(smoke_dir, tmp_path):
    """--render next to a report.json (no --out) rewrites the report's files and keeps the rest of the folder
    (a GPU run's README, bench results and logs live beside its report)."""
    import shutil

    from numcheck.reports.report.command import REPORT_FILES
    from numcheck.reports.report.plots import PLOT_FILES

    folder = tmp_path / "gpu-run"
    folder.mkdir()
    shutil.copy(smoke_dir / "report.json", folder / "report.json")
    for name in ("README.md", "bench.json", "suite.txt"):
        (folder / name).write_text(name)
    assert cli.main(["report", "--render", str(folder / "report.json")]) == 0
    names = {p.name for p in folder.iterdir()}
    assert {"README.md", "bench.json", "suite.txt", "report.md"} <= names, sorted(names)
    assert all((folder / n).read_text() == n for n in ("README.md", "bench.json", "suite.txt"))
    assert names - {"README.md", "bench.json", "suite.txt"} <= REPORT_FILES | PLOT_FILES, sorted(names)


def test_plots_written_and_missing_matplotlib_degrades(smoke_dir, tmp_path, monkeypatch):
    """The PNG plots exist; without matplotlib the report is still written and says how to get them."""
    for name in ("error_vs_length.png", "fp8_error_vs_length.png", "ratio_distribution.png", "accumulation.png"):
        data = (smoke_dir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"
    from numcheck.reports.report import plots

    def no_matplotlib():
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(plots, "_plt", no_matplotlib)
    rep = report_schema.load(smoke_dir / "report.json")
    out = tmp_path / "noplots"
    assert write_report(rep, out) == []
    assert plots.MISSING_MESSAGE in (out / "report.md").read_text()
    assert not list(out.glob("*.png"))


def test_unavailable_broken_and_raising_impls_are_listed(impl_module):
    """An unavailable impl is listed with its reason, a broken spec with its error, and a raising impl fails with it."""
    rep = build_report(
        SMOKE,
        [f"{impl_module}:unavailable", f"{impl_module}:raising", "no_such_module_xyz:impl"],
        "cpu",
        progress=False,
        memory=False,
        accumulation=False,
    )
    status = {i["name"]: i for i in rep["impls"]}
    assert status["needs_zeta"]["status"] == "unavailable" and "Zeta" in status["needs_zeta"]["reason"]
    assert status["no_such_module_xyz:impl"]["status"] == "broken"
    assert "no_such_module_xyz" in status["no_such_module_xyz:impl"]["reason"]
    raised = [c for c in rep["cases"] if c["impl"] == "raises"]
    assert raised and all(c["status"] == "error" for c in raised)
    assert all("kernel exploded on purpose" in c["error"] and not any(c["verdicts"].values()) for c in raised)
    assert all(f"numcheck repro --impl {impl_module}:raising " in c["repro"] for c in raised), (
        "repro must name the outside impl's spec"
    )
    from numcheck.reports.report.md import render

    md = render(rep)
    assert "needs a GPU named Zeta" in md and "kernel exploded on purpose" in md and "broken" in md


# -- compare --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def accumulation_reports(impl_module, tmp_path_factory) -> tuple[Path, Path]:
    """(baseline, regressed) report files of one impl name before and after switching to bf16 accumulation."""
    d = tmp_path_factory.mktemp("cmp")
    base = build_report(TINY_BF16, [f"{impl_module}:good"], "cpu", progress=False, memory=False, accumulation=False)
    new = build_report(TINY_BF16, [f"{impl_module}:regressed"], "cpu", progress=False, memory=False, accumulation=False)
    (d / "base.json").write_text(report_schema.dumps(base))
    (d / "new.json").write_text(report_schema.dumps(new))
    return d / "base.json", d / "new.json"


def test_compare_catches_switch_to_bf16_accumulation(accumulation_reports):
    """An impl switched to bf16 grad_weight accumulation (declaring fp32) is a regression, and --compare exits 1."""
    base_p, new_p = accumulation_reports
    base, new = report_schema.load(base_p), report_schema.load(new_p)
    assert all(c["status"] == "pass" for c in base["cases"]), "the fp32-accumulating baseline impl must pass"
    diff = report_compare.compare_reports(base, new)
    hit = [f for f in diff.regressions if f.output == "grad_weight"]
    assert hit, f"no grad_weight regression found; findings: {diff.findings}"
    assert any(f.case.startswith("N200") for f in hit), "the 50-chunk case (N=200, 4 rows per chunk) must regress"
    assert cli.main(["report", "--compare", str(base_p), "--current", str(new_p)]) == 1
    assert cli.main(["report", "--compare", str(base_p), "--current", str(base_p)]) == 0


def test_compare_flags_growth_above_the_floor_from_an_edited_baseline(accumulation_reports, tmp_path):
    """A baseline whose error/bound was 10× smaller flags growth once the new ratio exceeds the floor, not below it."""
    base_p, _ = accumulation_reports
    rep = report_schema.load(base_p)
    edited = json.loads(json.dumps(report_schema._encode(rep)))
    case = max(edited["cases"], key=lambda c: c["outputs"]["grad_x"]["ratio_hard"])
    new_ratio = case["outputs"]["grad_x"]["ratio_hard"]
    case["outputs"]["grad_x"]["ratio_hard"] = new_ratio / 10
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    edited = report_schema.load(tmp_path / "edited.json")
    found = report_compare.compare_reports(edited, rep, factor=2.0, floor=new_ratio / 2).regressions
    assert [(f.case, f.output) for f in found] == [(case["label"], "grad_x")]
    assert not report_compare.compare_reports(edited, rep, factor=2.0, floor=new_ratio * 1.01).regressions
    assert "1 regression" in report_compare.to_markdown(report_compare.compare_reports(edited, rep, floor=0.0))


def test_compare_lists_coverage_differences_as_notes(accumulation_reports):
    """Impls or cases in one report only are notes, never regressions; a broken impl that ran before is a regression."""
    base = report_schema.load(accumulation_reports[0])
    new = json.loads(json.dumps(report_schema._encode(base)))
    new["cases"] = new["cases"][1:]
    new["impls"].append({"name": "newcomer", "kind": "linear-ce", "status": "ran", "reason": ""})
    diff = report_compare.compare_reports(base, report_schema._decode(new))
    assert not diff.regressions
    notes = " ".join(f.message for f in diff.of("note"))
    assert "not in this run" in notes and "no baseline" in notes
    new["impls"][0]["status"], new["impls"][0]["reason"] = "broken", "ImportError: gone"
    assert report_compare.compare_reports(base, report_schema._decode(new)).regressions


# -- writing --------------------------------------------------------------------------------------------------------
def test_atomic_write_replaces_its_files_or_nothing(tmp_path):
    """A report's own files are replaced as a whole (a stale one is removed), other files in the directory are
    kept; a failure while writing leaves the old directory and no temp dirs."""
    out = tmp_path / "rep"
    write_atomically(out, {"report.json": "{}", "stale.png": "p"})
    (out / "README.md").write_text("mine")
    (out / "runs").mkdir()
    (out / "runs" / "bench.json").write_text("b")
    write_atomically(out, {"report.json": '{"v": 2}'}, owned=frozenset({"report.json", "stale.png"}))
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "report.json", "runs"]
    assert (out / "README.md").read_text() == "mine" and (out / "runs" / "bench.json").read_text() == "b"

    def boom(_tmp):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomically(out, {"report.json": '{"v": 3}'}, extra=boom)
    assert (out / "report.json").read_text() == '{"v": 2}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"], "a temporary directory was left behind"


def test_existing_reports_and_foreign_folders_are_not_overwritten(tmp_path):
    """An --out holding a report is refused without --force; a folder that is no report is refused always."""
    import argparse

    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.json").write_text("{}")
    ns = dict(device="cpu", force=False, update_baseline=False)
    with pytest.raises(ValueError, match="already holds a report.*--force"):
        resolve_out_dir(argparse.Namespace(out=out, **ns))
    assert resolve_out_dir(argparse.Namespace(out=out, **{**ns, "force": True}))[0] == out
    rc = cli.main(["report", "--grid", "smoke", "--impl", "eager", "--out", str(out), "--no-progress"])
    assert rc == 2 and (out / "report.json").read_text() == "{}"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    with pytest.raises(ValueError, match="not a numcheck report directory"):
        resolve_out_dir(argparse.Namespace(out=other, **{**ns, "force": True}))


def test_schema_roundtrip_and_bad_files(tmp_path):
    """Non-finite floats survive a round trip as strict JSON; a file that is not a report is refused by name."""
    rep = {
        "schema": report_schema.SCHEMA,
        "environment": {},
        "impls": [],
        "cases": [
            {
                "impl": "i",
                "case": "P()",
                "status": "error",
                "verdicts": {},
                "outputs": {"loss": {"ratio_hard": math.inf, "max_abs": math.nan}},
                "label": "inf",
            }
        ],
    }
    p = tmp_path / "r.json"
    p.write_text(report_schema.dumps(rep))
    back = report_schema.load(p)
    o = back["cases"][0]["outputs"]["loss"]
    assert o["ratio_hard"] == math.inf and math.isnan(o["max_abs"]) and back["cases"][0]["label"] == "inf"
    (tmp_path / "x.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="x.json"):
        report_schema.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match="does not exist"):
        report_schema.load(tmp_path / "missing.json")


def test_report_includes_distributed_impls_per_world_size():
    """A distributed impl's grid cases run at world sizes 1, 2 and 4, each output with its error/bound; a mutant
    without grad_x's all-reduce passes at P = 1 and fails at P = 2 and 4 with its repro line (tensor-parallel FP8
    rows: test_report_tp.py)."""
    specs = ["vocab_parallel[nan]", "numcheck.tests.self.helpers.dist_mutants:dist_impls"]
    rep = build_report(SMOKE, specs, "cpu", progress=False, memory=False, accumulation=False)
    good = [c for c in rep["cases"] if c["impl"] == "vocab_parallel[nan]"]
    assert sorted(c["world_size"] for c in good) == [1, 2, 4] and all(c["status"] == "pass" for c in good)
    four = next(c for c in good if c["world_size"] == 4)
    assert {"loss", "grad_x", "grad_weight", "grad_x@rank3"} <= set(four["outputs"])
    assert all(set(OUTPUT_FIELDS) - {"ratio_expected"} <= set(o) for o in four["outputs"].values())
    bad = {c["world_size"]: c for c in rep["cases"] if c["impl"] == "mutant_dist[NoGradXAllReduce]"}
    assert bad[1]["status"] == "pass" and bad[2]["status"] == bad[4]["status"] == "fail"
    assert "numcheck.tests.self.helpers.dist_mutants:mutant_dist[NoGradXAllReduce]" in bad[2]["repro"]


def test_report_with_distributed_impl_renders_and_reloads(tmp_path):
    """A report holding a distributed impl's cases writes, reloads under the schema check and renders its table."""
    rep = build_report(SMOKE, ["vocab_parallel[zero]"], "cpu", progress=False, memory=False, accumulation=False)
    write_report(rep, tmp_path / "r", plots=False)
    assert report_schema.load(tmp_path / "r" / "report.json")["cases"]
    assert "### Distributed linear + cross-entropy" in (tmp_path / "r" / "report.md").read_text()


def test_dist_grid_counts_known_divergences_instead_of_running_them():
    """A distributed grid case a recorded known divergence covers (Megatron's local-shard smoothing at P > 1) is
    counted with that reason and not run, as the suite leaves it out of its draws; every case run is uncovered."""
    from numcheck.impls.adapters.megatron import megatron_impls
    from numcheck.properties.distributed.linear_ce.suite import known_divergence
    from numcheck.reports.report.families.dist_linear_ce import dist_cases
    from numcheck.reports.report.grid import QUICK

    impl = next(m for m in megatron_impls() if not m.fused)
    if impl.support.unavailable_reason():
        pytest.skip(impl.support.unavailable_reason())
    cases, skipped = dist_cases(QUICK, impl)
    assert any(why.startswith("known divergence: megatron-core") for why in skipped), skipped
    assert cases and all(known_divergence(impl, gc.case) is None for gc in cases)


def test_cases_take_a_reduction_the_impl_declares():
    """An impl declaring only ``none`` (TransformerEngine's reduce_loss=False) is judged on every grid shape in
    ``none``, a scalar upstream turned per-row; one declaring ``mean`` only gets the ``sum`` option case as ``mean``;
    an impl declaring every reduction keeps the grid's own cases (the committed baselines' are unchanged)."""
    import dataclasses

    import torch

    from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport
    from numcheck.impls.registry import ImplEntry
    from numcheck.reports.report.run import plan

    def per_row(x, w, t, b=None, *, reduction="none", ignore_index=-100):
        return torch.nn.functional.cross_entropy(
            torch.nn.functional.linear(x, w, b), t, reduction=reduction, ignore_index=ignore_index
        )

    def impl(name, reductions=("mean", "sum", "none")):
        return FunctionImpl(
            name=name,
            fn=per_row,
            support=LinearCESupport(
                dtypes=frozenset({torch.float32}),
                options=frozenset({"bias", "ignore_index"}),
                reductions=frozenset(reductions),
                autocast=frozenset(),
            ),
        )

    spec = dataclasses.replace(QUICK, option_modes=("float32",))
    _, work = plan(
        [ImplEntry(i, "test") for i in (impl("only_none", ("none",)), impl("only_mean", ("mean",)), impl("every"))],
        spec,
        "cpu",
    )
    # The grid's accuracy cases (the property cases, group suite:..., judge several properties on one case each).
    cases = {
        name: [gc.case for i, gc in work if i.name == name and not gc.group.startswith("suite:")]
        for name in ("only_none", "only_mean", "every")
    }
    props = [gc.case for i, gc in work if i.name == "only_none" and gc.group.startswith("suite:")]
    assert props and all(c.reduction == "none" for c in props)
    assert cases["only_none"] and all(c.reduction == "none" for c in cases["only_none"])
    assert all(c.upstream in ("one", "per_row") for c in cases["only_none"])
    assert len(cases["only_none"]) == len(set(cases["only_none"]))
    ladder = [gc.case for gc in linear_ce_cases(spec) if gc.group.startswith("ladder") and gc.mode == "float32"]
    assert {(c.N, c.H, c.V) for c in ladder} <= {(c.N, c.H, c.V) for c in cases["only_none"]}
    assert any(c.ignored == 0.25 and c.bias and c.reduction == "mean" for c in cases["only_mean"])  # the sum case
    # "every" declares all three: each of its cases is a grid case or one of its declared cases, as drawn.
    grid = {gc.case for gc in linear_ce_cases(spec) + declared_cases(spec, impl("every"))}
    assert set(cases["every"]) <= grid and any(c.reduction == "sum" for c in cases["every"])
