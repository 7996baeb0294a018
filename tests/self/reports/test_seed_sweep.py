"""``numcheck sweep``: the suite over several hypothesis seeds, its failures and the tightness table.

End-to-end runs call the console entry (``numcheck.reports.cli.main``) in this process, whose per-seed pytest runs
are its subprocesses (a python start and torch import less than a subprocess of the command itself), on a tiny
selection (one fast impl, ``-k`` on the accuracy tests, 2 examples per test through ``NUMCHECK_CI_EXAMPLES``):
about 15 s per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numcheck.reports import common
from numcheck.reports.sweep import command as seed_sweep

#: The tiny selection: the two tests that call the accuracy property directly.
KEYWORD = "test_accuracy and not sharp or test_strided_inputs"

MUTANT = """
from numcheck.tests.self.helpers.mutants import MUTANTS

impl = next(m for m in MUTANTS if m.name == "mutant_loss_bf16")
"""


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]):
    """``numcheck sweep *extra`` run as the console entry runs it, in this process (its seeds' pytest runs are
    the subprocesses it starts), in ``tmp_path`` with that folder on the path (an outside module there) and
    ``examples`` hypothesis examples per test: its exit status and what it and its subprocesses wrote."""
    from numcheck.reports import cli

    def run(*extra: str, examples: str = "2") -> subprocess.CompletedProcess:
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
        monkeypatch.setenv("NUMCHECK_CI_EXAMPLES", examples)
        monkeypatch.delenv("NUMCHECK_IMPLS", raising=False)
        monkeypatch.delitem(sys.modules, "mutmod", raising=False)
        capfd.readouterr()
        code = cli.main(["sweep", *extra])
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["numcheck", "sweep", *extra], code, out, err)

    return run


def test_sweep_of_a_correct_impl_writes_counts_and_tightness(tmp_path, sweep):
    """Two seeds of eager on the accuracy tests: exit 0, both seeds in sweep.json with their (test, impl) counts,
    0 failures, a tightness row per output × dtype whose quantiles are ordered and below 1, and the same table in
    sweep.md and on stdout."""
    out = tmp_path / "out"
    proc = sweep("--seeds", "0-1", "--impl", "eager", "-k", KEYWORD, "--out", str(out))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    data = json.loads((out / "sweep.json").read_text())
    assert data["schema"] == seed_sweep.SCHEMA and data["failures"] == 0
    assert data["selection"]["profile"] == "numcheck-ci-seeded" and data["selection"]["ci_examples"] == 2
    assert [s["seed"] for s in data["seeds"]] == [0, 1]
    for s in data["seeds"]:
        assert s["counts"]["passed"] == 2 and s["counts"]["failed"] == s["counts"]["error"] == 0, s
        assert s["records"] > 0 and s["seconds"] > 0
    rows = data["tightness"]
    assert rows and {r["output"] for r in rows} >= {"loss", "grad_x", "grad_weight"}
    # judgement (b) beside (a): its ratio is the RMSE over the allowance, so a passing impl stays below 1 too
    assert {r["output"] for r in rows} >= {"loss (b)", "grad_x (b)", "grad_weight (b)"}, sorted(
        {r["output"] for r in rows}
    )
    assert sum(r["count"] for r in rows) == sum(s["records"] for s in data["seeds"])
    for r in rows:
        assert r["nonfinite"] == 0 and 0 <= r["median"] <= r["p90"] <= r["max"] <= 1, r
    assert {r["impl"] for r in data["tightness_per_impl"]} == {"eager"}
    md = (out / "sweep.md").read_text()
    assert "**failures: 0** over 2 seed(s)" in md and "| output | dtype | count | exact | median | p90 |" in md
    assert md in proc.stdout
    assert "seed 0 (1/2)" in proc.stderr and "seed 1 (2/2)" in proc.stderr


def test_sweep_of_a_mutant_counts_its_failures(tmp_path, sweep):
    """A mutant that rounds the loss through bf16 (tests/self/helpers/mutants.py), named as an outside impl, gets
    failures with its test id, message, case and repro command on stdout and in sweep.json, and exit 1; the
    failing judgements are in the tightness table with error/bound above 1."""
    (tmp_path / "mutmod.py").write_text(MUTANT)
    out = tmp_path / "out"
    proc = sweep("--seeds", "3", "--impl", "mutmod:impl", "-k", KEYWORD, "--out", str(out))
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    data = json.loads((out / "sweep.json").read_text())
    fails = data["seeds"][0]["failures"]
    assert data["failures"] == len(fails) > 0
    assert all(f["impl"] == "mutant_loss_bf16" and f["status"] == "failed" for f in fails)
    assert any("loss" in f["detail"] and f["reproduce"].startswith("PYTHONPATH=") for f in fails), fails
    loss = [r for r in data["tightness"] if r["output"] == "loss"]
    assert max(r["max"] for r in loss) > 1
    assert "`test_properties::test_accuracy[mutant_loss_bf16]` (failed)" in proc.stdout


def test_sweep_that_selects_nothing_is_bad_input(tmp_path, sweep):
    """A -k expression no test matches: pytest's exit 5 becomes exit 2 with the selection named, and nothing is
    written."""
    out = tmp_path / "out"
    proc = sweep("--seeds", "0", "--impl", "eager", "-k", "no_such_test_anywhere", "--out", str(out))
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "collected no test (exit 5)" in proc.stderr and "'no_such_test_anywhere'" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "text, seeds", [("0-9", list(range(10))), ("5", [5]), ("0-2,7", [0, 1, 2, 7]), ("3,1,3", [3, 1])]
)
def test_seeds_parse(text, seeds):
    """--seeds takes ranges, lists and both, in the order given, each seed once."""
    assert seed_sweep.parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "3-1", "-2", "1-", "1,,2"])
def test_bad_seeds_are_refused(text):
    """A malformed --seeds is bad input naming the part that is wrong."""
    with pytest.raises(seed_sweep.BadInput, match="--seeds"):
        seed_sweep.parse_seeds(text)


def test_derandomized_or_unknown_profile_is_refused():
    """numcheck-ci (derandomized: every seed the same draws) and an unknown profile are bad input."""
    with pytest.raises(seed_sweep.BadInput, match="derandomized"):
        seed_sweep.profile_name("ci")
    with pytest.raises(seed_sweep.BadInput, match="names no numcheck hypothesis profile"):
        seed_sweep.profile_name("fast")
    assert seed_sweep.profile_name("ci-seeded") == "numcheck-ci-seeded"


def _args(out: Path, **kw) -> argparse.Namespace:
    base = dict(
        seeds="0-1",
        impl=["eager"],
        profile="ci-seeded",
        keyword="test_accuracy",
        jobs=1,
        device="cpu",
        out=out,
        force=False,
        keep_stale=False,
        assemble=False,
        per_impl=False,
        compare=None,
    )
    return argparse.Namespace(**{**base, **kw})


def _fake_seed(calls: list[int], exit_status: int = 0):
    def run_seed(seed, args, profile):
        calls.append(seed)
        return seed_sweep.SeedRun(
            seed,
            exit_status,
            1.0,
            [{"test": "m::t", "impl": "eager", "status": "passed"}],
            [{"output": "loss", "dtype": "float32", "ratio": 0.1 * (seed + 1), "impl": "eager"}],
        )

    return run_seed


def _on_code(monkeypatch, code: str, torch: str = "2.13.0", commit: str = "aaaaaaaaaaaa") -> None:
    """Make the sweep see numcheck code ``code``, torch ``torch`` and git commit ``commit``."""
    monkeypatch.setattr(seed_sweep, "code_identity", lambda: {"code": code * 64, "torch": torch})
    monkeypatch.setattr(seed_sweep.report_schema, "environment", lambda d: {"git_commit": commit})


def test_kept_seeds_are_reused_and_their_commits_listed(tmp_path, monkeypatch):
    """A seed kept in --out/seeds/ by an earlier run on the same code is taken, not run again (unless --force),
    even across commits; the summary lists each seed's commit and code hash."""
    calls: list[int] = []
    monkeypatch.setattr(seed_sweep, "run_seed", _fake_seed(calls))
    _on_code(monkeypatch, "c", commit="aaaaaaaaaaaa")
    assert seed_sweep.run(_args(tmp_path, seeds="0")) == 0
    assert calls == [0] and seed_sweep.seed_path(tmp_path, 0).exists()
    _on_code(monkeypatch, "c", commit="bbbbbbbbbbbb")
    assert seed_sweep.run(_args(tmp_path, seeds="0-1")) == 0
    assert calls == [0, 1], "seed 0 was run again though it was kept on the same code"
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert [(s["seed"], s["commit"], s["code"], s["resumed"], s["stale"]) for s in summary["seeds"]] == [
        (0, "aaaaaaaaaaaa", "c" * 64, True, None),
        (1, "bbbbbbbbbbbb", "c" * 64, False, None),
    ]
    assert summary["tightness"][0]["count"] == 2, "the kept seed's records are not in the table"
    md = (tmp_path / "sweep.md").read_text()
    assert "2 different commits with the same numcheck code" in md and "| aaaaaaaaa | cccccccccccc |" in md
    assert seed_sweep.run(_args(tmp_path, seeds="0", force=True)) == 0
    assert calls == [0, 1, 0]


