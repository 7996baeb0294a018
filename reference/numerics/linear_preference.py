"""Linear head + preference loss in low precision, the way an eager PyTorch training loop computes it: what the
built-ins (:mod:`impls.builtin.linear_preference`) run and what judgement (b) of the properties measures against
(eager in the same dtype). Differentiable by torch.autograd.

The logits are one matmul in the inputs' dtype (fp32 accumulation inside), the log-softmax and everything after it
in fp32 (Liger-Kernel's ``log_softmax(logits.float())``); the formulas are those of
:mod:`reference.linear_preference`, whose docstring states them.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from numcheck.reference.linear_preference import REFERENCE_LOSSES, Conventions, PreferenceParams, margin


def sequence_logps(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None, averaged: bool, ignore: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, nll_sum)``: each row's summed (or, ``averaged``, mean) target log-probability over its non-ignored
    positions in fp32, and each row's summed negative log-likelihood (fp32)."""
    logits = x @ weight.T
    if bias is not None:
        logits = logits + bias
    logp = torch.log_softmax(logits.float(), dim=-1)
    mask = target != ignore
    tok = logp.gather(-1, torch.where(mask, target, 0).unsqueeze(-1)).squeeze(-1) * mask
    s = tok.sum(-1)
    return (s / mask.sum(-1) if averaged else s), -s


def pair_losses(
    conv: Conventions, params: PreferenceParams, c: torch.Tensor, r: torch.Tensor, ref_c: torch.Tensor | None, ref_r
) -> torch.Tensor:
    """Each pair's loss ``f_i`` in fp32 from the chosen and rejected per-sequence log-probabilities."""
    eps = params.label_smoothing
    if conv.loss in REFERENCE_LOSSES and ref_c is None:
        raise ValueError(f"loss {conv.loss!r} needs the reference model's log-probabilities (ref_logps)")
    if conv.loss == "kto":
        zc, zr = params.beta * ((c - ref_c) - params.kl), -params.beta * ((r - ref_r) - params.kl)
        return (1 - torch.sigmoid(zc)) + (1 - torch.sigmoid(zr))
    if conv.loss == "orpo":
        v = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        return -params.beta * F.logsigmoid(v)
    u = margin(conv, params, c, r, ref_c, ref_r)
    if conv.loss == "dpo_robust":
        return (-(1 - eps) * F.logsigmoid(u) + eps * F.logsigmoid(-u)) / (1 - 2 * eps)
    return -(1 - eps) * F.logsigmoid(u) - eps * F.logsigmoid(-u)


def chunk_loss(
    chosen: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    rejected: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv: Conventions,
    params: PreferenceParams,
    denominators: tuple[float, float],
    seq: Callable[..., tuple[torch.Tensor, torch.Tensor]] = sequence_logps,
) -> torch.Tensor:
    """The loss of some pairs (``chosen``, ``rejected``: ``(x rows, target rows, ref_logps rows or None)``) with the
    whole batch's denominators ``(D, D_nll)`` (:func:`reference.linear_preference.denominators`), in fp32: the
    batch's loss is the sum of its chunks' losses. ``seq``: how the per-sequence log-probabilities are formed
    (:func:`sequence_logps`; a seam for the built-in's mutants)."""
    averaged = conv.averaged(params)
    (xc, tc, rc), (xr, tr, rr) = chosen, rejected
    x, t = torch.cat([xc, xr]), torch.cat([tc, tr])
    a, nll = seq(x, weight, t, bias, averaged, params.ignore_index)
    P = xc.shape[0]
    f = pair_losses(conv, params, a[:P], a[P:], rc, rr)
    D, D_nll = denominators
    loss = f.sum() / D
    if params.nll_weight:
        loss = loss + params.nll_weight * (nll[:P].sum() / D_nll)
    return loss
