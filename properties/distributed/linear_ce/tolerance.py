"""The tolerance model for vocabulary-parallel linear+CE: the single-device model
(:mod:`numcheck.properties.linear_ce.tolerance`) with the terms the sharded reductions add.

A rank r of P holds classes V_r (Σ_r V_r = V) and reduces across ranks:

1. The row maximum (all-reduce MAX): exact, whatever the order.
2. Σ_j exp(z_j − m) as P partials of V_r terms each (fp32), then a sum of the P partials in some order (the
   all-reduce's). Any summation order of n terms, any tree, errs by at most γ_{n−1}·Σ|terms| (Higham, *Accuracy
   and Stability*, §4.2: every term passes through at most n−1 additions); the sharded sum is one such order of
   the V terms, so the model's γ_V(u_a)·Σ p term (step 2, R_i) already covers it. The same holds for the target
   logit (one rank contributes z_y, the others exact zeros) and for smoothing's Σ_j w_j z_j: no new term.
3. grad_x = Σ_r G_r·W_r: each rank's partial (one fp32-accumulated matmul of length V_r, γ_{V_r} ≤ γ_V) is
   rounded to x's dtype, then the P partials are added in x's dtype by the all-reduce (P−1 roundings of running
   sums, in any order). Rounding the partials costs Σ_r u_x|P_r| ≤ u_x·|G||W|; each addition rounds a partial sum
   S_k with |S_k| ≤ |G||W|, so the P−1 additions cost ≤ (P−1)·u_x·|G||W|: P·u_x·|G||W| in all, plus P·η_x below
   the normal range. That is step 5's ``param_dtype`` path over K_V = P chunks, which the model gives as a_x =
   K_V·u_p with u_p = u(x's dtype). An impl declaring ``grad_x_reduce_dtype="float32"`` reduces fp32 partials
   (P·u_a) and rounds once (u_out, already counted).
4. grad_W and grad_b of a shard come from the rank's own matmul over all N rows: the single-device terms with
   the impl's declared row chunking (``chunk_rows``, ``grad_accumulation``), unchanged.
5. The loss: every rank forms it from the global statistics: the single-device terms.

So the only new term is grad_x's all-reduce (item 3).

**The world-size relation** (:func:`relation_bounds`, the property ``dist_world_size_invariance``): one case run at
world sizes P_a and P_b, each output compared with the other run's, element by element, within what may
legitimately differ between the two runs, not within the sum of the two oracle bounds (which contains every
rounding both runs make alike, and so cannot see what (a) cannot). What P changes, under the declaration:

6. The arithmetic upstream of the reduction. A rank's logits come from a GEMM on its [V_r, H] shard (its blocking
   may change with the shape: measured on the CPU, MKL's fp32 GEMM of a shard differs from the same rows of the
   full product in the last bits), the fp32 statistics are summed as P partials (items 1–2), so G and every
   output formed from it differ in the last fp32 bits. Each run is within the single-device terms of these
   evaluations, B_up: the model of the impl's declaration with each output's last rounding at fp32 and grad_x's
   reduction taken out (item 7 counts it); a difference of the two is within B_up(a) + B_up(b), the triangle
   inequality through the exact value. Where the declaration keeps the logits in fp32 (``logits_dtype="float32"``)
   their gradient is held in fp32 up to the rank's partial too (the distributed protocol's reading, and what
   autograd gives: the gradient of an fp32 tensor is fp32), so B_up charges G's formation and scaling at u_a (2u_a),
   not at the compute dtype: B_up is then fp32 throughout. Where the logits are kept in the compute dtype, G is
   too, and a last-bit difference in fp32 may round it to the neighbouring compute-dtype value in one run and not
   the other: B_up keeps the compute dtype's roundings u_L, u_G, and the relation is no sharper than the sum of
   the bounds there.
7. grad_x's reduction at world size P, in the declared dtype, from the rank partials q_r = Σ_{j∈V_r} G_ij·W_jk
   (their exact values from the oracle; an impl's fp32 partial differs from q_r by its share of B_up, so
   |q̂_r| ≤ |q_r| + B_up,r and Σ_r |q̂_r| ≤ M_P := Σ_r |q_r| + B_up):
   ``"input"``: each partial rounded to x's dtype (u_x·|q̂_r| + η_x each), then P − 1 additions in x's dtype in
   any order (γ_{P−1}(u_x)·Σ_r |r̂_r| with |r̂_r| ≤ (1 + u_x)|q̂_r|, plus (P − 1)·η_x):
   F_P = (u_x + γ_{P−1}(u_x)(1 + u_x))·M_P + (2P − 1)·η_x; at P = 1 one rounding, u_x·M_1 + η_x.
   ``"float32"``: the partials added in fp32 (within B_up: any order of the V fp32 terms is γ_V(u_a)) and the sum
   rounded once to x's dtype: F_P = u_x·(|gx| + B_up) + η_x, whatever P.
   So a float32-declared reduction at P and at 1 gives two roundings of nearly equal fp32 values, within about one
   unit in the last place of x's dtype of each other, while partials rounded to bf16 and summed in it differ by
   up to u_x·Σ_r |q_r| from the sum: many units where the partials cancel.
8. Every other output's last rounding into its returned dtype, once in each run: F = u_out·(|v| + B_up) + η_out
   (u_out as the single-device model takes it: doubled when an upstream gradient scales an already rounded one).

Hence |v(P_a) − v(P_b)| ≤ B_up(a) + B_up(b) + F_{P_a} + F_{P_b}, element by element, for every output and for
every rank's grad_x. An impl declaring a float32 reduction that rounds its partials to bf16 fails it wherever the
partials cancel; the same code declaring ``"input"`` is held to F_P of ``"input"`` and passes.
"""

