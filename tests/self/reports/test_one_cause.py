"""One clear failure per cause, and a plugin that costs nothing where it is not used: an impl that cannot load is
one error (the suite, under xdist too, and premerge, which stops there); an impl that raises fails each property
once with numcheck's message and nothing else; an ``--impl`` selection collects only the tests of its impls'
kinds; a failure's printed repro line reproduces it (an FP8 quantizer failure on a drawn tensor included); the
memory line says "not measured" for an impl that cannot run on ``meta``; importing the plugin imports neither
torch nor hypothesis; ``--hypothesis-show-statistics`` and ``NUMCHECK_DRAWN_LOG`` cover the covering rows and
the distributed tests under ``-n``.

Each suite run is a pytest subprocess in a temporary folder (``--pyargs``, the user's module on ``PYTHONPATH``),
with few hypothesis examples; the impls are tests/self/helpers/user_impls.py's user-style declarations.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numcheck
from numcheck.tests.self.helpers import user_impls

#: Where ``import numcheck`` finds this numcheck (a checkout's root or site-packages), for the subprocesses.
PACKAGE_PARENT = Path(numcheck.__file__).absolute().parent.parent
UNLOADABLE = "import no_such_dependency_of_this_impl  # noqa: F401\n"
HELPERS = "numcheck.tests.self.helpers.user_impls"


def _env(folder: Path, **extra: str) -> dict[str, str]:
    """A user's environment: ``folder`` and this numcheck on ``PYTHONPATH``, nothing of this test run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NUMCHECK_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(PACKAGE_PARENT)])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # its numcheck command
    env.update(extra)
    return env


