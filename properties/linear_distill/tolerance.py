"""The tolerance model for linear + generalised JSD: an element-wise bound for the loss, grad_x and grad_weight of
the student, evaluated in float64 beside the oracle (:func:`reference.linear_distill.linear_distill`). Derivation
in ``docs/linear-distill.md``; it reuses linear+CE's softmax analysis (``docs/error-analysis.md``,
:mod:`properties.linear_ce.tolerance`, steps 1–2) for each of the two heads, and adds the divergence's terms.

Notation as linear+CE's: u_c the compute dtype's unit roundoff, u_a = 2⁻²⁴, u_L = u_c where the logits are
materialised in the compute dtype (``logits_dtype="compute"``) else u_a, u_d = u_a for a divergence evaluated in
fp32 (``divergence_dtype="float32"``) else u_c, u_out the returned output's, γ_n(u) = nu/(1−nu) (hard) or √n·u
(expected level, judgement (b)'s slack).

1. Logits, per head: e_z = γ_H(u_a)·|x||W|ᵀ + (u_L + 2u_a)|z|; scaled by the head's temperature T_h:
   e' = e_z/T_h + u_L|z'| (the division rounds at the logits' precision).
2. Log-probabilities, exact in e' (linear+CE step 2, :func:`~properties.linear_ce.tolerance.logp_error_bound`):
   Λ_ij = L_ij + R_i + u_d|log p_ij| + 2u_d with R_i = γ_V(u_d) + 3u_d + u_d(1 + 3|lse_i|), for the student's
   (Λq) and the teacher's (Λp) rows; |δp| ≤ p·expm1(Λ). The mixture M = αA + (1−α)B moves by at most
   max(ΛA, ΛB) in log (a convex combination of relative moves), plus 2u_d(1 + |log M|) for its own evaluation.
3. The row loss ℓ(z'_s, z'_t). Through the logits' errors, by the mean value theorem: δℓ = Σ_j G̃_s,j δz'_s,j +
   G̃_t,j δz'_t,j with G̃ the gradients w.r.t. each head's scaled logits at an intermediate point, each within step
   4's bound dG of the exact one (step 4 holds for any logit error within e'); the teacher's gradient is the
   student's formula with the heads swapped and β ↔ 1 − β (the divergence's symmetry): so
   Σ_j (|G_s,j| + dG_s,j)·e'_s,j + (|G_t,j| + dG_t,j)·e'_t,j. The evaluation (log-probabilities off by ρ = R +
   u_d|log p| + 2u_d at that point, whose probabilities are within e^Λ of the exact ones), with ℓ = Σ_t c_t Σ_j
   a_j d_j (terms of :func:`reference.linear_distill.jsd_terms`, d_j = log a_j − log o_j): |δ(a d)| ≤
   |δa|(|d| + |δd|) + a|δd| with |δa| ≤ a·e^Λ·expm1(ρ), |δd| ≤ ρ_a + ρ_o; plus the sums' roundings, whichever
   form the impl evaluates (the KL form a·(log a − log o), or Liger's entropy form βP·Y + (1−β)Q·X − M log M whose
   terms cancel): (γ_{3V}(u_d) + 3u_d)·Σ_t c_t Σ_j a_j e^Λ (|log a_j| + |log o_j|).
   The loss: (T² or 1)/D·Σ_i [bound_i + (γ_N(u_a) + 2u_d)|ℓ_i|] + (3u_a + u_out)|L| (2u_d: a chunk's sum and
   its division by D rounded at the divergence's precision before the fp32 total).
4. The student's logit gradient G_z = q ⊙ (g − ⟨q, g⟩), g = w·r, r = log q − log o: with |δr| ≤ Λq + Λo,
   δr̄ ≤ Σ_k(|δq_k|(|r_k| + |δr_k|) + q_k|δr_k|), r̄ ≤ Σ_k q_k|r_k|:
   |δG_z| ≤ w[|δq|(|r| + r̄ + |δr| + δr̄) + q(|δr| + δr̄)] + (5u_d + γ_V(u_d))·w·q(|r| + r̄); forward KL's
   G_z = q − p: |δq| + |δp| + 2u_d(q + p). Then G = c·G_z/T_s (2u_d more) stored in the compute dtype and scaled
   by the upstream gradient in it: + 2u_c|G| + η_c. At the divergence's precision each probability exp(log p)
   below the normal range carries an absolute error η_d (fp16's 2⁻²⁵ for a divergence in fp16: a probability of
   1e-7 is subnormal there), so |δq| and |δp| get + η_d, and the evaluation + 3η_d·w (measured: Liger's chunked
   loss in fp16 at β = 1, T = 0.7, a grad_weight element of 4.6e-7 off by 9.9e-7).
5. grad_x = G·W_s: |δG||W| + γ_V(u_a)|G||W| + u_out|gx|; grad_W = Gᵀx_s: |δG|ᵀ|x| + (γ_N(u_a) + a_path)|G|ᵀ|x|
   + 2u_out|gW| (rounded when accumulated, again when the upstream scales it), a_path as linear+CE's: ``fp32`` 0,
   ``per_chunk_rounding`` u_c, ``param_dtype`` K·u_p over K row chunks. Each rounding of a returned gradient
   (the store, the upstream gradient's multiply when it is not 1, each of the path's K or 1 roundings) adds an
   absolute η of its dtype where the value is subnormal (fp16's 2⁻²⁵: measured, Liger's chunked fp16 grad_weight
   element of 7.4e-8 two subnormal roundings off).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from numcheck.properties.linear_ce.tolerance import (
    U_ACC,
    UNDERFLOW,
    Level,
    gamma,
    logp_error_bound,
    unit_roundoff,
)
from numcheck.properties.linear_distill.cases import DistillCase, DistillTensors
from numcheck.reference.linear_distill import DistillResult, jsd_terms, log_mixture, student_logit_grad

OUTPUTS: tuple[str, ...] = ("loss", "grad_x", "grad_weight")


def _logit_error(x: torch.Tensor, w: torch.Tensor, z_scaled: torch.Tensor, T: float, u_L: float, level: Level):
    """Step 1: e' of one head's scaled logits."""
    H = x.shape[1]
    z = z_scaled * T
    e = gamma(H, U_ACC, level) * (x.abs() @ w.abs().T) + (u_L + 2 * U_ACC) * z.abs()
    return e / T + (u_L * z_scaled.abs() if T != 1.0 else 0.0)


def _logp_error(log_p: torch.Tensor, z: torch.Tensor, e: torch.Tensor, u_d: float, level: Level):
    """Step 2: ``(Λ, ρ)``, the bounds on |δ log p| of one head from its logits' errors and its evaluation, and on
    the evaluation's part alone (ρ = R + u_d|log p| + 2u_d)."""
    p = log_p.exp()
    T_plus = (p * torch.expm1(e)).sum(-1, keepdim=True)
    T_minus = (p * torch.expm1(-e)).sum(-1, keepdim=True)
    lse = torch.logsumexp(z, -1, keepdim=True)
    V = log_p.shape[-1]
    rho = gamma(V, u_d, level) + 3 * u_d + u_d * (1 + 3 * lse.abs()) + u_d * log_p.abs() + 2 * u_d
    return logp_error_bound(p, e, T_plus, T_minus) + rho, rho


