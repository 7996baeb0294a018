"""``numcheck report`` and premerge as strict as the suite on what an impl declares: each declared option and
reduction run alone and combined (linear+CE and distributed), uneven vocabulary shards where declared, every case
not run named with its reason, the declared behaviours a grid did not reach named (and premerge's report line citing
them when the suite failed where the report passed); a report written whatever its data (NaN everywhere, a
distributed-only impl); the headline when only built-ins were judged; relative errors where the oracle is 0; a bad
``--impl`` value; many chunks of a chunked impl as it declares them, as the suite's ``test_many_chunks`` draws them.

The impls are written as a user writes them (:mod:`numcheck.tests.self.helpers.report_strict_impls`,
:mod:`numcheck.tests.self.helpers.user_chunked`).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from numcheck.impls.registry import discover
from numcheck.properties.linear_ce import chunks
from numcheck.reports import cli
from numcheck.reports.premerge import command as premerge
from numcheck.reports.report import md as report_md
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report.command import build_report, write_report
from numcheck.reports.report.families.dist_linear_ce import dist_cases
from numcheck.reports.report.families.linear_ce import declared_cases, many_chunk_cases, option_groups
from numcheck.reports.report.grid import DIST_UNEVEN_V, QUICK, SMOKE
from numcheck.reports.report.run import plan
from numcheck.tests.self.helpers import report_strict_impls as helpers
from numcheck.tests.self.helpers import user_chunked

MOD = "numcheck.tests.self.helpers.report_strict_impls"
SMOOTH, SMOOTH_BAD = f"{MOD}:smoothing_ce", f"{MOD}:smoothing_ce_ignored_grad"
VP, VP_BAD = f"{MOD}:vp_ce", f"{MOD}:vp_ce_rank_start"
CHUNKED = "numcheck.tests.self.helpers.user_chunked"


def _report(grid, specs):
    return build_report(grid, specs, "cpu", progress=False, memory=False, accumulation=False)


def _by_impl(report: dict, name: str) -> list[dict]:
    return [c for c in report["cases"] if c["impl"] == name]


@pytest.fixture(scope="module")
def smoothing_report() -> dict:
    """The quick grid over the smoothing impl without class weights and its twin leaking a smoothing gradient."""
    return _report(QUICK, [SMOOTH, SMOOTH_BAD])


@pytest.fixture(scope="module")
def vp_report() -> dict:
    """The quick grid over the vocabulary-parallel impl and its twin starting its shard at rank·V_r."""
    return _report(QUICK, [VP, VP_BAD])


@pytest.fixture(scope="module")
def chunked_report() -> dict:
    """The quick grid over a chunked impl declared with the decorator (chunk_rows=64, no with_chunk_rows) whose
    grad_weight running sum across chunks is kept in bf16, and its twin keeping it in fp32."""
    return _report(QUICK, [f"{CHUNKED}:bf16_sum_c64", f"{CHUNKED}:fp32_sum_c64"])


@pytest.fixture(scope="module")
def smoke_eager() -> dict:
    """The smoke grid over the built-in eager impl alone."""
    return _report(SMOKE, ["eager"])


# -- linear+CE: each declared option alone and combined --------------------------------------------------------
def test_quick_report_fails_a_smoothing_gradient_on_ignored_rows(smoothing_report):
    """An impl declaring smoothing but not class weights, whose only defect is a smoothing gradient on ignored rows,
    fails the quick report (on the declared cases combining smoothing with ignored rows), and premerge's report line;
    its correct twin passes every case."""
    bad = _by_impl(smoothing_report, helpers.smoothing_ce_ignored_grad.name)
    good = _by_impl(smoothing_report, helpers.smoothing_ce.name)
    failing = [c for c in bad if c["status"] != "pass"]
    assert failing and all(
        c["group"].startswith("declared:") and "label_smoothing" in c["label"] and "ignore_index" in c["label"]
        for c in failing
    ), [c["label"] for c in failing]
    assert good and all(c["status"] == "pass" for c in good), [c["label"] for c in good if c["status"] != "pass"]
    assert not premerge.check_report(smoothing_report, "quick").ok


def test_every_declared_option_and_reduction_runs_alone_and_combined(smoothing_report):
    """The quick grid runs each declared option on its own and all of them together at every declared reduction,
    each reduction on its own and an all-ignored batch, in a mode the impl declares (it declares no autocast)."""
    groups = {c["group"] for c in _by_impl(smoothing_report, helpers.smoothing_ce.name)}
    want = {
        "declared:bias",
        "declared:ignore_index",
        "declared:label_smoothing",
        "declared:reduction=sum",
        "declared:reduction=none",
        "declared:all_ignored",
    }
    want |= {f"declared:bias+ignore_index+label_smoothing+{r}" for r in ("mean", "sum", "none")}
    assert want <= groups, want - groups
    info = next(i for i in smoothing_report["impls"] if i["name"] == helpers.smoothing_ce.name)
    assert info["unreached"] == [], info["unreached"]


def test_options_a_declaration_excludes_together_are_combined_apart():
    """With softcap and z-loss excluded together, the combined cases split them, every option in one of them."""
    support = dataclasses.replace(
        helpers.smoothing_ce.support,
        options=frozenset({"softcap", "z_loss", "bias"}),
        option_combinations_excluded=frozenset({frozenset({"softcap", "z_loss"})}),
    )
    groups = option_groups(support)
    assert sorted(groups) == [("bias", "softcap"), ("bias", "z_loss")], groups
    labels = {gc.group for gc in declared_cases(QUICK, SimpleNamespace(name="excludes", support=support))}
    assert {"declared:bias+softcap+mean", "declared:bias+z_loss+mean", "declared:softcap"} <= labels, labels


def test_linear_ce_grid_leaves_known_divergences_out_and_names_them():
    """As the suite does, the grid runs no case a recorded known divergence of the impl covers (PyTorch's chunked
    linear_cross_entropy: bf16 from N = 32, all-ignored mean): each is named as not run with that reason, and the
    declared cases move to a declared mode the divergence leaves alone."""
    from numcheck.properties.linear_ce.known import known

    name = "torch_native[chunked,acc=auto]"
    entries = discover([name])
    if entries[0].impl.support.unavailable_reason():
        pytest.skip(entries[0].impl.support.unavailable_reason())
    infos, work = plan(entries, QUICK, "cpu")
    assert work and not [gc.group for _, gc in work if known(name, "accuracy", gc.case)]
    named = {c["group"] for c in infos[0]["not_run"] if c["reason"].startswith("known divergence: ")}
    assert {"declared:all_ignored", "ladder:base"} <= named, named
    declared = {gc.group for _, gc in work if gc.group.startswith("declared:")}
    assert {"declared:bias", "declared:class_weights", "declared:bias+ignore_index+class_weights+none"} <= declared


def test_each_case_not_run_is_named_with_its_reason(smoothing_report):
    """Every grid case the declaration excludes is named in report.json (group, mode, case, reason), counted per
    reason as before, and named in report.md's coverage section."""
    info = next(i for i in smoothing_report["impls"] if i["name"] == helpers.smoothing_ce.name)
    named = info["not_run"]
    assert named and sum(info["not_declared"].values()) == len(named)
    assert all(set(c) == {"group", "mode", "case", "reason"} for c in named)
    assert any(c["group"] == "ladder:N" and c["mode"] == "amp-bfloat16" and "autocast" in c["reason"] for c in named)
    text = report_md.render(smoothing_report)
    assert "`ladder:N` (amp-bfloat16, `N4H40V40-float32+amp-bfloat16-mean-plain-ordinary-s1004`)" in text


