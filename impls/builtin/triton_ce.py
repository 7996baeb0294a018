"""A Triton cross-entropy kernel for one logits chunk, and the ``chunked_triton`` impl that uses it.

:func:`ce_block_triton_` has exactly the contract of :func:`reference.numerics.ce_block.ce_block_` (same options, same
per-row outputs, gradient G written in place of the logits chunk in its dtype) and every option: ignore_index,
per-row coefficients (so every reduction and a per-row upstream), label smoothing, class weights, softcap,
z-loss, and known row statistics (recompute). Each program takes ``ROWS`` rows and sweeps the vocabulary in blocks of
``BLOCK_V`` twice: pass 1 is an online softmax (running max m and rescaled sum s) that also gathers the target
logit and Σ_j w_j (m − z'_ij) (re-based as m grows); pass 2 forms G in fp32 and stores it over the logits.
Every quantity is formed from non-negative parts exactly as in the torch block (see :mod:`reference.numerics.ce_block`):
loss (m − z'_y) + log s, softmax exp((z' − m) − log s), true-class term p_y − 1 before it is scaled. Padded vocabulary lanes are
set to −inf *after* the softcap (s·tanh(−inf/s) = −s would otherwise leak into the softmax).

tanh is computed here (Triton's libdevice is not available under the interpreter): tanh(a) = sign(a)·(1−e)/(1+e)
with e = exp(−2|a|) for |a| ≥ 0.15, and the odd Taylor polynomial to a⁷ below (truncation < 0.022·a⁸·|a| ≤
6e-9·|a|, under one fp32 ulp), so it is within a few fp32 ulps of torch.tanh everywhere.

It runs compiled on CUDA, and on CPU under ``TRITON_INTERPRET=1``, which numcheck's entry points set
(:mod:`impls.interpreter`) before this module is imported when CUDA is absent. The interpreter is slow: small shapes only.
"""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls.builtin.chunked import ChunkedLinearCE
from numcheck.impls.protocols.linear_ce import ElementaryError, LinearCESupport
from numcheck.impls.triton_lang import INTERPRET, tl, triton, unavailable_reason
from numcheck.reference.numerics.ce_block import BlockResult, SoftmaxStats, check_block

