"""``numcheck premerge``: the checklist for an outside impl named with ``--impl mymod:impl`` — every check ✅ and
exit 0 for a correct impl, ❌ with the reproduce command and exit 1 for a wrong one.

Each end-to-end run calls the console entry (``numcheck.reports.cli.main``) in this process, whose suite run is
its pytest subprocess (a PYTHONPATH-only outside module), on the smoke grid with 1 hypothesis example per property
(``NUMCHECK_CI_EXAMPLES``): about 15 s each on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from numcheck.reports.premerge import command as premerge

GOOD = '''
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import linear_ce_impl

@linear_ce_impl(name="mymod_fp32_ce", dtypes=("float32", "bfloat16"), autocast=(), options=("bias", "ignore_index"),
                logits_dtype="float32", all_ignored="nan")
def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """Upcast to fp32, then F.linear and F.cross_entropy: logits are kept in fp32, as declared."""
    logits = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)
'''

# Wrong: drops the bias from the logits although it declares bias support.
BAD = GOOD.replace("None if bias is None else bias.float()", "None").replace("mymod_fp32_ce", "mymod_no_bias")


@pytest.fixture
def premerge_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]):
    """``numcheck premerge --impl MODULE:impl --grid smoke *extra`` on ``source`` written to ``tmp_path/MODULE.py``
    (found through ``PYTHONPATH`` alone), the console entry called in this process (its suite run is the pytest
    subprocess it starts): its exit status and what it and its subprocesses wrote."""
    from numcheck.reports import cli

    def run(module: str, source: str, *extra: str) -> subprocess.CompletedProcess:
        (tmp_path / f"{module}.py").write_text(source)
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
        monkeypatch.setenv("NUMCHECK_CI_EXAMPLES", "1")
        monkeypatch.delenv("NUMCHECK_IMPLS", raising=False)
        monkeypatch.delitem(sys.modules, module, raising=False)
        capfd.readouterr()
        code = cli.main(["premerge", "--impl", f"{module}:impl", "--grid", "smoke", *extra])
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["numcheck", "premerge"], code, out, err)

    return run


def test_outside_impl_gets_a_passing_checklist(premerge_run):
    """A correct outside impl named by --impl mymod:impl gets every check ✅, the environment, and exit 0."""
    proc = premerge_run("mymod", GOOD)
    out = proc.stdout
    assert proc.returncode == 0, f"premerge exited {proc.returncode}\n{out}\n{proc.stderr[-2000:]}"
    assert "## numcheck pre-merge checklist" in out and "`mymod:impl`" in out
    for title in (
        "impls load",
        "capability probes",
        "property suite (ci profile)",
        "report",
        "vs committed baseline",
        "memory",
    ):
        assert f"✅ **{title}**" in out, f"check {title!r} not ✅:\n{out}"
    assert "Hardware:" in out and "torch " in out and "Python " in out
    assert "❌" not in out


def test_wrong_outside_impl_fails_with_repro_commands(premerge_run):
    """An outside impl that ignores its declared bias gets ❌ for the property suite and the report, the repro
    command of each failure, and exit 1."""
    proc = premerge_run("mybad", BAD)
    out = proc.stdout
    assert proc.returncode == 1, f"premerge exited {proc.returncode}\n{out}\n{proc.stderr[-2000:]}"
    assert "❌ **property suite (ci profile)**" in out, out
    assert "❌ **report**" in out, out
    assert "numcheck repro --impl mybad:impl --property" in out, out


def test_junit_parsing_counts_and_extracts_repro(tmp_path):
    """Failures in pytest's JUnit XML are counted and their 'reproduce:' line is carried to the checklist."""
    xml = tmp_path / "j.xml"
    xml.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.test_properties" name="test_accuracy[x]">'
        "<failure message=\"PropertyFailure: property 'accuracy' fails for impl 'x'\">"
        "property fails\n  reproduce: numcheck repro --impl x --property accuracy --problem 'Problem(N=1, H=1, V=1)'\n"
        "</failure></testcase>"
        '<testcase classname="t" name="ok"/><testcase classname="t" name="s"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    counts, details = premerge._junit_failures(xml)
    assert counts == {"passed": 1, "failed": 1, "errors": 0, "skipped": 1}
    assert len(details) == 1 and "reproduce: `numcheck repro --impl x --property accuracy" in details[0]


def test_checklist_marks_failures_and_regressions():
    """A report with a failing case is ❌ with its repro; a baseline regression is ❌; no baseline is ✅ and says so."""
    case = {
        "impl": "m",
        "kind": "linear-ce",
        "case": "P",
        "label": "L",
        "group": "g",
        "mode": "float32",
        "status": "fail",
        "verdicts": {"analytic": False},
        "ratio_hard": 2.0,
        "ratio_expected": 3.0,
        "failures": ["grad_x beyond"],
        "repro": "numcheck repro --impl m",
        "outputs": {"grad_x": {"ratio_hard": 2.0, "ratio_expected": 3.0, "verdicts": {"analytic": False}}},
    }
    rep = {
        "grid": {"seconds": 1.0},
        "impls": [{"name": "m", "kind": "linear-ce", "status": "ran", "reason": "", "declaration": {}}],
        "cases": [case],
    }
    c = premerge.check_report(rep, "smoke")
    assert not c.ok and "0/1" in c.figure and any("numcheck repro --impl m" in d for d in c.details)
    assert premerge.check_baseline(rep, None, 2.0, 0.25).ok
    assert "❌" in premerge.render({"device_name": "cpu", "device": "cpu", "torch": "t", "python": "p"}, [], [c])