def test_a_declared_behaviour_the_grid_does_not_reach_is_named():
    """A declared autocast dtype no case of the quick grid's accuracy cases runs under for the impl (AMP float16: the
    quick grid's ladders and option cases are AMP bf16, its declared cases then run in bfloat16, no random case is AMP
    fp16) is listed as unreached (the property cases, left out here, run earlier_calls and the dtype properties under
    a declared AMP dtype and so reach it)."""
    amp16 = dataclasses.replace(
        helpers.smoothing_ce,
        support=dataclasses.replace(helpers.smoothing_ce.support, autocast=frozenset({torch.float16})),
    )
    entry = next(e for e in discover([SMOOTH]))
    infos, _ = plan([dataclasses.replace(entry, impl=amp16)], dataclasses.replace(QUICK, properties=False), "cpu")
    assert infos[0]["unreached"] == ["autocast float16"], infos[0]["unreached"]
    infos, _ = plan([dataclasses.replace(entry, impl=amp16)], QUICK, "cpu")
    assert infos[0]["unreached"] == [], infos[0]["unreached"]


def test_premerge_report_line_names_what_the_grid_missed_when_the_suite_failed(smoothing_report, smoke_eager):
    """When the suite failed and the report passed, premerge's report line says which declared behaviours the grid
    did not reach (here the smoke grid's), or that it reached them all; without a suite failure it adds nothing."""
    smoke = smoke_eager
    line = premerge.check_report(smoke, "smoke", suite_failed=True)
    assert line.ok and "did not reach" in line.figure and "option label_smoothing" in line.figure, line.figure
    assert "did not reach" not in premerge.check_report(smoke, "smoke").figure
    good = dict(
        smoothing_report,
        impls=[i for i in smoothing_report["impls"] if i["name"] == helpers.smoothing_ce.name],
        cases=_by_impl(smoothing_report, helpers.smoothing_ce.name),
    )
    line = premerge.check_report(good, "quick", suite_failed=True)
    assert line.ok and "reached every behaviour" in line.figure, line.figure