def _mixture_error(lam_a: torch.Tensor, lam_b: torch.Tensor, log_m: torch.Tensor, u_d: float) -> torch.Tensor:
    """|δ log M| for M = αA + (1−α)B: the larger relative move of the two, plus M's own evaluation."""
    return torch.maximum(lam_a, lam_b) + 2 * u_d * (1 + log_m.abs())


def _evaluation_bound(
    log_q, log_p, lam_q, lam_p, rho_q, rho_p, beta: float, beta_zero: str, V: int, u_d: float, level: Level
):
    """Step 3's evaluation part, per row: log-probabilities off by ρ (at a point whose probabilities are within
    e^Λ of the exact ones) and the sums' roundings."""
    by_id = {id(log_q): (rho_q, lam_q), id(log_p): (rho_p, lam_p)}
    total, magnitude = 0.0, 0.0
    for c, la, lo in jsd_terms(log_q, log_p, beta, beta_zero):
        rho_a, lam_a = by_id[id(la)]
        if id(lo) in by_id:
            rho_o = by_id[id(lo)][0]
        else:  # the mixture
            rho_o = _mixture_error(rho_q, rho_p, lo, u_d)
        a = la.exp() * torch.exp(lam_a)
        lam_o = by_id[id(lo)][1] if id(lo) in by_id else _mixture_error(lam_q, lam_p, lo, u_d)
        d = (la - lo).abs() + lam_a + lam_o
        total = total + c * (a * torch.expm1(rho_a) * (d + rho_a + rho_o) + a * (rho_a + rho_o)).sum(-1)
        magnitude = magnitude + c * (a * (la.abs() + lo.abs())).sum(-1)
    return total + (gamma(3 * V, u_d, level) + 3 * u_d) * magnitude