@pytest.mark.parametrize("code, torch", [("d", "2.13.0"), ("c", "2.6.0")])
def test_kept_seed_of_other_code_or_torch_is_run_again(tmp_path, monkeypatch, capsys, code, torch):
    """A kept seed whose numcheck code hash or torch differs from this run's is run again, and the progress
    output says why; its new run replaces the kept file."""
    calls: list[int] = []
    monkeypatch.setattr(seed_sweep, "run_seed", _fake_seed(calls))
    _on_code(monkeypatch, "c")
    assert seed_sweep.run(_args(tmp_path, seeds="0")) == 0
    _on_code(monkeypatch, code, torch)
    capsys.readouterr()
    assert seed_sweep.run(_args(tmp_path, seeds="0")) == 0
    assert calls == [0, 0], "a kept seed of other code was reused"
    err = capsys.readouterr().err
    assert "seed 0: the kept seed ran on" in err and "running it again" in err
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert summary["seeds"][0]["code"] == code * 64 and summary["seeds"][0]["torch"] == torch
    assert seed_sweep.run(_args(tmp_path, seeds="0")) == 0
    assert calls == [0, 0], "the rerun seed was not kept"


def test_keep_stale_keeps_and_marks_the_stale_seed(tmp_path, monkeypatch):
    """--keep-stale takes a kept seed of other code, and sweep.md marks that seed's row with the code hash and
    commit it ran on; --force with --keep-stale is bad input."""
    calls: list[int] = []
    monkeypatch.setattr(seed_sweep, "run_seed", _fake_seed(calls))
    _on_code(monkeypatch, "c", commit="aaaaaaaaaaaa")
    assert seed_sweep.run(_args(tmp_path, seeds="0")) == 0
    _on_code(monkeypatch, "d", commit="bbbbbbbbbbbb")
    assert seed_sweep.run(_args(tmp_path, seeds="0-1", keep_stale=True)) == 0
    assert calls == [0, 1]
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert [bool(s["stale"]) for s in summary["seeds"]] == [True, False]
    md = (tmp_path / "sweep.md").read_text()
    assert "| 0 | 1 | 0 | 0 | 0 | 1 | aaaaaaaaa | cccccccccccc ⚠ stale, kept by --keep-stale |" in md
    assert "| 1 | 1 | 0 | 0 | 0 | 1 | bbbbbbbbb | dddddddddddd |" in md
    assert "seed 0 ran on other numcheck code (code cccccccccccc, commit aaaaaaaaa" in md
    assert seed_sweep.run(_args(tmp_path, seeds="0", keep_stale=True, force=True)) == 2


