"""The distributed harness (numcheck.properties.distributed.pool.pool): persistent gloo ranks, results per rank on the CPU,
a raising, hung or killed rank failing its call within its timeout with the rank named, the pool rebuilt after
it, no process group outliving its call, the latch that fails a timed-out case once outside hypothesis, and the
ranks' two start methods (forked from the zygote, or programs); numcheck's plugin closes the pools after a module."""

from __future__ import annotations

import subprocess
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numcheck.properties.distributed.pool import pool as dh
from numcheck.properties.distributed.pool.pool import DistPool, FailureLatch, RankFailure
from numcheck.properties.distributed.pool.zygote import PRELOAD_ENV, Zygote
from numcheck.tests.self.helpers import dist_fns

#: Seconds beyond a call's timeout (or the grace after a raise) its failure may take to come back: killing the
#: ranks and reading their replies, on the loaded 2-core machine.
SLACK_S = 15.0


def test_every_rank_answers_with_cpu_tensors():
    """Every rank runs the call on its own argument and its result comes back, tensors on the CPU."""
    pool = DistPool.get(2, "gloo")
    out = pool.run(dist_fns.allreduce_rank, None, timeout_s=dh.DEFAULT_TIMEOUT_S)
    assert [t.tolist() for t in out] == [[3.0], [3.0]]
    assert all(t.device.type == "cpu" for t in out)


def test_pool_persists_across_calls():
    """DistPool.get returns the same live pool (the same rank processes) for repeated calls."""
    pool = DistPool.get(2, "gloo")
    pids = [r.process.pid for r in pool.ranks]
    for _ in range(3):
        pool.run(dist_fns.allreduce_rank, None)
    again = DistPool.get(2, "gloo")
    assert again is pool and [r.process.pid for r in again.ranks] == pids


def test_the_plugin_closes_the_pools_after_a_modules_last_test():
    """numcheck's plugin keeps this process's rank pools between tests of one module and closes them when the next
    test is in another module, or there is none (an idle rank's gloo loop threads wake 100 times a second)."""
    from types import SimpleNamespace

    from numcheck.tests import plugin

    module, other = object(), object()
    pool = DistPool.get(2, "gloo")
    plugin._close_rank_pools(SimpleNamespace(module=module), SimpleNamespace(module=module))
    assert DistPool.get(2, "gloo") is pool and pool.alive()
    plugin._close_rank_pools(SimpleNamespace(module=module), SimpleNamespace(module=other))
    assert not pool.ranks and not pool.alive()
    pool = DistPool.get(2, "gloo")
    assert pool.run(dist_fns.allreduce_rank, None)[0].tolist() == [3.0]  # a module that uses one again starts one
    plugin._close_rank_pools(SimpleNamespace(module=module), None)
    assert not pool.ranks and not DistPool._pools


def test_raising_rank_is_named_with_its_traceback_and_pool_kept():
    """A rank that raises while the others answer fails the call naming that rank and its traceback; every rank
    answered, so the pool stays up."""
    pool = DistPool.get(2, "gloo")
    with pytest.raises(RankFailure) as info:
        pool.run(dist_fns.raise_on_rank, [1, 1])
    e = info.value
    assert (e.rank, e.kind, e.rebuilt) == (1, "raised", False)
    assert "ZeroDivisionError: rank 1 divides by zero on purpose" in str(e)
    assert DistPool.get(2, "gloo") is pool and pool.run(dist_fns.raise_on_rank, [5, 5]) == [0, 1]


def test_raise_while_others_wait_is_reported_not_timed_out():
    """A rank that raises before a collective the others entered is the failure reported (not a timeout), within
    GRACE_S: the waiting ranks either see the call's group torn down and raise too, or are killed; the next
    call works either way."""
    pool = DistPool.get(2, "gloo")
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool.run(dist_fns.raise_then_others_wait, [0, 0], timeout_s=300)
    took = time.monotonic() - t0
    assert (info.value.rank, info.value.kind) == (0, "raised")
    assert "fails before the all-reduce" in str(info.value)
    assert took < dh.GRACE_S + SLACK_S, took
    assert DistPool.get(2, "gloo").run(dist_fns.allreduce_rank, None)[0].item() == 3.0


def test_hung_rank_times_out_within_its_timeout():
    """A deadlocked call fails as a timeout within its timeout (plus the kill), and the pool is rebuilt."""
    pool = DistPool.get(2, "gloo")
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool.run(dist_fns.hang_on_rank, [1, 1], timeout_s=4)
    took = time.monotonic() - t0
    assert (info.value.kind, info.value.rebuilt) == ("timeout", True)
    assert "did not answer within 4 s" in str(info.value)
    assert 4 <= took < 4 + SLACK_S, took
    fresh = DistPool.get(2, "gloo")
    assert fresh is not pool and fresh.run(dist_fns.allreduce_rank, None)[1].item() == 3.0


def test_killed_rank_is_reported_as_died():
    """A rank whose process exits mid-call fails the call as ``died`` with its exit code, long before the
    timeout."""
    pool = DistPool.get(2, "gloo")
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool.run(dist_fns.kill_rank, [1, 1], timeout_s=300)
    assert (info.value.rank, info.value.kind, info.value.rebuilt) == (1, "died", True)
    assert "exit code 9" in str(info.value)
    assert time.monotonic() - t0 < dh.GRACE_S + SLACK_S


def test_leaked_group_fails_the_call():
    """A call that leaves a process group it created undestroyed fails, naming the leak."""
    pool = DistPool.get(2, "gloo")
    with pytest.raises(RankFailure, match="left 1 process group"):
        pool.run(dist_fns.leak_group, None)


