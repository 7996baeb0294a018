"""numcheck's pytest plugin as users meet it: the suite run with ``--pyargs`` outside any checkout, the repro line it
prints rerunning the failure as printed, a user's own hypothesis tests and ``ci`` profile untouched, and the
user fixtures; and :func:`numcheck.check` agreeing with the plugin's verdicts.

Each plugin run is a pytest subprocess in a temporary directory (the installed entry point, an outside module
found only through the user's ``pythonpath`` ini setting), one or two hypothesis examples per test; the tests that
read different things of the same run share it (:func:`suite_on_user_repo`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import numcheck

#: Correct except that the loss is 0.1% (and 1e-3) too large: fails accuracy on every draw with a row counted.
LOSS_OFF = '''
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import linear_ce_impl

@linear_ce_impl(name="plugin_loss_off", dtypes=("float32",), autocast=(), options=("bias", "ignore_index"),
                logits_dtype="float32")
def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """Correct except that the loss is 0.1% (and 1e-3) too large."""
    loss = F.cross_entropy(F.linear(x, weight, bias).float(), target, reduction=reduction, ignore_index=ignore_index)
    return loss * 1.001 + 1e-3
'''

#: A user's own conftest and hypothesis test, with their own ``ci`` profile, and a test using numcheck's fixtures.
USER_CONFTEST = """
from hypothesis import settings
settings.register_profile("ci", max_examples=7, derandomize=True, database=None)
settings.load_profile("ci")
"""
USER_TEST = """
import os
import sys
from pathlib import Path
from hypothesis import given, settings, strategies as st

def test_own_hypothesis_test_keeps_own_profile():
    assert "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules  # numcheck did nothing here
    assert "torch" not in sys.modules  # nor imported torch (its registry) for a run with no numcheck test
    calls = []

    @given(st.integers())
    def inner(n):
        calls.append(n)

    inner()
    assert settings.get_current_profile_name() == "ci"
    Path("examples_run.txt").write_text(str(len(calls)))

@given(st.integers())
def test_decorated_at_import(n):
    with open("decorated_calls.txt", "a") as f:
        f.write("x")
"""
USER_FIXTURE_TEST = """
from hypothesis import given, strategies as st
from numcheck.properties.linear_ce.props import accuracy

@given(data=st.data())
def test_my_impl_is_accurate(numcheck_impl, numcheck_problems, data):
    accuracy(numcheck_impl, data.draw(numcheck_problems))
"""


def _bin() -> Path:
    """This interpreter's scripts folder (its ``pytest`` and ``numcheck``)."""
    return Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: this venv's scripts on PATH, nothing of numcheck's test run."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "NUMCHECK_", "HYPOTHESIS")) and k not in ("PYTHONPATH", "TRITON_INTERPRET")
    }
    env["PATH"] = os.pathsep.join([str(_bin()), env.get("PATH", "")])
    env.update(extra)
    return env