def test_assemble_summarizes_kept_seeds_without_running_any(tmp_path, monkeypatch):
    """--assemble writes the summary of the kept seeds alone, in the environment they recorded, marking those of
    other code; a seed not kept, seeds of two environments, or --force with it are bad input."""
    calls: list[int] = []
    monkeypatch.setattr(seed_sweep, "run_seed", _fake_seed(calls))
    _on_code(monkeypatch, "c", commit="aaaaaaaaaaaa")
    monkeypatch.setattr(seed_sweep.report_schema, "environment", lambda d: {"device": "cuda", "torch": "2.11.0"})
    assert seed_sweep.run(_args(tmp_path, seeds="0-1")) == 0
    _on_code(monkeypatch, "d", commit="bbbbbbbbbbbb")  # the assembling machine: other code, another environment
    assert seed_sweep.run(_args(tmp_path, seeds="0-1", assemble=True)) == 0
    assert calls == [0, 1], "--assemble ran a seed"
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert summary["environment"]["device"] == "cuda" and summary["environment"]["torch"] == "2.11.0"
    assert [bool(s["stale"]) for s in summary["seeds"]] == [True, True]
    _on_code(monkeypatch, "c", torch="2.6.0")  # their code, on a machine with another torch: not stale
    assert seed_sweep.run(_args(tmp_path, seeds="0-1", assemble=True)) == 0
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert [s["stale"] for s in summary["seeds"]] == [None, None]
    _on_code(monkeypatch, "d", commit="bbbbbbbbbbbb")
    assert seed_sweep.run(_args(tmp_path, seeds="0-2", assemble=True)) == 2  # seed 2 was never run
    assert seed_sweep.run(_args(tmp_path, seeds="0", assemble=True, force=True)) == 2
    path = seed_sweep.seed_path(tmp_path, 1)  # seed 1 as if run on another torch release
    import gzip

    data = json.loads(gzip.decompress(path.read_bytes()))
    data["environment"]["torch"] = "2.13.0"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    assert seed_sweep.run(_args(tmp_path, seeds="0-1", assemble=True)) == 2


