"""Float64 oracle for linear + cross-entropy: forward and analytic backward, chunked.

Semantics (``docs/linear-ce.md``): z = x·Wᵀ + b; with softcap z' = s·tanh(z/s);
lse_i = log Σ_j exp(z'_ij); per-row loss
ℓ_i = (1−ε)·w_{y_i}·(lse_i − z'_{i,y_i}) + (ε/V)·Σ_j w_j·(lse_i − z'_ij), z-loss ζ_i = λ·lse_i².
``mean`` divides Σ ℓ by D = Σ_{i∈M} w_{y_i} (PyTorch) and Σ ζ by |M| (Liger); ``sum`` adds; ``none`` keeps
ℓ_i + ζ_i per row (0 on ignored rows).

Backward, per row with upstream u_i (scalar u broadcast for ``mean``/``sum``), c_i = u_i/D or u_i,
c^z_i = u_i/|M| or u_i:
g_ij = c_i·[(1−ε)·w_{y_i}·(p_ij − δ_{j,y_i}) + (ε/V)·(S_w·p_ij − w_j)] + c^z_i·2λ·lse_i·p_ij,
G_ij = g_ij·(1 − tanh²(z_ij/s)) under softcap, 0 on ignored rows;
grad_x = G·W, grad_W = Gᵀ·x, grad_b = Σ_i G_i.

Everything runs in float64 on the inputs' device, in blocks of ``row_chunk`` × ``vocab_chunk`` logits, so
no [N, V] float64 tensor exists at once: pass 1 computes lse by an online log-sum-exp over vocabulary
blocks, pass 2 recomputes each block and accumulates the gradients. An optional observer sees every block
of pass 2 (the tolerance model uses it to accumulate its magnitude terms in the same sweep).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Protocol

import torch

from numcheck.reference.options import CEOptions

AllIgnored = Literal["nan", "zero"]

DEFAULT_ROW_CHUNK = 1024
DEFAULT_VOCAB_CHUNK = 8192


@dataclass(frozen=True)
class Block:
    """One row×vocab block of pass 2, all float64: what an observer is shown.

    ``z``: logits before softcap; ``zc``: after softcap (same object when no softcap); ``p``: softmax;
    ``G``: gradient w.r.t. ``z`` (the matmul operand of grad_x and grad_W); ``dzc_dz``: softcap derivative
    (``None`` without softcap); ``rows``/``cols``: slices into N and V.
    """

    rows: slice
    cols: slice
    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor | None
    z: torch.Tensor
    zc: torch.Tensor
    p: torch.Tensor
    G: torch.Tensor
    dzc_dz: torch.Tensor | None


class BlockObserver(Protocol):
    """Receives every block of pass 2 together with the finished row statistics."""

    def block(self, blk: Block, rows: "RowStats") -> None: ...


@dataclass(frozen=True)
class RowStats:
    """Per-row float64 statistics from pass 1 (``[N]`` each) and the reduction's scalars."""

    lse: torch.Tensor
    z_target: torch.Tensor  # z'_{i,y_i} (0 on ignored rows)
    valid: torch.Tensor  # bool, row not ignored
    w_target: torch.Tensor  # w_{y_i} (0 on ignored rows)
    coef_ce: torch.Tensor  # c_i: upstream / normalizer for the CE part
    coef_z: torch.Tensor  # c^z_i for the z-loss part
    normalizer: float  # D (mean) or 1
    n_valid: int


@dataclass(frozen=True)
class LinearCEResult:
    """The oracle's outputs, float64. ``loss`` includes the z-loss; ``z_loss`` is reduced like ``loss``."""

    loss: torch.Tensor  # scalar, or [N] for reduction='none'
    per_row: torch.Tensor  # [N] ℓ_i + ζ_i, 0 on ignored rows
    lse: torch.Tensor  # [N] (computed for ignored rows too)
    z_loss: torch.Tensor  # reduced like loss
    grad_x: torch.Tensor
    grad_weight: torch.Tensor
    grad_bias: torch.Tensor | None
    stats: RowStats
    options: CEOptions