def test_wrong_argument_count_is_a_clear_error():
    """Per-rank arguments must be one per rank."""
    with pytest.raises(ValueError, match="3 per-rank arguments for world size 2"):
        DistPool.get(2, "gloo").run(dist_fns.allreduce_rank, [0, 1, 2])


def test_backend_switch(monkeypatch):
    """The backend follows NUMCHECK_DIST_BACKEND, else the suite's device; an unknown one is refused by name."""
    monkeypatch.delenv(dh.BACKEND_ENV, raising=False)
    monkeypatch.setenv("NUMCHECK_DEVICE", "cuda")
    assert dh.default_backend() == "nccl"
    monkeypatch.setenv("NUMCHECK_DEVICE", "cpu")
    assert dh.default_backend() == "gloo"
    monkeypatch.setenv(dh.BACKEND_ENV, "mpi")
    with pytest.raises(ValueError, match="NUMCHECK_DIST_BACKEND='mpi'"):
        dh.default_backend()


def test_nccl_runs_one_rank_per_visible_gpu(monkeypatch):
    """Under nccl a world size above the visible GPU count cannot run (named with both counts); gloo runs any."""

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert dh.world_size_unavailable(2, "nccl") is None
    assert dh.world_size_unavailable(4, "nccl") == "nccl needs one GPU per rank: world size 4, 2 GPU(s) visible"
    assert dh.world_size_unavailable(4, "gloo") is None


def test_latch_fails_a_timeout_once_outside_hypothesis():
    """Under hypothesis, a timed-out example is run once: later examples run nothing, no shrinking re-runs the
    timeout, and the failure (with its case note) is raised after hypothesis' loop."""
    latch = FailureLatch()
    calls: list[int] = []

    @settings(max_examples=20, database=None, deadline=None, derandomize=True)
    @given(n=st.integers(0, 100))
    def body(n):
        calls.append(n)
        out = latch.run(lambda: DistPool.get(2, "gloo"), dist_fns.hang_on_rank, [0, 0], timeout_s=3, note=f"case n={n}")
        if out is None:
            return

    t0 = time.monotonic()
    body()
    with pytest.raises(RankFailure) as info:
        latch.raise_if_failed()
    assert info.value.kind == "timeout"
    assert f"case n={calls[0]}" in info.value.__notes__
    assert time.monotonic() - t0 < 3 + SLACK_S + dh.STARTUP_TIMEOUT_S / 6  # one timeout, one pool start at most


def test_correct_calls_keep_a_wide_margin():
    """An all-reduce round trip at world size 4 (the oversubscribed case) takes far less than DEFAULT_TIMEOUT_S."""
    pool = DistPool.get(4, "gloo")
    t0 = time.monotonic()
    for _ in range(5):
        pool.run(dist_fns.allreduce_rank, None)
    per_call = (time.monotonic() - t0) / 5
    print(f"world size 4 all-reduce call: {per_call:.3f} s; timeout {dh.DEFAULT_TIMEOUT_S:g} s")
    assert per_call * 100 < dh.DEFAULT_TIMEOUT_S


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(dh.start_method() != "fork", reason="ranks are forked from the zygote on Linux only")
def test_ranks_are_forked_from_this_process_zygote():
    """Under the fork start method every rank is a child of this process's zygote, not a fresh program."""
    pool = DistPool.get(2, "gloo")
    zygote = Zygote.get(dh._worker_env(None), dh.STARTUP_TIMEOUT_S)
    assert [_parent_pid(r.process.pid) for r in pool.ranks] == [zygote.process.pid] * 2


@pytest.mark.skipif(dh.start_method() != "fork", reason="the zygote runs on Linux only")
def test_dead_zygote_is_restarted(monkeypatch):
    """A zygote that died is started again on the next pool start, and that pool works."""
    monkeypatch.setenv(PRELOAD_ENV, "numcheck.properties.distributed.pool.worker")  # a quick restart
    old = Zygote.get(dh._worker_env(None), dh.STARTUP_TIMEOUT_S)
    old.process.kill()
    old.process.wait()
    DistPool.close_all()
    pool = DistPool.get(2, "gloo")
    assert Zygote.get(dh._worker_env(None), dh.STARTUP_TIMEOUT_S).process.pid != old.process.pid
    assert pool.run(dist_fns.allreduce_rank, None)[0].item() == 3.0


def test_exec_start_method_runs_ranks_as_programs(monkeypatch):
    """NUMCHECK_DIST_START=exec starts each rank as its own program (subprocess), and the pool works; an unknown
    start method is refused by name."""
    monkeypatch.setenv(dh.START_ENV, "exec")
    pool = DistPool(2, "gloo")
    try:
        assert all(isinstance(r.process, subprocess.Popen) for r in pool.ranks)
        assert pool.run(dist_fns.allreduce_rank, None)[1].item() == 3.0
    finally:
        pool.close()
    monkeypatch.setenv(dh.START_ENV, "spawn")
    with pytest.raises(ValueError, match="NUMCHECK_DIST_START='spawn'"):
        dh.start_method()


def test_nccl_ranks_always_start_as_programs(monkeypatch):
    """nccl ranks are never forked from the zygote (CUDA cannot initialise in a forked child): exec by default,
    and NUMCHECK_DIST_START=fork with nccl is refused by name."""
    monkeypatch.delenv(dh.START_ENV, raising=False)
    assert dh.start_method("nccl") == "exec"
    monkeypatch.setenv(dh.START_ENV, "fork")
    with pytest.raises(ValueError, match="NUMCHECK_DIST_START=fork cannot start nccl ranks"):
        dh.start_method("nccl")