# -- linear+CE: many chunks, as declared --------------------------------------------------------------------
def test_quick_report_fails_a_bf16_running_sum_over_many_declared_chunks(chunked_report):
    """A decorator-declared chunked impl (chunk_rows=64) keeping its grad_weight running sum in bf16 fails the quick
    report on its many-chunk cases, 513 chunks of the declared 64 rows in bf16 (named in the record and in premerge's
    report line), and premerge's report line; its fp32-sum twin passes every case, each many-chunk case included."""
    bad = _by_impl(chunked_report, user_chunked.bf16_sum_c64.name)
    failing = [c for c in bad if c["status"] != "pass"]
    assert failing and all(c["group"] == "many_chunks" and c["mode"] == "bfloat16" for c in failing), failing
    assert all(not c["outputs"]["grad_weight"]["verdicts"]["analytic"] for c in failing), failing
    assert {c["chunks"] for c in failing} == {"32769 rows in 513 chunks of 64 (the declared chunk_rows)"}, failing
    line = premerge.check_report(chunked_report, "quick")
    assert not line.ok and any("513 chunks of 64" in d for d in line.details), line.details
    good = _by_impl(chunked_report, user_chunked.fp32_sum_c64.name)
    assert good and all(c["status"] == "pass" for c in good), [c["label"] for c in good if c["status"] != "pass"]
    ran = {(c["mode"], c["label"].split("-")[2]) for c in good if c["group"] == "many_chunks"}
    assert ran == {(d, r) for d in ("bfloat16", "float16") for r in ("mean", "sum", "none")}, ran


def test_many_chunk_cases_the_declaration_excludes_are_named(chunked_report):
    """The bf16-sum impl declares no float16: its float16 many-chunk cases are named as not run, with the reason."""
    info = next(i for i in chunked_report["impls"] if i["name"] == user_chunked.bf16_sum_c64.name)
    named = [c for c in info["not_run"] if c["group"] == "many_chunks"]
    assert {c["mode"] for c in named} == {"float16"} and len(named) == 3, named
    assert all("float16 not declared" in c["reason"] for c in named), named


def test_many_chunk_cases_follow_the_suites_layout():
    """The many-chunk cases take the suite's chunk counts from the declaration alone: 2/u + 1 chunks of a declared
    chunk size or rule in each dtype (at most MANY_CHUNK_MAX_ROWS rows), past UNDECLARED_CHUNK_ROWS rows where no
    chunk size is declared; a slow impl runs MANY_CHUNKS chunks in its coarsest dtype and first reduction only, the
    others named with the reason."""
    impls = {
        "rows": user_chunked.fp32_sum_c64,
        "rule": user_chunked.fp32_sum_rule,
        "undeclared": next(e.impl for e in discover(["eager"])),
    }
    for how, impl in impls.items():
        cases, not_run = many_chunk_cases(QUICK, impl)
        assert len(cases) == 6 and not not_run, (how, not_run.named)
        for run_as, gc in cases:
            p = gc.case
            assert run_as is impl and p.regime == "post_norm" and p.upstream != "per_row", (how, p)
            if how == "undeclared":
                assert p.N > chunks.UNDECLARED_CHUNK_ROWS, p
                continue
            k = chunks.chunk_count(impl.support, p.N, p.H, p.V)
            assert f"in {k} chunks of" in gc.chunks, gc.chunks
            if how == "rows":
                assert k == chunks.many_chunks(p.dtype, 64) >= chunks.MANY_CHUNKS, (p, k)
            else:  # the suite's cheapest shape giving the most chunks the rule gives up to many_chunks(dtype)
                want = chunks.rule_shapes(
                    user_chunked.about_v_over_h_chunks,
                    chunks.many_chunks(p.dtype),
                    chunks.MANY_CHUNK_MIN_H,
                    chunks.MANY_CHUNK_MIN_V,
                )[0]
                assert (p.N, p.H, p.V) == want and k >= chunks.MANY_CHUNKS, (p, want, k)
    slow = dataclasses.replace(impls["rows"], support=dataclasses.replace(impls["rows"].support, slow=True))
    cases, not_run = many_chunk_cases(QUICK, slow)
    assert [(gc.mode, gc.case.reduction) for _, gc in cases] == [("bfloat16", "mean")]
    assert chunks.chunk_count(slow.support, cases[0][1].case.N, 2, 4) == chunks.MANY_CHUNKS
    assert len(not_run.named) == 5 and all("declared slow" in c["reason"] for c in not_run.named), not_run.named


