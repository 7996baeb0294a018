"""The plugin suite reaches a chunked impl's many chunks from its declaration alone.

Each impl of tests/self/helpers/user_chunked.py is declared as the README shows (the decorator, ``chunk_rows`` or
``chunk_rule``, no ``with_chunk_rows``). The suite runs as a user runs it (``pytest --pyargs numcheck.tests.suite
--impl module:name ...``, default profile) in a subprocess (one for all the narrow impls, one per twin): the impls
whose grad_weight running sum across chunks is
kept in bf16 or fp16 fail ``test_many_chunks``, on a case of at least MANY_CHUNKS chunks named in the message;
their fp32-sum twins pass every test their chunking reaches (many chunks, rows moved across chunk boundaries,
determinism over several chunks, long batches).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import numcheck
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.chunks import MANY_CHUNKS, rows_per_chunk
from numcheck.tests.self.helpers import user_chunked

MODULE = "numcheck.tests.self.helpers.user_chunked"
#: The folder holding this checkout's ``numcheck`` package, first on the subprocess' path (an installed numcheck,
#: e.g. another checkout's editable install, would otherwise be the one imported from ``cwd``).
ROOT = Path(numcheck.__file__).resolve().parent.parent
#: The narrow running sums the suite must fail: bf16 at every declared size and the rule, fp16 where its range
#: lets the many-chunk draws show it (chunks.MANY_CHUNK_MAX_ROWS says why not over chunks of 1024 rows).
NARROW = [
    "bf16_sum_c7",
    "bf16_sum_c64",
    "bf16_sum_c1024",
    "bf16_sum_rule",
    "fp16_sum_c7",
    "fp16_sum_c64",
    "fp16_sum_rule",
]
#: Runs left out unless NUMCHECK_SLOW_SELF_TESTS is set: the fp32 twin over chunks of 1024 rows draws 257 to 1024
#: chunks of them (263k to 1M rows) in four tests, about 200 s on one core, as much as the rest of this file.
#: Its result, run so: docs/evidence/chunk_reach.md.
SLOW = pytest.mark.skipif(
    not os.environ.get("NUMCHECK_SLOW_SELF_TESTS"),
    reason="about 200 s; set NUMCHECK_SLOW_SELF_TESTS=1 to run it (its last result: docs/evidence/chunk_reach.md)",
)
#: The twins run one process each (each takes 40-130 s in CI, so xdist spreads them; one process for all would be
#: the leg's longest test).
TWINS = ["fp32_sum_c7", "fp32_sum_c64", pytest.param("fp32_sum_c1024", marks=SLOW), "fp32_sum_rule"]
#: The tests whose draws depend on the declared chunking.
CHUNKED_TESTS = "test_many_chunks or test_chunk_invariance or test_determinism or test_long_batch"


def _suite(cwd: Path, names: list[str], select: str) -> subprocess.CompletedProcess:
    """The README's plugin command on ``MODULE:name`` for each of ``names`` (one ``--impl`` each, one process:
    its start and the suite's collection, about 9 s of CPU, are paid once), ``-k select``, in ``cwd``, with this
    environment less numcheck's, pytest's and hypothesis' own settings (so the default profile runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NUMCHECK_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    impls = [a for name in names for a in ("--impl", f"{MODULE}:{name}")]
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "numcheck.tests.suite"]
    return subprocess.run([*cmd, *impls, "-k", select], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def _sections(out: str) -> dict[str, str]:
    """Each failed test's report in pytest's output (its ``____ test ____`` header to the next), by test id."""
    parts = re.split(r"^_{3,} (test_\S+) _{3,}$", out, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _failing_case(out: str) -> tuple[Problem, int]:
    """The first failure's case and the chunk count its message states."""
    case = re.search(r"case: (Problem\(.*\))", out)
    stated = re.search(r"chunks: (\d+) rows in (\d+) chunks of (\d+)", out)
    assert case and stated, out
    p = eval(case.group(1), {"__builtins__": {}}, {"Problem": Problem})  # noqa: S307 - the suite's own repr
    assert int(stated.group(1)) == p.N, out
    return p, int(stated.group(2))


@pytest.mark.costly(
    reason="a pytest subprocess running test_many_chunks on seven narrow running sums at many-chunk shapes until each fails"
)
def test_narrow_running_sum_fails_many_chunks(tmp_path: Path) -> None:
    """Each running sum across chunks kept in bf16 or fp16 (:data:`NARROW`, all in one pytest process) fails
    test_many_chunks on grad_weight, on a case of at least MANY_CHUNKS chunks of the declared size (or rule),
    which its message states."""
    r = _suite(tmp_path, NARROW, "test_many_chunks")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and f"{len(NARROW)} failed" in out, out
    sections = _sections(out)
    for name in NARROW:
        impl = getattr(user_chunked, name)
        section = sections.get(f"test_many_chunks[{impl.name}]")
        assert section is not None and "grad_weight" in section, (name, out)
        p, stated = _failing_case(section)
        declared = math.ceil(p.N / rows_per_chunk(impl.support, p.N, p.H, p.V))
        assert stated == declared >= MANY_CHUNKS and p.dtype in ("bfloat16", "float16"), (name, stated, declared, p)


@pytest.mark.parametrize("name", TWINS)
@pytest.mark.costly(
    reason="a pytest subprocess running four chunk tests on a user's chunked twin at many-chunk shapes (at least MANY_CHUNKS chunks of its declared size or rule)"
)
def test_fp32_running_sum_passes(name: str, tmp_path: Path) -> None:
    """The twin keeping its running sum in fp32 passes every test its declared chunking reaches, chunk invariance
    included (run, not skipped: the rows are moved across its declared chunk boundaries)."""
    r = _suite(tmp_path, [name], CHUNKED_TESTS)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "4 passed" in out and "skipped" not in out, out
