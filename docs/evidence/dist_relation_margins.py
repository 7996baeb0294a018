"""How the world-size relation's margins moved, per held-in distributed impl: the worst error/bound of each output
of the run at P against the run at P = 1, under the old tolerance (the sum of the two runs' analytic bounds) and
under the relation's (properties/distributed/linear_ce/tolerance.py, ``relation_bounds``), on fixed cases; and the
measurement behind the relation's item 6 (an fp32 GEMM of a shard is not bitwise the same rows of the full one).

Run from a checkout: ``PYTHONPATH=$PWD python docs/evidence/dist_relation_margins.py`` (gloo, 4 ranks; the output
is dist_relation_margins.txt beside this file).
"""

from __future__ import annotations

import torch

from numcheck.impls.builtin.vocab_parallel import vocab_parallel_impls
from numcheck.properties.core import matmul_precision
from numcheck.properties.core.compare import compare
from numcheck.properties.distributed.linear_ce.cases import DistCase
from numcheck.properties.distributed.linear_ce.props import (
    OUTPUT_NAMES,
    _bounds,
    invariance_cases,
    oracle_tensors,
    run_case,
)
from numcheck.properties.distributed.linear_ce.tolerance import relation_bounds
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.harness import run_oracle
from numcheck.tests.self.helpers import dist_mutants, dist_reduce

CASES = [
    Problem(N=24, H=16, V=37, dtype="bfloat16", bias=True, reduction="mean", seed=0),
    Problem(N=24, H=16, V=37, dtype="float32", reduction="sum", label_smoothing=0.1, seed=1),
    Problem(N=8, H=16, V=30, dtype="bfloat16", reduction="sum", regime="anisotropic_head", seed=2),
    Problem(
        N=6,
        H=12,
        V=41,
        dtype="float32",
        reduction="none",
        upstream="per_row",
        z_loss_scale=1e-3,
        regime="anisotropic_head",
        seed=3,
    ),
]


def margins(impl, p: Problem, P: int) -> tuple[float, float]:
    """(old, new) worst error/bound over every output of ``p`` at ``P`` against ``p`` at 1."""
    ca, cb = invariance_cases(impl, DistCase(p, P))
    ra, rb = run_case(impl, ca), run_case(impl, cb)
    va, vb = ra.assembled(), rb.assembled()
    _, ba = _bounds(impl, ca, va)
    _, bb = _bounds(impl, cb, vb)
    t = oracle_tensors(impl, cb)
    ref = run_oracle(p, t, all_ignored=impl.support.all_ignored or "nan")
    rel = relation_bounds(impl, p, t, ref, {k: v.dtype for k, v in vb.items() if v is not None}, (1, P))
    old = new = 0.0
    for n in OUTPUT_NAMES:
        if vb[n] is None or va[n] is None:
            continue
        old = max(old, compare(n, vb[n], va[n].double(), ba[n] + bb[n]).ratio)
        new = max(new, compare(n, vb[n], va[n].double(), rel[n]).ratio)
    return old, new


def shard_gemm_differs() -> str:
    """How many fp32 shard GEMMs differ from the same columns of the full product (and bf16 ones)."""
    g = torch.Generator().manual_seed(0)
    lines = []
    for dt in (torch.float32, torch.bfloat16):
        differ = total = 0
        for N, H, V in ((17, 24, 48), (40, 32, 37), (64, 100, 256)):
            x, w = torch.randn(N, H, generator=g).to(dt), torch.randn(V, H, generator=g).to(dt)
            full = torch.nn.functional.linear(x, w)
            for P in (2, 4):
                lo = 0
                for r in range(P):
                    hi = lo + V // P + (1 if r < V % P else 0)
                    total += 1
                    differ += not torch.equal(torch.nn.functional.linear(x, w[lo:hi].contiguous()), full[:, lo:hi])
                    lo = hi
        lines.append(f"{dt}: {differ} of {total} shard GEMMs differ bitwise from the full product's columns")
    return "\n".join(lines)


def main() -> None:
    impls = [
        *vocab_parallel_impls()[:1],
        *dist_mutants.dist_impls(),
        dist_reduce.fp32_reduce,
        dist_reduce.bf16_reduce_declared_input,
        dist_reduce.bf16_reduce_declared_fp32,
    ]
    print(f"torch {torch.__version__}\n{shard_gemm_differs()}\n")
    print("| impl | case | P | old (sum of bounds) | relation |\n| --- | --- | --- | --- | --- |")
    with matmul_precision.pinned():
        for impl in impls:
            for p in CASES:
                if impl.support.dtypes and getattr(torch, p.dtype) not in impl.support.dtypes:
                    continue
                if (p.label_smoothing and "label_smoothing" not in impl.support.options) or (
                    p.z_loss_scale and "z_loss" not in impl.support.options
                ):
                    continue
                for P in (2, 4):
                    old, new = margins(impl, p, P)
                    print(f"| {impl.name} | {p.short()} | {P} | {old:.3g} | {new:.3g} |", flush=True)


if __name__ == "__main__":
    main()