if triton is not None:

    @triton.jit
    def _tanh(a):
        aa = tl.abs(a)
        e = tl.exp(-2.0 * aa)
        big = (1.0 - e) / (1.0 + e)
        a2 = aa * aa
        small = aa * (1.0 + a2 * (-0.3333333333333333 + a2 * (0.13333333333333333 + a2 * -0.05396825396825397)))
        r = tl.where(aa < 0.15, small, big)
        return tl.where(a < 0.0, -r, r)

    @triton.jit
    def _ce_kernel(
        L,
        stride_l,
        T,
        CC,
        CZ,
        CW,
        SW,
        M_IN,
        LOGS_IN,
        CE_OUT,
        Z_OUT,
        LSE_OUT,
        M_OUT,
        LOGS_OUT,
        C,
        V,
        ignore_index,
        eps,
        lam,
        softcap,
        HAS_CW: tl.constexpr,
        HAS_EPS: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        HAS_STATS: tl.constexpr,
        WANT_LOSS: tl.constexpr,
        WANT_GRAD: tl.constexpr,
        ROWS: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        rmask = rows < C
        rows_s = tl.minimum(rows, C - 1)  # rows past the chunk read row C-1 and store nothing
        y = tl.load(T + rows_s).to(tl.int64)
        valid = (y != ignore_index) & rmask
        ys = tl.where(valid, y, 0)
        if HAS_CW:
            w_t = tl.where(valid, tl.load(CW + ys).to(tl.float32), 0.0)
            s_w = tl.load(SW).to(tl.float32)
        else:
            w_t = tl.where(valid, 1.0, 0.0)
            s_w = V * 1.0
        row_ptr = L + rows_s.to(tl.int64)[:, None] * stride_l
        cols0 = tl.arange(0, BLOCK_V)

        if HAS_STATS:
            m = tl.load(M_IN + rows_s)
            log_s = tl.load(LOGS_IN + rows_s)
        else:
            m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
            log_s = tl.zeros([ROWS], dtype=tl.float32)
        if WANT_LOSS or not HAS_STATS:
            # Pass 1, online: running max m, Σ exp(z' − m), the target's z', and for smoothing
            # Σ_j w_j (m − z'_j) (non-negative terms; re-based by (m_new − m)·Σ w when m grows).
            s = tl.zeros([ROWS], dtype=tl.float32)
            zy = tl.zeros([ROWS], dtype=tl.float32)
            wd = tl.zeros([ROWS], dtype=tl.float32)
            wsum = tl.zeros([ROWS], dtype=tl.float32)
            if HAS_STATS:
                m_run = tl.full([ROWS], float("-inf"), dtype=tl.float32)
            else:
                m_run = m
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + cols0
                cm = cols < V
                z = tl.load(row_ptr + cols[None, :], mask=cm[None, :], other=0.0).to(tl.float32)
                if HAS_SOFTCAP:
                    z = softcap * _tanh(z / softcap)
                zm = tl.where(cm[None, :], z, float("-inf"))  # padded lanes stay out, also after the softcap
                m_new = tl.maximum(m_run, tl.max(zm, 1))
                s = s * tl.exp(m_run - m_new) + tl.sum(tl.exp(zm - m_new[:, None]), 1)
                zy += tl.sum(tl.where(cols[None, :] == ys[:, None], z, 0.0), 1)
                if HAS_EPS:
                    if HAS_CW:
                        w = tl.load(CW + cols, mask=cm, other=0.0).to(tl.float32)
                    else:
                        w = tl.where(cm, 1.0, 0.0)
                    m_prev = tl.where(wsum > 0.0, m_run, m_new)  # nothing to re-base before the first block
                    wd += (m_new - m_prev) * wsum
                    wd += tl.sum(tl.where(cm[None, :], (m_new[:, None] - z) * w[None, :], 0.0), 1)
                    wsum += tl.sum(w, 0)
                m_run = m_new
            log_s_run = tl.log(s)
            if not HAS_STATS:
                m = m_run
                log_s = log_s_run
            if WANT_LOSS:  # from this pass's own statistics, with which zy and wd were formed
                ce = (1.0 - eps) * w_t * ((m_run - zy) + log_s_run)
                if HAS_EPS:
                    ce += (eps / V) * (wd + s_w * log_s_run)
                lse_l = m_run + log_s_run
                tl.store(CE_OUT + rows, tl.where(valid, ce, 0.0), mask=rmask)
                tl.store(Z_OUT + rows, tl.where(valid, lam * lse_l * lse_l, 0.0), mask=rmask)
        lse = m + log_s
        tl.store(LSE_OUT + rows, lse, mask=rmask)
        tl.store(M_OUT + rows, m, mask=rmask)
        tl.store(LOGS_OUT + rows, log_s, mask=rmask)

        if WANT_GRAD:
            c = tl.where(valid, tl.load(CC + rows_s), 0.0)
            cz = tl.where(valid, tl.load(CZ + rows_s), 0.0)
            a = (1.0 - eps) * c * w_t
            e = (eps / V) * c
            b = e * s_w + 2.0 * lam * cz * lse
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + cols0
                cm = cols < V
                z = tl.load(row_ptr + cols[None, :], mask=cm[None, :], other=0.0).to(tl.float32)
                if HAS_SOFTCAP:
                    t = _tanh(z / softcap)
                    z = softcap * t
                p = tl.exp((z - m[:, None]) - log_s[:, None])
                # a·(p − δ_y) + b·p: at the target a·(p_y − 1) + b·p_y, p_y − 1 exact before it is scaled and b·p_y
                # its own term ((a + b)·(p_y − 1) + b leaves u·b, large under a z-loss: see reference/numerics/ce_block.py)
                is_y = cols[None, :] == ys[:, None]
                g = a[:, None] * (p - tl.where(is_y, 1.0, 0.0)) + b[:, None] * p
                if HAS_EPS:
                    if HAS_CW:
                        w = tl.load(CW + cols, mask=cm, other=0.0).to(tl.float32)
                        g -= e[:, None] * w[None, :]
                    else:
                        g -= e[:, None]
                if HAS_SOFTCAP:
                    g = g * (1.0 - t * t)
                tl.store(row_ptr + cols[None, :], g.to(L.dtype.element_ty), mask=rmask[:, None] & cm[None, :])


#: fp32's log2(e), as Triton's tl.exp multiplies by it on CUDA (2^(x·log2 e), ElementwiseOpToLLVM.cpp).
_LOG2E_F32 = float(torch.tensor(1.4426950408889634, dtype=torch.float32))
_U32 = 2.0**-24


def exp2_arg_ulps() -> float:
    """Ulps per unit |x| of exp(x) evaluated as 2^fl(x·fl(log2 e)): the exponent errs by |x|·(|fl(log2 e) − log2 e|
    + u·log2 e), which moves the result relatively by ln 2 times that; one ulp is at least 2u relative."""
    import math

    rel = math.log(2) * (abs(_LOG2E_F32 - 1 / math.log(2)) + _U32 / math.log(2))
    return rel / (2 * _U32)


def composite_tanh_ulps(exp: ElementaryError, div_ulps: float, arg_div: bool = True) -> float:
    """Ulps beyond correct rounding of :func:`_tanh` applied to fl(z/s), first order, worst over its argument:
    what a declaration's ``tanh`` field is for this kernel, given the accuracy of its exp and of fp32 division.

    Relative errors in units of u. For |a| ≥ 0.15, t = (1 − e)/(1 + e) with e = exp(−2|a|): e's error
    (1 + 2·n_exp + 2·n_arg·2|a|) is amplified by 2e/(1 − e²); 1 − e is exact for e ≥ 1/2 (Sterbenz), else one
    rounding; 1 + e one rounding; the division 1 + 2·n_div; the caller's a = z/s another 1 + 2·n_div, damped by
    2a/sinh(2a). Below 0.15 the Taylor polynomial: its Horner steps ≈ 1.03, the product with a 1, truncation
    0.094 (< 0.022·a⁸·|a|), and the caller's division. The model already counts one rounding each for tanh and
    the division (2u); the rest, halved, is in ulps."""
    import math

    div = 1 + 2 * div_ulps
    worst = 1.03 + 1 + 0.094 + (div if arg_div else 1)
    for k in range(0, 4000):
        a = 0.15 + k * 0.005
        e = math.exp(-2 * a)
        eps_e = 1 + 2 * exp.exp + 2 * exp.exp_per_arg * 2 * a
        total = 2 * e / (1 - e * e) * eps_e + (0 if e >= 0.5 else 1) + 1 + div
        total += (2 * a / math.sinh(2 * a)) * (div if arg_div else 1)
        worst = max(worst, total)
    return max(worst - 2, 0.0) / 2


def elementary_error(interpreted: bool) -> ElementaryError:
    """The accuracy of the exp, log and tanh the CE kernel evaluates (``docs/error-analysis.md``, "Elementary
    functions"). Compiled for CUDA: tl.exp is ex2.approx.f32 of x·log2 e (2 ulps, PTX ISA, plus
    :func:`exp2_arg_ulps` per |x|), tl.log libdevice's logf (1 ulp) or lg2.approx.f32 times ln 2 (absolute
    error ≈ 1 ulp of 1, plus the product): 2; fp32 ``/`` is div.full.f32 (2 ulps). Interpreted on CPU: numpy's
    float32 exp and log (at most 2.52 and 3.83 ulps, numpy's SIMD implementations; measured 2.43 and 2.99 here),
    IEEE division, and bf16 stores that truncate (``bf16_store``). tanh is this module's :func:`_tanh`
    (:func:`composite_tanh_ulps`)."""
    if interpreted:
        exp = ElementaryError(exp=3.0, log=4.0)
        div = 0.0
    else:
        exp = ElementaryError(exp=2.0, exp_per_arg=exp2_arg_ulps(), log=2.0)
        div = 2.0
    return ElementaryError(
        exp=exp.exp,
        exp_per_arg=exp.exp_per_arg,
        log=exp.log,
        tanh=composite_tanh_ulps(exp, div),
        bf16_store=0.5 if interpreted else 0.0,
    )


def triton_library_elementary(interpreted: bool, *, softmax_divides: bool) -> ElementaryError:
    """The accuracy of a third-party Triton CE kernel built from tl.exp/tl.exp2 of an fp32 product, tl.log and
    libdevice's tanh of x/softcap (Liger-Kernel, cut-cross-entropy); interpreted, bf16 stores truncate
    (``bf16_store``, measured: :func:`properties.core.tensors.kernel_store`). On CUDA: exp 2 ulps plus
    :func:`exp2_arg_ulps` per |x| (also when the kernel multiplies by log2 e itself for tl.exp2), + 2 where the
    softmax is exp(…)/d (div.full.f32, 2 ulps); log 2 (as :func:`elementary_error`); tanh libdevice's tanhf 2 ulps
    + 2 for div.full in x/softcap. Interpreted: numpy's float32 exp 3, log 4, tanh 2 (measured 1.37 here), IEEE
    division, and the kernel's own product by log2 e."""
    if interpreted:
        return ElementaryError(exp=3.0, exp_per_arg=exp2_arg_ulps(), log=4.0, tanh=2.0, bf16_store=0.5)
    return ElementaryError(exp=2.0 + (2.0 if softmax_divides else 0.0), exp_per_arg=exp2_arg_ulps(), log=2.0, tanh=4.0)


def _launch_shape(C: int, V: int) -> tuple[int, int, int]:
    """``(ROWS, BLOCK_V, num_warps)``: one row per program with wide vocabulary blocks when compiled;
    many rows per program under the interpreter, whose cost is per operation, not per element."""
    bv = triton.next_power_of_2(V)
    if INTERPRET:
        return min(triton.next_power_of_2(C), 32), min(bv, 1024), 4
    bv = min(bv, 8192)
    return 1, bv, 16 if bv >= 4096 else 8


def ce_block_triton_(
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
    """The Triton equivalent of :func:`reference.numerics.ce_block.ce_block_` (same arguments and result; G replaces
    ``logits``, which must have unit stride along the vocabulary; without ``want_grad`` the logits are left
    untouched)."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"ce_block_triton_: {reason}")
    check_block(logits, target, coef_ce, coef_z, class_weights, stats)
    if logits.stride(1) != 1:
        raise ValueError(f"logits must have unit stride along V, got strides {logits.stride()}")
    result = _empty_result(logits.shape[0], logits.device, want_loss)
    if logits.shape[0] == 0:
        return result
    _launch_ce_kernel(
        logits,
        target,
        coef_ce,
        coef_z,
        result,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        class_weights=class_weights,
        softcap=softcap,
        z_loss_scale=z_loss_scale,
        stats=stats,
        want_loss=want_loss,
        want_grad=want_grad,
    )
    return result


def _empty_result(C: int, device: torch.device, want_loss: bool) -> BlockResult:
    """The fp32 ``[C]`` outputs the kernel fills; ``ce`` and ``z`` only with ``want_loss``."""
    f32 = torch.float32
    lse = torch.empty(C, dtype=f32, device=device)
    m_out = torch.empty(C, dtype=f32, device=device)
    logs_out = torch.empty(C, dtype=f32, device=device)
    ce = torch.empty(C, dtype=f32, device=device) if want_loss else None
    z = torch.empty(C, dtype=f32, device=device) if want_loss else None
    return BlockResult(ce, z, lse, SoftmaxStats(m_out, logs_out))


def _launch_ce_kernel(
    logits: torch.Tensor,
    target: torch.Tensor,
    coef_ce: torch.Tensor,
    coef_z: torch.Tensor,
    out: BlockResult,
    *,
    ignore_index: int,
    label_smoothing: float,
    class_weights: torch.Tensor | None,
    softcap: float | None,
    z_loss_scale: float,
    stats: SoftmaxStats | None,
    want_loss: bool,
    want_grad: bool,
) -> None:
    """One launch of :func:`_ce_kernel` over the chunk's rows, writing ``out`` (and G into ``logits`` with
    ``want_grad``). A pointer the kernel never reads (loss outputs without ``want_loss``, class weights without
    ``HAS_CW``, statistics without ``HAS_STATS``) is given as ``out.lse``."""
    C, V = logits.shape
    f32 = torch.float32
    lse = out.lse
    cw = class_weights.to(f32).contiguous() if class_weights is not None else None
    sw = cw.sum().reshape(1) if cw is not None else lse  # a pointer only read when HAS_CW
    m_in, logs_in = (
        (stats.m.to(f32).contiguous(), stats.log_s.to(f32).contiguous()) if stats is not None else (lse, lse)
    )
    rows, block_v, warps = _launch_shape(C, V)
    _ce_kernel[(triton.cdiv(C, rows),)](
        logits,
        logits.stride(0),
        target.contiguous(),
        coef_ce.to(f32).contiguous(),
        coef_z.to(f32).contiguous(),
        cw if cw is not None else lse,
        sw,
        m_in,
        logs_in,
        out.ce if want_loss else lse,
        out.z if want_loss else lse,
        lse,
        out.stats.m,
        out.stats.log_s,
        C,
        V,
        int(ignore_index),
        float(label_smoothing),
        float(z_loss_scale),
        float(softcap) if softcap is not None else 1.0,
        HAS_CW=cw is not None,
        HAS_EPS=bool(label_smoothing),
        HAS_SOFTCAP=softcap is not None,
        HAS_STATS=stats is not None,
        WANT_LOSS=want_loss,
        WANT_GRAD=want_grad,
        ROWS=rows,
        BLOCK_V=block_v,
        num_warps=warps,
    )


#: Tokens per chunk of the ``split_fp32`` impls: at V=131072 a bf16 logits chunk of 640 rows is 160 MiB, which
#: with the 1024 MiB lower half of the split accumulator stays under the 1200 MiB extra-peak target of the GPU
#: tier, while the accumulator's per-chunk read and write (8 bytes per [V, H] element, 4 GiB) stays close to
#: the time of the chunk's grad_W GEMM on an H200 (``docs/accumulation-and-memory.md``, "Speed on one H200").
SPLIT_CHUNK_ROWS = 640


def triton_support(**changes: Any) -> LinearCESupport:
    """The declaration of a chunked impl with this module's kernel (with ``changes`` to its fields): it runs
    where Triton does (CUDA, or the CPU under the interpreter, slowly) with :func:`elementary_error`'s accuracy."""
    fields: dict[str, Any] = {
        "returns_z_loss": True,
        "all_ignored": "nan",
        "devices": frozenset({"cpu"}) if INTERPRET else frozenset({"cuda"}),
        "elementary_error": elementary_error(INTERPRET),
        "requires": unavailable_reason,
        "slow": INTERPRET,
    }
    return LinearCESupport(**{**fields, **changes})


def triton_impls() -> list[ChunkedLinearCE]:
    """``chunked_triton`` (fp32 [V, H] accumulator via addmm_out_dtype), and ``chunked_triton[split_fp32]`` /
    ``recompute_triton[split_fp32]`` (the exact fp32 sum held as the bf16 gradient plus a 16-bit lower half)."""
    where = " [Triton interpreter]" if INTERPRET else ""
    return [
        ChunkedLinearCE(
            "chunked_triton",
            path="addmm_out_dtype",
            kernel=ce_block_triton_,
            support=triton_support(),
            description="chunked FLCE with the Triton CE kernel (online softmax, G in place of the logits), "
            "grad_weight via addmm_out_dtype" + where,
        ),
        ChunkedLinearCE(
            "chunked_triton[split_fp32]",
            path="split_fp32",
            kernel=ce_block_triton_,
            chunk_rows=SPLIT_CHUNK_ROWS,
            support=triton_support(),
            description="chunked FLCE with the Triton CE kernel; grad_weight's exact fp32 sum kept as the bf16 "
            "gradient plus an int16 lower half, added by a Triton GEMM (impls.builtin.split_accum)" + where,
        ),
        ChunkedLinearCE(
            "recompute_triton[split_fp32]",
            path="split_fp32",
            kernel=ce_block_triton_,
            chunk_rows=SPLIT_CHUNK_ROWS,
            recompute=True,
            support=triton_support(),
            description="recompute (O(N) held across backward) with the Triton CE kernel and the split fp32 "
            "accumulator" + where,
        ),
    ]
