"""The tolerance model for linear+preference: an element-wise bound on the loss and every gradient, derived by
floating-point error analysis and evaluated in float64 beside the oracle (:mod:`reference.linear_preference`).

Notation as docs/error-analysis.md: u_c the unit roundoff of the inputs' dtype, u_a = 2⁻²⁴ (the matmuls accumulate
in fp32; the log-softmax and everything after it run in fp32, the protocol's numerics), γ_n = n·u/(1 − n·u) (hard
ceiling) or √n·u (expected level). All |·| element-wise, every quantity from the oracle.

1. **Logits and per-position log-probabilities**: the linear+CE analysis, steps 1–2 of
   :mod:`properties.linear_ce.tolerance`, unchanged: e_z = γ_{H+1}(u_a)(|x||W|ᵀ + |b|) + (u_c + 2u_a)|z|
   [+ u_c(|z| + |b|) with a bias]; then for any logit errors |δz_j| ≤ e_j the exact bound L_j of
   :func:`~properties.linear_ce.tolerance.logp_error_bound` on |δ log p_j|, plus R = γ_V(u_a) + 3u_a + u_a(1 + 3|lse|)
   for evaluating lse in fp32 and ρ_j = u_a|log p_j| + 2u_a for storing log p: |δℓ_j| ≤ λ_j = L_j + R + ρ_j.
2. **Per-sequence log-probability** (new): S_s = Σ_t m_{s,t}ℓ_{s,t} over its T positions in fp32, so
   |δS_s| ≤ Σ_t m λ_{t,y} + γ_T(u_a)·Σ_t m|ℓ_t|; the mean a = S/n adds one rounding: |δa| ≤ |δS|/n + u_a|a|
   (E_s below). The reference log-probabilities are inputs, exact (the oracle reads the same fp32 values).
3. **Pair losses** (new): each loss is a sum of terms monotone in one scalar (the margin u, or ORPO's v), so the
   exact range of a term over all per-sequence errors |δa_s| ≤ E_s is its values at the two ends of that scalar's
   interval — no first-order step, and the bound stays right where log σ saturates.
   * DPO, robust DPO, CPO, SimPO: u = β((c − ref_c) − (r − ref_r)) (CPO/SimPO without ref, SimPO − γ) moves by
     w_u = β(E_c + E_r) + 3u_a·β(|c| + |ref_c| + |r| + |ref_r|) + u_a(|u| + γ) (the subtractions and the products
     with β and γ in fp32). Terms: −(1−ε)log σ(u) and −ε log σ(−u) (robust: −(1−ε)log σ(u)/(1−2ε) and
     +ε log σ(−u)/(1−2ε)); each term's error ≤ max|t(u ± w_u) − t(u)| + 4u_a|t(u)| (log σ and its products in fp32).
   * KTO: each completion a term of its own, 1 − σ(z) with z = ±β(a − ref − κ) (decreasing), moved by
     w = β·E + 3u_a·β(|a| + |ref| + κ) + u_a|z|; its slope σ(z)σ(−z) peaks at z = 0, so its range over
     [z − w, z + w] is its ends' values, with ¼ where the interval holds 0; evaluated in fp32 it forms 1 − σ̂ from
     σ̂ rounded at 2u_a, an absolute 3u_a·max(σ(z), σ(−z)) however small the slope.
   * ORPO: log-odds o(a) = a − log1p(−e^a), increasing, so v = o(c) − o(r) lies in [o(c − E_c) − o(r + E_r),
     o(c + E_c) − o(r − E_r)], widened by 3u_a(|c| + |r| + |l_c| + |l_r|) + u_a(e^c/(1 − e^c) + e^r/(1 − e^r))
     (l = log1p(−e^a); e^a and log1p each round once); f = −β log σ(v), decreasing. An interval reaching a ≥ 0
     says nothing (the bound is infinite there; the draws keep a far from 0).
   Loss: |δL| ≤ Σ_i err(f_i)/D + γ_P(u_a)Σ|f_i|/D + α·(Σ_{chosen} |δS_s| + γ_{N_c}(u_a)Σ|ℓ|)/D_nll + 3u_a|L|.
4. **Gradient w.r.t. the logits** (new): G = k·(e_y − p) with k_{s,t} = m(κ_s/n_s − [s chosen]α/D_nll) and
   κ_s = ∂L/∂a_s. κ's terms are monotone in u (−(1−ε)σ(−u), εσ(u), and their robust forms) or, for ORPO, a product
   of the positive factors σ(−v) (decreasing in v) and 1/(1 − e^a) (increasing in a): the range over the same
   intervals bounds |δκ| exactly, plus 4u_a|κ|. Then |δk| ≤ m(|δκ|/n + 3u_a(|κ|/n + α/D_nll)) and
   |δG_j| ≤ |δk||e_y − p_j| + |k|·p_j·expm1(λ_j) + 3u_a|k|(e_y + p_j) + u_c|G_j| (G handed to the matmuls in the
   inputs' dtype; + η_c, the absolute error of a value below the normal range, ``UNDERFLOW`` of the linear+CE
   model: an fp16 G of 1e-7 is a subnormal).
5. **grad_x = G·W, grad_W = Gᵀx, grad_b = Σ G** (the linear+CE steps 5–6): |δgx| ≤ |δG||W| + γ_V(u_a)|G||W| +
   u_c|gx|; |δgW| ≤ |δG|ᵀ|x| + (γ_N(u_a) + a_path)|G|ᵀ|x| + u_c|gW| with N = 2P·T rows and a_path of the declared
   ``grad_weight_accumulation`` over K chunks (``fp32`` 0, ``per_chunk_rounding`` u_c, ``param_dtype`` K·u_c; K =
   ⌈P / chunk_pairs⌉, P when the call leaves the chunking to the impl); grad_b likewise with Σ|G|; each output + η_c
   for its own storage.
"""