def _check_inputs(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None, opts: CEOptions
) -> None:
    """Raise ``ValueError`` naming the argument for bad shapes, dtypes or targets."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor [N, H], got {getattr(x, 'shape', type(x))}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D tensor [V, H], got {getattr(weight, 'shape', type(weight))}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias), ("class_weights", opts.class_weights)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor or None, got {type(t).__name__}")
        if t is not None and not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t is not None and t.is_complex():
            raise ValueError(f"{name} must be real, got dtype {t.dtype}")
    N, H = x.shape
    V, H2 = weight.shape
    if H != H2:
        raise ValueError(f"x has H={H} columns but weight has {H2} (weight must be [V, H])")
    if V < 1:
        raise ValueError("weight must have at least one row (V >= 1)")
    if not isinstance(target, torch.Tensor) or target.shape != (N,):
        raise ValueError(f"target must be a tensor of shape [N]=[{N}], got {getattr(target, 'shape', type(target))}")
    if target.is_floating_point() or target.dtype == torch.bool or target.is_complex():
        raise ValueError(f"target must hold integer class indices, got dtype {target.dtype}")
    if bias is not None and bias.shape != (V,):
        raise ValueError(f"bias must have shape [V]=[{V}], got {tuple(bias.shape)}")
    if opts.class_weights is not None and opts.class_weights.shape != (V,):
        raise ValueError(f"class_weights must have shape [V]=[{V}], got {tuple(opts.class_weights.shape)}")
    valid = target != opts.ignore_index
    bad = valid & ((target < 0) | (target >= V))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"target[{i}]={int(target[i])} is outside [0, V={V}) and is not ignore_index={opts.ignore_index}"
        )


def _check_upstream(
    upstream: torch.Tensor | float | None, opts: CEOptions, N: int, device: torch.device
) -> torch.Tensor:
    """The upstream gradient as ``[N]`` float64 (a scalar broadcast), checked against the reduction."""
    if upstream is None:
        return torch.ones((N,), dtype=torch.float64, device=device)
    u = torch.as_tensor(upstream, dtype=torch.float64, device=device)
    if opts.reduction == "none":
        if u.shape != (N,):
            raise ValueError(f"upstream for reduction='none' must have shape [N]=[{N}], got {tuple(u.shape)}")
        return u
    if u.dim() != 0:
        raise ValueError(f"upstream for reduction={opts.reduction!r} must be a scalar, got shape {tuple(u.shape)}")
    return u.expand(N)


def _blocks(n: int, size: int) -> list[slice]:
    """``[0, n)`` cut into consecutive slices of ``size`` (the last one shorter)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@dataclass(frozen=True)
