"""The same cases drawn and the same verdicts for the same (test, impl) however the suite is invoked: two files
or the whole suite collected, with or without a local module full of numeric literals loaded, from numcheck's
root or with ``--pyargs`` from another directory (another rootdir), in one process or on two xdist workers; and
:func:`numcheck.check` likewise.

hypothesis mixes literal constants of loaded local modules into its draws and keys parametrized tests by node id;
numcheck.properties.core.draw_isolation is what keeps the draws apart from both. The suite runs record what they drew
through ``NUMCHECK_DRAWN_LOG`` (tests/suite/drawn.py) and their verdicts in a JUnit XML file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import numcheck
import numcheck.tests as tests_package
from numcheck.properties.core.draw_isolation import isolated_draws
from numcheck.tests.suite.drawn import DRAWN_LOG_ENV, fingerprint

#: A local module of literals in the ranges the suite's strategies draw from (sizes, seeds, fractions, softcaps).
#: Its name carries no ``test``: hypothesis skips test files when collecting constants.
LITERALS_MODULE = "numcheck_scope_literals"
INTS = [101 + 37 * i for i in range(120)] + [1_000_003 + 7_919 * i for i in range(120)]
FLOATS = [0.013 + 0.0071 * i for i in range(130)] + [0.61 + 0.37 * i for i in range(130)]

#: The (test, impl) pairs run under every scope: fast impls, a test parametrized by a marker besides the impl
#: (hypothesis keys those by the full node id), and an FP8 quantizer test (wide seed and exponent draws). Tests of
#: the kinds no ``--impl`` here names (the distributed suites' ``test_determinism``, for one) are not collected.
SELECT = (
    "test_determinism or test_ignored_rows or test_frozen_inputs and not weight"
    " or test_quantizer_bitwise_on_random_tensors"
)
IMPLS = ("--impl", "eager", "--impl", "fp8_linear[current]")
#: The selected tests, by name.
SELECTED = (
    "test_determinism[eager]",
    "test_ignored_rows[eager]",
    "test_frozen_inputs[eager-x]",
    "test_quantizer_bitwise_on_random_tensors[fp8_linear[current]]",
)

SUITE_DIR = Path(tests_package.__file__).parent / "suite"
#: Where ``import numcheck`` finds this numcheck (a checkout's root or site-packages).
PACKAGE_PARENT = Path(numcheck.__file__).resolve().parent.parent


def _write_literals(folder: Path) -> None:
    """The module of literals, in ``folder``."""
    (folder / f"{LITERALS_MODULE}.py").write_text(f"INTS = {INTS!r}\nFLOATS = {FLOATS!r}\n")


def _suite(cwd: Path, out: Path, *args: str, literals: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """Run pytest on numcheck's suite in ``cwd`` (3 examples per test, numcheck resolving to this process's
    numcheck, ``literals``' module loaded as a plugin when given); its recorded draws (sorted JSON lines, one per example) and its
    verdicts (``test[params]`` → passed, failed, skipped or error)."""
    log, xml = out / "drawn", out / "junit.xml"
    log.mkdir(parents=True)
    path = [str(PACKAGE_PARENT), *([str(literals)] if literals else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NUMCHECK_", "HYPOTHESIS"))}
    env.update(
        PYTHONPATH=os.pathsep.join(path),
        NUMCHECK_CI_EXAMPLES="3",
        HYPOTHESIS_STORAGE_DIRECTORY=str(out / "hyp"),
        **{DRAWN_LOG_ENV: str(log)},
    )
    plugin = ("-p", LITERALS_MODULE) if literals else ()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, f"--junitxml={xml}", *IMPLS, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1) and xml.exists(), r.stdout + r.stderr
    drawn = sorted(line for f in log.iterdir() for line in f.read_text().splitlines())
    verdicts = {}
    for case in ET.parse(xml).iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        verdicts[case.get("name")] = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(
            kinds[0] if kinds else "", "passed"
        )
    return drawn, verdicts


def _first_difference(a: list[str], b: list[str]) -> str:
    """How many recorded draws one run made and the other did not, and the first, for the assertion message."""
    only = sorted(set(a) ^ set(b))
    return f"{len(only)} differ, e.g. {only[0] if only else None}"


def test_same_draws_and_verdicts_however_invoked(tmp_path):
    """The selected (test, impl) pairs draw the same cases and get the same verdicts run as two files with ``-k``
    in one process from numcheck's own root, and with ``--pyargs`` (the whole suite collected) from another
    directory on two xdist workers with a module of literals loaded."""
    literals = tmp_path / "literals"
    literals.mkdir()
    _write_literals(literals)
    files = [str(SUITE_DIR / "test_properties.py"), str(SUITE_DIR / "test_fp8_impls.py")]
    drawn, verdicts = _suite(PACKAGE_PARENT, tmp_path / "files", *files, "-k", SELECT, "-p", "no:xdist")
    assert len(verdicts) == len(SELECTED) and len(drawn) >= 3 * len(SELECTED), (drawn, verdicts)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    drawn2, verdicts2 = _suite(
        elsewhere, tmp_path / "pyargs", "--pyargs", "numcheck.tests.suite", "-k", SELECT, "-n", "2", literals=literals
    )
    assert drawn2 == drawn, _first_difference(drawn2, drawn)
    assert verdicts2 == verdicts


def _draw_integers(n: int) -> list[int]:
    """``n`` derandomized draws of a wide integer (one hypothesis test, the same function every call)."""
    out: list[int] = []

    @settings(derandomize=True, database=None, max_examples=n)
    @given(st.integers(0, 2**31 - 1))
    def draw(k: int) -> None:
        out.append(k)

    draw()
    return out


def test_isolated_draws_ignore_loaded_literals(tmp_path, monkeypatch):
    """Once a module of literals is imported, hypothesis draws some of them (the mechanism is live in this
    release), and inside ``isolated_draws`` it draws none: the draws equal those made before the import."""
    _write_literals(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, LITERALS_MODULE, raising=False)
    with isolated_draws():
        before = _draw_integers(300)
    __import__(LITERALS_MODULE)
    with isolated_draws():
        after = _draw_integers(300)
    free = _draw_integers(300)
    assert after == before
    assert (set(free) - set(before)) & set(INTS), (
        "hypothesis drew no literal of the loaded module: is the "
        "mechanism gone, or has it moved where isolated_draws misses it?"
    )


def _recording_impl(calls: list[str]) -> Any:
    """An fp32 linear+CE impl (F.linear, F.cross_entropy) that appends a fingerprint of each call's inputs to
    ``calls``."""

    @numcheck.linear_ce_impl(
        name="scope_recording",
        dtypes=("float32",),
        options=("bias", "ignore_index"),
        autocast=(),
        logits_dtype="float32",
    )
    def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
        calls.append(" ".join(fingerprint(t) for t in (x, weight, target)) + f" {reduction} {ignore_index}")
        logits = F.linear(x, weight, bias)
        return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)

    return impl


def test_check_draws_do_not_depend_on_loaded_modules(tmp_path, monkeypatch):
    """numcheck.check hands an impl the same inputs before and after a module of literals is imported."""
    _write_literals(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, LITERALS_MODULE, raising=False)
    before: list[str] = []
    after: list[str] = []
    assert numcheck.check(_recording_impl(before), ["accuracy"], max_examples=12).ok
    __import__(LITERALS_MODULE)
    assert numcheck.check(_recording_impl(after), ["accuracy"], max_examples=12).ok
    assert len(before) >= 12 and after == before, _first_difference(after, before)


@pytest.fixture(autouse=True)
def _forget_literals():
    """The module of literals is not left imported for later tests."""
    yield
    sys.modules.pop(LITERALS_MODULE, None)