from __future__ import annotations

import dataclasses

import torch

from numcheck.impls.protocols.dist_linear_ce import shard_bounds
from numcheck.properties.linear_ce.cases import Problem, dtype_of
from numcheck.properties.linear_ce.tolerance import (
    U_ACC,
    UNDERFLOW,
    ErrorModel,
    Level,
    error_model,
    gamma,
    linear_ce_bounds,
    unit_roundoff,
)


def dist_error_model(
    impl, p: Problem, out_dtypes: dict[str, torch.dtype], world_size: int, level: Level = "hard"
) -> ErrorModel:
    """The :class:`ErrorModel` of a distributed impl at ``world_size`` (the module docstring's item 3 on top of the
    single-device model of its per-rank declaration ``impl.support``), at ``level``."""
    m = error_model(impl.support, p, out_dtypes, level)
    # u_p is shared with grad_W's path: lowered to fp32's only where grad_W's path does not read it.
    if impl.dist.grad_x_reduce_dtype == "float32" and m.grad_accumulation != "param_dtype":
        return dataclasses.replace(m, grad_x_accumulation="param_dtype", chunks_x=world_size, u_p=U_ACC)
    return dataclasses.replace(
        m, grad_x_accumulation="param_dtype", chunks_x=world_size, u_p=max(unit_roundoff(p.param_dtype), m.u_p)
    )


def upstream_model(impl, p: Problem, world_sizes: tuple[int, ...]) -> ErrorModel:
    """B_up's model (module docstring, item 6): the impl's declaration with every output's last rounding at fp32,
    grad_x's reduction left to F (``"input"``) or in fp32 over the most partials of ``world_sizes``
    (``"float32"``), and G at fp32 where the logits are declared fp32."""
    m = error_model(impl.support, p, {})
    # A bias already held in the compute dtype is not rounded by a cast to it (the single-device model charges
    # u_c·|b| for any low-precision compute dtype; here only a bias of another dtype may round).
    bias_dtype = dtype_of(p.bias_dtype) or p.param_dtype
    m = dataclasses.replace(m, bias_rounding=bool(p.bias) and bias_dtype != p.compute_dtype)
    if getattr(impl.support, "logits_dtype", "compute") == "float32":
        m = dataclasses.replace(m, u_G=2 * U_ACC)
    if impl.dist.grad_x_reduce_dtype == "float32":
        return dataclasses.replace(m, grad_x_accumulation="param_dtype", chunks_x=max(world_sizes), u_p=U_ACC)
    return dataclasses.replace(m, grad_x_accumulation="fp32", chunks_x=1)


