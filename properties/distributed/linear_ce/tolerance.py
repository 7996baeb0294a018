"""The tolerance model for vocabulary-parallel linear+CE: the single-device model
(:mod:`numcheck.properties.core.tolerance`) with the terms the sharded reductions add.

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
"""

from __future__ import annotations

import dataclasses

import torch

from numcheck.properties.core.problems import Problem
from numcheck.properties.core.tolerance import U_ACC, ErrorModel, error_model, unit_roundoff


def dist_error_model(impl, p: Problem, out_dtypes: dict[str, torch.dtype], world_size: int) -> ErrorModel:
    """The :class:`ErrorModel` of a distributed impl at ``world_size`` (the module docstring's item 3 on top of the
    single-device model of its per-rank declaration ``impl.support``)."""
    m = error_model(impl.support, p, out_dtypes)
    # u_p is shared with grad_W's path: lowered to fp32's only where grad_W's path does not read it.
    if impl.dist.grad_x_reduce_dtype == "float32" and m.grad_accumulation != "param_dtype":
        return dataclasses.replace(m, grad_x_accumulation="param_dtype", chunks_x=world_size, u_p=U_ACC)
    return dataclasses.replace(m, grad_x_accumulation="param_dtype", chunks_x=world_size,
                               u_p=max(unit_roundoff(p.param_dtype), m.u_p))