@pytest.mark.parametrize(
    "text, detail",
    [
        (
            "PropertyFailure('property \\'determinism\\' fails for impl \\'x\\'\\n  case: Problem(N=1)\\n  grad_x differs "
            "between two identical runs: max |difference| 1.9e-06\\n  reproduce: numcheck repro --impl x')",
            "grad_x differs between two identical runs: max |difference| 1.9e-06",
        ),
        (
            "numcheck.properties.core.failures.PropertyFailure: property 'two_calls' fails for impl 'x'\nE   case: Problem(N=2)\n"
            "E   two calls of 1 rows each (1, 1 not ignored) in one graph\nE   grad_x (torch.bfloat16): 1 / 4 elements beyond "
            "bound; worst at index [0, 0] (error/bound 1.61)\nE   reproduce: numcheck repro --impl x",
            "grad_x (torch.bfloat16): 1 / 4 elements beyond bound; worst at index [0, 0] (error/bound 1.61)",
        ),
    ],
)
def test_failure_message_parts(text, detail):
    """A failure message gives its case, judgement line and repro command, also when JUnit recorded it as the
    exception's one-line repr (a failure hypothesis raised in a group) or its judgement has no (a)/(b) label."""
    parts = seed_sweep._message_parts(text)
    assert parts["detail"] == detail and parts["case"].startswith("Problem(N=")
    assert parts["reproduce"] == "numcheck repro --impl x" and parts["message"].startswith(
        ("PropertyFailure: ", "numcheck.properties")
    )


def test_seed_kept_without_a_code_hash_is_stale(tmp_path, monkeypatch):
    """A seed kept by a numcheck that did not record its code hash (the committed sweeps' seeds) is stale: run
    again by default, kept and marked "unknown" under --keep-stale."""
    calls: list[int] = []
    monkeypatch.setattr(seed_sweep, "run_seed", _fake_seed(calls))
    _on_code(monkeypatch, "c")
    key = seed_sweep._selection_key(_args(tmp_path), "numcheck-ci-seeded")
    seed_sweep.save_seed(tmp_path, seed_sweep.SeedRun(0, 0, 1.0, [], [], {"git_commit": "0123456789ab"}), key)
    assert seed_sweep.run(_args(tmp_path, seeds="0", keep_stale=True)) == 0
    assert calls == []
    md = (tmp_path / "sweep.md").read_text()
    assert "| 012345678 | unknown ⚠ stale, kept by --keep-stale |" in md
    assert "code unknown, commit 012345678" in md
    assert seed_sweep.run(_args(tmp_path, seeds="0")) == 0
    assert calls == [0]


