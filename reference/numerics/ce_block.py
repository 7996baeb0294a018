"""Cross-entropy on one chunk of logits, in torch: per-row loss, lse, z-loss and the gradient w.r.t. the logits.

Semantics are exactly those of :func:`reference.linear_ce.linear_ce` (``docs/linear-ce.md``), with
z the logits chunk, z' = s·tanh(z/s) under softcap (else z' = z), lse_i = log Σ_j exp(z'_ij), p = exp(z' − lse):

* CE part of row i:  ℓ_i = (1−ε)·w_{y_i}·(lse_i − z'_{i,y_i}) + (ε/V)·(S_w·lse_i − Σ_j w_j z'_ij),
  S_w = Σ_j w_j (w ≡ 1 without class weights, so S_w = V); 0 on ignored rows.
* z-loss of row i:   ζ_i = λ·lse_i²; 0 on ignored rows.
* gradient, given per-row coefficients c_i (CE part) and c^z_i (z-loss part) that carry the reduction's
  normaliser and the upstream gradient (:func:`reduction_coefficients`):
  g_ij = c_i·[(1−ε)·w_{y_i}·(p_ij − δ_{j,y_i}) + (ε/V)·(S_w·p_ij − w_j)] + c^z_i·2λ·lse_i·p_ij,
  G_ij = g_ij·(1 − tanh²(z_ij/s)) under softcap; exactly 0 on ignored rows.

The logits chunk may be low precision (bf16/fp16, as a bf16 matmul produces it); all math runs in fp32 and the
gradient G is written back **in place of the logits chunk**, in its dtype, ready to be the operand of the
grad_x and grad_W matmuls (the Liger design). The Triton kernel in :mod:`impls.builtin.triton_ce` has the same contract.

Accuracy: the row statistics are kept as the pair (m_i = max_j z'_ij, log s_i = log Σ_j exp(z'_ij − m_i)) rather
than lse_i alone, and every quantity is formed from non-negative parts, like ``log_softmax``: the loss as
(m_i − z'_{i,y}) + log s_i and Σ_j w_j (m_i − z'_ij) + S_w·log s_i, the softmax as exp((z' − m) − log s), the
true-class gradient from p_y − 1 (exact in fp32 by Sterbenz) before it is scaled. Forming lse_i − z'_{i,y} in
fp32 instead would lose a confident row's small loss to the rounding of lse_i (u·|lse_i| absolute).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


class SoftmaxStats(NamedTuple):
    """Per-row softmax statistics, fp32 ``[C]``: ``m`` = max_j z'_ij, ``log_s`` = log Σ_j exp(z'_ij − m_i);
    lse = m + log_s. What the recompute path keeps from forward to backward."""

    m: torch.Tensor
    log_s: torch.Tensor


class BlockResult(NamedTuple):
    """Per-row fp32 outputs of one chunk: CE part ``ce`` (ℓ_i), z-loss ``z`` (ζ_i), ``lse`` and the row
    statistics ``stats`` (``[C]`` each; ``ce``/``z`` are ``None`` when the loss was not asked for)."""

    ce: torch.Tensor | None
    z: torch.Tensor | None
    lse: torch.Tensor
    stats: SoftmaxStats


class CEKernel(Protocol):
    """The contract shared by :func:`ce_block_` and :func:`impls.builtin.triton_ce.ce_block_triton_`."""

    def __call__(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        coef_ce: torch.Tensor,
        coef_z: torch.Tensor,
        *,
        ignore_index: int,
        label_smoothing: float = 0.0,
        class_weights: torch.Tensor | None = None,
        softcap: float | None = None,
        z_loss_scale: float = 0.0,
        stats: SoftmaxStats | None = None,
        want_loss: bool = True,
        want_grad: bool = True,
    ) -> BlockResult: ...


def row_weights(
    target: torch.Tensor, class_weights: torch.Tensor | None, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(valid, safe_target, w_t)``: the non-ignored mask, the targets with ignored rows set to class 0 (safe
    to index with) and w_{y_i} in fp32 (0 on ignored rows). No host synchronisation."""
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    if class_weights is None:
        w_t = valid.to(torch.float32)
    else:
        w_t = torch.where(
            valid, class_weights.to(torch.float32)[safe], torch.zeros((), dtype=torch.float32, device=target.device)
        )
    return valid, safe, w_t


class Coefficients(NamedTuple):
    """Per-row gradient coefficients ``coef_ce`` (c_i) and ``coef_z`` (c^z_i), fp32 ``[N]``, 0 on ignored rows,
    and the reduction's normalisers ``D`` = Σ_{i∈M} w_{y_i} and ``n_valid`` = |M| (fp32 0-dim tensors)."""

    coef_ce: torch.Tensor
    coef_z: torch.Tensor
    D: torch.Tensor
    n_valid: torch.Tensor


