"""Adding a kind needs only its slice and one line per registry (CONTRIBUTING.md, "Adding a family"): a toy kind
(``tests/self/helpers/toy_kind/``: a sum of a vector) is copied into a temporary folder outside numcheck, registered
with one line in each registry, and run through ``numcheck list``, ``numcheck report --grid smoke``, the
``numcheck repro`` line its failure prints, :func:`numcheck.check` and the pytest plugin, all in this process.

Nothing of numcheck is edited for it: each registry line is a ``monkeypatch`` of the registry's table, as the line a
new family adds to the file (:func:`toy`).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import numcheck
from numcheck.impls.protocols import kinds
from numcheck.properties.suites import SUITES
from numcheck.reports import cli
from numcheck.reports.report.families import FAMILIES

#: The toy kind's slice, a folder (not a package of numcheck) copied into each test's temporary folder.
SLICE = Path(__file__).resolve().parent / "helpers" / "toy_kind"
CORRECT, OFF = "toykind.impls:impl", "toykind.impls:off"


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The toy slice importable from a temporary folder, registered with one line per registry; the folder."""
    root = tmp_path / "toy_kind"
    shutil.copytree(SLICE, root)
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "toykind" or m.startswith("toykind.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv("NUMCHECK_IMPLS", raising=False)
    monkeypatch.chdir(tmp_path)
    from toykind import protocol, report
    from toykind.properties import suite

    # impls/protocols/kinds.py: the kind's line in KINDS (BY_NAME and NAMES are derived from it there, and here)
    monkeypatch.setattr(kinds, "KINDS", (*kinds.KINDS, protocol.KIND))
    monkeypatch.setitem(kinds.BY_NAME, protocol.TOY_KIND, protocol.KIND)
    monkeypatch.setattr(kinds, "NAMES", tuple(kinds.BY_NAME))
    # properties/suites.py: the family's suite
    monkeypatch.setitem(SUITES, protocol.TOY_KIND, suite.FAMILY)
    # reports/report/families/__init__.py: the family's report section
    monkeypatch.setitem(FAMILIES, protocol.TOY_KIND, report.FAMILY)
    return tmp_path


def _numcheck(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``numcheck ARGV`` in this process: its exit status and what it printed."""
    capsys.readouterr()
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_list_shows_the_toy_kind(toy, capsys):
    rc, out = _numcheck(capsys, "list", "--impl", CORRECT)
    assert rc == 0, out
    assert "toy_sum  [toy_total, from --impl]" in out and "dtypes: float32" in out, out


def test_report_judges_the_toy_kind_and_its_repro_line_reruns_a_failure(toy, capsys, monkeypatch):
    rc, out = _numcheck(capsys, "report", "--grid", "smoke", "--impl", CORRECT, "--impl", OFF, "--out", "out")
    assert rc == 1, out  # toy_off is off by 1e-3·Σ|x|
    report = json.loads((toy / "out" / "report.json").read_text())
    status = {(c["impl"], c["case"]): c["status"] for c in report["cases"]}
    assert set(status.values()) == {"pass", "fail"}, status
    assert all(s == "pass" for (impl, _), s in status.items() if impl == "toy_sum"), status
    assert all(s == "fail" for (impl, _), s in status.items() if impl == "toy_off"), status
    assert "### Toy sums: per impl × dtype" in (toy / "out" / "report.md").read_text()
    failed = next(c for c in report["cases"] if c["status"] == "fail")
    words = shlex.split(failed["repro"])
    while "=" in words[0]:  # the environment the line sets (the toy's folder is on this process's path already)
        name, _, value = words.pop(0).partition("=")
        if name != "PYTHONPATH":
            monkeypatch.setenv(name, value)
    assert words[0] == "numcheck", failed["repro"]
    rc, out = _numcheck(capsys, *words[1:])
    assert rc == 1 and out.startswith("FAIL"), out
    rc, out = _numcheck(capsys, *[CORRECT if w == words[words.index("--impl") + 1] else w for w in words[1:]])
    assert rc == 0 and out.startswith("PASS"), out


def test_check_runs_the_toy_suite(toy):
    from toykind.impls import impl, off

    assert numcheck.check(impl, max_examples=3).ok
    result = numcheck.check(off, ["accuracy"], max_examples=3)
    assert not result.ok and "numcheck repro" in result.verdicts["accuracy"].message, result


class _Outcomes:
    """A pytest plugin keeping each test's outcome by node id."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid.rpartition("::")[2]] = report.outcome


def test_plugin_parametrizes_the_toy_kinds_fixture(toy):
    """The toy's suite module takes the kind's fixture (``toy_impl``), which numcheck's plugin parametrizes over the
    impls ``--impl`` loads, as it does the built-in kinds' fixtures."""
    shutil.copy(SLICE / "toy_suite.py", toy / "test_toy.py")
    seen = _Outcomes()
    rc = pytest.main(
        [str(toy / "test_toy.py"), "--impl", CORRECT, "--impl", OFF, "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        plugins=[seen],
    )
    assert rc == 1
    assert seen.outcomes == {
        "test_accuracy[toy_sum]": "passed",
        "test_accuracy[toy_off]": "failed",
        "test_determinism[toy_sum]": "passed",
        "test_determinism[toy_off]": "passed",
    }, seen.outcomes
