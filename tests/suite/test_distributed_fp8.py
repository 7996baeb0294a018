"""Tensor/sequence-parallel FP8 linears on gloo ranks, judged against the unsharded float64 oracle.

Parametrized over every loaded impl of kind ``tp_quant_linear`` (the plugin's ``tp_fp8_linear_impl`` fixture: the built-ins
of :func:`numcheck.impls.builtin.tp_fp8_linear.tp_fp8_linear_impls`, or those ``--impl`` names); cases are
drawn inside each declaration (:mod:`numcheck.properties.distributed.tp_fp8.suite`), the ranks are the harness's persistent
pools (:mod:`numcheck.properties.distributed.pool.pool`). Failures name impl, case, output, error, bound, worst element and
the repro line (:mod:`numcheck.properties.distributed.tp_fp8.props`).
"""

from __future__ import annotations

import pytest
import torch

from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
from numcheck.properties.distributed.tp_fp8 import props as checks
from numcheck.properties.distributed.tp_fp8.cases import TPFp8Case
from numcheck.properties.distributed.tp_fp8.suite import run_drawn


def _sizes(tp_impl) -> list[int]:
    """The impl's declared world sizes the backend can run here (nccl: at most one rank per visible GPU)."""
    return [p for p in tp_impl.support.world_sizes if world_size_unavailable(p, default_backend()) is None]


def _pinned(tp_impl) -> dict:
    """No pin where every declared size can run; else the world size pinned to the largest that can (on one GPU
    under nccl that is P = 1, the smoke check), skipping when none can."""
    sizes = _sizes(tp_impl)
    if not sizes:
        pytest.skip(world_size_unavailable(min(tp_impl.support.world_sizes), default_backend()))
    return {} if sizes == list(tp_impl.support.world_sizes) else {"world": max(sizes)}


#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")
pytestmark = [
    pytestmark,
    pytest.mark.torch_versions_impls(
        "tp_fp8_linear[current]", reason="torch.distributed (gloo) of this torch with FP8, on one recipe"
    ),
]


def test_dist_accuracy_and_same_scale(tp_fp8_linear_impl):
    """At P = 2 and 4 the assembled outputs are within the sharded bounds of both references, replicated outputs
    agree on every rank, and every rank quantizes each operand with the oracle's global scale (or its blocks)."""
    tp_impl = tp_fp8_linear_impl
    run_drawn(tp_impl, "dist_accuracy_and_same_scale", **_pinned(tp_impl))


def test_world_size_invariance(tp_fp8_linear_impl):
    """The outputs at P = 1, 2 and 4 agree within the sum of their bounds against the dequantized reference."""
    tp_impl = tp_fp8_linear_impl
    if len(_sizes(tp_impl)) < 2:
        pytest.skip(
            f"fewer than two of world sizes {tp_impl.support.world_sizes} can run here: "
            f"{world_size_unavailable(max(tp_impl.support.world_sizes), default_backend())}"
        )
    run_drawn(tp_impl, "world_size_invariance")


def test_save_original_input_bitwise_under_sp(tp_fp8_linear_impl):
    """Column-parallel with SP: save_original_input True (the gathered original requantized in backward) and False
    give bitwise identical outputs on every rank."""
    tp_impl = tp_fp8_linear_impl
    if True not in tp_impl.support.save_original_input or not any(
        r.allows_save_original_input for r in tp_impl.support.recipes
    ):
        pytest.skip(f"{tp_impl.name} declares no recipe with save_original_input=True")
    run_drawn(tp_impl, "dist_save_original_input", **_pinned(tp_impl))


@pytest.mark.parametrize("parallel", ["column", "row"])
def test_determinism(tp_fp8_linear_impl, parallel):
    """Declared deterministic: two runs of one case (sequence-parallel where declared, bfloat16 where declared) at
    P = 4 (the most ranks the backend runs here) agree bitwise on every rank."""
    tp_impl = tp_fp8_linear_impl
    if not tp_impl.support.deterministic:
        pytest.skip(f"{tp_impl.name} does not declare deterministic")
    P = max([p for p in _sizes(tp_impl) if p > 1], default=None)
    if P is None:
        pytest.skip(f"determinism runs at P > 1: {world_size_unavailable(2, default_backend())}")
    s = tp_impl.support
    if parallel not in s.parallel:
        pytest.skip(f"{tp_impl.name} does not declare {parallel}-parallel")
    sp = True in s.sequence_parallel  # SP where declared: its gathers are where nondeterminism would enter
    dtype = "bfloat16" if torch.bfloat16 in s.dtypes else str(sorted(s.dtypes, key=str)[0]).removeprefix("torch.")
    r = s.recipes[0]
    edge = {"blockwise": 128, "mxfp8": 32}.get(r.kind, 1) * 4
    M, K, N = (
        (36, 40, edge * 3 if edge == 4 else edge) if parallel == "column" else (36, edge * 3 if edge == 4 else edge, 24)
    )
    checks.dist_determinism(
        tp_impl,
        TPFp8Case(
            r,
            M,
            K,
            N,
            dtype=dtype,
            bias=s.bias,
            regime="normal",
            seed=7,
            save_original_input=False,
            steps=2 if r.kind == "delayed" else 1,
            world=P,
            parallel=parallel,
            sequence_parallel=sp,
        ),
    )