def test_baseline_check_flags_regressions_and_ignores_unselected_impls(tmp_path):
    """Against a baseline, a verdict flip is ❌; with --impl, impls not selected are not compared (no notes)."""
    from numcheck.reports.report import schema as report_schema

    def case(status, ratio):
        return {
            "impl": "m",
            "kind": "linear-ce",
            "case": "P",
            "label": "L",
            "group": "g",
            "mode": "float32",
            "status": status,
            "verdicts": {"analytic": status == "pass"},
            "ratio_hard": ratio,
            "outputs": {"grad_x": {"ratio_hard": ratio, "verdicts": {"analytic": status == "pass"}}},
        }

    impls = [
        {"name": "m", "kind": "linear-ce", "status": "ran", "reason": ""},
        {"name": "other", "kind": "linear-ce", "status": "ran", "reason": ""},
    ]
    base = {"schema": report_schema.SCHEMA, "environment": {}, "impls": impls, "cases": [case("pass", 0.1)]}
    p = tmp_path / "base.json"
    p.write_text(report_schema.dumps(base))
    same = {"grid": {"seconds": 0}, "impls": impls[:1], "cases": [case("pass", 0.1)]}
    restricted = premerge.check_baseline(same, p, 2.0, 0.25, restricted=True)
    assert restricted.ok and "0 note(s)" in restricted.figure
    assert "1 note(s)" in premerge.check_baseline(same, p, 2.0, 0.25).figure
    flipped = dict(same, cases=[case("fail", 1.5)])
    c = premerge.check_baseline(flipped, p, 2.0, 0.25, restricted=True)
    assert not c.ok and "1 regression" in c.figure and any("pass → fail" in d for d in c.details)


KNOWN_DIVERGENCE = {
    "impl": "te_parallel_ce[mean]",
    "library": "transformer-engine",
    "release": "2.7.0",
    "summary": "reduce_loss=True divides by all rows, ignored ones included",
    "artifact": False,
    "cases_left_out": 3,
}
ENV = {"device_name": "cpu", "device": "cpu", "torch": "t", "python": "p"}


def test_known_divergences_are_a_checklist_finding_and_fail_under_strict():
    """A known divergence that applied is ⚠️, named (library, release, what is wrong, cases left out) in its line
    and in the result line, and does not fail the checklist; --strict makes it ❌. An environment artifact alone is
    "not judged here" and never fails."""
    rep = {"impls": [], "cases": [], "known_divergences": [KNOWN_DIVERGENCE]}
    item = premerge.check_known(rep)
    assert item.ok and "⚠️" in item.line() and "[ ]" in item.line(), item.line()
    text = premerge.render(ENV, [], [item])
    named = "te_parallel_ce[mean]: transformer-engine 2.7.0 — reduce_loss=True divides by all rows"
    assert named in text.split("\n- ")[0] and named in item.details[0], text
    assert not premerge.check_known(rep, strict=True).ok
    artifact = {"impls": [], "cases": [], "known_divergences": [{**KNOWN_DIVERGENCE, "artifact": True}]}
    only = premerge.check_known(artifact, strict=True)
    assert only.ok and "✅" in only.line() and "not judged here" in only.details[0], only
    assert premerge.check_known({"impls": [], "cases": []}, strict=True).line().startswith("- [x] ✅")


def test_strict_with_base_is_bad_input(capsys):
    """--strict has no meaning in the A/B mode: exit 2 with a fix-it message before anything runs."""
    from numcheck.reports import cli

    assert cli.main(["premerge", "--impl", "eager", "--base", "eager", "--strict"]) == 2
    assert "drop --strict" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_suite_draws_on_the_premerge_device(monkeypatch, device):
    """``numcheck premerge --device D`` runs its property suite with NUMCHECK_DEVICE=D, so the suite judges the impls
    where the report does (an H100 run of ``--device cuda`` drew every suite case on the CPU, where a CUDA-only
    declaration has no entry), and says so in its figure."""
    seen = {}

    def fake_stream(cmd, env):
        seen.update(env)
        junit = next(a.split("=", 1)[1] for a in cmd if a.startswith("--junitxml="))
        Path(junit).write_text('<testsuites><testsuite><testcase classname="t" name="ok"/></testsuite></testsuites>')
        return 0, []

    monkeypatch.setenv("NUMCHECK_DEVICE", "elsewhere")
    monkeypatch.setattr(premerge, "stream", fake_stream)
    item = premerge.check_property_suite(["mymod:impl"], 1, device)
    assert seen["NUMCHECK_DEVICE"] == device and item.ok, (seen.get("NUMCHECK_DEVICE"), item)
    assert item.figure.endswith(f"problems drawn on {device}"), item.figure