def _run(folder: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """``python *args`` in ``folder`` as a user runs it."""
    return subprocess.run(
        [sys.executable, *args], cwd=folder, env=_env(folder, **extra), capture_output=True, text=True, timeout=900
    )


def _suite(folder: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """The README's plugin command (``pytest --pyargs numcheck.tests.suite``) with ``args``."""
    return _run(folder, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "numcheck.tests.suite", *args, **extra)


def _summary(out: str) -> str:
    """pytest's last line (``1 error in 12.3s``)."""
    return [line for line in out.splitlines() if line.strip()][-1]


def test_unloadable_impl_is_one_error_under_xdist(tmp_path):
    """An impl whose module cannot be imported is exactly one error, naming the spec and the import error; no
    test (linear+CE, FP8, distributed) is collected for it, and the summary says so under ``-n 2``."""
    (tmp_path / "broken_mod.py").write_text(UNLOADABLE)
    r = _suite(tmp_path, "-n", "2", "--impl", "broken_mod:impl", NUMCHECK_CI_EXAMPLES="2")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    summary = _summary(r.stdout)
    assert re.search(r"\b1 error\b", summary) and "passed" not in summary and "failed" not in summary, summary
    assert out.count("ERROR numcheck::load[broken_mod:impl]") == 1, out
    assert "could not be loaded" in out and "no_such_dependency_of_this_impl" in out, out
    assert not re.search(r"test_\w+\[broken_mod:impl", out), out
    for kind in ("linear-ce", "fp8-linear", "dist-linear-ce", "tp-fp8-linear"):
        assert re.search(rf"numcheck: \d+ test\(s\) for {kind} impls not collected", out), out


#: The suite's tests an impl that raises is run on here: covering rows first (accuracy, strided_inputs), draws
#: only (shift_invariance, ignored_rows), several variants (determinism), one test over many cases (pinned cases,
#: the protocol's structure per reduction).
RAISING_SELECTION = (
    "test_accuracy and not sharp or test_strided_inputs or test_shift_invariance"
    " or test_ignored_rows or test_determinism or test_pinned_cases or test_protocol_structure"
)


def test_impl_that_raises_fails_each_property_once_with_numchecks_message(tmp_path):
    """Every selected test fails (none passes), each once, with numcheck's message (the exception, where it was
    raised, the case, the repro line) and without pytest's traceback, argument dumps or hypothesis' blob."""
    r = _suite(
        tmp_path,
        "-p",
        "no:xdist",
        "--impl",
        f"{HELPERS}:always_raises",
        "-k",
        RAISING_SELECTION,
        NUMCHECK_CI_EXAMPLES="2",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    failed = re.findall(r"^FAILED (\S+)", r.stdout, flags=re.M)
    assert len(failed) == 7 and len(set(failed)) == 7, out
    assert "passed" not in _summary(r.stdout) and "PASSED" not in out, out
    sections = re.split(r"^_{3,} (test_\S+) _{3,}$", r.stdout, flags=re.M)[1:]
    bodies = dict(zip(sections[::2], sections[1::2]))
    assert len(bodies) == 7, out
    for name, body in bodies.items():
        text = body.split("=====")[0]
        assert f"the impl raised RuntimeError: {user_impls.RAISED}" in text, (name, text)
        assert "raised at " in text and "case: Problem(" in text and "reproduce: " in text, (name, text)
        for noise in ("Traceback", "impl = ", "def test_", "reproduce_failure", "Falsifying example", "tensor("):
            assert noise not in text, (name, noise, text)
        assert len(text.strip().splitlines()) <= 8, (name, text)


def test_impl_selection_collects_only_its_kinds(tmp_path):
    """``--impl`` naming a distributed impl collects the distributed tests alone: no linear+CE or FP8 test, and
    not numcheck's own protocol test, which runs only without ``--impl``."""
    r = _suite(tmp_path, "--collect-only", "-q", "-p", "no:xdist", "--impl", "vocab_parallel[nan]")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    collected = [line for line in r.stdout.splitlines() if "::" in line]
    assert collected and all("test_distributed.py::" in line for line in collected), out
    assert "test_protocol_rejects_malformed_impls" not in "\n".join(collected), out
    assert "test(s) of numcheck's own protocol code not collected: they run only without --impl" in out, out


def test_plugin_import_loads_neither_torch_nor_hypothesis(tmp_path):
    """What pytest imports for numcheck's entry point in every run imports pytest and the standard library only
    (torch alone takes seconds): the plugin stays inert in time where no numcheck test is collected."""
    code = (
        "import sys, pytest; import numcheck.tests.plugin; "
        "print(sorted(m for m in ('torch', 'hypothesis', 'triton', 'numpy', 'scipy') if m in sys.modules))"
    )
    r = _run(tmp_path, "-c", code)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_premerge_stops_after_a_failed_load(tmp_path):
    """premerge on an impl that cannot load prints one line naming it and the cause and exits 1, running nothing
    else (no suite, no report)."""
    (tmp_path / "broken_mod.py").write_text(UNLOADABLE)
    r = _run(tmp_path, "-m", "numcheck.reports.cli", "premerge", "--impl", "broken_mod:impl", "--grid", "smoke")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, r.stdout
    assert "broken_mod:impl" in lines[0] and "no_such_dependency_of_this_impl" in lines[0], lines[0]
    assert "stopped" in lines[0] and "running the property suite" not in r.stderr, r.stderr


def test_memory_line_says_not_measured_for_an_impl_that_cannot_run_on_meta():
    """A Liger-style backward with a ``torch.equal(grad_output, 1)`` shortcut cannot run on ``meta``: premerge's
    memory line says "not measured" with the reason and what to do, and is not ✅."""
    from numcheck.reports.premerge.command import check_memory
    from numcheck.reports.report.command import memory_section

    check = check_memory(
        {
            "memory": memory_section(
                [
                    user_impls.equal_shortcut,
                    numcheck.linear_ce_impl(name="eager_fp32", dtypes=("float32",), options=(), autocast=())(_eager),
                ]
            )
        }
    )
    line = check.line()
    assert "✅" not in line and "⚠️" in line and "not measured for `user_equal_shortcut`" in line, line
    assert "eager_fp32 held" in line, line
    detail = "\n".join(check.details)
    assert "aten::equal" in detail and "accumulation_step" in detail and "--device cuda" in detail, detail


def _eager(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    import torch.nn.functional as F

    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)


def test_fp8_quantizer_failure_on_a_drawn_tensor_reproduces_as_printed(tmp_path):
    """A quantizer that flushes NaN inputs to code 0 fails on a drawn tensor holding a NaN; the printed repro line,
    run as printed elsewhere, rebuilds that tensor and fails too (it used to run a case without it: PASS)."""
    from hypothesis import Phase, settings

    from numcheck.properties.check import _run_drawn
    from numcheck.properties.fp8.suite import FP8_SUITE

    # numcheck.check's run of the property, unshrunk (the case as first found: a larger tensor than the shrunk one)
    base = settings(settings.get_profile("numcheck-ci"), max_examples=4, phases=[p for p in Phase if p != Phase.shrink])
    v = _run_drawn(FP8_SUITE["quantizer_bitwise_on_random_tensors"], user_impls.fp8_nan_flushed, base)
    assert v.status == "failed" and "QuantizerCase(" in v.message and "DrawnTensor(" in v.message, v
    line = re.search(r"reproduce: (.+)", v.message).group(1).strip()
    rerun = subprocess.run(
        ["bash", "-c", line], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=900
    )
    assert rerun.returncode == 1 and rerun.stdout.startswith("FAIL"), f"{line}\n{rerun.stdout}\n{rerun.stderr}"
    assert "user_fp8_nan_flushed" in rerun.stdout and "codes differ from the oracle" in rerun.stdout, rerun.stdout


def test_statistics_and_drawn_log_cover_rows_and_distributed_tests_under_xdist(tmp_path):
    """Under ``-n 2``, ``--hypothesis-show-statistics`` counts a test's covering rows and shows a distributed test
    (whose ``@given`` runs inside it), and ``NUMCHECK_DRAWN_LOG`` records the distributed test's draws."""
    log = tmp_path / "drawn"
    log.mkdir()
    r = _suite(
        tmp_path,
        "-n",
        "2",
        "--hypothesis-show-statistics",
        "--impl",
        "eager",
        "--impl",
        "vocab_parallel[nan]",
        "-k",
        "test_accuracy and not sharp or test_dist_accuracy and 1",
        NUMCHECK_CI_EXAMPLES="2",
        NUMCHECK_DRAWN_LOG=str(log),
        # the ranks' fork server imports the vocabulary-parallel props alone, not megatron-core's entry points
        # (~5 s of CPU) for the built-in that needs none of them
        NUMCHECK_DIST_PRELOAD="numcheck.properties.distributed.linear_ce.props",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    stats = out.split("Hypothesis Statistics", 1)[1]
    accuracy = stats.split("test_accuracy[eager]:", 1)[1].split("\n\n\n")[0]
    rows = re.search(r"covering rows, run before the draws .*\n\s+- (\d+) rows, .*: (\d+) passing", accuracy)
    assert rows and int(rows.group(1)) > 2 and int(rows.group(2)) > 0, accuracy
    assert re.search(r"test_dist_accuracy\[vocab_parallel\[nan\]-1\]:\n(.|\n)*?\d+ passing", stats), stats
    drawn = [json.loads(line) for f in log.iterdir() for line in f.read_text().splitlines()]
    assert any(
        d["test"] == "dist_accuracy[world_size=1]" and d["impl"] == "vocab_parallel[nan]" and d["drawn"] for d in drawn
    ), drawn