class _Partials:
    """A block observer (:func:`numcheck.reference.linear_ce.block_walker`) summing |Σ_{j∈V_r} G_ij·W_jk| over the
    shards of each world size: the exact rank partials of grad_x."""

    def __init__(self, N: int, H: int, V: int, sizes: tuple[int, ...]) -> None:
        self.shards = {P: [shard_bounds(V, P, r) for r in range(P)] for P in sizes}
        self.q = {P: torch.zeros(P, N, H, dtype=torch.float64) for P in sizes}

    def block(self, blk, rows) -> None:  # noqa: ANN001 - the reference's Block and RowStats
        c0, c1 = blk.cols.start, blk.cols.stop
        for P, shards in self.shards.items():
            for r, (lo, hi) in enumerate(shards):
                a, b = max(lo, c0), min(hi, c1)
                if a < b:
                    self.q[P][r, blk.rows] += blk.G[:, a - c0 : b - c0].cpu() @ blk.w[a - c0 : b - c0].cpu()


def partial_magnitudes(p: Problem, t, sizes: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Σ_r |q_r| (module docstring, item 7) for each world size in ``sizes``: [N, H] float64."""
    from numcheck.properties.linear_ce.harness import oracle_operands
    from numcheck.reference.linear_ce import block_walker

    x, w, b = oracle_operands(p, t)
    obs = _Partials(p.N, p.H, p.V, sizes)
    _, walk = block_walker(x, w, t.target, b, options=t.options, upstream=t.upstream, all_ignored="zero")
    walk(obs)
    return {P: q.abs().sum(dim=0) for P, q in obs.q.items()}


def reduction_term(
    impl, m: ErrorModel, gx: torch.Tensor, b_up: torch.Tensor, partial_abs: torch.Tensor, world_size: int
) -> torch.Tensor:
    """F_P of grad_x (module docstring, item 7) for the impl's declared reduce dtype; ``m`` gives u_x and η_x (the
    model of the returned dtypes), ``gx`` the oracle's grad_x, ``b_up`` its B_up, ``partial_abs`` Σ_r |q_r|."""
    u, eta = m.u_out.get("grad_x", U_ACC), m.eta_out.get("grad_x", 0.0)
    if impl.dist.grad_x_reduce_dtype == "float32":
        return u * (gx.abs() + b_up) + eta
    M = partial_abs.to(gx.device) + b_up
    P = world_size
    return (u + gamma(P - 1, u) * (1 + u)) * M + (2 * P - 1) * eta


def relation_bounds(
    impl, p: Problem, t, ref, out_dtypes: dict[str, torch.dtype], sizes: tuple[int, int], known=None
) -> dict[str, torch.Tensor]:  # noqa: ANN001 - known: ErrorModel -> ErrorModel
    """|v(P_a) − v(P_b)| bounds per output for ``sizes`` = (P_a, P_b) (module docstring: B_up(a) + B_up(b) +
    F_{P_a} + F_{P_b}; B_up is the same model at both sizes, so 2·B_up). ``known``: a recorded known divergence's
    map from the impl's model to the model of what its release computes, applied to B_up's."""
    m_up = upstream_model(impl, p, sizes)
    b_up = linear_ce_bounds(p, t, ref, known(m_up) if known is not None else m_up)
    m = error_model(impl.support, p, out_dtypes)
    partials = partial_magnitudes(p, t, tuple(sorted(set(sizes))))
    out = {}
    for name, bu in b_up.items():
        val = getattr(ref, name, None)
        if val is None:
            continue
        if name == "grad_x":
            f = sum(reduction_term(impl, m, val, bu, partials[P], P) for P in sizes)
        else:
            u, eta = m.u_out.get(name, U_ACC), m.eta_out.get(name, UNDERFLOW[torch.float32])
            f = 2 * (u * (val.abs().nan_to_num(0.0) + bu) + eta)
        out[name] = 2 * bu + f
    return out
