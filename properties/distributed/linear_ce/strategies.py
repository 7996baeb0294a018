"""Hypothesis strategies of distributed linear+CE cases (:class:`~numcheck.properties.distributed.linear_ce.cases.DistCase`),
inside what a distributed impl declares: small problems (each call runs on up to 4 ranks on a 2-core machine),
the target placements drawn on purpose (shard boundaries, one rank owning every target), ignored rows (every
rank sees every row), and V divisible by the world size only for impls that need it."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import assume
from hypothesis import strategies as st

from numcheck.properties.distributed.linear_ce.cases import PLACEMENTS, DistCase
from numcheck.properties.distributed.pool.pool import default_backend
from numcheck.properties.linear_ce.cases import HEAD_REGIME, REGIMES, Problem

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def draw_case(impl: Any, data: Any, world_size: int, cancelling: bool = False) -> DistCase:
    """One case for ``impl`` at ``world_size`` (rejected with ``assume`` where the Problem's own rules refuse it).

    ``cancelling``: half the draws take the ``anisotropic_head`` regime (N < H; :data:`HEAD_REGIME`), whose head
    rows share a mean direction that the exact grad_x = Σ_j G_ij·W_j cancels (Σ_j G_ij = 0) while each shard's
    partial Σ_{j∈V_r} G_ij·W_j carries it: the partials of grad_x's reduction are then large against their sum,
    which is where the dtype they are reduced in shows (the world-size relation's draws)."""
    s, opts = impl.support, impl.support.options
    P = world_size
    V = data.draw(st.integers(max(P, 2), 48), label="V")
    if not impl.dist.uneven_vocab:
        V = max(P, V - V % P)
    dtypes = sorted(_DTYPE_NAMES[d] for d in s.dtypes if d in _DTYPE_NAMES)
    reductions = sorted(s.reductions)
    reduction = data.draw(st.sampled_from(reductions), label="reduction")
    if cancelling and data.draw(st.booleans(), label="cancelling head"):
        H = data.draw(st.integers(2, 24), label="H")
        N, regime = data.draw(st.integers(1, H - 1), label="N"), HEAD_REGIME
    else:
        N, H = data.draw(st.integers(1, 40), label="N"), data.draw(st.integers(1, 24), label="H")
        regime = data.draw(st.sampled_from(REGIMES), label="regime")
    kw: dict[str, Any] = dict(
        N=N,
        H=H,
        V=V,
        dtype=data.draw(st.sampled_from(dtypes), label="dtype"),
        reduction=reduction,
        regime=regime,
        seed=data.draw(st.integers(0, 2**16), label="seed"),
    )
    if "bias" in opts:
        kw["bias"] = data.draw(st.booleans(), label="bias")
    if "ignore_index" in opts:
        choices = [0.0, 0.25] + ([1.0] if s.all_ignored is not None else [])
        kw["ignored"] = data.draw(st.sampled_from(choices), label="ignored")
        if data.draw(st.booleans(), label="pad class ignore_index"):
            kw["ignore_index"] = data.draw(st.integers(0, V - 1), label="ignore_index")
    if "label_smoothing" in opts:
        kw["label_smoothing"] = data.draw(st.sampled_from([0.0, 0.1, 0.4]), label="label_smoothing")
    if "class_weights" in opts:
        kw["class_weights"] = data.draw(st.booleans(), label="class_weights")
    if "softcap" in opts:
        kw["softcap"] = data.draw(st.sampled_from([None, 3.0, 30.0]), label="softcap")
    if "z_loss" in opts:
        kw["z_loss_scale"] = data.draw(st.sampled_from([0.0, 1e-3, 0.2]), label="z_loss_scale")
    kw["upstream"] = data.draw(
        st.sampled_from(["one", "per_row"] if reduction == "none" else ["one", "scalar"]), label="upstream"
    )
    try:
        p = Problem(**kw)
    except ValueError:
        assume(False)
        raise  # unreachable: assume(False) raises
    placement = data.draw(st.sampled_from(PLACEMENTS), label="placement")
    owner = data.draw(st.integers(0, P - 1), label="owner")
    return DistCase(p, P, default_backend(), placement, owner)