def _pytest(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """This venv's ``pytest`` run in ``cwd`` as a user would, with ``env`` added to :func:`_env`."""
    return subprocess.run(
        [str(_bin() / "pytest"), "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def user_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's repository: an outside impl module found through pytest's ``pythonpath`` ini setting only (and
    not yet imported in this process)."""
    monkeypatch.delitem(sys.modules, "myflce", raising=False)
    return _write_user_repo(tmp_path)


def _write_user_repo(folder: Path) -> Path:
    """The files of :func:`user_repo` in ``folder``."""
    (folder / "myflce.py").write_text(LOSS_OFF)
    (folder / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    return folder


#: The suite tests the shared run (:func:`suite_on_user_repo`) selects: the accuracy test, where the wrong impl
#: fails on a covering row, and two that numcheck.check must agree with (one passes, one does not apply); and the
#: user's own test of :data:`USER_FIXTURE_TEST`.
SHARED_SELECTION = (
    "test_accuracy and not sharp or test_determinism or test_chunk_invariance or test_my_impl_is_accurate"
)


@pytest.fixture(scope="module")
def suite_on_user_repo(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """One run of the suite as a user runs it from their repository (``--pyargs numcheck.tests.suite``, the
    outside impl ``myflce:impl`` beside the built-in ``eager``, :data:`SHARED_SELECTION`, two examples a test),
    with the user's own test module taking numcheck's fixtures (``test_mine.py``, under the ``numcheck-ci``
    profile, the one the suite runs under anyway), shared by the tests that read different things of it (the
    repro line it prints; the verdicts numcheck.check must agree with; the user's test's verdicts): one pytest
    start, collection and run instead of one per test."""
    repo = _write_user_repo(tmp_path_factory.mktemp("user_repo"))
    (repo / "test_mine.py").write_text(USER_FIXTURE_TEST)
    impls = ("--impl", "eager", "--impl", "myflce:impl")
    return _pytest(
        repo,
        "-v",
        "-rA",
        "test_mine.py",
        "--pyargs",
        "numcheck.tests.suite",
        *impls,
        "-k",
        SHARED_SELECTION,
        "--hypothesis-profile",
        "numcheck-ci",
        NUMCHECK_CI_EXAMPLES="2",
    )


def test_impl_in_the_directory_run_from_loads_without_configuration(tmp_path, monkeypatch):
    """A user's repository with no pytest configuration and their package not installed: the README's command,
    run from its root, imports the impl from there (as ``numcheck report`` does) instead of failing to load it."""
    monkeypatch.delitem(sys.modules, "myflce", raising=False)
    (tmp_path / "myflce.py").write_text(LOSS_OFF)
    r = _pytest(tmp_path, "-q", "--pyargs", "numcheck.tests.suite", "--impl", "myflce:impl", "-k", "protocol_structure")
    out = r.stdout + r.stderr
    assert "could not be loaded" not in out and "1 passed" in out, out


def test_printed_repro_line_reruns_the_failure(suite_on_user_repo, tmp_path_factory):
    """The suite run outside the checkout with ``--pyargs numcheck.tests.suite --impl myflce:impl`` fails the
    wrong impl and prints a repro line that, run as printed in a shell elsewhere, reproduces the failure."""
    r = suite_on_user_repo
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    # The failing case is a covering row (run before hypothesis' draws, so no @reproduce_failure blob): the
    # suite's repro line is what reruns it.
    section = re.split(r"^_{3,} test_accuracy\[plugin_loss_off\] _{3,}$", r.stdout, flags=re.M)
    assert len(section) == 2, out
    failure = re.split(r"^_{3,} ", section[1], flags=re.M)[0]
    assert "covering row" in failure, failure
    lines = re.findall(r"reproduce: (.+)", failure)
    assert lines, failure
    line = lines[0].strip()
    assert "numcheck repro --impl myflce:impl --property accuracy" in line, line
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    rerun = subprocess.run(["bash", "-c", line], cwd=elsewhere, env=_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 1, f"{line}\n{rerun.stdout}\n{rerun.stderr}"
    assert rerun.stdout.startswith("FAIL") and "plugin_loss_off" in rerun.stdout, rerun.stdout


def test_user_profile_and_hypothesis_tests_untouched(tmp_path):
    """With numcheck installed, a user's own hypothesis tests run under the user's own ``ci`` profile: 7
    examples for a test decorated at call time and one decorated at import, no numcheck profile loaded, and
    nothing of numcheck's set up (no Triton interpreter asked for, neither triton nor torch imported)."""
    (tmp_path / "conftest.py").write_text(USER_CONFTEST)
    (tmp_path / "test_user.py").write_text(USER_TEST)
    r = _pytest(tmp_path, "-q")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert (tmp_path / "examples_run.txt").read_text() == "7", out
    assert len((tmp_path / "decorated_calls.txt").read_text()) == 7, out


def test_user_fixtures_run_the_users_own_property(suite_on_user_repo):
    """A user's own test taking ``numcheck_impl`` and ``numcheck_problems`` runs once per ``--impl`` impl and
    fails the wrong one with the suite's failure message."""
    r = suite_on_user_repo
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "PASSED test_mine.py::test_my_impl_is_accurate[eager]" in out, out
    assert "FAILED test_mine.py::test_my_impl_is_accurate[plugin_loss_off]" in out, out
    mine = re.split(r"^_{3,} test_my_impl_is_accurate\[plugin_loss_off\] _{3,}$", r.stdout, flags=re.M)
    assert len(mine) == 2, out
    assert "property 'accuracy' fails for impl 'plugin_loss_off'" in re.split(r"^_{3,} ", mine[1], flags=re.M)[0], out


def test_check_agrees_with_the_plugin(user_repo, suite_on_user_repo, monkeypatch):
    """numcheck.check gives the verdicts the plugin's suite gives: a correct impl passes what the suite passes,
    the wrong impl fails accuracy with the suite's message, and a property that does not apply is skipped."""
    monkeypatch.syspath_prepend(str(user_repo))
    names = ["accuracy", "determinism", "chunk_invariance"]
    good = numcheck.check("eager", names, max_examples=2)
    bad = numcheck.check("myflce:impl", names, max_examples=2)
    assert good.ok and [good.verdicts[n].status for n in names] == ["passed", "passed", "skipped"], good
    assert good.verdicts["accuracy"].worst_ratio is not None and good.verdicts["accuracy"].worst_ratio <= 1, good
    assert not bad.ok and bad.verdicts["accuracy"].status == "failed", bad
    assert "property 'accuracy' fails for impl 'plugin_loss_off'" in bad.verdicts["accuracy"].message, bad
    r = suite_on_user_repo
    out = r.stdout + r.stderr
    for result in (good, bad):
        for n in names:
            status = result.verdicts[n].status.upper()
            assert re.search(rf"::test_{n}\[{re.escape(result.impl)}\] {status}", out), (
                f"{n} for {result.impl}: check says {status}\n{out}"
            )


def test_check_rejects_bad_arguments():
    """Unknown property names, a profile that is not numcheck's and an unloadable spec are named in the error."""
    with pytest.raises(ValueError, match="unknown properties.*'acuracy'"):
        numcheck.check("eager", ["acuracy"])
    with pytest.raises(ValueError, match="'ci-fast' names no numcheck hypothesis profile"):
        numcheck.check("eager", ["determinism"], profile="ci-fast")
    with pytest.raises(ValueError, match="no_such_module_xyz"):
        numcheck.check("no_such_module_xyz:impl")


def test_repro_line_names_the_spec_of_an_impl_passed_as_an_object(user_repo, monkeypatch):
    """An impl handed to the suite as an object (numcheck.check(impl)) still gets a repro line that loads it by
    its module-level name, with the module's folder on PYTHONPATH."""
    monkeypatch.syspath_prepend(str(user_repo))
    import importlib

    impl = importlib.import_module("myflce").impl
    bad = numcheck.check(impl, ["accuracy"], max_examples=1)
    line = re.search(r"reproduce: (.+)", bad.verdicts["accuracy"].message).group(1)
    words = shlex.split(line)
    assert words[0] == f"PYTHONPATH={user_repo.resolve()}" and words[1:5] == [
        "numcheck",
        "repro",
        "--impl",
        "myflce:impl",
    ], line


def test_check_runs_the_quantized_linear_suite():
    """numcheck.check runs the drawn FP8 tests for a quantized-linear impl: the built-in passes and a mutant that
    saves a copy of x where it declares the original fails the saved-tensor property with the suite's message."""
    from numcheck.tests.self.helpers.fp8_mutants import MUTANTS

    name = "saved_tensor_aliasing_and_bytes"
    good = numcheck.check("fp8_linear[current]", [name], max_examples=2)
    assert good.ok and good.verdicts[name].status == "passed", good
    mutant = next(m for m in MUTANTS if m.name == "mutant_saves_copy_of_x")
    bad = numcheck.check(mutant, [name], max_examples=4)
    assert bad.verdicts[name].status == "failed" and "mutant_saves_copy_of_x" in bad.verdicts[name].message, bad
    with pytest.raises(ValueError, match="unknown properties.*for a fp8-linear impl"):
        numcheck.check("fp8_linear[current]", ["pinned_cases"])


#: Correct impls named as numcheck's ``eager`` (F.cross_entropy's recorded fp16 divergences apply to that name on
#: the CPU, whatever the release) and as a Liger variant (its frozen-x divergence covers every draw of
#: ``frozen_inputs[x]`` on an installed liger-kernel >= 0.6.3).
NAMED_AS_KNOWN = """
import torch
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport

def ce(x, w, t, b=None, *, reduction="mean", ignore_index=-100):
    return F.cross_entropy(F.linear(x, w, b), t, reduction=reduction, ignore_index=ignore_index)

def _support(*dtypes):
    return LinearCESupport(dtypes=frozenset(dtypes), options=frozenset({"bias", "ignore_index"}), autocast=frozenset())

eager = FunctionImpl(name="eager", fn=ce, support=_support(torch.float32, torch.float16))
liger = FunctionImpl(name="liger[user]", fn=ce, support=_support(torch.float32))
"""


@pytest.fixture(scope="module")
def named_as_known(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's repository holding :data:`NAMED_AS_KNOWN` (never imported in this process: the runs are pytest
    subprocesses)."""
    folder = tmp_path_factory.mktemp("named_as_known")
    (folder / "named_as_known.py").write_text(NAMED_AS_KNOWN)
    (folder / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    return folder


#: The tests the strict tests run, each on its impl: the protocol test on ``eager`` (passes, under a known
#: divergence that applies to its name) and the frozen-x test on ``liger[user]`` (every draw a known divergence).
EAGER_KNOWN = "protocol_structure and eager"
LIGER_KNOWN = "frozen_inputs and x and liger"


def _known_run(folder: Path, names: tuple[str, ...], keyword: str, *extra: str) -> subprocess.CompletedProcess:
    """The suite on :data:`NAMED_AS_KNOWN`'s impls ``names``, ``-k keyword``."""
    impls = [arg for name in names for arg in ("--impl", f"named_as_known:{name}")]
    args = ("-q", "--pyargs", "numcheck.tests.suite", *impls, "-k", keyword, *extra)
    return _pytest(folder, *args, PYTHONPATH=_this_numcheck())


@pytest.fixture(scope="module")
def known_without_strict(named_as_known: Path) -> subprocess.CompletedProcess:
    """One run without ``--numcheck-strict`` of both strict tests' selections, shared by them (each reads its
    impl's part): one pytest start instead of two. Each test's ``--numcheck-strict`` run stays its own, on its
    impl alone, so each shows what alone fails its session."""
    return _known_run(named_as_known, ("eager", "liger"), f"{EAGER_KNOWN} or {LIGER_KNOWN}")


def _this_numcheck() -> str:
    """The folder holding the numcheck under test (a checkout's root, or site-packages), for PYTHONPATH."""
    return str(Path(numcheck.__file__).resolve().parents[1])


def test_summary_names_known_divergences_and_strict_fails_the_session(named_as_known, known_without_strict):
    """After the suite, the summary names each known divergence that applied (library, release, what is wrong) and
    the run passes; with --numcheck-strict the session exits 1 though every test passed."""
    r = known_without_strict
    out = r.stdout + r.stderr
    line = "numcheck: known divergence, not a pass: eager: torch "
    assert r.returncode == 0 and line in out and "F.cross_entropy on CPU fp16 'mean' returns inf" in out, out
    r = _known_run(named_as_known, ("eager",), EAGER_KNOWN, "--numcheck-strict")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and " passed" in out and "(--numcheck-strict: a failure)" in out, out
    assert " failed" not in out and " skipped" not in out, out  # every test passed: the summary alone fails it


def test_strict_fails_a_test_skipped_as_a_known_divergence(named_as_known, known_without_strict):
    """A test every draw of which is a known divergence is a skip, and a failure under --numcheck-strict."""
    from packaging.version import Version

    from numcheck.properties.linear_ce.known_liger import liger_release

    if Version(liger_release() or "0") < Version("0.6.3"):
        pytest.skip("needs liger-kernel >= 0.6.3 installed (its frozen-x divergence)")
    r = known_without_strict
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout + r.stderr
    r = _known_run(named_as_known, ("liger",), LIGER_KNOWN, "--numcheck-strict")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "1 failed" in out and "--numcheck-strict: a known divergence is a failure" in out, out


def test_an_xdist_worker_starts_its_subprocesses_with_one_thread():
    """In an xdist worker the plugin sets ``OMP_NUM_THREADS=1`` for the processes its tests start (as it sets the
    worker's own torch to one thread), unless the user set it; outside a worker it sets nothing."""
    from numcheck.tests.plugin import one_thread_per_worker

    worker = {"PYTEST_XDIST_WORKER": "gw0"}
    assert one_thread_per_worker(worker) and worker["OMP_NUM_THREADS"] == "1"
    users = {"PYTEST_XDIST_WORKER": "gw1", "OMP_NUM_THREADS": "4"}
    assert one_thread_per_worker(users) and users["OMP_NUM_THREADS"] == "4"
    alone: dict[str, str] = {}
    assert not one_thread_per_worker(alone) and alone == {}


class _Outcomes:
    """A pytest plugin keeping each test's outcome and skip reason by test name."""

    def __init__(self) -> None:
        self.outcomes: dict[str, tuple[str, str]] = {}

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 - pytest's TestReport
        if report.when == "call" or report.outcome != "passed":
            reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
            self.outcomes[report.nodeid.rpartition("::")[2]] = (report.outcome, reason)


def test_suite_skips_an_impl_declared_for_another_device():
    """An FP8 impl declared for CUDA only (``devices=("cuda",)``, its per-device fields without a CPU entry, as
    torchao's adapter declares itself on a GPU) is skipped by every test of the shipped suite drawing on the CPU, with
    the fix (NUMCHECK_DEVICE=cuda), never called on CPU tensors or failed: an H100 run of the suite on the CPU (what
    ``numcheck premerge --device cuda`` ran) failed every test that reached the declaration's missing CPU entry."""
    from numcheck.properties.core.device import DEVICE_TYPE

    if DEVICE_TYPE != "cpu":
        pytest.skip(f"the suite draws on {DEVICE_TYPE} here, where the impl is declared")
    seen = _Outcomes()
    impl = "numcheck.tests.self.helpers.user_impls:fp8_cuda_only"
    args = ["--pyargs", "numcheck.tests.suite.test_fp8_impls", "--impl", impl, "-q", "-p", "no:cacheprovider"]
    rc = pytest.main([*args, "-p", "no:xdist"], plugins=[seen])
    mine = {name: v for name, v in seen.outcomes.items() if "user_fp8_cuda_only" in name}
    assert rc == 0 and len(mine) >= 10, (rc, seen.outcomes)
    for name, (outcome, reason) in mine.items():
        assert outcome == "skipped" and "declares devices ['cuda']" in reason, (name, outcome, reason)
        assert "NUMCHECK_DEVICE=cuda" in reason, (name, reason)
