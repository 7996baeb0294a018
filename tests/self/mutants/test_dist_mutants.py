"""Every distributed mutant (one vocabulary-parallel bug each, tests/self/helpers/dist_mutants.py) is caught by
the ci profile's dist_accuracy at world size 4 with a house-format failure naming the impl, world size and
backend, and a repro line that runs as printed; a deadlocking impl fails one case within its timeout without
stopping the run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.vocab_parallel import VocabParallelCE
from numcheck.properties.distributed.linear_ce.props import dist_accuracy
from numcheck.properties.distributed.linear_ce.suite import run_property
from numcheck.properties.distributed.pool import pool as dh
from numcheck.properties.distributed.pool.pool import RankFailure
from numcheck.tests.self.helpers.dist_mutants import dist_impls

MUTANTS = dist_impls()


def _world_size() -> int:
    """World size 4, or the most ranks (at least 2) the backend runs here (nccl: one GPU per rank)."""
    P = next((p for p in (4, 2) if dh.world_size_unavailable(p, dh.default_backend()) is None), None)
    if P is None:
        pytest.skip(f"the mutants need P >= 2: {dh.world_size_unavailable(2, dh.default_backend())}")
    return P


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_caught_by_ci_profile(mutant):
    """The ci profile's dist_accuracy at world size 4 (2 on a 2-GPU nccl host) fails on the mutant, in the house format (found in the
    generate phase; not shrunk, which only minimises the case)."""
    P = _world_size()
    with pytest.raises(PropertyFailure) as info:
        run_property(dist_accuracy, mutant, P, "numcheck-ci", shrink=False)
    msg = str(info.value)
    assert f"fails for impl {mutant.name!r} (world size {P}, {dh.default_backend()})" in msg
    assert (
        'reproduce: python -m numcheck.properties.distributed.linear_ce.props --impl "numcheck.tests.self.helpers.dist_mutants:'
        in msg
    )


class _Deadlock(VocabParallelCE):
    """Rank 1 never joins the max all-reduce: every call deadlocks."""

    def rank_call(self, x, weight, target, bias=None, *, group, vocab_start, vocab_size, **options):
        import torch.distributed as dist

        if dist.get_rank(group) == 1:
            time.sleep(3600)
        return super().rank_call(
            x, weight, target, bias, group=group, vocab_start=vocab_start, vocab_size=vocab_size, **options
        )


DEADLOCK = _Deadlock("deadlock_dist", "nan")


def test_deadlocking_impl_fails_one_case_within_timeout(monkeypatch):
    """A deadlocking impl fails its first case as a timeout, once: no further case runs into the timeout (no
    shrinking through timeouts). Counted on the pool's calls, not timed (a wall-clock cap fails under load)."""
    monkeypatch.setattr("numcheck.properties.distributed.linear_ce.props.DEFAULT_TIMEOUT_S", 5.0)
    monkeypatch.setattr(DEADLOCK, "spec_module", __name__, raising=False)
    why = dh.world_size_unavailable(2, dh.default_backend())
    if why:
        pytest.skip(why)
    calls, timeouts, run = [0], [0], dh.DistPool.run

    def counted(self, *args, **kwargs):
        calls[0] += 1
        try:
            return run(self, *args, **kwargs)
        except RankFailure as exc:
            timeouts[0] += exc.kind == "timeout"
            raise

    monkeypatch.setattr(dh.DistPool, "run", counted)
    with pytest.raises(RankFailure) as info:
        run_property(dist_accuracy, DEADLOCK, 2, "numcheck-ci")
    assert info.value.kind == "timeout" and info.value.rebuilt
    assert any("case: DistCase(" in n for n in info.value.__notes__)
    assert (calls[0], timeouts[0]) == (1, 1)


def test_printed_repro_line_runs_as_printed(monkeypatch):
    """A distributed failure's printed repro line, run in a shell as printed (``python`` being this interpreter),
    fails again with the same failure header."""
    monkeypatch.setenv(
        "NUMCHECK_DIST_PRELOAD", "numcheck.properties.distributed.linear_ce.props"
    )  # no megatron: a quick start
    mutant = next(m for m in MUTANTS if "TargetOffset" in m.name)
    with pytest.raises(PropertyFailure) as info:
        run_property(dist_accuracy, mutant, _world_size(), "numcheck-ci", shrink=False)
    msg = str(info.value)
    line = msg.rsplit("reproduce: ", 1)[1].strip()
    bindir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    if not os.path.exists(os.path.join(bindir, "python")):
        pytest.skip(f"no `python` beside {sys.executable}")
    out = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert msg.splitlines()[0] in out.stdout
