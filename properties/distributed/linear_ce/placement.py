"""Where a distributed case puts its targets (:class:`~numcheck.properties.distributed.linear_ce.cases.DistCase`'s
``placement``): below both the properties and the known divergences, which decide on the placed tensors."""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls.protocols.dist_linear_ce import shard_bounds
from numcheck.properties.linear_ce.cases import Tensors


def place_targets(t: Tensors, case: Any) -> Tensors:
    """``t`` with its non-ignored targets moved as ``case.placement`` says (the pad class, an ``ignore_index`` in
    [0, V), is never chosen)."""
    if case.placement == "as_built":
        return t
    V, P = case.problem.V, case.layout_world_size
    ii = t.options.ignore_index
    if case.placement == "boundary":
        cand = sorted({c for r in range(P) for c in (shard_bounds(V, P, r)[0], shard_bounds(V, P, r)[1] - 1)})
    else:
        lo, hi = shard_bounds(V, P, case.owner)
        cand = list(range(lo, hi))
    cand = [c for c in cand if c != ii] or [c for c in range(V) if c != ii]
    valid = t.target != ii
    pick = torch.tensor(cand, dtype=t.target.dtype)[torch.arange(t.target.numel()) % len(cand)]
    return t._replace(target=torch.where(valid, pick.to(t.target.device), t.target))