def test_interrupted_seed_is_reported_but_never_kept(tmp_path, monkeypatch):
    """A seed whose pytest exited 2 (interrupted or a collection error) is in the summary but not kept, so the
    next run runs it again."""
    calls: list[int] = []
    monkeypatch.setattr(seed_sweep, "run_seed", _fake_seed(calls, exit_status=2))
    _on_code(monkeypatch, "c")
    seed_sweep.run(_args(tmp_path, seeds="0"))
    assert not seed_sweep.seed_path(tmp_path, 0).exists()
    assert json.loads((tmp_path / "sweep.json").read_text())["seeds"][0]["exit_status"] == 2
    seed_sweep.run(_args(tmp_path, seeds="0"))
    assert calls == [0, 0]


def test_code_hash_covers_every_py_file(tmp_path):
    """The code hash changes when a .py file's bytes or name change, or one is added, and ignores
    __pycache__ and other files."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 2\n")
    h0 = common.code_hash(tmp_path / "pkg")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "c.py").write_text("z")
    (tmp_path / "pkg" / "notes.txt").write_text("z")
    assert common.code_hash(tmp_path / "pkg") == h0
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 3\n")
    h1 = common.code_hash(tmp_path / "pkg")
    (tmp_path / "pkg" / "sub" / "b.py").rename(tmp_path / "pkg" / "sub" / "c.py")
    h2 = common.code_hash(tmp_path / "pkg")
    (tmp_path / "pkg" / "d.py").write_text("")
    assert len({h0, h1, h2, common.code_hash(tmp_path / "pkg")}) == 4
    assert len(common.code_hash()) == 64


def test_kept_seed_of_another_selection_is_refused(tmp_path, monkeypatch):
    """A kept seed run with other impls (or -k, profile, device) cannot join the sweep: bad input naming it."""
    monkeypatch.setattr(seed_sweep, "run_seed", _fake_seed([]))
    _on_code(monkeypatch, "c")
    assert seed_sweep.run(_args(tmp_path, seeds="0")) == 0
    assert seed_sweep.run(_args(tmp_path, seeds="0", impl=["recompute"])) == 2


def test_tightness_quantiles_and_nonfinite():
    """Per output × dtype: count, exact zeros, median and 90th percentile (numpy's linear interpolation: of 0, 1,
    2, 3 and an inf, the finite four give 1.5 and 2.7), max; a non-finite ratio is counted apart."""
    rows = [{"output": "loss", "dtype": "float32", "ratio": r} for r in (3.0, 0.0, 2.0, 1.0, math.inf)]
    rows.append({"output": "grad_x", "dtype": "float32", "ratio": 0.5})
    table = {r["output"]: r for r in seed_sweep.tightness(rows)}
    assert table["loss"] == {
        "output": "loss",
        "dtype": "float32",
        "count": 5,
        "exact": 1,
        "nonfinite": 1,
        "median": 1.5,
        "p90": pytest.approx(2.7),
        "max": 3.0,
    }
    assert table["grad_x"]["median"] == table["grad_x"]["p90"] == 0.5


def test_p90_falling_past_the_limit_is_flagged():
    """--compare flags an output × dtype whose p90 fell by more than 2× from the baseline's, not one within it."""
    base = [{"output": "loss", "dtype": "float32", "p90": 0.4}, {"output": "grad_x", "dtype": "float32", "p90": 0.4}]
    now = [{"output": "loss", "dtype": "float32", "p90": 0.1}, {"output": "grad_x", "dtype": "float32", "p90": 0.25}]
    flags = {r["output"]: r["too_loose"] for r in seed_sweep.compare_tightness(now, base)}
    assert flags == {"loss": True, "grad_x": False}


def test_junit_names_with_bracketed_impls():
    """A JUnit case name splits into module::test and the impl, brackets inside the impl name kept."""
    assert seed_sweep._split_name("numcheck.tests.suite.test_properties", "test_accuracy[chunked[fp32_operands]]") == (
        "test_properties::test_accuracy",
        "chunked[fp32_operands]",
    )
    assert seed_sweep._split_name("m", "test_plain") == ("m::test_plain", "")
