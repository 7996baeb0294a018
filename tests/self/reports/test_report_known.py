"""Known divergences are findings (issue 44 item 3): report.json's ``known_divergences``, the verdict computed from
the judgements alone, report.md's headline, the last line and ``--strict``; an environment artifact is "not judged
here" and never trips ``--strict``.

The release is faked (``transformer_engine.release``), and the impls named as TransformerEngine's adapters are
correct outside impls (F.cross_entropy), so no TransformerEngine install is needed: what is judged is how the
report names the recorded divergences of the release it sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from numcheck.impls.adapters import transformer_engine
from numcheck.reports import cli
from numcheck.reports.report import md as report_md
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report.verdict import verdict

SMOKE = ["--grid", "smoke", "--no-progress", "--no-plots"]

FAKE_TE = """
import torch
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport

def ce(x, w, t, b=None, *, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    return F.cross_entropy(F.linear(x, w, b), t, reduction=reduction, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)

def _support(reduction, dtypes):
    return LinearCESupport(dtypes=frozenset(dtypes), options=frozenset({"bias", "ignore_index"}),
                           reductions=frozenset({reduction}), autocast=frozenset())

mean = FunctionImpl(name="te_parallel_ce[mean]", fn=ce, support=_support("mean", {torch.float32, torch.bfloat16}))
none = FunctionImpl(name="te_parallel_ce[none]", fn=ce, support=_support("none", {torch.float32}))
"""


@pytest.fixture
def fake_te(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``fake_te:mean`` / ``fake_te:none`` importable, and a function setting the TransformerEngine release the
    known divergences see (and whether Triton's interpreter gets a bf16 constant wrong here)."""
    (tmp_path / "fake_te.py").write_text(FAKE_TE)
    monkeypatch.syspath_prepend(str(tmp_path))

    def release(version: str, interpreter_wrong: bool = False) -> None:
        monkeypatch.setattr(transformer_engine, "release", lambda: version)
        monkeypatch.setattr(
            transformer_engine, "interpreter_bf16_constant", lambda: 6.4e37 if interpreter_wrong else None
        )

    return release


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def _run(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    status = cli.main(["report", *SMOKE, *args])
    return status, capsys.readouterr().out


def test_release_with_divergences_names_them_and_strict_exits_1(fake_te, tmp_path, capsys):
    """With TE 2.7.0 the last line, report.md's headline and report.json name the 2.7.0 divergences of both impls
    (library, release, what is wrong, the cases left out) apart from the passes, exit 0; --strict exits 1."""
    fake_te("2.7.0")
    out = tmp_path / "r"
    status, text = _run(["--impl", "fake_te:mean", "--impl", "fake_te:none", "--out", str(out)], capsys)
    last = _last_line(text)
    assert status == 0 and last.startswith("numcheck report: PASS with known divergences (exit 0"), last
    for needle in (
        "te_parallel_ce[mean]: transformer-engine 2.7.0 — reduce_loss=True divides the loss and its gradient by all rows",
        "te_parallel_ce[none]: transformer-engine 2.7.0 — reduce_loss=False scales every row's gradient by the first",
    ):
        assert needle in last, last
    report = report_schema.load(out / "report.json")
    ignored = [d for d in report["known_divergences"] if "ignored ones included" in d["summary"]]
    assert ignored and ignored[0]["cases_left_out"] >= 1 and ignored[0]["cases"], report["known_divergences"]
    assert {d["artifact"] for d in report["known_divergences"]} == {False}
    head = (out / "report.md").read_text().split("| environment |")[0]
    assert "Known divergences that apply here — findings, not passes" in head and "transformer-engine 2.7.0" in head
    status, text = _run(
        ["--impl", "fake_te:mean", "--impl", "fake_te:none", "--out", str(out), "--force", "--strict"], capsys
    )
    assert status == 1 and _last_line(text).startswith("numcheck report: FAIL (exit 1, --strict)"), _last_line(text)


def test_fixed_release_names_none(fake_te, tmp_path, capsys):
    """With TE 2.20.2 no known divergence applies: a plain PASS, and --strict exits 0."""
    fake_te("2.20.2")
    status, text = _run(
        ["--impl", "fake_te:mean", "--impl", "fake_te:none", "--out", str(tmp_path / "r"), "--strict"], capsys
    )
    last = _last_line(text)
    assert status == 0 and last.startswith("numcheck report: PASS (exit 0)") and "known divergence" not in last, last
    assert json.loads((tmp_path / "r" / "report.json").read_text())["known_divergences"] == []


def test_environment_artifact_is_not_judged_here_and_does_not_trip_strict(fake_te, tmp_path, capsys):
    """Where Triton's interpreter gets a bf16 constant wrong, TE 2.17's reduce_loss=False bf16 cases are "not judged
    here" (an environment artifact, with the cases left out), never the library's divergence: --strict exits 0."""
    fake_te("2.17.1", interpreter_wrong=True)
    status, text = _run(["--impl", "fake_te:none", "--out", str(tmp_path / "r"), "--strict"], capsys)
    last = _last_line(text)
    assert status == 0 and "not judged here (environment artifact" in last, last
    assert "known divergence(s) apply" not in last, last
    (artifact,) = json.loads((tmp_path / "r" / "report.json").read_text())["known_divergences"]
    assert artifact["artifact"] is True and artifact["cases_left_out"] >= 1, artifact


def test_third_party_adapter_is_named_with_its_release():
    """ "No impl of yours was judged" never describes a third-party adapter: the library and release judged are
    named; numcheck's own built-ins keep the sentence."""
    report = {
        "grid": {"impl_specs": ["te_parallel_ce[mean]", "eager"]},
        "impls": [
            {
                "name": "te_parallel_ce[mean]",
                "origin": "built-in",
                "library": {"name": "transformer-engine", "release": "2.7.0"},
            },
            {"name": "eager", "origin": "built-in"},
        ],
    }
    note = report_md.builtins_only_note(report)
    assert "Judged: transformer-engine 2.7.0" in note and "`te_parallel_ce[mean]`" in note, note
    assert "No impl of yours was judged" in note and note.index("No impl") > note.index("Judged:"), note
    only_te = {**report, "impls": report["impls"][:1]}
    assert "No impl of yours" not in report_md.builtins_only_note(only_te)


def _judged(statuses: list[str], known: list[dict] | None = None) -> dict:
    cases = [{"impl": "m", "status": s, "property": p} for s, p in zip(statuses, ("accuracy", "determinism", "held"))]
    return {"impls": [{"name": "m", "status": "ran"}], "cases": cases, "known_divergences": known or []}


KNOWN = {
    "impl": "m",
    "library": "lib",
    "release": "1.0",
    "summary": "what is wrong",
    "artifact": False,
    "cases_left_out": 2,
}


def test_verdict_reads_the_judgements():
    """The verdict reads cases, impls and known_divergences: a fail or error of any property fails; a known
    divergence is named and exits 0, 1 under strict; an artifact alone never fails."""
    assert verdict(_judged(["pass", "fail"]))[0] == 1  # a non-accuracy property's failure
    assert verdict(_judged(["pass", "pass", "error"]))[0] == 1
    status, line = verdict(_judged(["pass"], [KNOWN]))
    assert status == 0 and "m: lib 1.0 — what is wrong (2 case(s) of this grid left out)" in line, line
    assert verdict(_judged(["pass"], [KNOWN]), strict=True)[0] == 1
    twice = [KNOWN, {**KNOWN, "impl": "m2", "cases_left_out": 1}]
    line = verdict(_judged(["pass"], twice))[1]
    assert line.count("what is wrong") == 1 and "m, m2: lib 1.0 — what is wrong (3 case(s)" in line, line
    artifact = {**KNOWN, "artifact": True}
    status, line = verdict(_judged(["pass"], [artifact]), strict=True)
    assert status == 0 and "not judged here" in line and "known divergence(s) apply" not in line, line


def test_verdict_does_not_import_the_markdown():
    """The verdict module is computed from the judgements: importing it and judging does not load report.md's."""
    code = (
        "import sys\nfrom numcheck.reports.report.command import verdict\n"
        "verdict({'impls': [], 'cases': []})\n"
        "assert 'numcheck.reports.report.md' not in sys.modules, 'md imported'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]


def test_known_divergences_section_is_validated(tmp_path):
    """report.json's known_divergences is optional (a report made before it loads) and, when present, each record
    names impl, library, release, summary, artifact and cases left out."""
    base = {"schema": report_schema.SCHEMA, "environment": {}, "impls": [], "cases": []}
    (tmp_path / "old.json").write_text(json.dumps(base))
    assert report_schema.load(tmp_path / "old.json")["impls"] == []
    (tmp_path / "bad.json").write_text(json.dumps({**base, "known_divergences": [{"impl": "m"}]}))
    with pytest.raises(ValueError, match=r"known_divergences\[0\] lacks the key\(s\) 'library'"):
        report_schema.load(tmp_path / "bad.json")


def test_strict_where_nothing_is_judged_is_bad_input(tmp_path, capsys):
    """--strict with --render (judges nothing) exits 2 with a fix-it message before anything runs."""
    status = cli.main(["report", "--render", str(tmp_path / "x.json"), "--strict"])
    err = capsys.readouterr().err
    assert status == 2 and "--strict" in err and "drop --strict" in err, err


def test_unknown_release_is_named_in_the_report_header(tmp_path, capsys, monkeypatch):
    """A library whose release numcheck cannot tell (two different releases own its module) is named in report.md's
    header with why, so "no known divergence applies" is never read off an unknown release silently (item 4)."""
    from numcheck.impls.adapters import release_notes

    note = "fused_linear_cross_entropy.py is listed by liger-kernel distributions of different releases: 0.8.4, 0.8.5"
    monkeypatch.setattr(release_notes, "release_notes", lambda: {"liger-kernel": note})
    out = tmp_path / "r"
    rc, _ = _run(["--impl", "eager", "--out", str(out)], capsys)
    assert rc == 0
    assert report_schema.load(out / "report.json")["environment"]["release_notes"] == {"liger-kernel": note}
    assert f"| release of liger-kernel | {note} |" in (out / "report.md").read_text()