class _Operands:
    """The oracle's float64 operands on the inputs' device and the per-row quantities both passes share."""

    X: torch.Tensor  # [N, H]
    W: torch.Tensor  # [V, H]
    B: torch.Tensor | None  # [V]
    cw: torch.Tensor | None  # class weights [V]
    eps: float  # label smoothing ε
    lam: float  # z-loss scale λ
    softcap: float | None
    upstream: torch.Tensor  # u_i, [N]
    valid: torch.Tensor  # bool [N], row not ignored
    safe_t: torch.Tensor  # targets with ignored rows set to class 0
    w_t: torch.Tensor  # w_{y_i}, 0 on ignored rows
    S_w: float  # Σ_j w_j
    row_blocks: list[slice]
    col_blocks: list[slice]

    def logits(self, r: slice, c: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Block ``(r, c)`` of the logits: ``z``, after softcap ``z'`` and the softcap derivative (``None``
        without softcap, when ``z'`` is ``z`` itself)."""
        z = self.X[r] @ self.W[c].T
        if self.B is not None:
            z = z + self.B[c]
        s = self.softcap
        if s is None:
            return z, z, None
        t = torch.tanh(z / s)
        return z, s * t, 1.0 - t * t


def _operands(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    opts: CEOptions,
    upstream: torch.Tensor | float | None,
    row_chunk: int,
    vocab_chunk: int,
) -> _Operands:
    """Upcast the (already checked) inputs to float64 on ``x``'s device and derive the per-row target data."""
    dev = x.device
    f64 = torch.float64
    N = x.shape[0]
    V = weight.shape[0]
    cw = opts.class_weights.detach().to(dev, f64) if opts.class_weights is not None else None
    tgt = target.to(dev)
    valid = tgt != opts.ignore_index
    safe_t = torch.where(valid, tgt, torch.zeros_like(tgt)).long()
    w_t = (cw[safe_t] if cw is not None else torch.ones(N, dtype=f64, device=dev)) * valid
    return _Operands(
        X=x.detach().to(f64),
        W=weight.detach().to(dev, f64),
        B=bias.detach().to(dev, f64) if bias is not None else None,
        cw=cw,
        eps=float(opts.label_smoothing),
        lam=float(opts.z_loss_scale),
        softcap=opts.softcap,
        upstream=_check_upstream(upstream, opts, N, dev),
        valid=valid,
        safe_t=safe_t,
        w_t=w_t,
        S_w=float(cw.sum()) if cw is not None else float(V),
        row_blocks=_blocks(N, row_chunk),
        col_blocks=_blocks(V, vocab_chunk),
    )


def _row_pass(ops: _Operands) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pass 1: per row, ``lse`` by an online log-sum-exp over vocabulary blocks, the target logit z'_{i,y_i}
    (0 on ignored rows) and Σ_j w_j·z'_ij."""
    X, cw = ops.X, ops.cw
    N, dev, f64 = X.shape[0], X.device, torch.float64
    lse = torch.empty(N, dtype=f64, device=dev)
    z_tgt = torch.zeros(N, dtype=f64, device=dev)
    wz_sum = torch.zeros(N, dtype=f64, device=dev)
    for r in ops.row_blocks:
        m = torch.full((r.stop - r.start,), -math.inf, dtype=f64, device=dev)
        acc = torch.zeros_like(m)
        zt = torch.zeros_like(m)
        wz = torch.zeros_like(m)
        t_r = ops.safe_t[r]
        for c in ops.col_blocks:
            _, zc, _ = ops.logits(r, c)
            m_new = torch.maximum(m, zc.max(dim=1).values)
            acc = acc * torch.exp(m - m_new) + torch.exp(zc - m_new[:, None]).sum(dim=1)
            m = m_new
            inside = (t_r >= c.start) & (t_r < c.stop)
            local = (t_r - c.start).clamp(0, c.stop - c.start - 1)
            zt = zt + torch.where(inside, zc.gather(1, local[:, None]).squeeze(1), torch.zeros_like(zt))
            wz = wz + (zc @ cw[c] if cw is not None else zc.sum(dim=1))
        lse[r] = m + torch.log(acc)
        z_tgt[r] = zt
        wz_sum[r] = wz
    return lse, z_tgt * ops.valid, wz_sum


@dataclass(frozen=True)
class _Reduced:
    """The forward's results: per-row losses, the reduced loss and z-loss, and the backward's row statistics."""

    per_row: torch.Tensor
    loss: torch.Tensor
    z_loss: torch.Tensor
    stats: RowStats


def _reduce(
    ops: _Operands,
    lse: torch.Tensor,
    z_tgt: torch.Tensor,
    wz_sum: torch.Tensor,
    reduction: str,
    all_ignored: AllIgnored,
) -> _Reduced:
    """Per-row ℓ_i and ζ_i, their reduction, and the backward's coefficients c_i and c^z_i."""
    valid, w_t, eps, lam, u = ops.valid, ops.w_t, ops.eps, ops.lam, ops.upstream
    N, V, dev, f64 = lse.shape[0], ops.W.shape[0], lse.device, torch.float64
    nll = torch.where(valid, lse - z_tgt, torch.zeros_like(lse))
    smooth = torch.where(valid, ops.S_w * lse - wz_sum, torch.zeros_like(lse))
    ce_row = (1.0 - eps) * w_t * nll + (eps / V) * smooth
    z_row = torch.where(valid, lam * lse * lse, torch.zeros_like(lse))
    per_row = ce_row + z_row
    n_valid = int(valid.sum())
    D = float(w_t.sum())
    if reduction == "mean":
        if n_valid == 0:
            fill = math.nan if all_ignored == "nan" else 0.0
            loss = torch.tensor(fill, dtype=f64, device=dev)
            z_loss = torch.tensor(fill, dtype=f64, device=dev)
            coef_ce = torch.zeros(N, dtype=f64, device=dev)
            coef_z = torch.zeros(N, dtype=f64, device=dev)
        else:
            loss = ce_row.sum() / D + z_row.sum() / n_valid
            z_loss = z_row.sum() / n_valid
            coef_ce = u / D
            coef_z = u / n_valid
        normalizer = D
    elif reduction == "sum":
        loss, z_loss = per_row.sum(), z_row.sum()
        coef_ce = coef_z = u
        normalizer = 1.0
    else:
        loss, z_loss = per_row.clone(), z_row.clone()
        coef_ce = coef_z = u
        normalizer = 1.0
    stats = RowStats(
        lse=lse,
        z_target=z_tgt,
        valid=valid,
        w_target=w_t,
        coef_ce=coef_ce * valid,
        coef_z=coef_z * valid,
        normalizer=normalizer,
        n_valid=n_valid,
    )
    return _Reduced(per_row=per_row, loss=loss, z_loss=z_loss, stats=stats)


def _pass2_blocks(ops: _Operands, stats: RowStats) -> Iterator[Block]:
    """Pass 2's blocks in order (rows outer, vocabulary inner): each recomputed, with p and G (the gradient
    w.r.t. z)."""
    X, W, B, cw, eps = ops.X, ops.W, ops.B, ops.cw, ops.eps
    V = W.shape[0]
    lse, S_w = stats.lse, ops.S_w
    a = (1.0 - eps) * stats.coef_ce * ops.w_t  # weight on (p − onehot)
    e = (eps / V) * stats.coef_ce  # weight on (S_w p − w)
    zz = 2.0 * ops.lam * stats.coef_z * lse  # weight on p from z-loss
    for r in ops.row_blocks:
        t_r = ops.safe_t[r]
        for c in ops.col_blocks:
            z, zc, d = ops.logits(r, c)
            p = torch.exp(zc - lse[r, None])
            g = (a[r] + e[r] * S_w + zz[r])[:, None] * p
            if cw is not None:
                g = g - e[r][:, None] * cw[c][None, :]
            elif eps:
                g = g - e[r][:, None]
            inside = (t_r >= c.start) & (t_r < c.stop)
            if bool(inside.any()):
                idx = inside.nonzero().squeeze(1)
                g[idx, t_r[idx] - c.start] -= a[r][idx]
            G = g * d if d is not None else g
            yield Block(
                rows=r, cols=c, x=X[r], w=W[c], b=B[c] if B is not None else None, z=z, zc=zc, p=p, G=G, dzc_dz=d
            )


@dataclass(frozen=True)
class _Prepared:
    """The oracle after pass 1 and the reduction (its options, operands, lse and forward results), with pass 2's
    blocks on demand: the one walk that both :func:`linear_ce` and :func:`block_walker` make."""

    options: CEOptions
    ops: _Operands
    lse: torch.Tensor
    forward: _Reduced

    def blocks(self) -> Iterator[Block]:
        """Pass 2's blocks in order (:func:`_pass2_blocks`)."""
        return _pass2_blocks(self.ops, self.forward.stats)

    def walk(self, observer: BlockObserver) -> None:
        """Show ``observer`` every block of pass 2, in order, with the row statistics."""
        for blk in self.blocks():
            observer.block(blk, self.forward.stats)


def _prepare(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    options: CEOptions | None,
    upstream: torch.Tensor | float | None,
    all_ignored: AllIgnored,
    row_chunk: int,
    vocab_chunk: int,
) -> _Prepared:
    """Check the arguments (:func:`linear_ce`'s), upcast the operands and run pass 1 and the reduction."""
    opts = options if options is not None else CEOptions()
    _check_inputs(x, weight, target, bias, opts)
    if all_ignored not in ("nan", "zero"):
        raise ValueError(f"all_ignored must be 'nan' or 'zero', got {all_ignored!r}")
    if row_chunk < 1 or vocab_chunk < 1:
        raise ValueError(f"row_chunk and vocab_chunk must be >= 1, got {row_chunk}, {vocab_chunk}")
    ops = _operands(x, weight, target, bias, opts, upstream, row_chunk, vocab_chunk)
    lse, z_tgt, wz_sum = _row_pass(ops)
    return _Prepared(
        options=opts, ops=ops, lse=lse, forward=_reduce(ops, lse, z_tgt, wz_sum, opts.reduction, all_ignored)
    )


def _backward(
    prep: _Prepared, observer: BlockObserver | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Pass 2: walk every block and accumulate grad_x, grad_W, grad_b from its G (the gradient w.r.t. z)."""
    X, W, B, stats = prep.ops.X, prep.ops.W, prep.ops.B, prep.forward.stats
    (N, H), V, dev, f64 = X.shape, W.shape[0], X.device, torch.float64
    gx = torch.zeros(N, H, dtype=f64, device=dev)
    gw = torch.zeros(V, H, dtype=f64, device=dev)
    gb = torch.zeros(V, dtype=f64, device=dev) if B is not None else None
    for blk in prep.blocks():
        r, c, G = blk.rows, blk.cols, blk.G
        gx[r] += G @ W[c]
        gw[c] += G.T @ X[r]
        if gb is not None:
            gb[c] += G.sum(dim=0)
        if observer is not None:
            observer.block(blk, stats)
    return gx, gw, gb


def linear_ce(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    options: CEOptions | None = None,
    upstream: torch.Tensor | float | None = None,
    all_ignored: AllIgnored = "nan",
    row_chunk: int = DEFAULT_ROW_CHUNK,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
    observer: BlockObserver | None = None,
) -> LinearCEResult:
    """Float64 forward and analytic backward of linear + cross-entropy.

    Args:
        x: ``[N, H]`` activations, any float dtype (upcast to float64 exactly).
        weight: ``[V, H]``.
        target: ``[N]`` integer classes; entries equal to ``options.ignore_index`` are ignored.
        bias: ``[V]`` or ``None``.
        options: :class:`CEOptions` (defaults: PyTorch's).
        upstream: the gradient flowing into the loss: a scalar (``mean``/``sum``) or ``[N]`` (``none``);
            ``None`` means 1.
        all_ignored: what ``mean`` gives when every row is ignored: ``"nan"`` (PyTorch: NaN loss, zero
            gradients) or ``"zero"`` (Liger: zero loss and gradients).
        row_chunk, vocab_chunk: block sizes (results agree across sizes to float64 rounding).
        observer: optional :class:`BlockObserver` shown every block of the backward sweep.

    Raises:
        ValueError: naming the argument, for bad shapes, dtypes, targets or options.
    """
    prep = _prepare(x, weight, target, bias, options, upstream, all_ignored, row_chunk, vocab_chunk)
    gx, gw, gb = _backward(prep, observer)
    fwd = prep.forward
    return LinearCEResult(
        loss=fwd.loss,
        per_row=fwd.per_row,
        lse=prep.lse,
        z_loss=fwd.z_loss,
        grad_x=gx,
        grad_weight=gw,
        grad_bias=gb,
        stats=fwd.stats,
        options=prep.options,
    )


def block_walker(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    options: CEOptions | None = None,
    upstream: torch.Tensor | float | None = None,
    all_ignored: AllIgnored = "nan",
    row_chunk: int = DEFAULT_ROW_CHUNK,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
) -> tuple[RowStats, Callable[[BlockObserver], None]]:
    """Pass 1 of :func:`linear_ce` once, and a function that shows an observer every block of pass 2 (the same
    blocks, bit for bit, as :func:`linear_ce` shows its observer) without accumulating the gradients: for a
    caller that sweeps the blocks several times (the tolerance model's two phases) and needs no second oracle.
    Arguments as :func:`linear_ce`'s."""
    prep = _prepare(x, weight, target, bias, options, upstream, all_ignored, row_chunk, vocab_chunk)
    return prep.forward.stats, prep.walk


def forward_autograd(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    options: CEOptions | None = None,
    all_ignored: AllIgnored = "nan",
) -> torch.Tensor:
    """The same forward written with differentiable float64 torch ops over the full [N, V] logits.

    It exists to prove the analytic backward of :func:`linear_ce` against autograd and gradcheck; it
    materializes [N, V], so it is for small shapes only. Inputs must already be float64.
    """
    opts = options if options is not None else CEOptions()
    _check_inputs(x, weight, target, bias, opts)
    V = weight.shape[0]
    z = x @ weight.T
    if bias is not None:
        z = z + bias
    if opts.softcap is not None:
        z = opts.softcap * torch.tanh(z / opts.softcap)
    lse = torch.logsumexp(z, dim=1)
    valid = target != opts.ignore_index
    safe_t = torch.where(valid, target, torch.zeros_like(target)).long()
    cw = opts.class_weights.to(z) if opts.class_weights is not None else torch.ones(V, dtype=z.dtype, device=z.device)
    w_t = cw[safe_t] * valid
    eps = float(opts.label_smoothing)
    nll = lse - z.gather(1, safe_t[:, None]).squeeze(1)
    smooth = cw.sum() * lse - z @ cw
    ce_row = torch.where(valid, (1 - eps) * w_t * nll + (eps / V) * smooth, torch.zeros_like(lse))
    z_row = torch.where(valid, opts.z_loss_scale * lse * lse, torch.zeros_like(lse))
    if opts.reduction == "none":
        return ce_row + z_row
    if opts.reduction == "sum":
        return (ce_row + z_row).sum()
    n_valid = valid.sum()
    if int(n_valid) == 0:
        fill = math.nan if all_ignored == "nan" else 0.0
        return (ce_row + z_row).sum() * 0.0 + fill
    return ce_row.sum() / w_t.sum() + z_row.sum() / n_valid