def logit_grad_bound(
    log_s, log_t, lam_s, lam_t, beta: float, beta_zero: str, u_d: float, level: Level, eta_d: float = 0.0
):
    """Step 4: the bound on |δG_z| per element of the gradient w.r.t. the logits of the head ``log_s`` (the
    student's; the teacher's with the heads swapped and β ↔ 1 − β)."""
    q, p = log_s.exp(), log_t.exp()
    # each probability exp(log p) formed at the divergence's precision: an absolute η_d where it is subnormal
    dq, dp = q * torch.expm1(lam_s) + eta_d, p * torch.expm1(lam_t) + eta_d
    student_first = beta_zero == "reverse_kl"
    if beta in (0.0, 1.0) and (beta == 0.0) != student_first:
        return dq + dp + 2 * u_d * (q + p)
    if beta in (0.0, 1.0):
        w, log_o, lam_o = 1.0, log_t, lam_t
    else:
        w = beta if student_first else 1.0 - beta
        log_o = log_mixture(*((log_s, log_t) if student_first else (log_t, log_s)), beta)
        lam_o = _mixture_error(lam_s, lam_t, log_o, u_d)
    r = (log_s - log_o).abs()
    dr = lam_s + lam_o
    rbar = (q * r).sum(-1, keepdim=True)
    drbar = (dq * (r + dr) + q * dr).sum(-1, keepdim=True)
    V = q.shape[-1]
    evaluation = (5 * u_d + gamma(V, u_d, level)) * w * q * (r + rbar) + 3 * eta_d * w
    return w * (dq * (r + rbar + dr + drbar) + q * (dr + drbar)) + evaluation


def _row_loss_bound(
    o: DistillResult, heads, beta: float, beta_zero: str, V: int, u_d: float, level: Level, eta_d: float
):
    """Step 3, per row: the logits' errors through the mean value theorem (the gradient w.r.t. each head's logits
    at an intermediate point, within step 4's bound of the exact one), plus the evaluation's part."""
    (e_s, lam_s, rho_s), (e_t, lam_t, rho_t) = heads
    G_s = o.G_z.abs()
    G_t = student_logit_grad(o.log_p, o.log_q, 1.0 - beta, beta_zero).abs()
    dG_s = logit_grad_bound(o.log_q, o.log_p, lam_s, lam_t, beta, beta_zero, u_d, level, eta_d)
    dG_t = logit_grad_bound(o.log_p, o.log_q, lam_t, lam_s, 1.0 - beta, beta_zero, u_d, level, eta_d)
    through_logits = ((G_s + dG_s) * e_s + (G_t + dG_t) * e_t).sum(-1)
    evaluation = _evaluation_bound(o.log_q, o.log_p, lam_s, lam_t, rho_s, rho_t, beta, beta_zero, V, u_d, level)
    return through_logits + evaluation, dG_s


