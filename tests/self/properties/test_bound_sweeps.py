"""The shared bound sweep (:func:`properties.linear_ce.tolerance.sweep_bounds`: the oracle's pass 1 once, its blocks walked
without re-accumulating the oracle's gradients, each block's model-independent products formed once for many
error models) gives the bounds of the one-model evaluation bit for bit, for every declaration of the registry at
both levels, on a spread of small problems (options, dtypes, reductions, upstreams, several oracle blocks)."""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.registry import by_kind, discover
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.harness import run_oracle
from numcheck.properties.linear_ce.strategies import refusal
from numcheck.properties.linear_ce.tolerance import (
    _linear_ce_bounds_two_runs,
    error_model,
    linear_ce_bounds,
    linear_ce_bounds_many,
    sweep_key,
)
from numcheck.reference.linear_ce import DEFAULT_ROW_CHUNK, DEFAULT_VOCAB_CHUNK

PROBLEMS = [
    Problem(N=37, H=16, V=61, seed=1),
    Problem(N=30, H=6, V=50, dtype="bfloat16", reduction="sum", upstream="scalar", bias=True, seed=6),
    Problem(N=20, H=8, V=33, dtype="bfloat16", bias=True, ignored=0.2, seed=2),
    Problem(
        N=24,
        H=8,
        V=40,
        dtype="float16",
        softcap=5.0,
        z_loss_scale=1e-3,
        label_smoothing=0.1,
        class_weights=True,
        seed=3,
    ),
    Problem(N=16, H=8, V=30, dtype="float32", autocast="bfloat16", upstream="loss_scale", seed=4),
    Problem(N=12, H=4, V=9, dtype="bfloat16", reduction="none", ignored=0.5, upstream="per_row", seed=5),
    Problem(N=DEFAULT_ROW_CHUNK + 5, H=2, V=7, dtype="bfloat16", bias=True, seed=8),  # two row blocks
    Problem(N=3, H=2, V=DEFAULT_VOCAB_CHUNK + 3, dtype="float16", z_loss_scale=1e-2, seed=9),  # two vocab blocks
]


def _models(p: Problem) -> list:
    """Every registered declaration that takes ``p``, at both levels, with the dtypes an impl returns."""
    dtypes = {
        "loss": torch.float32,
        "z_loss": torch.float32,
        "grad_x": p.param_dtype,
        "grad_weight": p.param_dtype,
        "grad_bias": p.param_dtype,
    }
    impls = [e.impl for e in by_kind(discover([]), "linear-ce")]
    models = [
        error_model(i.support, p, dtypes, level)
        for i in impls
        if refusal(i.support, p) is None
        for level in ("hard", "expected")
    ]
    return list({repr(m): m for m in models}.values())


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: f"{p.dtype}-{p.N}x{p.H}x{p.V}-{p.reduction}-s{p.seed}")
def test_shared_sweep_equals_one_model_sweeps_bitwise(p: Problem) -> None:
    """Every bound of every model from one shared sweep equals the one-model evaluation's, bit for bit."""
    t = build(p)
    ref = run_oracle(p, t, all_ignored="nan")
    models = _models(p)
    assert len({repr(sweep_key(m)) for m in models}) > 1, "the spread must share a sweep between different models"
    many = linear_ce_bounds_many(p, t, ref, models)
    for m, got in zip(models, many):
        want = _linear_ce_bounds_two_runs(p, t, ref, m)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), f"{name} differs for {m!r}"


def test_one_model_entry_point_is_the_shared_path():
    """linear_ce_bounds of one model equals its bounds from a sweep shared with other models."""
    p = PROBLEMS[3]
    t = build(p)
    ref = run_oracle(p, t, all_ignored="nan")
    models = _models(p)
    alone = linear_ce_bounds(p, t, ref, models[-1])
    shared = linear_ce_bounds_many(p, t, ref, models)[-1]
    assert all(torch.equal(alone[k], shared[k]) for k in alone)
