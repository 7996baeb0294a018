"""Judgement (b) for a vocabulary-parallel impl: every assembled output and every rank's grad_x judged as on one
device (:func:`numcheck.properties.core.relative.relative_judgement`: RMSE(impl − oracle) ≤ k(n_eff)·RMSE(yardstick −
oracle) + λ(α)·RMS(E), the same k, λ and α), against a yardstick that follows the declaration.

The yardstick is numcheck's evaluation of the declared path (:mod:`numcheck.properties.linear_ce.declared_path`) at the
case's world size: logits in the declared dtype (fp32 where ``logits_dtype="float32"``, where eager would round them
to the compute dtype), the softmax and G in fp32 math, the rank partials of grad_x formed in the logits' dtype
(in fp32 where the reduction is declared in fp32), rounded to the declared ``grad_x_reduce_dtype`` and summed in it
in rank order, then rounded to x's dtype; grad_W and grad_b along the rank's declared accumulation path. An impl
is so held to the accuracy of an honest implementation of what it declares, not of eager, which keeps less (bf16
logits, one bf16 GEMM for grad_x). E is the expected level (√n·u per reduction) of the sharded model
(:func:`numcheck.properties.distributed.linear_ce.tolerance.dist_error_model`) with each output's last rounding at
the finer of the impl's and the yardstick's dtypes.

An output a recorded known divergence covers (:mod:`numcheck.properties.distributed.linear_ce.known`) is recorded, not
judged: the divergence is a rounding the declaration does not state, so no honest evaluation of the declaration
is its yardstick; (a) still judges it under the divergence's model.
"""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls.protocols.dist_linear_ce import shard_bounds
from numcheck.properties.core.relative import RelativeJudgement, relative_judgement
from numcheck.properties.distributed.linear_ce.tolerance import dist_error_model
from numcheck.properties.linear_ce.cases import Problem, Tensors
from numcheck.properties.linear_ce.declared_path import DeclaredPath, path_errors
from numcheck.properties.linear_ce.tolerance import linear_ce_bounds, unit_roundoff


def dist_path(impl: Any, p: Problem, world_size: int, x_dtype: torch.dtype) -> DeclaredPath:
    """The declared path of a vocabulary-parallel impl at ``world_size`` (module docstring)."""
    s = impl.support
    reduce = torch.float32 if impl.dist.grad_x_reduce_dtype == "float32" else x_dtype
    return DeclaredPath(
        logits_fp32=getattr(s, "logits_dtype", "compute") == "float32",
        grad_accumulation=s.grad_accumulation,
        chunk_rows=getattr(s, "chunk_rows", None) or 1,
        grad_x_parts=tuple(shard_bounds(p.V, world_size, r) for r in range(world_size)),
        reduce_dtype=reduce,
    )


def _finer(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return a if unit_roundoff(a) <= unit_roundoff(b) else b


def dist_relative(
    impl: Any,
    p: Problem,
    world_size: int,
    t: Tensors,
    ref: Any,
    pairs: list[tuple[str, torch.Tensor | None]],
    known: dict[str, str],
) -> dict[str, RelativeJudgement]:
    """Judgement (b) of each ``(label, value)`` of ``pairs`` (an output name, or ``grad_x[rank i]``) of one run at
    ``world_size`` on the oracle tensors ``t`` (oracle ``ref``); ``known``: output → the reason of a known
    divergence covering it (recorded, not judged)."""
    path = dist_path(impl, p, world_size, t.x.dtype)
    yard = path_errors(path, p, t, ref)
    dtypes = {lab.split("[")[0]: v.dtype for lab, v in pairs if isinstance(v, torch.Tensor)}
    slack = {n: _finer(d, yard[n][1]) if n in yard else d for n, d in dtypes.items()}
    expected = linear_ce_bounds(p, t, ref, dist_error_model(impl, p, slack, world_size, level="expected"))
    out = {}
    for label, value in pairs:
        key = label.split("[")[0]
        oracle = getattr(ref, key, None)
        if value is None or oracle is None or key not in yard:
            continue
        note = f"not judged: known divergence ({known[key]})" if key in known else ""
        out[label] = relative_judgement(
            label, value, oracle, yard[key], expected[key], note=note, yardstick=path.describe()
        )
    return out