def reduction_coefficients(
    valid: torch.Tensor, w_t: torch.Tensor, reduction: str, upstream: torch.Tensor | None = None
) -> Coefficients:
    """c_i and c^z_i for ``reduction`` and an upstream gradient (``None`` = 1; a 0-dim tensor for
    ``mean``/``sum``, ``[N]`` for ``none``): ``mean`` → u/D and u/|M|, ``sum``/``none`` → u; 0 on ignored rows
    (also when every row is ignored, where u/D is 0/0). No host synchronisation."""
    f32 = torch.float32
    zero = torch.zeros((), dtype=f32, device=valid.device)
    u = torch.ones((), dtype=f32, device=valid.device) if upstream is None else upstream.to(f32)
    D = w_t.sum()
    n_valid = valid.sum().to(f32)
    if reduction == "mean":
        ce, z = u / D, u / n_valid
    elif reduction in ("sum", "none"):
        ce = z = u
    else:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    ce = torch.where(valid, ce, zero)
    z = torch.where(valid, z, zero)
    return Coefficients(ce, z, D, n_valid)


def check_block(
    logits: torch.Tensor,
    target: torch.Tensor,
    coef_ce: torch.Tensor,
    coef_z: torch.Tensor,
    class_weights: torch.Tensor | None,
    stats: SoftmaxStats | None,
) -> None:
    """The shapes of one block's arguments (the torch block's and the Triton kernel's contract): ``ValueError``
    naming the argument that does not fit the logits chunk ``[C, V]``."""
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a 2-D floating chunk [C, V], got {tuple(logits.shape)} {logits.dtype}")
    C, V = logits.shape
    m, log_s = stats if stats is not None else (None, None)
    for name, t in (
        ("target", target),
        ("coef_ce", coef_ce),
        ("coef_z", coef_z),
        ("stats.m", m),
        ("stats.log_s", log_s),
    ):
        if t is not None and tuple(t.shape) != (C,):
            raise ValueError(f"{name} must have shape [C]=[{C}], got {tuple(t.shape)}")
    if class_weights is not None and tuple(class_weights.shape) != (V,):
        raise ValueError(f"class_weights must have shape [V]=[{V}], got {tuple(class_weights.shape)}")


def ce_block_(
    logits: torch.Tensor,
    target: torch.Tensor,
    coef_ce: torch.Tensor,
    coef_z: torch.Tensor,
    *,
    ignore_index: int,
    label_smoothing: float = 0.0,
    class_weights: torch.Tensor | None = None,
    softcap: float | None = None,
    z_loss_scale: float = 0.0,
    stats: SoftmaxStats | None = None,
    want_loss: bool = True,
    want_grad: bool = True,
) -> BlockResult:
    """CE of one logits chunk ``[C, V]`` in fp32 math; with ``want_grad`` the gradient G replaces ``logits``.

    Args:
        logits: the chunk (any float dtype). It is scratch: overwritten with G when ``want_grad``, otherwise
            its contents afterwards are unspecified.
        target: ``[C]`` integer classes (``ignore_index`` marks ignored rows).
        coef_ce, coef_z: ``[C]`` fp32 gradient coefficients (see :func:`reduction_coefficients`).
        stats: the rows' (m, log s) already known (recompute backward); computed when ``None``.
        want_loss: compute ``ce`` and ``z`` of the result.
        want_grad: write G into ``logits``.
    """
    check_block(logits, target, coef_ce, coef_z, class_weights, stats)
    eps = float(label_smoothing)
    lam = float(z_loss_scale)
    t, d, stats = _centred(logits, softcap, stats)
    lse = stats.m + stats.log_s
    wts = _weights(logits, target, class_weights, ignore_index)
    ce = z = None
    if want_loss:
        ce, z = _row_losses(d, stats.log_s, lse, wts, eps, lam)
    if want_grad:
        _gradient_(logits, d, t, stats.log_s, lse, wts, coef_ce, coef_z, eps, lam)
    return BlockResult(ce, z, lse, stats)


