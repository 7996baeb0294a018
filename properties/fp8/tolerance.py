"""Element-wise error bounds for a quantized linear, derived from the FP8 unit roundoff and the
accumulation precision, against both references of :mod:`reference.fp8_linear`.

Notation: one output element is ``o = Σ_{k=1..n} a_k·b_k`` (+ bias for y); ``â, b̂`` are the dequantized
operands (exactly known to the oracle), ``a, b`` the original ones; ``u_a`` the unit roundoff of the impl's
accumulation (declared; 2⁻²⁴ for fp32), ``u_o`` that of the output dtype, ``η_o`` half its smallest
subnormal spacing, ``γ_m(u) = m·u/(1 − m·u)`` (Higham, *Accuracy and Stability*, §3.1).

**Against the dequantized reference (accumulation alone).** Every path an impl may take rounds each term
``â_k·b̂_k`` at most ``n + 4`` times at ``u_a``: dequantizing each operand to fp32 (2 roundings, exact for
power-of-2 scales), the product (1; exact for FP8×FP8 codes), the ``n − 1`` additions in any order or
blocking, applying ``scale_a·scale_b`` after the sum (``_scaled_mm``: 2) and the bias add (1) — blockwise
GEMMs that scale each 128-long partial sum before adding it fit in the same count. Hence (the bound
holds for every summation order; products of ``1 + δ`` factors compose into ``γ``)::

    |S − o_dq| ≤ E := γ_{n+4}(u_a)·Σ_k |â_k||b̂_k| + (n + 4)·2⁻¹⁵⁰          (fp32 underflow, per op)
    |ô − o_dq| ≤ B_dq := E + u_o·(|o_dq| + E) + η_o                        (rounding S to the output)

With *promotion* (Hopper FP8 tensor cores keep ~14 bits and are promoted to fp32 every ``c`` products,
declared as ``accum_chunk``), each term sees at most ``c + 4`` roundings at ``u_a`` inside its chunk and
then ``⌈n/c⌉ − 1`` fp32 additions of chunk sums: ``E := (γ_{c+4}(u_a) + (1 + γ_{c+4}(u_a))·γ_{⌈n/c⌉}(2⁻²⁴))
·Σ|â||b̂| + (n + 4)·2⁻¹⁵⁰``.

This is the hard (worst-case) ceiling. The expected level for independent rounding errors is
``√n·u_a`` instead of ``n·u_a`` (Higham & Mary 2019); it is reported, not enforced.

**Against the original reference (total error).** For one element ``t`` of an operand quantized with
scale ``s`` (dequantization ``s_inv``), the cast computes ``v = fp32(t·s)`` then RNE-saturates to FP8:
``|v − t·s| ≤ u₃₂·|t·s| + 2⁻¹⁵⁰``; the FP8 rounding of ``v`` errs by at most ``u_q·|v|`` in the normal
range (``u_q = 2^−(mbits+1)``: 2⁻⁴ for E4M3, 2⁻³ for E5M2) or half the subnormal spacing ``h`` below it,
plus ``|v| − fp8_max`` if it saturates. So, with ``v⁺ = |t|·s·(1 + u₃₂) + 2⁻¹⁵⁰``::

    ρ(t) := s_inv·( max(u_q·v⁺, h) + max(0, v⁺ − fp8_max) + u₃₂·|t|·s + 2⁻¹⁵⁰ ) + |t|·|s·s_inv − 1|
    |deq(Q(t)) − t| ≤ ρ(t)

and ``|o_dq − o_true| ≤ Q := Σ_k (ρ(a_k)|b_k| + |a_k|ρ(b_k) + ρ(a_k)ρ(b_k))``, giving
``B_true := E + Q + u_o·(|o_true| + E + Q) + η_o``. In the normal range this is
``≈ (2u_q + u_q²)·Σ|a||b|``: the FP8 unit roundoff per operand. Saturation (MXFP8 FLOOR clips blocks
whose amax mantissa exceeds 1.75) and FP8 subnormals enter through ``ρ`` exactly as they occur.

**Rowwise scales** (the ``rowwise`` kinds, torchao's ``AXISWISE``: one scale per row of each K-major operand over
the whole reduction). Neither term changes its form. ``E`` bounds the rounding of the *accumulation* of the terms
``â_k·b̂_k``, whatever scale each operand row carries: a per-row scale multiplies every term of one output by the
same ``s_inv(a_i)·s_inv(b_j)`` (dequantizing first, or scaling the fp32 sum after as ``_scaled_mm`` rowwise does,
costs the same ≤ 4 extra roundings per term counted above). Only ``ρ`` moves: each element is quantized with *its
own row's* (column's) scale ``s``, so ``ρ(a_ik)`` is taken with ``s(row i)`` — :func:`quantization_error_bound`
expands the per-block scales to the element, and a row's amax sits at ``fp8_max/s`` of its own row, not the
tensor's: a row of small values keeps the FP8 relative error ``u_q`` instead of losing bits to a larger row. The
normal-range total stays ``≈ (2u_q + u_q²)·Σ|a||b|`` per output, with each row's own ``u_q·|a|``.

**A GEMM left in high precision** (``rowwise_gw_hp``'s wgrad, ``ScalingType.DISABLED``): its operands are the
original ones, ``ρ = 0`` and nothing is free, so ``B_dq = B_true = E + u_o·(|o| + E) + η_o``: the plain GEMM of
the input dtype, accumulated at the declared ``u_a`` (fp32 on the CPU, including a bf16 GEMM's fp32 accumulator)
and rounded once to the output dtype.

**Bias after the output rounding** (``bias_after_output_rounding``: ``y = fl_o(fl_o(Ŝ) + b)``, torchao's
``Float8Linear``): the bias-free product ``S`` is rounded to the output dtype first, erring by at most
``R := u_o·(|S| + E) + η_o`` (|Ŝ − S| ≤ E), and the final rounding is of a value within ``E + R`` of ``o``; so
``B_dq := E + R_dq + u_o·(|o_dq| + E + R_dq) + η_o`` with ``S_dq = o_dq − b``, and likewise ``B_true`` with
``E + Q`` for ``E`` and ``S_true = o_true − b``. Under cancellation (``|S| ≫ |o|``) ``R`` is many ulps of ``o``.

``bgrad = Σ_i dy_i`` is summed from the unquantized dy in fp32: ``B = γ_M(2⁻²⁴)·Σ|dy_i| + u_o·(|o| + ·) + η_o``
against both references.

**Truncating block steps** (``accum_block``: Hopper's FP8 tensor cores as mmaemu models them, 32 products per step,
``u_a = 2⁻¹³`` for 13 fraction bits; Fasi et al. 2021, Khattak & Mikaitis 2026). A chain starts at ``c_1 = 0``; step
``b`` takes its ``m ≤ 32`` products ``p_i`` and the running sum ``c_b``, aligns all of them to the largest exponent
``E_b = max(e(c_b), max_i (ε_a + ε_b))`` (ε: an FP8 value's exponent, clamped to the format's emin, so a subnormal's
can sit above its magnitude), truncates each toward zero to a multiple of the grid ``2^(E_b)·u_a``, adds them
exactly, and truncates the sum ``s_b`` toward zero to ``u_a`` of its own exponent: ``c_{b+1}``. Slow accumulation
restarts the chain every ``accum_chunk`` products and adds the chains' results in fp32; fast accumulation is one
chain. Three facts give a bound without γ factors:

1. truncation toward zero never increases a magnitude, so by induction ``|c_b| ≤ P_{b−1} := Σ_{steps < b} Σ|p_i|``
   (exactly, no ``1 + u`` factors) and ``|s_b| ≤ P_b``; and ``2^e(c_b) ≤ |c_b|``, so the grid is at most
   ``g_b := u_a·max(P_{b−1}, max_i 2^(ε_a+ε_b))``;
2. a product of two FP8 values is a multiple of its last bit ``2^(ε_a − m_a)·2^(ε_b − m_b)`` (m: mantissa bits), so
   it is kept exactly where that last bit is on or above the grid; otherwise it loses less than ``min(|p_i|, g_b)``;
3. ``c_b`` is realigned only when a product's exponent exceeds its own: it loses less than
   ``u_a·max_i 2^(ε_a+ε_b)``, and never more than ``|c_b| ≤ P_{b−1}``; the step's sum loses less than
   ``u_a·|s_b| ≤ u_a·P_b``.

Summed over every step of every chain (:func:`block_step_error`)::

    T := Σ_b [ Σ_{i: last bit of p_i < g_b} min(|p_i|, g_b) + u_a·min(max_i 2^(ε_a+ε_b), P_{b−1}) + u_a·P_b ]
    E := T + γ_{⌈n/c⌉+4}(2⁻²⁴)·(Σ|â||b̂| + T) + 2⁻¹⁵⁰·(1 + γ)·Σ|codes_a||codes_b| + (n + 4)·2⁻¹⁵⁰

in dequantized units (a per-tensor scale multiplies every term of a chain alike). The γ term is the fp32 additions
of the chains' results (``⌈n/c⌉`` of them, 1 for one chain) and the epilogue's ``fl(fl(s_a·s_b)·acc)``, the bias add
and a spare, each a rounding of a sum at most ``Σ|â||b̂| + T``; the third term is the epilogue's ``α = fl(s_a·s_b)``
when it lands among fp32's subnormals (an absolute error of 2⁻¹⁵⁰ times the code-space accumulator, whose magnitude
is at most ``Σ|codes|`` by fact 1: seen on the ``tiny`` regime's wgrad, 2.6× the bound before this term).

Why it grows linearly: with operands of one sign the running sum is the prefix sum, ``|c_b| ≈ P_{b−1}``, so every
step's grid grows with the chain and each step's alignment loses up to ``m·u_a·P_{b−1}`` — all with one sign, so the
losses add: ``T ≈ m·u_a·Σ_b P_{b−1} ≈ u_a·n²·|p|/2 = (n/2)·u_a·Σ|p|`` for one chain of ``n`` equal products, linear
in ``n`` relative to the sum, where independent round-to-nearest errors would give ``√n·u_a``. A restart every ``c``
products caps it at ``(c/2)·u_a`` per chain. So the expected level reported for block steps is ``E/2`` (a truncation
loses on average half a grid), not the √n level. Until the running sum is about 2⁷ times a product (E4M3 × E4M3:
7 bits between a product's 8 significant bits and 14 of the sum's), fact 2 keeps the products exact and only the
sums' truncation counts, which is why a chain of 128 stays far below a long one. Measured on ``fp8_linear[hopper]``
(mmaemu's model, HYBRID current scaling, same-sign operands, K = 520–776): y at 0.09–0.16 of this bound with chains
of 128, 0.2–0.25 with one chain (``fp8_linear[hopper_fast]``, judged against its own bound), and the one chain run
where chains of 128 are declared at 1.3–2.9× (``mutant_hopper_restart_dropped``); one-step sums (dgrad and wgrad
over N, M ≤ 32) reach 0.9: a sum just above a power of two truncated by almost a grid.

**Unspecified outputs** (the protocol's contract): outputs whose reduction meets a *free* operand element
(:func:`free_elements`: dequantized beyond binary32's range — an MXFP8 block holding inf, at 2^127 — or
nonzero in an MXFP8 block of E8M0 code 0) are unspecified; so are outputs whose reference magnitude
reaches the output dtype's overflow threshold. NaN in the reference must be NaN in the impl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from numcheck.reference.fp8_formats import F64, FP32_MAX
from numcheck.reference.fp8_linear import OUTPUT_GEMM, Fp8LinearReference
from numcheck.reference.fp8_scaling import Quantized, expand_blocks, round_to_fp32

U32 = 2.0**-24
ETA32 = 2.0**-150
#: Unit roundoff and underflow half-spacing of the output dtypes.
OUT_U: dict[torch.dtype, float] = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
OUT_ETA: dict[torch.dtype, float] = {torch.float32: 2.0**-150, torch.bfloat16: 2.0**-134, torch.float16: 2.0**-25}
#: Extra roundings per term beyond the n − 1 additions (see the module docstring).
EXTRA_ROUNDINGS = 4


def gamma(m: int, u: float) -> float:
    """γ_m(u) = m·u / (1 − m·u); inf once m·u ≥ 1 (no bound)."""
    mu = m * u
    return math.inf if mu >= 1 else mu / (1 - mu)


def quantization_error_bound(q: Quantized, t: torch.Tensor) -> torch.Tensor:
    """ρ(t) elementwise (float64, ``t``'s shape): a bound on |deq(Q(t)) − t| (module docstring)."""
    t64 = round_to_fp32(t.detach().to("cpu", F64)).abs()
    shape = tuple(t64.shape)
    s = expand_blocks(q.scale, shape, q.block)
    si = expand_blocks(q.scale_inv, shape, q.block)
    f = q.fmt
    v_plus = t64 * s * (1 + U32) + ETA32
    rounding = torch.maximum(f.unit_roundoff * v_plus, torch.full_like(v_plus, f.min_subnormal / 2))
    saturation = torch.clamp(v_plus - f.max_finite, min=0.0)
    return si * (rounding + saturation + U32 * t64 * s + ETA32) + t64 * (s * si - 1.0).abs()


@dataclass(frozen=True)
class GemmOperands:
    """One GEMM output's operands in K-major float64 form: ``o = A·Bᵀ`` with the reduction along dim 1.

    ``A_dq, B_dq`` dequantized; ``A, B`` original; ``rho_A, rho_B`` their quantization-error bounds;
    ``free_A, free_B`` the elements whose quantization the contract leaves open (:func:`free_elements`).
    """

    A_dq: torch.Tensor
    B_dq: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    rho_A: torch.Tensor
    rho_B: torch.Tensor
    free_A: torch.Tensor
    free_B: torch.Tensor
    top_A: torch.Tensor | None = None
    top_B: torch.Tensor | None = None
    last_A: torch.Tensor | None = None
    last_B: torch.Tensor | None = None
    codes_A: torch.Tensor | None = None
    codes_B: torch.Tensor | None = None


def step_exponents(q: Quantized) -> tuple[torch.Tensor, torch.Tensor]:
    """``(2^ε, 2^(ε − mbits))`` per element, in dequantized units (times its ``s_inv``; 0 for zeros and non-finite
    codes): ε = max(⌊log2 |v|⌋, emin) is the exponent a truncating block step aligns an FP8 value ``v`` by (a subnormal's
    clamped to emin), and ``v`` is a multiple of 2^(ε − mbits), its last bit (module docstring, *Truncating block
    steps*)."""
    v = _nan0(q.values.abs())
    e = torch.floor(torch.log2(v.clamp_min(2.0**q.fmt.emin)))
    s_inv = expand_blocks(q.scale_inv, tuple(q.codes.shape), q.block)
    top = torch.where(v != 0, torch.exp2(e), torch.zeros_like(v)) * s_inv
    return top, top * 2.0**-q.fmt.mbits


def free_elements(q: Quantized) -> torch.Tensor:
    """Elements whose quantization implementations legitimately disagree on, so the contract leaves free:
    those dequantized beyond binary32's range (an MXFP8 block holding inf, at 2^127), and the nonzero
    elements of MXFP8 blocks with E8M0 code 0 (amax below about 2^−118: TE and torchao RCEIL multiply by 1
    there and flush them to zero, torchao FLOOR divides by 2^−126, the oracle divides by exactly 2^−127)."""
    shape = tuple(q.codes.shape)
    free = q.dequantized.abs() > FP32_MAX
    if q.scale_code is not None:
        zero_code = expand_blocks((q.scale_code == 0).to(F64), shape, q.block) > 0
        free = free | (zero_code & (q.values != 0))
    return free


def gemm_operands(
    ref: Fp8LinearReference, output: str, x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor
) -> GemmOperands:
    """The K-major operands behind ``output`` (``"y"``, ``"dgrad"`` or ``"wgrad"``)."""

    def f64(t: torch.Tensor) -> torch.Tensor:
        return round_to_fp32(t.detach().to("cpu", F64))

    high_precision = output in OUTPUT_GEMM and not ref.recipe.quantizes(OUTPUT_GEMM[output])

    def parts(role: str, usage: str, src: torch.Tensor, transpose: bool):
        if high_precision:  # the operand as given: no quantization error, nothing free
            o = f64(src)
            d, r, fr = o, torch.zeros_like(o), torch.zeros(o.shape, dtype=torch.bool)
            top, last, v = 2 * _nan0(o.abs()), torch.zeros_like(o), _nan0(o.abs())  # never truncated blocks: safe
        else:
            q = ref.operand(role, usage)
            d, o, r, fr = q.dequantized, f64(src), quantization_error_bound(q, src), free_elements(q)
            (top, last), v = step_exponents(q), _nan0(q.values.abs())
        parts = (d, o, r, fr, top, last, v)
        return tuple(p.t() for p in parts) if transpose else parts

    if output == "y":
        a, b = parts("x", "rowwise", x, False), parts("w", "rowwise", weight, False)
    elif output == "dgrad":
        a, b = parts("dy", "rowwise", dy, False), parts("w", "columnwise", weight, True)
    elif output == "wgrad":
        a, b = parts("dy", "columnwise", dy, True), parts("x", "columnwise", x, True)
    else:
        raise ValueError(f"output={output!r} must be 'y', 'dgrad' or 'wgrad'")
    return GemmOperands(*(t for pair in zip(a, b) for t in pair))


@dataclass(frozen=True)
class OutputBounds:
    """Bounds and masks for one output.

    Attributes:
        dq, true: element-wise bounds against the dequantized and the original reference.
        unspecified: elements the contract leaves free (see the module docstring).
        expected_dq: the expected level √(n+4)·u_a·Σ|â||b̂| + u_o·|o_dq| (probabilistic accumulation error plus
            output rounding), for reports.
    """

    dq: torch.Tensor
    true: torch.Tensor
    unspecified: torch.Tensor
    expected_dq: torch.Tensor


def _nan0(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def accumulation_gamma(n: int, accum_u: float, chunk: int | None) -> float:
    """The relative factor of the accumulation bound E (module docstring) for a length-``n`` reduction."""
    if chunk is None or chunk >= n:
        return gamma(n + EXTRA_ROUNDINGS, accum_u)
    g_in = gamma(chunk + EXTRA_ROUNDINGS, accum_u)
    return g_in + (1 + g_in) * gamma(-(-n // chunk), U32)


def block_step_error(ops: GemmOperands, u: float, block: int, chain: int) -> torch.Tensor:
    """``T``: the summed bound of every truncating block step's error (module docstring, *Truncating block steps*) for
    ``o = A·Bᵀ`` of ``ops`` reduced along dim 1, steps of ``block`` products at unit roundoff ``u``, chains restarting
    every ``chain`` products. Per step, its products as ``[rows, cols, block]`` (never the whole reduction at once)."""
    absA, absB = _nan0(ops.A_dq.abs()), _nan0(ops.B_dq.abs())
    n = absA.shape[1]
    T = torch.zeros(absA.shape[0], absB.shape[0], dtype=F64)
    for c0 in range(0, n, chain):
        P = torch.zeros_like(T)  # P_{b−1}: Σ|products| of the chain so far, which bounds the running sum |c_b|
        for k0 in range(c0, min(c0 + chain, n), block):
            k = slice(k0, min(k0 + block, c0 + chain, n))
            p = absA[:, None, k] * absB[None, :, k]
            top = ops.top_A[:, None, k] * ops.top_B[None, :, k]  # 2^(ε_a+ε_b): the products' alignment exponents
            last = ops.last_A[:, None, k] * ops.last_B[None, :, k]  # each product a multiple of this
            M = top.amax(dim=2) if top.shape[2] else torch.zeros_like(T)
            grid = u * torch.maximum(P, M)  # ≥ 2^(E_b − f): E_b = max(e_c, ε_a+ε_b), 2^e_c ≤ |c_b| ≤ P_{b−1}
            lossy = last < grid[..., None]  # a product whose last bit is on or above the grid is kept exactly
            T += torch.where(lossy, torch.minimum(p, grid[..., None]), torch.zeros_like(p)).sum(dim=2)
            T += u * torch.minimum(M, P)  # c_b realigned to a product's larger exponent: below the grid, ≤ |c_b|
            P = P + p.sum(dim=2)
            T += u * P  # the step's sum truncated to u of itself: |s_b| ≤ P_b (truncation never grows a magnitude)
    return T


def _accumulation_bound(
    ops: GemmOperands, n: int, A_abs: torch.Tensor, accum_u: float, chunk: int | None, block: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E, its expected level)`` of a length-``n`` reduction whose Σ|terms| is ``A_abs`` (module docstring)."""
    m = n + EXTRA_ROUNDINGS
    if block is None:
        E = accumulation_gamma(n, accum_u, chunk) * A_abs + m * ETA32
        return E, math.sqrt(min(m, (chunk or m) + EXTRA_ROUNDINGS)) * accum_u * A_abs
    # truncating block steps in chains, the chains' results and the epilogue in fp32
    chain = chunk or max(n, 1)
    T = block_step_error(ops, accum_u, block, chain)
    g32 = gamma(-(-n // chain) + EXTRA_ROUNDINGS, U32)
    # alpha = fp32(s_a·s_b) may be subnormal: 2⁻¹⁵⁰ absolute on alpha, times |acc| ≤ Σ|codes| (truncation shrinks)
    alpha = ETA32 * (1 + g32) * (ops.codes_A @ ops.codes_B.t())
    E = T + g32 * (A_abs + T) + alpha + m * ETA32
    return E, 0.5 * E  # truncation: one-signed errors, on average half of each grid: linear, not √n


def output_bounds(
    ref: Fp8LinearReference,
    output: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    out_dtype: torch.dtype,
    accum_u: float,
    accum_chunk: int | None = None,
    accum_block: int | None = None,
    bias_after_output_rounding: bool = False,
) -> OutputBounds:
    """The bounds of ``output`` for an impl accumulating at ``accum_u`` (promoted to fp32 every
    ``accum_chunk`` products, if given; in truncating steps of ``accum_block`` products, if given) and returning
    ``out_dtype``; ``bias_after_output_rounding``: ``y``'s product is rounded to ``out_dtype`` before the bias is
    added (module docstring)."""
    u_o, eta_o = OUT_U[out_dtype], OUT_ETA[out_dtype]
    out_max = float(torch.finfo(out_dtype).max)
    ref_dq, ref_true = ref.dq[output], ref.true[output]
    n = ref.reduction[output]
    if output == "bgrad":
        E = gamma(n, U32) * _nan0(ref.abs_products[output]) + n * ETA32
        bdq = E + u_o * (ref_dq.abs() + E) + eta_o
        unspec = ref_dq.abs() * (1 + u_o) + bdq >= out_max
        return OutputBounds(bdq, bdq, unspec, math.sqrt(n) * U32 * _nan0(ref.abs_products[output]) + u_o * ref_dq.abs())
    ops = gemm_operands(ref, output, x, weight, dy)
    absA, absB = _nan0(ops.A_dq.abs()), _nan0(ops.B_dq.abs())
    A_abs = absA @ absB.t()
    if output == "y" and bias is not None:
        A_abs = A_abs + _nan0(round_to_fp32(bias.detach().to("cpu", F64)).abs())
    E, expected = _accumulation_bound(ops, n, A_abs, accum_u, accum_chunk, accum_block)
    oA, oB = _nan0(ops.A.abs()), _nan0(ops.B.abs())
    rA, rB = _nan0(ops.rho_A), _nan0(ops.rho_B)
    Q = rA @ oB.t() + oA @ rB.t() + rA @ rB.t()
    R_dq = R_true = 0.0
    if output == "y" and bias is not None and bias_after_output_rounding:
        b64 = round_to_fp32(bias.detach().to("cpu", F64))
        R_dq = u_o * (_nan0((ref_dq - b64).abs()) + E) + eta_o
        R_true = u_o * (_nan0((ref_true - b64).abs()) + E + Q) + eta_o
    bdq = E + R_dq + u_o * (_nan0(ref_dq.abs()) + E + R_dq) + eta_o
    btrue = E + Q + R_true + u_o * (_nan0(ref_true.abs()) + E + Q + R_true) + eta_o
    unspec = ops.free_A.any(dim=1)[:, None] | ops.free_B.any(dim=1)[None, :]
    unspec = (
        unspec
        | (_nan0(ref_dq.abs()) * (1 + u_o) + bdq >= out_max)
        | (_nan0(ref_true.abs()) * (1 + u_o) + btrue >= out_max)
    )
    expected = expected + u_o * _nan0(ref_dq.abs())
    return OutputBounds(bdq, btrue, unspec, expected)