from __future__ import annotations

import math

import torch

from numcheck.properties.linear_ce.tolerance import UNDERFLOW, Level, gamma, logp_error_bound, unit_roundoff
from numcheck.properties.linear_preference.cases import PreferenceCase, PreferenceTensors
from numcheck.reference.linear_preference import (
    REFERENCE_LOSSES,
    Conventions,
    PreferenceReference,
    denominators,
    log_odds,
    pair_rows,
)

U_A = 2.0**-24
_ls, _sig = torch.nn.functional.logsigmoid, torch.sigmoid


def _position_errors(t: PreferenceTensors, o: PreferenceReference, u_c: float, level: Level) -> torch.Tensor:
    """λ_j of step 1: the bound on |δ log p_j| at every position and class ``[B, T, V]``."""
    x, w = t.x.cpu().double(), t.weight.cpu().double()
    H, V = w.shape[1], w.shape[0]
    mag = x.abs() @ w.abs().T
    z = o.logits
    e = (u_c + 2 * U_A) * z.abs()
    if t.bias is not None:
        b = t.bias.cpu().double().abs()
        mag = mag + b
        e = e + u_c * (z.abs() + b)
    e = e + gamma(H + 1, U_A, level) * mag
    p = o.logp.exp()
    T_plus, T_minus = (p * torch.expm1(e)).sum(-1, keepdim=True), (p * torch.expm1(-e)).sum(-1, keepdim=True)
    lse = torch.logsumexp(z, -1, keepdim=True)
    R = gamma(V, U_A, level) + 3 * U_A + U_A * (1 + 3 * lse.abs())
    return logp_error_bound(p, e, T_plus, T_minus) + R + U_A * o.logp.abs() + 2 * U_A


def _sequence_errors(
    o: PreferenceReference, lam: torch.Tensor, target: torch.Tensor, averaged: bool, level: Level
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E, E_S)`` of step 2: the bound on each sequence's |δa| and on its summed |δS|."""
    safe = target.cpu().clamp_min(0)
    lam_t = lam.gather(-1, safe.unsqueeze(-1)).squeeze(-1) * o.mask
    n = o.mask.sum(-1)
    E_S = lam_t.sum(-1) + gamma(target.shape[1], U_A, level) * o.token_logp.abs().sum(-1)
    if averaged:
        return E_S / n + U_A * o.seq_logp.abs(), E_S
    return E_S, E_S


def _terms(loss: str, eps: float):
    """The pair loss's terms and its slope's terms as functions of the margin u (each monotone)."""
    if loss == "dpo_robust":
        k = 1 - 2 * eps
        return (
            (lambda u: -(1 - eps) * _ls(u) / k, lambda u: eps * _ls(-u) / k),
            (lambda u: -(1 - eps) * _sig(-u) / k, lambda u: -eps * _sig(u) / k),
        )
    return (
        (lambda u: -(1 - eps) * _ls(u), lambda u: -eps * _ls(-u)),
        (lambda u: -(1 - eps) * _sig(-u), lambda u: eps * _sig(u)),
    )