def _path_term(support: Any, case: DistillCase, u_c: float, u_p: float) -> tuple[float, int]:
    """a_path of step 5 for the declared grad_weight accumulation, and the roundings it adds (each an absolute
    η more where the running sum is subnormal)."""
    if support.grad_accumulation == "fp32":
        return 0.0, 0
    if support.grad_accumulation == "per_chunk_rounding":
        return u_c, 1
    K = math.ceil(case.N / support.rows_per_chunk(case.N, case.H, case.V))
    return K * u_p, K


def distill_bounds(
    support: Any,
    case: DistillCase,
    t: DistillTensors,
    o: DistillResult,
    out_dtypes: dict[str, torch.dtype],
    level: Level = "hard",
) -> dict[str, torch.Tensor]:
    """The element-wise bound of each output (module docstring), float64, for ``support``'s declaration."""
    f64 = torch.float64
    dt = case.torch_dtype
    u_c = unit_roundoff(dt)
    u_L = u_c if support.logits_dtype == "compute" else U_ACC
    u_d = U_ACC if support.divergence_dtype == "float32" else u_c
    conv = support.convention
    Ts, Tt = conv.temperatures(case.temperature)
    sx, sw, tx, tw = (v.detach().to(f64) for v in (t.sx, t.sw, t.tx, t.tw))
    e_s = _logit_error(sx, sw, o.z_s, Ts, u_L, level)
    e_t = _logit_error(tx, tw, o.z_t, Tt, u_L, level)
    lam_s, rho_s = _logp_error(o.log_q, o.z_s, e_s, u_d, level)
    lam_t, rho_t = _logp_error(o.log_p, o.z_t, e_t, u_d, level)
    heads = ((e_s, lam_s, rho_s), (e_t, lam_t, rho_t))
    eta_d = UNDERFLOW[torch.float32] if support.divergence_dtype == "float32" else UNDERFLOW[dt]
    row_b, dGz = _row_loss_bound(o, heads, case.beta, conv.beta_zero, case.V, u_d, level, eta_d)
    row = torch.where(o.kept, row_b, torch.zeros((), dtype=f64))
    D = {"tokens": float(o.kept.sum()), "rows": float(case.N), "sum": 1.0}[conv.denominator]
    scale = conv.scale(case.temperature)
    u_loss = unit_roundoff(out_dtypes["loss"])
    loss = (
        scale / D * (row.sum() + (gamma(case.N, U_ACC, level) + 2 * u_d) * o.row_loss.abs().sum())
        + (3 * U_ACC + u_loss) * o.loss.abs()
        + UNDERFLOW[out_dtypes["loss"]]
    )
    c = o.c[:, None].abs() / Ts
    G = (c * o.G_z).abs()
    eta = UNDERFLOW[dt] * (1 + abs(case.upstream))
    dG = c * dGz + (2 * u_d + 2 * u_c) * G + eta * (o.c[:, None] != 0)
    gx_out, gw_out = unit_roundoff(out_dtypes["grad_x"]), unit_roundoff(out_dtypes["grad_weight"])
    u_p = unit_roundoff(t.sw.dtype)
    # the returned gradients' last roundings, each an absolute η where subnormal: the store, and the upstream
    # gradient's multiply when it is not 1 (measured: Liger's chunked fp16 grad_weight of 7.4e-8, two fp16
    # subnormal roundings off)
    last = 1 + (case.upstream != 1.0)
    gx = dG @ sw.abs() + gamma(case.V, U_ACC, level) * (G @ sw.abs()) + gx_out * o.grad_x.abs() + last * UNDERFLOW[dt]
    a_path, path_roundings = _path_term(support, case, u_c, u_p)
    gw = (
        dG.T @ sx.abs()
        + (gamma(case.N, U_ACC, level) + a_path) * (G.T @ sx.abs())
        + 2 * gw_out * o.grad_weight.abs()
        + (last + path_roundings) * UNDERFLOW[dt]
    )
    return {"loss": loss, "grad_x": gx, "grad_weight": gw}
