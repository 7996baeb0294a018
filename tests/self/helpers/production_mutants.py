"""A mutant only the production-shape tier catches: a Triton CE kernel that forms element offsets in int32.

``int32_offsets`` has the structure of the built-in ``chunked_triton`` (:mod:`impls.builtin.triton_ce`: logits in the
compute dtype, a Triton kernel sweeping each row's vocabulary twice, online softmax then G in place of the
logits, grad_x = G·W and grad_W = Gᵀ·x in fp32) with two changes: its one chunk is every row (the [N, V] logits
exist whole, as in an unfused CE kernel), and its kernel computes ``row * stride + col`` in int32 where the
built-in widens the row to int64 first. Below N·V = 2³¹ that is the same kernel; from the first row with
(row+1)·V > 2³¹ the offsets wrap to negative values and the kernel reads and writes 2³² elements before the row.

A wrapped offset points outside the logits tensor. So that the tier sees wrong values rather than a fault that
ends the process (or writes over another tensor), the wrapper places the logits 2³¹ elements into a larger
buffer of zeros: the wrapped reads find zeros there, the wrapped writes land there, and the rows from the first
wrapped one on come back with wrong losses and gradients. The property suite's shapes never reach 2³¹ elements,
so only ``numcheck production`` at its ``int32-*`` shape catches it, and its failure names that row
(``tests/self/properties/test_production_tier.py``; the CUDA run in ``results/production/``).

Load it with ``--impl numcheck.tests.self.helpers.production_mutants:int32_offsets`` (from a checkout).
"""

from __future__ import annotations

import torch

from numcheck.impls.builtin.chunked import ChunkedLinearCE
from numcheck.impls.builtin.triton_ce import _launch_shape, triton_support
from numcheck.impls.triton_lang import tl, triton, unavailable_reason
from numcheck.reference.numerics.ce_block import BlockResult, SoftmaxStats, check_block

#: Elements an int32 offset addresses before it wraps; the guard in front of the logits (see the module docstring).
GUARD = 2**31

if triton is not None:

    @triton.jit
    def _ce_kernel_int32(
        L,
        stride_l,
        T,
        CC,
        CE_OUT,
        LSE_OUT,
        M_OUT,
        LOGS_OUT,
        C,
        V,
        ignore_index,
        WANT_GRAD: tl.constexpr,
        ROWS: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        rmask = rows < C
        rows_s = tl.minimum(rows, C - 1)
        y = tl.load(T + rows_s).to(tl.int64)
        valid = (y != ignore_index) & rmask
        ys = tl.where(valid, y, 0)
        cols0 = tl.arange(0, BLOCK_V)
        m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
        s = tl.zeros([ROWS], dtype=tl.float32)
        zy = tl.zeros([ROWS], dtype=tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + cols0
            cm = cols < V
            offs = rows_s[:, None] * stride_l + cols[None, :]  # the mutation: int32 (the built-in widens the row)
            z = tl.load(L + offs, mask=cm[None, :], other=0.0).to(tl.float32)
            zm = tl.where(cm[None, :], z, float("-inf"))
            m_new = tl.maximum(m, tl.max(zm, 1))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(zm - m_new[:, None]), 1)
            zy += tl.sum(tl.where(cols[None, :] == ys[:, None], z, 0.0), 1)
            m = m_new
        log_s = tl.log(s)
        tl.store(CE_OUT + rows, tl.where(valid, (m - zy) + log_s, 0.0), mask=rmask)
        tl.store(LSE_OUT + rows, m + log_s, mask=rmask)
        tl.store(M_OUT + rows, m, mask=rmask)
        tl.store(LOGS_OUT + rows, log_s, mask=rmask)
        if WANT_GRAD:
            c = tl.where(valid, tl.load(CC + rows_s), 0.0)
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + cols0
                cm = cols < V
                offs = rows_s[:, None] * stride_l + cols[None, :]
                z = tl.load(L + offs, mask=cm[None, :], other=0.0).to(tl.float32)
                p = tl.exp((z - m[:, None]) - log_s[:, None])
                g = c[:, None] * (p - tl.where(cols[None, :] == ys[:, None], 1.0, 0.0))
                tl.store(L + offs, g.to(L.dtype.element_ty), mask=rmask[:, None] & cm[None, :])


def _guarded(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` copied GUARD elements into a zero buffer when it has more than GUARD elements (see the module
    docstring); itself otherwise."""
    if logits.numel() <= GUARD:
        return logits
    buf = torch.zeros(GUARD + logits.numel(), dtype=logits.dtype, device=logits.device)
    inner = buf[GUARD:].view(logits.shape)
    inner.copy_(logits)
    return inner


def ce_block_int32_(
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
    """The :class:`reference.numerics.ce_block.CEKernel` contract for plain CE (ignore_index and per-row coefficients; the
    options it does not declare raise), with the int32 kernel. ``stats`` are recomputed, not read (the same
    kernel on the same logits gives them bit for bit)."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"ce_block_int32_: {reason}")
    if label_smoothing or class_weights is not None or softcap is not None or z_loss_scale:
        raise ValueError("ce_block_int32_: only plain CE (no smoothing, class weights, softcap or z-loss)")
    check_block(logits, target, coef_ce, coef_z, class_weights, stats)
    C, V = logits.shape
    dev, f32 = logits.device, torch.float32
    ce, lse, m, log_s = (torch.empty(C, dtype=f32, device=dev) for _ in range(4))
    if C:
        work = _guarded(logits.contiguous())
        rows, block_v, warps = _launch_shape(C, V)
        _ce_kernel_int32[(triton.cdiv(C, rows),)](
            work,
            work.stride(0),
            target.contiguous(),
            coef_ce.to(f32).contiguous(),
            ce,
            lse,
            m,
            log_s,
            C,
            V,
            int(ignore_index),
            WANT_GRAD=want_grad,
            ROWS=rows,
            BLOCK_V=block_v,
            num_warps=warps,
        )
        if want_grad and work.data_ptr() != logits.data_ptr():
            logits.copy_(work)
    return BlockResult(
        ce if want_loss else None, torch.zeros_like(ce) if want_loss else None, lse, SoftmaxStats(m, log_s)
    )


#: One chunk of every row (N below 2⁶² is always one chunk).
WHOLE = 2**62

int32_offsets = ChunkedLinearCE(
    "mutant_int32_offsets",
    path="addmm_out_dtype",
    chunk_rows=WHOLE,
    kernel=ce_block_int32_,
    support=triton_support(options=frozenset({"ignore_index"})),
    description="mutant: chunked_triton's structure over the whole [N, V] logits, element offsets in int32",
)
