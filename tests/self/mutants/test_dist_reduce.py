"""A vocabulary-parallel impl declaring ``grad_x_reduce_dtype="float32"`` that rounds each rank's grad_x partial to
bf16 and all-reduces it in bf16 (tests/self/helpers/dist_reduce.py) fails the world-size relation at world
sizes 2 and 4, while its correct twin and the same code declaring ``"input"`` pass; judgement (b) measures every
sharded output against the declared path, which keeps fp32 where the declaration does."""

from __future__ import annotations

import math

import pytest
import torch

from numcheck.errors import PropertyFailure
from numcheck.properties.core import matmul_precision
from numcheck.properties.distributed.linear_ce.cases import DistCase
from numcheck.properties.distributed.linear_ce.props import (
    DistRun,
    dist_world_size_invariance,
    oracle_tensors,
    other_ranks_grad_x,
    run_case,
)
from numcheck.properties.distributed.linear_ce.suite import run_property
from numcheck.properties.distributed.linear_ce.yardstick import dist_relative
from numcheck.properties.distributed.pool import pool as dh
from numcheck.properties.linear_ce.accuracy import eager_errors
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.harness import run_oracle
from numcheck.tests.self.helpers import dist_reduce

#: bf16 cases whose grad_x partials cancel somewhere (the relation's failing elements at P = 2 and 4: 5–27 of 384).
CASES = [
    Problem(N=24, H=16, V=37, dtype="bfloat16", reduction="mean", seed=0),
    Problem(N=24, H=16, V=37, dtype="bfloat16", reduction="none", upstream="per_row", seed=2),
]


def _needs(P: int) -> None:
    why = dh.world_size_unavailable(P, dh.default_backend())
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("p", CASES, ids=[p.short() for p in CASES])
def test_relation_fails_bf16_reduce_declared_fp32(p, P):
    """The defect's grad_x at P is beyond the relation's bound of its P = 1 grad_x; the message names the pair."""
    _needs(P)
    with matmul_precision.pinned(), pytest.raises(PropertyFailure) as info:
        dist_world_size_invariance(dist_reduce.bf16_reduce_declared_fp32, DistCase(p, P))
    msg = str(info.value)
    assert f"grad_x (P={P} against P=1)" in msg and "reduced in float32" in msg
    # Every rank holds the all-reduced grad_x's bits: one line names them all, not one line per rank.
    assert msg.count(f"grad_x (P={P} against P=1)") == 1 and "grad_x[rank" not in msg, msg
    assert ("rank 1 holds" if P == 2 else "ranks 1, 2, 3 hold") + " the same bits" in msg, msg


def test_a_rank_with_other_bits_keeps_its_own_line():
    """Only ranks holding rank 0's grad_x bits fold into its line; a rank whose grad_x differs is judged alone."""
    g = torch.ones(2, 3, dtype=torch.bfloat16)
    run = DistRun([{"grad_x": g}, {"grad_x": g.clone()}, {"grad_x": g + 1}, {"grad_x": None}])
    others, note = other_ranks_grad_x(run)
    assert [i for i, _ in others] == [2, 3] and note == " (rank 1 holds the same bits)"
    assert other_ranks_grad_x(DistRun([{"grad_x": g}, {"grad_x": g * 2}]))[1] == ""


@pytest.mark.parametrize(
    "impl",
    [dist_reduce.fp32_reduce, dist_reduce.bf16_reduce_declared_input],
    ids=["fp32_reduce", "bf16_reduce_declared_input"],
)
@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("p", CASES, ids=[p.short() for p in CASES])
def test_relation_holds_for_what_is_declared(p, P, impl):
    """The correct twin, and the same bf16 reduction declared ``"input"``, pass (a), (b) and the relation."""
    _needs(P)
    with matmul_precision.pinned():
        dist_world_size_invariance(impl, DistCase(p, P))


@pytest.mark.parametrize("P", [2, 4])
def test_ci_profile_draws_catch_it(P):
    """The suite's own draws of the relation (the ci profile, unshrunk: the first failure is enough) fail it."""
    _needs(P)
    with pytest.raises(PropertyFailure):
        run_property(dist_world_size_invariance, dist_reduce.bf16_reduce_declared_fp32, P, "numcheck-ci", shrink=False)


def test_relative_judgement_follows_the_declaration():
    """(b) judges every assembled output and every rank's grad_x against the declared path, whose grad_x keeps the
    declared fp32 reduction and fp32 logits: its error is below eager's (bf16 logits, one bf16 GEMM); the correct
    impl is within it, and a grad_x twice as far off as allowed is not."""
    _needs(2)
    impl, case = (
        dist_reduce.fp32_reduce,
        DistCase(Problem(N=24, H=16, V=37, dtype="bfloat16", bias=True, reduction="sum", seed=4), 2),
    )
    with matmul_precision.pinned():
        run = run_case(impl, case)
        t = oracle_tensors(impl, case)
        ref = run_oracle(case.problem, t, all_ignored="nan")
        out = run.assembled()
        pairs = [(n, out[n]) for n in ("loss", "grad_x", "grad_weight", "grad_bias")] + [
            ("grad_x[rank 1]", run.ranks[1]["grad_x"])
        ]
        rel = dist_relative(impl, case.problem, 2, t, ref, pairs, {})
        eager = eager_errors(case.problem, t, ref)
    assert set(rel) == {"loss", "grad_x", "grad_weight", "grad_bias", "grad_x[rank 1]"}
    assert all(r.judged and r.ok for r in rel.values()), [r.describe() for r in rel.values()]
    gx = rel["grad_x"]
    assert "reduced in float32" in gx.yardstick and "fp32 logits" in gx.yardstick
    assert gx.rmse_eager < eager["grad_x"][0], (gx.rmse_eager, eager["grad_x"][0])
    noise = torch.randn(out["grad_x"].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    off = ref.grad_x + noise * (2 * gx.allowed / math.sqrt(float(noise.square().mean())))
    bad = dist_relative(impl, case.problem, 2, t, ref, [("grad_x", off.to(torch.bfloat16))], {})["grad_x"]
    assert bad.judged and not bad.ok, bad.describe()


def test_repro_run_names_the_user_spec_again():
    """The repro command loads a decorated function by its ``module:attr`` spec as ``--impl`` does, so the
    reproduce line it prints names that spec again (it named ``numcheck.impls.registry:<impl name>``, which
    cannot load a user's impl); a spec that names nothing exits 2 with one line, not a traceback."""
    import subprocess
    import sys

    spec = "numcheck.tests.self.helpers.dist_reduce:bf16_reduce_declared_fp32"
    code = (
        "from numcheck.properties.distributed.linear_ce import props as p\n"
        f"impl = p.load_impl({spec!r})\n"
        "case = p.DistCase(problem=p.Problem(N=4, H=3, V=5, dtype='bfloat16', seed=0), world_size=2, backend='gloo')\n"
        "print(p.repro_command(impl, 'dist_world_size_invariance', case))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f'--impl "{spec}"' in out.stdout, out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "numcheck.properties.distributed.linear_ce.props", "--impl", "no_such_mod_xyz:f"]
        + ["--property", "dist_accuracy", "--case", "None"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "no_such_mod_xyz" in bad.stderr