def _centred(
    logits: torch.Tensor, softcap: float | None, stats: SoftmaxStats | None
) -> tuple[torch.Tensor | None, torch.Tensor, SoftmaxStats]:
    """``(t, d, stats)``: t = tanh(z/s) under softcap (else ``None``), d = z' − m in an fp32 working copy of the
    chunk (in place of ``logits`` when that is fp32), and the rows' statistics (computed when not given)."""
    # fp32 working copy; it aliases `logits` when that is already fp32, which is fine: the chunk is scratch,
    # and nothing below reads the original after the in-place steps start.
    zc = logits.float()
    t = None
    if softcap is not None:
        t = torch.tanh(zc / softcap)
        zc = t * softcap
    if stats is None:
        m = zc.amax(dim=1)
        d = zc.sub_(m[:, None])  # z' − m ≤ 0, in place
        log_s = torch.logsumexp(d, dim=1)  # log Σ exp(z' − m) ≥ 0
        stats = SoftmaxStats(m, log_s)
    else:
        m, log_s = stats
        d = zc.sub_(m[:, None])
    return t, d, stats


class _Weights(NamedTuple):
    """A chunk's weights in fp32: the non-ignored mask ``valid``, the targets as a gather index ``idx`` (``[C, 1]``,
    ignored rows at class 0), w_{y_i} ``w_t``, the class weights ``cw`` (``None`` without) and their sum ``S_w``
    (V without), and a 0-dim zero."""

    valid: torch.Tensor
    idx: torch.Tensor
    w_t: torch.Tensor
    cw: torch.Tensor | None
    S_w: torch.Tensor | float
    zero: torch.Tensor


def _weights(
    logits: torch.Tensor, target: torch.Tensor, class_weights: torch.Tensor | None, ignore_index: int
) -> _Weights:
    valid, safe, w_t = row_weights(target, class_weights, ignore_index)
    cw = class_weights.to(torch.float32) if class_weights is not None else None
    S_w = cw.sum() if cw is not None else float(logits.shape[1])
    zero = torch.zeros((), dtype=torch.float32, device=logits.device)
    return _Weights(valid, safe[:, None], w_t, cw, S_w, zero)


def _row_losses(
    d: torch.Tensor, log_s: torch.Tensor, lse: torch.Tensor, wts: _Weights, eps: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' CE parts ℓ_i and z-losses ζ_i from d = z' − m (read, not changed); 0 on ignored rows."""
    valid, idx, w_t, cw, S_w, zero = wts
    V = d.shape[1]
    ce = (1.0 - eps) * w_t * (log_s - d.gather(1, idx).squeeze(1))  # lse − z'_y from non-negative parts
    if eps:
        neg_wd = torch.mv(d, cw) if cw is not None else d.sum(dim=1)  # −Σ_j w_j (m − z'_j) ≤ 0
        ce = ce + (eps / V) * (S_w * log_s - neg_wd)
    ce = torch.where(valid, ce, zero)
    z = torch.where(valid, lam * lse * lse, zero)
    return ce, z


def _gradient_(
    logits: torch.Tensor,
    d: torch.Tensor,
    t: torch.Tensor | None,
    log_s: torch.Tensor,
    lse: torch.Tensor,
    wts: _Weights,
    coef_ce: torch.Tensor,
    coef_z: torch.Tensor,
    eps: float,
    lam: float,
) -> None:
    """G written into ``logits``, formed in place of d = z' − m (and of t = tanh(z/s) under softcap)."""
    valid, idx, w_t, cw, S_w, zero = wts
    V = d.shape[1]
    c = torch.where(valid, coef_ce.to(torch.float32), zero)
    cz = torch.where(valid, coef_z.to(torch.float32), zero)
    a = (1.0 - eps) * c * w_t  # weight on (p − onehot)
    e = (eps / V) * c  # weight on (S_w·p − w)
    b = e * S_w + 2.0 * lam * cz * lse  # weight on p alone (smoothing's S_w·p and the z-loss)
    # g = a·(p − δ_y) + b·p − e·w: off the target (a + b)·p; at the target a·(p_y − 1) + b·p_y, with p_y − 1
    # exact in fp32 (Sterbenz) before it is scaled, so a confident row's true-class gradient keeps its
    # relative accuracy (a·p_y − a would leave an absolute error u·a in a value a·(1 − p_y) ≪ a), and b·p_y
    # added as its own term ((a + b)·(p_y − 1) + b would leave u·b, which a z-loss makes large: b ∝ λ·lse).
    g = d.sub_(log_s[:, None]).exp_()  # p = exp((z' − m) − log s), in place of the working copy
    p_y = g.gather(1, idx).squeeze(1)
    g.mul_((a + b)[:, None])
    g.scatter_(1, idx, (a * (p_y - 1.0) + b * p_y)[:, None])
    if cw is not None:
        if eps:
            g.addr_(e, cw, alpha=-1.0)
    elif eps:
        g.sub_(e[:, None])
    if t is not None:
        g.mul_(t.mul_(t).neg_().add_(1.0))  # 1 − tanh²
    if g is not logits:  # `.float()` and the in-place ops return `logits` itself when it is fp32
        logits.copy_(g)