def _spread(fn, mid: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(max |fn(mid ± w) − fn(mid)|, |fn(mid)|)`` for a monotone ``fn``."""
    c = fn(mid)
    return torch.maximum((fn(mid + w) - c).abs(), (fn(mid - w) - c).abs()), c.abs()


def _sigmoid_pairs(conv: Conventions, case: PreferenceCase, a, E, ref, ci, ri):
    """Step 3–4 for the margin losses: per pair ``(err f, |f| terms, err κ_c)`` (κ_r = −κ_c)."""
    beta, gam = case.beta, case.gamma if conv.loss == "simpo" else 0.0
    c, r = a[ci], a[ri]
    rc, rr = (ref[ci], ref[ri]) if conv.loss in REFERENCE_LOSSES else (0 * c, 0 * r)
    u = beta * ((c - rc) - (r - rr)) - gam
    w = beta * (E[ci] + E[ri]) + 3 * U_A * beta * (c.abs() + rc.abs() + r.abs() + rr.abs()) + U_A * (u.abs() + gam)
    f_terms, d_terms = _terms(conv.loss, case.label_smoothing)
    err_f, abs_f, err_d = 0 * u, 0 * u, 0 * u
    for fn in f_terms:
        dev, mag = _spread(fn, u, w)
        err_f, abs_f = err_f + dev + 4 * U_A * mag, abs_f + mag
    for fn in d_terms:
        dev, mag = _spread(fn, u, w)
        err_d = err_d + beta * (dev + 4 * U_A * mag)
    return err_f, abs_f, err_d, err_d


def _kto_term(case: PreferenceCase, z: torch.Tensor, w: torch.Tensor):
    """One completion's KTO term 1 − σ(z) (decreasing) and its slope σ(z)σ(−z) (peaked at 0) over [z − w, z + w]:
    ``(err term, err slope)``."""
    t = lambda v: 1 - _sig(v)  # noqa: E731
    s = lambda v: _sig(v) * _sig(-v)  # noqa: E731
    err_t = torch.maximum(t(z - w) - t(z), t(z) - t(z + w)) + 4 * U_A
    lo, hi = s(z - w), s(z + w)
    top = torch.where((z - w < 0) & (z + w > 0), torch.full_like(z, 0.25), torch.maximum(lo, hi))
    mid = s(z)
    # σ(z)(1 − σ(z)) in fp32 forms 1 − σ̂ from a σ̂ rounded at 2u_a: an absolute 3u_a·max(σ(z), σ(−z)), however
    # small the slope (a saturated completion's slope is all rounding).
    err_s = torch.maximum(top - mid, mid - torch.minimum(lo, hi)) + 4 * U_A * mid + 3 * U_A * _sig(z.abs())
    return err_t, case.beta * err_s


def _kto_pairs(case: PreferenceCase, a, E, ref, ci, ri):
    """Steps 3–4 for KTO, whose two completions of a pair are terms of their own: z = ±β(a − ref − κ) moves by
    β·E + 3u_a·β(|a| + |ref| + κ) + u_a|z|; per pair ``(err f, |f| terms, err κ_c, err κ_r)``."""
    out = []
    for rows, sign in ((ci, 1.0), (ri, -1.0)):
        x, r = a[rows], ref[rows]
        z = sign * case.beta * ((x - r) - case.kl)
        w = case.beta * E[rows] + 3 * U_A * case.beta * (x.abs() + r.abs() + abs(case.kl)) + U_A * z.abs()
        out.append(_kto_term(case, z, w))
    (ft_c, k_c), (ft_r, k_r) = out
    return ft_c + ft_r, torch.full_like(ft_c, 2.0), k_c, k_r


def _orpo_pairs(case: PreferenceCase, a, E, ci, ri):
    """Steps 3–4 for ORPO: per pair ``(err f, |f|, err κ_c, err κ_r)``."""
    beta, c, r, Ec, Er = case.beta, a[ci], a[ri], E[ci], E[ri]
    inf = torch.full_like(c, math.inf)
    o_ = lambda v: torch.where(v < 0, log_odds(v.clamp_max(-1e-300)), inf)  # noqa: E731
    lc, lr = torch.log1p(-torch.exp(c)), torch.log1p(-torch.exp(r))
    q = lambda v: torch.exp(v) / (-torch.expm1(v))  # noqa: E731
    ev = 3 * U_A * (c.abs() + r.abs() + lc.abs() + lr.abs()) + U_A * (q(c) + q(r))
    v = log_odds(c) - log_odds(r)
    v_lo, v_hi = log_odds(c - Ec) - o_(r + Er) - ev, o_(c + Ec) - log_odds(r - Er) + ev
    f = -beta * _ls(v)
    err_f = torch.maximum(-beta * _ls(v_lo) - f, f + beta * _ls(v_hi)) + 4 * U_A * f.abs()
    s, s_lo, s_hi = _sig(-v), _sig(-v_hi), _sig(-v_lo)
    inv = lambda v_: torch.where(v_ < 0, 1 / (-torch.expm1(v_.clamp_max(-1e-300))), inf)  # noqa: E731

    def err_k(x, Ex):
        k, k_lo, k_hi = s * inv(x), s_lo * inv(x - Ex), s_hi * inv(x + Ex)
        return beta * (torch.maximum(k_hi - k, k - k_lo) + 4 * U_A * k)

    return err_f, f.abs(), err_k(c, Ec), err_k(r, Er)


def preference_bounds(
    case: PreferenceCase, conv: Conventions, path: str, t: PreferenceTensors, o: PreferenceReference, level: Level
) -> dict[str, torch.Tensor]:
    """Each output's element-wise bound (module docstring); ``path`` the declared grad_weight accumulation."""
    u_c = unit_roundoff(case.torch_dtype)
    averaged = conv.averaged(case.params)
    lam = _position_errors(t, o, u_c, level)
    E, E_S = _sequence_errors(o, lam, t.target, averaged, level)
    ci, ri = pair_rows(conv.layout, t.x.shape[0])
    ref = t.ref_logps.cpu().double() if t.ref_logps is not None else torch.zeros_like(o.seq_logp)
    if conv.loss == "orpo":
        err_f, abs_f, err_kc, err_kr = _orpo_pairs(case, o.seq_logp, E, ci, ri)
    elif conv.loss == "kto":
        err_f, abs_f, err_kc, err_kr = _kto_pairs(case, o.seq_logp, E, ref, ci, ri)
    else:
        err_f, abs_f, err_kc, err_kr = _sigmoid_pairs(conv, case, o.seq_logp, E, ref, ci, ri)
    D, D_nll = denominators(conv, len(ci), float(o.mask[ci].sum()))
    alpha = case.nll_weight
    nll_err = (E_S[ci].sum() + gamma(int(o.mask[ci].sum()), U_A, level) * o.token_logp[ci].abs().sum()) / D_nll
    loss = (err_f.sum() + gamma(len(ci), U_A, level) * abs_f.sum()) / D + alpha * nll_err + 3 * U_A * o.loss.abs()
    dk_seq = torch.zeros_like(o.seq_logp)
    dk_seq[ci], dk_seq[ri] = err_kc / D, err_kr / D
    n = o.mask.sum(-1)
    kappa = o.dL_da.abs()
    if averaged:
        dk_seq, kappa = dk_seq / n, kappa / n
    chosen = torch.zeros_like(n)
    chosen[ci] = 1.0
    dk = o.mask * (dk_seq + 3 * U_A * (kappa + chosen * alpha / D_nll)).unsqueeze(-1)
    return _gradient_bounds(case, path, t, o, lam, dk.unsqueeze(-1), u_c, level) | {"loss": loss}


def _gradient_bounds(case, path, t, o, lam, dk, u_c, level) -> dict[str, torch.Tensor]:
    """Steps 4–5: the bounds of grad_x, grad_weight and grad_bias from |δk| ``[B, T, 1]``."""
    p = o.logp.exp()
    onehot = torch.nn.functional.one_hot(t.target.cpu().clamp_min(0), p.shape[-1]).double()
    k = o.k.abs().unsqueeze(-1)
    G = k * (onehot - p).abs()
    eta = UNDERFLOW[case.torch_dtype]
    dG = dk * (onehot - p).abs() + k * p * torch.expm1(lam) + 3 * U_A * k * (onehot + p) + u_c * G + eta
    x, w = t.x.cpu().double().abs(), t.weight.cpu().double().abs()
    B, T, V = G.shape
    N = B * T
    K = -(-case.P // case.chunk_pairs) if case.chunk_pairs else case.P
    a_path = {"fp32": 0.0, "per_chunk_rounding": u_c, "param_dtype": K * u_c}[path]
    G2, dG2, x2 = G.reshape(N, V), dG.reshape(N, V), x.reshape(N, -1)
    out = {
        "grad_x": dG @ w + gamma(V, U_A, level) * (G @ w) + u_c * o.grad_x.abs() + eta,
        "grad_weight": dG2.T @ x2 + (gamma(N, U_A, level) + a_path) * (G2.T @ x2) + u_c * o.grad_weight.abs() + eta,
    }
    if o.grad_bias is not None:
        out["grad_bias"] = dG2.sum(0) + (gamma(N, U_A, level) + a_path) * G2.sum(0) + u_c * o.grad_bias.abs() + eta
    return out
