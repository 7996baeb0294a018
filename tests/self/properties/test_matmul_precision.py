"""The GEMM precision numcheck judges under (numcheck.properties.core.matmul_precision): cuBLAS's reduced-precision
reductions and TF32 off inside every judgement (the suite's runner, the public assertions, the command line and
every distributed rank), and the caller's settings back afterwards."""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Iterator

import pytest
import torch
import torch.nn.functional as F

import numcheck
from numcheck.properties.core import matmul_precision as mp
from numcheck.properties.core import runner
from numcheck.properties.core.runner import SuiteProperty
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.props import accuracy

MATMUL = torch.backends.cuda.matmul


def _state() -> dict[str, Any]:
    return {**mp._flags(), "float32": torch.get_float32_matmul_precision()}


PINNED_STATE = {**{k: v for k, v in mp.PINNED_FLAGS.items() if k in mp._flags()}, "float32": mp.FLOAT32_PRECISION}


@contextlib.contextmanager
def permissive() -> Iterator[dict[str, Any]]:
    """The caller's state set to the opposite of what numcheck pins, inside the block (numcheck's plugin pins
    its own tests' bodies, so the test sets it itself)."""
    saved = _state()
    try:
        for k in mp._flags():
            setattr(MATMUL, k, True)
        torch.set_float32_matmul_precision("medium")
        yield _state()
    finally:
        for k in mp._flags():
            setattr(MATMUL, k, saved[k])
        torch.set_float32_matmul_precision(saved["float32"])


def test_numcheck_tests_run_pinned():
    """numcheck's plugin runs each of numcheck's own tests (the suite's among them) pinned."""
    assert _state() == PINNED_STATE


def test_pinned_sets_and_restores():
    """Inside pinned() every flag has numcheck's value; after it, also after an exception, the caller's."""
    with permissive() as before:
        assert before != PINNED_STATE
        with mp.pinned():
            assert _state() == PINNED_STATE
            with mp.pinned():
                assert _state() == PINNED_STATE
            assert _state() == PINNED_STATE
        assert _state() == before
        with pytest.raises(KeyError):
            with mp.pinned():
                raise KeyError("inside")
        assert _state() == before


def _recording_impl(seen: list[dict[str, Any]]) -> Any:
    """A correct fp32 linear+CE impl that records the flags in its forward and in its backward."""

    def keep(g: torch.Tensor) -> torch.Tensor:
        seen.append(_state())
        return g

    @numcheck.linear_ce_impl(name="records_matmul_flags", dtypes=("float32",), autocast=())
    def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
        seen.append(_state())
        logits = F.linear(x, weight, bias)
        if logits.requires_grad:
            logits.register_hook(keep)
        return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)

    return impl


def test_assertion_judges_pinned():
    """assert_linear_ce runs the impl's forward and backward pinned, and leaves the caller's flags as they were."""
    with permissive() as before:
        seen: list[dict[str, Any]] = []
        numcheck.assert_linear_ce(_recording_impl(seen), N=4, H=8, V=16)
        assert len(seen) >= 2 and all(s == PINNED_STATE for s in seen)
        assert _state() == before


def test_suite_runner_judges_pinned():
    """The suite's runner (pytest plugin, numcheck.check, the sweep) judges each example pinned."""
    with permissive() as before:
        seen: list[dict[str, Any]] = []
        prop = SuiteProperty("accuracy", accuracy, draw=lambda impl, data: Problem(N=4, H=8, V=16))
        runner._judged(prop, _recording_impl(seen), Problem(N=4, H=8, V=16))
        assert len(seen) >= 2 and all(s == PINNED_STATE for s in seen)
        assert _state() == before


def test_command_line_runs_pinned(monkeypatch):
    """Every judging numcheck subcommand runs pinned; bench and memory, which measure, run under the caller's
    settings."""
    from numcheck.reports import cli

    with permissive() as before:
        seen: dict[str, dict[str, Any]] = {}
        commands = {}
        for name in ("fake", "bench", "memory"):
            fake = types.ModuleType(f"numcheck_fake_{name}")
            fake.HELP = "records the flags"
            fake.add_arguments = lambda p: None
            fake.run = lambda args: seen.__setitem__(args.command, _state()) or 0
            monkeypatch.setitem(sys.modules, fake.__name__, fake)
            commands[name] = fake.__name__
        monkeypatch.setattr(cli, "COMMANDS", commands)
        for name in commands:
            assert cli.main([name]) == 0
        assert seen == {"fake": PINNED_STATE, "bench": before, "memory": before}
        assert _state() == before


def test_distributed_ranks_run_pinned():
    """Every rank's call runs pinned, whatever the rank process's own defaults."""
    from numcheck.properties.distributed.pool.pool import DistPool
    from numcheck.tests.self.helpers import dist_fns

    out = DistPool.get(2, "gloo").run(dist_fns.matmul_flags_rank, None)
    assert out == [PINNED_STATE, PINNED_STATE]


def test_describe_names_every_pinned_flag():
    """The environment line names each flag this torch has, with the value numcheck sets."""
    line = mp.describe()
    for k in mp._flags():
        assert f"{k}={mp.PINNED_FLAGS[k]}" in line
    assert repr(mp.FLOAT32_PRECISION) in line