# -- distributed: uneven shards, each declared option and reduction -------------------------------------------
def test_quick_report_fails_a_vocab_start_of_rank_times_shard_size(vp_report):
    """A vocabulary-parallel impl taking its first class to be rank·V_r (right only for even shards) fails the quick
    report on the uneven-shard cases at P = 2 and 4; its correct twin passes every case."""
    rep = vp_report
    bad = _by_impl(rep, helpers.vp_ce_rank_start.name)
    failing = {(c["group"], c["world_size"]) for c in bad if c["status"] != "pass"}
    assert failing and {P for _, P in failing} == {2, 4} and all(g.startswith("dist:uneven:") for g, _ in failing)
    good = _by_impl(rep, helpers.vp_ce.name)
    assert good and all(c["status"] == "pass" for c in good), [c["label"] for c in good if c["status"] != "pass"]


def test_dist_grid_runs_declared_options_and_uneven_shards_or_names_why_not():
    """The distributed grid runs each declared option and reduction alone and combined, uneven shards at every world
    size above 1 where declared; an impl not declaring uneven shards gets them named as not run, with the reason."""
    cases, _ = dist_cases(QUICK, helpers.vp_ce)
    groups = {gc.group for gc in cases}
    assert {
        "dist:declared:bias",
        "dist:declared:ignore_index",
        "dist:declared:reduction=sum",
        "dist:declared:reduction=none",
        "dist:declared:bias+ignore_index+none",
    } <= groups, groups
    uneven = {gc.case.world_size for gc in cases if gc.case.problem.V % gc.case.world_size}
    assert uneven == {2, 4}
    even_only = dataclasses.replace(helpers.vp_ce, dist=dataclasses.replace(helpers.vp_ce.dist, uneven_vocab=False))
    cases, not_run = dist_cases(QUICK, even_only)
    assert all(gc.case.problem.V % gc.case.world_size == 0 for gc in cases)
    named = [c for c in not_run.named if "uneven_vocab=False" in c["reason"]]
    assert {c["mode"].split()[0] for c in named} == {"P=2", "P=4"} and f"V{DIST_UNEVEN_V}" in named[0]["case"]


# -- a report whatever its data -----------------------------------------------------------------------------------
def test_report_of_an_all_nan_impl_is_written_with_notes_for_its_plots(tmp_path, capsys):
    """An impl whose outputs are all NaN: the report (JSON, Markdown) is written, the plots that cannot be drawn are
    replaced by a note saying why, and the command exits 1 with its verdict, no traceback."""
    out = tmp_path / "r"
    rc = cli.main(["report", "--grid", "smoke", "--no-progress", "--impl", f"{MOD}:all_nan_ce", "--out", str(out)])
    err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in err.err + err.out
    assert err.out.strip().splitlines()[-1].startswith("numcheck report: FAIL (exit 1)")
    assert report_schema.load(out / "report.json")["cases"]
    text = (out / "report.md").read_text()
    assert "error_vs_length.png is not drawn: " in text and "NaN" in text


def test_distributed_only_report_has_its_plots(vp_report, tmp_path):
    """A report of distributed impls alone is written with its distribution plot (no crash on an empty facet)."""
    drawn = write_report(vp_report, tmp_path / "r", plots=True)
    assert "ratio_distribution.png" in drawn and (tmp_path / "r" / "ratio_distribution.png").exists()


# -- headline, relative errors, bad --impl ----------------------------------------------------------------------
def test_headline_says_when_only_builtins_were_judged(smoothing_report, smoke_eager):
    """report.md's headline says no impl of the user's was judged when only built-ins ran, and not otherwise."""
    assert "No impl of yours was judged" in report_md.render(smoke_eager).split("| environment |")[0]
    assert "No impl of yours was judged" not in report_md.render(smoothing_report)


def test_relative_error_where_the_oracle_is_zero_is_shown_as_absolute():
    """Where the oracle is 0 the error is given as absolute, never as a relative error of 1e300."""
    from numcheck.properties.core.compare import compare

    oracle = torch.tensor([0.0, 1.0], dtype=torch.float64)
    c = compare("grad_x", torch.tensor([1e-3, 1.0001]), oracle, torch.full((2,), 1e-6, dtype=torch.float64))
    assert c.max_rel == pytest.approx(1e-4, rel=1e-2) and c.max_abs_zero == pytest.approx(1e-3)
    text = c.describe()
    assert "where the oracle is 0 max abs error 0.001" in text and "e+30" not in text, text


@pytest.mark.parametrize("spec", ["", "  ", "eagr", "mod:", "a b:c"])
def test_bad_impl_value_exits_2_with_one_message(spec, tmp_path, capsys):
    """An --impl value that names no impl is bad input: exit 2 as the arguments are read (every command's --impl is
    checked alike: tests/self/reports/test_impl_args.py), one line naming it, nothing run."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", "--grid", "smoke", "--no-progress", "--impl", spec, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument --impl: {spec!r}" in err and "Traceback" not in err
    assert err.count("error:") == 1, err
    assert not (tmp_path / "r").exists()
