"""Low-precision linear + generalised JSD as numcheck evaluates it: the eager evaluation (logits materialised,
autograd's backward) and the chunked one (analytic backward formed in forward, grad_weight accumulated over row
chunks in fp32 or in the weight's dtype). The built-ins (:mod:`impls.builtin.linear_distill`) are these, and
judgement (b)'s yardstick (:func:`declared_path`) runs them as an impl declares its path.

Each computes the student's logits in the compute dtype (one GEMM, fp32 accumulation), casts them to fp32,
divides by the temperature, and forms the log-softmax and the divergence in fp32; the teacher runs under
``torch.no_grad`` (frozen).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from numcheck.reference.linear_distill import DistillConvention, jsd_terms, student_logit_grad, terms_sum


def _denominator(kept: torch.Tensor, convention: DistillConvention) -> float:
    return {"tokens": float(kept.sum()), "rows": float(kept.numel()), "sum": 1.0}[convention.denominator]


def _log_probs(x, w, T: float) -> torch.Tensor:
    """fp32 log-softmax of x·wᵀ / T, the product in x's dtype."""
    z = torch.nn.functional.linear(x, w).float()
    return torch.log_softmax(z / T if T != 1.0 else z, dim=-1)


def eager_loss(sx, sw, tx, tw, target, *, beta, temperature, ignore_index, convention=DistillConvention()):
    """The loss with [N, V] logits materialised, differentiated by autograd."""
    Ts, Tt = convention.temperatures(temperature)
    log_q = _log_probs(sx, sw, Ts)
    with torch.no_grad():
        log_p = _log_probs(tx, tw, Tt)
    kept = target != ignore_index
    rows = terms_sum(jsd_terms(log_q, log_p, float(beta), convention.beta_zero))
    total = torch.where(kept, rows, torch.zeros_like(rows)).sum()
    return total * (convention.scale(temperature) / _denominator(kept, convention))


class _Chunked(torch.autograd.Function):
    """Forward in row chunks, each chunk's student gradients formed there; backward scales them."""

    @staticmethod
    def forward(ctx, sx, sw, tx, tw, target, beta, temperature, ignore_index, convention, rows, accumulate, loss_sum):
        Ts, Tt = convention.temperatures(temperature)
        kept = target != ignore_index
        c = convention.scale(temperature) / _denominator(kept, convention)
        loss = torch.zeros((), dtype=loss_sum, device=sx.device)
        gx = torch.empty_like(sx)
        gw = torch.zeros(sw.shape, dtype=torch.float32 if accumulate == "fp32" else sw.dtype, device=sw.device)
        for lo in range(0, sx.shape[0], rows):
            sl = slice(lo, lo + rows)
            log_q = _log_probs(sx[sl], sw, Ts)
            with torch.no_grad():
                log_p = _log_probs(tx[sl], tw, Tt)
            k = kept[sl]
            row = terms_sum(jsd_terms(log_q, log_p, float(beta), convention.beta_zero))
            loss = loss + torch.where(k, row, torch.zeros_like(row)).sum().to(loss_sum)
            G = student_logit_grad(log_q, log_p, float(beta), convention.beta_zero) * (c / Ts)
            G = torch.where(k[:, None], G, torch.zeros_like(G)).to(sx.dtype)
            gx[sl] = G @ sw
            if accumulate == "fp32":
                gw.addmm_(G.t().float(), sx[sl].float())
            else:
                gw += G.t() @ sx[sl]
        ctx.save_for_backward(gx, gw.to(sw.dtype))
        return (loss.float() * c).to(sx.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        gx, gw = ctx.saved_tensors
        g = grad_out.to(gx.dtype)
        return (gx * g, gw * g, *([None] * 10))


def chunked_loss(
    sx,
    sw,
    tx,
    tw,
    target,
    *,
    beta,
    temperature,
    ignore_index,
    convention=DistillConvention(),
    rows=8,
    accumulate="fp32",
    loss_sum=torch.float32,
):
    """The loss in chunks of ``rows`` rows, grad_weight summed over chunks in fp32 (``accumulate="fp32"``) or in
    the weight's dtype (``"param_dtype"``), the chunks' loss sums added in ``loss_sum``."""
    return _Chunked.apply(
        sx, sw, tx, tw, target, beta, temperature, ignore_index, convention, rows, accumulate, loss_sum
    )


def declared_path(support: Any) -> Callable[..., torch.Tensor]:
    """The call evaluating what ``support`` declares (its conventions, chunk rows and grad_weight path) in the
    inputs' dtype: judgement (b)'s yardstick."""
    acc = "fp32" if support.grad_accumulation == "fp32" else "param_dtype"

    def fn(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
        N, H = sx.shape
        rows = support.rows_per_chunk(N, H, sw.shape[0])
        kw = dict(beta=beta, temperature=temperature, ignore_index=ignore_index, convention=support.convention)
        if rows >= N and acc == "fp32":
            return eager_loss(sx, sw, tx, tw, target, **kw)
        return chunked_loss(sx, sw, tx, tw, target, rows=rows, accumulate=acc, **kw)

    return fn
