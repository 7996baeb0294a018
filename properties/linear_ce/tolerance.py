"""The tolerance model for linear+CE: an element-wise error bound for every output, derived by floating-point
error analysis (first order in the roundings u; exact in the logits' errors, which reach O(1) for bf16 logits
of a few hundred) and evaluated in float64 next to the oracle.

Notation (``docs/error-analysis.md``): u_c = unit roundoff of the compute (matmul operand) dtype,
u_a = 2⁻²⁴ (matmuls accumulate in fp32: bf16/fp16 products are exact in fp32, fp32 GEMMs accumulate in
fp32), u_L = precision the impl stores logits and log-probabilities in (u_c when it materializes the logits
chunk in the compute dtype, which every impl calling a low-precision matmul does), u_G = precision of the
stored gradient w.r.t. the logits (u_c likewise), u_out = precision of each returned output.
γ_n = n·u/(1−n·u) is Higham's worst-case constant for a length-n reduction (the *hard ceiling*);
the *expected level* replaces it with √n·u (Higham & Mary 2019, λ = 1), all else equal.

Derivation, one output at a time (all |·| element-wise, all quantities from the float64 oracle):

1. Logits (reduction length H, +1 with bias):
   e_z = γ_{H+1}(u_a)·(|x||W|ᵀ + |b|) + (u_L + 2u_a)·|z| [+ u_L·(|z| + |b|) with a bias: the matmul output may be
   rounded before the bias is added] [+ u_c·|b| when a bias may be rounded to the compute dtype].
   Softcap z' = s·tanh(z/s): tanh' = sech² falls in |t|, so over |δz| ≤ e_z
   e_z' = sech²(t_lo)·e_z + (3u_L + κ_tanh)·|z'|, t_lo = max(|z| − e_z, 0)/s (tanh, divide and multiply each round
   once; κ_tanh = 2·n_tanh·u_ce for a tanh declared n_tanh ulps from correct rounding, ``elementary_error``).
2. Row statistics, exact for any logit errors |δ_j| ≤ e'_j (not first order: bf16 logits near 320 carry e' ≈ 1,
   and p moves by e^δ). lse(z' + δ) − lse(z') = log Σ_j p_j e^{δ_j}, so |δlse_i| ≤ E*_i + R_i with
   E*_i = max(log1p(T⁺_i), −log1p(T⁻_i)), T^±_i = Σ_j p_ij·expm1(±e'_ij) (E*_i ≥ Σ_j p_ij e'_ij by Jensen, equal to
   first order) and R_i = γ_V(u_a) + 3u_a + u_ce(1 + 3|lse_i|) for evaluating lse (a sum of V positive terms in fp32,
   then exp, log and the shift by the max, each rounded at u_ce: u_a, or u_c for an impl declaring
   ``ce_dtype="compute"``, whose kernels keep the max and lse in the logits dtype; the sum s ≥ 1 rounded at u_ce
   moves log s by u_ce absolutely, whatever |lse|: torch's CPU bf16 log_softmax rounds s to bf16, measured at
   N=2049, H=V=2 (s = 1.0117 → 1.0156, loss 0.0155 for 0.0117)); a declared ``elementary_error`` adds
   2u_ce·(n_exp + n_arg·(H_i − log s_i)) for the exps of the sum (their arguments z' − m and the online rescales
   add up along each term's path to m − z'_j; Σ_j p_j(m − z'_j) = H_i − log s_i with H_i the row's entropy and
   log s_i = lse_i − max_j z'_ij) and 2u_ce·n_log·max(log s_i, 1) for log s.
   δ log p_j = δ_j − δlse exactly. With S_j = Σ_{k≠j} p_k e^{δ_k} = 1 − p_j + D_j, D_j ∈ [D⁻_j, D⁺_j],
   D⁺_j = T⁺ − p_j expm1(e'_j) ≥ 0, D⁻_j = T⁻ − p_j expm1(−e'_j) ≤ 0:
   δ log p_j = −log1p((1 − p_j)·expm1(−δ_j) + D_j·e^{−δ_j}), decreasing in δ_j and increasing in D_j, so
   |δ log p_ij| ≤ L_ij = max(log1p((1−p)expm1(e') + D⁺e^{e'}), −log1p((1−p)expm1(−e') + D⁻e^{−e'})), the second
   side at most −log p (p̂ ≤ 1); to first order L = E_i + (1 − 2p_ij)·e'_ij. Keeping (1 − p_ij) rather than the
   triangle inequality is what makes confident rows (p_y → 1) tight: the true-class gradient p_y − 1 is bounded
   relative to itself, so an impl that forms it in bf16 (100% error) is caught. Then
   |δ log p_ij| ≤ L_ij + R_i + ρ_ij, ρ_ij = u_L·|log p_ij| + 2u_a [+ 2u_ce(n_exp + n_arg·|log p_ij|) for p =
   exp(log p) under a declared ``elementary_error``] covers p recomputed from log-probabilities stored at u_L
   (eager's log_softmax backward does exactly that), and |δp_ij| ≤ p_ij·expm1(|δ log p_ij|).
3. Per-row loss ℓ_i = C_i·lse_i − Σ_j q_ij z'_ij with C_i = (1−ε)w_{y_i} + (ε/V)S_w and
   q_ij = (1−ε)w_{y_i}δ_{j,y_i} + (ε/V)w_j, so by the mean value theorem δℓ_i = Σ_j (C_i p̃_ij − q_ij)δz'_ij with p̃
   the softmax at an intermediate point, |p̃ − p| ≤ p·expm1(L):
   |δℓ_i| ≤ Σ_j (|C_i p_ij − q_ij| + C_i p_ij expm1(L_ij))·e'_ij + C_i R_i + (u_L + 4u_a)|ℓ_i| (log-probabilities
   stored at u_L, the final products and sums) [+ 3u_c|ℓ_i| when class weights may be rounded to the compute
   dtype: the weight itself and the normalizer D] [+ (1−ε)w_{y_i}(u_c·Σ_k |x_ik w_{y_i}k| + H·η_c) when the impl
   declares ``target_logit="rounded_products"``: its z_y is a separate dot product whose H products are each
   rounded to the compute dtype]. z-loss ζ_i = λ·lse_i²: δζ = λ(2·lse·δlse + δlse²), so
   |δζ_i| ≤ λ(2|lse_i|·Δ_i + Δ_i²) + 4u_a ζ_i with Δ_i = E*_i + R_i.
   Reductions add γ_N(u_a)·Σ|terms| and the final rounding u_out·|L|.
4. Gradient w.r.t. the logits, g_ij = c_i(C_i p_ij − q_ij) + c^z_i·2λ·lse_i·p_ij (c = upstream / normalizer):
   |δg_ij| ≤ |c_i|C_i|δp_ij| + |c^z_i|2λ(|lse_i|·|δp_ij| + Δ_i·(p_ij + |δp_ij|))
            + 3u_ce(|c_i|(C_i p_ij + q_ij) + |c^z_i|2λ|lse_i|p_ij) [+ 2u_c|g_ij| for rounded class weights]
            + |δε|·|c_i|·|∂C_i/∂ε·p_ij − ∂q_ij/∂ε| (ε itself held at u_ce, as a Triton kernel's fp32 argument:
            δε = fl_ce(ε) − ε, up to u·ε, and 1 − fl(ε) is exact, so (1−ε) errs relatively by up to u·ε/(1−ε);
            ∂C/∂ε = S_w/V − w_y, ∂q_ij/∂ε = w_j/V − w_yδ_{j,y}; the loss likewise takes
            |δε|·|Σ_j ∂q_ij/∂ε·(lse_i − z'_ij)|),
   u_ce = u_a when the impl forms g in fp32, u_c when it declares ``ce_dtype="compute"`` (then p_y − 1 of a
   confident row may round to 0: the term 3u_c·C·p_y is what allows it).
   Through softcap G = g·d, d = 1 − tanh²: d moves by |δd| ≤ 2·tanh(t_hi)·sech²(t_lo)·e_z/s (mean value theorem),
   t_hi = (|z| + e_z)/s, and d̂ ≤ sech²(t_lo), so |δG| ≤ |δg|·min(d + |δd|, sech²(t_lo)) + |g|(|δd| + 3u_L
   + 2κ_tanh·tanh²) (d = 1 − t̂² doubles tanh's relative error in the square); then the stored G
   rounds once more, or twice (formed, then scaled by the normalizer or upstream gradient in the compute
   dtype): + u_G|G| + η_G with u_G = 2u_c, and η_G = η_c·(1 + max|u|) when an upstream u ≠ 1 scales an already
   underflowed G.
5. grad_x = G·W (length V): |δgx| ≤ |δG||W| + (γ_V(u_a) + a_x)|G||W| + u_out|gx|, where a_x is step 6's a_path for
   the declared ``grad_x_accumulation`` over K_V = ⌈V/chunk_cols⌉ vocabulary chunks (``param_dtype``: the
   running sum lives in x's dtype, K_V·u_p; cut-cross-entropy's kernels add 128-class blocks that way).
Under autocast, gradient matmuls return compute-dtype results (u_out ≥ u_c, and each grad_weight chunk is
rounded: at least ``per_chunk_rounding``); with an upstream gradient ≠ 1, gradients formed in forward and
scaled in backward round twice (2·u_out).

6. grad_W = Gᵀx and grad_b = Σ_i G_i (length N): |δgW| ≤ |δG|ᵀ|x| + (γ_N(u_a) + a_path)|G|ᵀ|x| + u_out|gW|,
   where the declared accumulation path adds a_path: ``fp32`` 0; ``per_chunk_rounding`` u_c (each chunk's
   partial product P_k is rounded once: Σ_k u_c|P_k| ≤ u_c|G|ᵀ|x|); ``param_dtype`` K·u_p (the running sum is
   rounded after each of K chunks: Σ_k u_p|S_k| ≤ K·u_p|G|ᵀ|x|; K = ⌈N/rows per chunk⌉ with the rows declared
   (``chunk_rows``, or ``chunk_rule`` at the problem's shape: :func:`properties.linear_ce.chunks.chunk_count`), N when
   neither is; grad_b's running sum lives in the bias's own dtype, K·u_pb, which differs from u_p for an fp16
   bias beside fp32 weights).

These are worst-case bounds, first order in the roundings: second-order terms in u are O(u²) relative and far
below the slack of the γ constants at the sizes the suite draws. In the logits' errors e' they are exact (steps
2–4), and reduce to the first-order terms as e' → 0, so small errors are bounded as tightly as before. The relative judgement (b) lives in :mod:`properties.linear_ce.accuracy`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from numcheck.properties.core.compare import overflow_threshold
from numcheck.properties.linear_ce.cases import Problem, Tensors, dtype_of
from numcheck.properties.linear_ce.chunks import chunk_count
from numcheck.reference.linear_ce import Block, LinearCEResult, RowStats, block_walker, linear_ce

Level = Literal["hard", "expected"]

UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}
U_ACC = UNIT_ROUNDOFF[torch.float32]

#: Absolute error allowed for a value below the normal range, per rounding. fp32 and bf16 (same exponent
#: range): the smallest normal 2⁻¹²⁶, because flushing subnormals to zero (FTZ/DAZ) is common in GPU kernels,
#: fast-math builds and Triton's interpreter alike, and a flushed value is off by up to that much. fp16 keeps
#: its subnormals on every backend numcheck knows, so only half its smallest spacing, 2⁻²⁵ ≈ 3e-8 (a
#: gradient of the logits of 1e-7 stored in fp16 is a subnormal with 50% relative error).
#: Every "u·|v|" rounding term of the model becomes "u·|v| + η".
UNDERFLOW: dict[torch.dtype, float] = {
    torch.float64: 2.0**-1022,
    torch.float32: 2.0**-126,
    torch.float16: 2.0**-25,
    torch.bfloat16: 2.0**-126,
}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype`` at 1 (u). Raises ValueError for a dtype without an entry."""
    try:
        return UNIT_ROUNDOFF[dtype]
    except KeyError:
        raise ValueError(f"no unit roundoff known for dtype {dtype}") from None


def round_at(v: float, u: float) -> float:
    """``v`` rounded to nearest (ties to even) in the binary format of unit roundoff ``u`` = 2⁻ᵗ (t significand
    bits: 24 for fp32, 11 for fp16, 8 for bf16), ignoring its exponent range.

    >>> round_at(0.1, 2.0**-8)  # bf16's 0.1
    0.10009765625
    """
    if v == 0 or not math.isfinite(v):
        return v
    t = round(-math.log2(u))
    mant, e = math.frexp(v)  # v = mant·2^e, 0.5 ≤ |mant| < 1
    return math.ldexp(round(math.ldexp(mant, t)), e - t)


def gamma(n: int, u: float, level: Level = "hard") -> float:
    """Error constant of a length-``n`` reduction at unit roundoff ``u``: γ_n (hard) or √n·u (expected)."""
    if level == "expected":
        return math.sqrt(max(n, 1)) * u
    nu = n * u
    return math.inf if nu >= 1 else nu / (1 - nu)


@dataclass(frozen=True)
class ErrorModel:
    """The precisions and path that parametrize the bounds of one impl on one problem.

    Attributes:
        u_c: compute (matmul operand) dtype. u_L: logits / log-probability storage. u_G: stored gradient of
        the logits. u_ce: precision of the softmax / gradient arithmetic (declared ``ce_dtype``). u_out: per-output precision of what the impl returned. grad_accumulation, chunks, u_p:
        the declared grad_weight path, its chunk count K and the parameter dtype's u; grad_x_accumulation, chunks_x:
        grad_x's path over K_V vocabulary chunks. bias_rounding /
        class_weight_rounding: whether those may legitimately be rounded to the compute dtype.
        level: ``"hard"`` (γ_n) or ``"expected"`` (√n·u). exp_ulps, exp_arg_ulps, log_ulps, tanh_ulps: the
        declared ``elementary_error`` (ulps beyond correct rounding; 0 when undeclared).
    """

    u_c: float
    u_L: float
    u_G: float
    u_ce: float
    u_out: dict[str, float]
    eta_c: float
    eta_out: dict[str, float]
    grad_accumulation: str
    upstream_scale: float
    chunks: int
    u_p: float
    bias_rounding: bool
    class_weight_rounding: bool
    level: Level = "hard"
    target_products: bool = False

    grad_x_accumulation: str = "fp32"
    chunks_x: int = 1
    exp_ulps: float = 0.0
    exp_arg_ulps: float = 0.0
    log_ulps: float = 0.0
    tanh_ulps: float = 0.0
    #: u of grad_bias's running sum on the ``param_dtype`` path: the bias's own dtype, which may differ from the
    #: weight's (an fp16 bias beside fp32 parameters under AMP: Liger's accumulator is ``zeros_like(bias)``);
    #: ``None``: u_p.
    u_pb: float | None = None

    def kappa_tanh(self) -> float:
        """The declared extra relative error of one tanh, 2·ulps·u_ce (an ulp of y is at most 2u·|y|)."""
        return 2 * self.tanh_ulps * self.u_ce

    def _path(self, path: str, chunks: int) -> float:
        if path == "fp32":
            return 0.0
        if path == "per_chunk_rounding":
            return self.u_c
        if path == "param_dtype":
            return chunks * self.u_p
        raise ValueError(f"unknown accumulation path {path!r}")

    def path_eta(self, path: str, chunks: int) -> float:
        """The absolute part of a declared path's roundings below the normal range: each of the K partials
        (``per_chunk_rounding``: rounded in the compute dtype, η_c) or running sums (``param_dtype``: η of the
        parameter dtype, taken as η_c's when that is the coarser) may underflow or flush: K·η."""
        if path == "fp32":
            return 0.0
        return chunks * self.eta_c

    @property
    def eta_ce(self) -> float:
        """η of the softmax / gradient arithmetic: fp32's (2⁻¹²⁶, flushed subnormals) unless the impl declares
        ``ce_dtype="compute"``."""
        return self.eta_c if self.u_ce != U_ACC else UNDERFLOW[torch.float32]

    def path_term(self) -> float:
        """a_path of step 6 in the module docstring (grad_weight and grad_bias over K token chunks)."""
        return self._path(self.grad_accumulation, self.chunks)

    def path_term_b(self) -> float:
        """a_path of step 6 for grad_bias: the same path, its ``param_dtype`` running sum in the bias's dtype
        (K·u_pb: Σ_k u_pb|S_k| ≤ K·u_pb·Σ_i|G_i|)."""
        if self.grad_accumulation == "param_dtype" and self.u_pb is not None:
            return self.chunks * self.u_pb
        return self.path_term()

    def path_term_x(self) -> float:
        """a_x of step 5 (grad_x over K_V vocabulary chunks)."""
        return self._path(self.grad_x_accumulation, self.chunks_x)


@functools.lru_cache(maxsize=256)
def _upstream_max(p: Problem) -> float:
    """max |u| of ``p``'s upstream gradient (1 when it has none), from its tensors built once per problem:
    :func:`error_model` asks twice a call, and callers ask per level and output dtypes."""
    from numcheck.properties.linear_ce.cases import build

    u = build(p).upstream
    return float(u.abs().max()) if u is not None and u.numel() else 1.0


def _bf16_store(support) -> float:
    """The declared excess of a bf16 store over round-to-nearest, in ulps (0 when undeclared).

    A bf16 store that is not rounded to nearest (Triton's interpreter truncates: elementary_error.bf16_store)
    errs by up to 2·(1/2 + bf16_store)·u: it applies to every bf16 output and to G held in bf16."""
    return getattr(getattr(support, "elementary_error", None), "bf16_store", 0.0)


def _last_roundings(
    support, p: Problem, out_dtypes: dict[str, torch.dtype]
) -> tuple[dict[str, float], dict[str, float]]:
    """``(u_out, eta_out)`` of :class:`ErrorModel`: the relative (u) and absolute (η) error of each output's last
    rounding, into the dtype the impl returned it in, widened for autocast, an upstream gradient and a declared
    bf16 store."""
    c = p.compute_dtype
    u_c = unit_roundoff(c)
    out = {k: unit_roundoff(v) for k, v in out_dtypes.items()}
    # A gradient may be summed from partials (vocabulary or token chunks) each rounded in the output dtype
    # before the last rounding: below the normal range that is η per rounding, so 2η for gradients.
    eta_out = {k: UNDERFLOW[v] * (2 if k.startswith("grad_") else 1) for k, v in out_dtypes.items()}
    if p.autocast is not None:
        # Under autocast the gradient matmuls themselves produce compute-dtype results, cast to the fp32
        # parameters' dtype only afterwards: the last rounding is at u_c whatever dtype comes back.
        for k in ("grad_x", "grad_weight", "grad_bias"):
            if k in out:
                out[k] = max(out[k], u_c)
                eta_out[k] = max(eta_out[k], UNDERFLOW[c])
    if p.upstream != "one":
        # Gradients formed in forward and scaled by the upstream gradient u in backward round twice; an
        # underflowed one carries |u|·η from the first rounding, then η from the second.
        scale = 1.0 + _upstream_max(p)
        for k in ("grad_x", "grad_weight", "grad_bias"):
            if k in out:
                out[k] = 2 * out[k]
                eta_out[k] = scale * eta_out[k]
    store = _bf16_store(support)
    if store:
        for k, v in out_dtypes.items():
            if v == torch.bfloat16:
                out[k] += 2 * store * unit_roundoff(v)
    return out, eta_out


def error_model(support, p: Problem, out_dtypes: dict[str, torch.dtype], level: Level = "hard") -> ErrorModel:
    """The :class:`ErrorModel` for an impl's declaration ``support`` on problem ``p``.

    ``out_dtypes`` maps each output name to the dtype the impl returned it in (its last rounding).
    """
    c = p.compute_dtype
    u_c = unit_roundoff(c)
    low = c != torch.float32
    out, eta_out = _last_roundings(support, p, out_dtypes)
    u_L = u_c if (getattr(support, "logits_dtype", "compute") == "compute") else U_ACC
    u_G_store = 2 * _bf16_store(support) * u_c if c == torch.bfloat16 else 0.0
    K = chunk_count(support, p.N, p.H, p.V) or p.N  # declared chunk_rows or chunk_rule; one chunk a row if neither
    chunk_cols = getattr(support, "chunk_cols", None)
    K_V = math.ceil(p.V / chunk_cols) if chunk_cols else p.V
    x_path = getattr(support, "grad_x_accumulation", "fp32")
    return ErrorModel(
        u_c=u_c,
        u_L=u_L,
        # G may be rounded when formed and again when scaled by the reduction's normalizer or the upstream
        # gradient in the compute dtype (Liger divides by the token count after forming p − y): two roundings.
        u_G=2 * u_c + u_G_store,
        upstream_scale=(1.0 if p.upstream == "one" else 1.0 + _upstream_max(p)),
        u_ce=u_c if getattr(support, "ce_dtype", "float32") == "compute" else U_ACC,
        u_out=out,
        eta_c=UNDERFLOW[c],
        eta_out=eta_out,
        # Under autocast each chunk's grad_weight product comes out of the matmul in the compute dtype:
        # at least per-chunk rounding, whatever the declared path.
        grad_accumulation=(
            "per_chunk_rounding"
            if (p.autocast is not None and support.grad_accumulation == "fp32")
            else support.grad_accumulation
        ),
        chunks=K,
        u_p=unit_roundoff(p.param_dtype),
        u_pb=unit_roundoff(dtype_of(p.bias_dtype)) if p.bias and p.bias_dtype else None,
        bias_rounding=bool(p.bias) and (low or p.bias_dtype not in (None, p.dtype)),
        class_weight_rounding=bool(p.class_weights) and low,
        level=level,
        target_products=getattr(support, "target_logit", "logits") == "rounded_products",
        # Under autocast a vocabulary-chunked grad_x's partial products come out in the compute dtype too.
        grad_x_accumulation=(
            "per_chunk_rounding" if (p.autocast is not None and x_path == "fp32" and chunk_cols) else x_path
        ),
        chunks_x=K_V,
        **_elementary_fields(support),
    )


#: The outputs a gradient GEMM produces whole (grad_x = G·W, grad_W = Gᵀx, grad_b = Σ_i G_i).
GEMM_OUTPUTS: tuple[str, ...] = ("grad_x", "grad_weight", "grad_bias")


def upstream_overflow(p: Problem, t: Tensors | None = None) -> str:
    """Why the backward of ``p`` legitimately overflows its compute dtype before any gradient is formed ("" where
    it does not): the upstream gradient u times a row's coefficient c_i (1/n under ``mean``, w_{y_i}/Σ_j w_{y_j}
    with class weights, 1 under ``sum``), scaled by the target's share 1 − ε + ε/V of the smoothed label, is the
    exact gradient of that row's log p_{y_i}. Eager under CUDA autocast holds it in fp16: with a loss scale
    of 2^17 and N = 1 it is 131072, past fp16's range, and on the H200 the logits' gradient and every gradient
    after it came back NaN though each exact gradient fits fp16 with 4× headroom (CPU autocast keeps it in fp32
    and stays finite: ``docs/evidence/amp_loss_scale.txt``). A correct evaluation may hold it in the compute dtype; one whose exact
    value overflows that format overflows legitimately, as a GradScaler expects."""
    from numcheck.properties.linear_ce.cases import build

    c = p.compute_dtype
    if c == torch.float32 or p.upstream != "loss_scale" or p.N == 0:
        return ""
    t = t if t is not None else build(p)
    valid = t.target != p.ignore_index
    if not bool(valid.any()):
        return ""
    if p.reduction == "sum":
        coef = torch.ones(int(valid.sum()), dtype=torch.float64)
    elif t.options.class_weights is not None:
        w = t.options.class_weights.double().cpu()[t.target[valid].long().cpu()]
        coef = w / w.sum()
    else:
        coef = torch.full((int(valid.sum()),), 1.0 / float(valid.sum()), dtype=torch.float64)
    share = 1.0 - p.label_smoothing + p.label_smoothing / p.V
    top = float(coef.max()) * share * float(t.upstream.abs().max())
    limit = overflow_threshold(c)
    if top < limit:
        return ""
    return (
        f"the upstream gradient times the largest row coefficient, |u·c_i|·(1 − ε + ε/V) = {top:.6g}, reaches "
        f"{c}'s overflow threshold {limit:.6g}: the gradient of that row's log-probability overflows before "
        f"any other gradient is formed"
    )


def range_dtypes(p: Problem, out_dtypes: dict[str, torch.dtype]) -> dict[str, torch.dtype]:
    """The narrowest format each output is held in whole before its last cast, whose range its ±inf is judged
    against (:func:`properties.core.compare.legitimate_overflow`).

    Under autocast the gradient GEMMs return compute-dtype results, cast to the parameters' dtype only afterwards
    (the same fact :func:`error_model` charges as u_out ≥ u_c): an fp16 grad_weight whose exact value exceeds
    65504 comes back as ±inf in fp32, which is what AMP does and what a loss scaler exists to catch. The loss is
    held in the dtype it is returned in (autocast runs cross_entropy in fp32). Elsewhere: the returned dtype.
    """
    out = dict(out_dtypes)
    c = p.compute_dtype
    if p.autocast is not None:
        for k in GEMM_OUTPUTS:
            if k in out and out[k].is_floating_point and torch.finfo(c).max < torch.finfo(out[k]).max:
                out[k] = c
    return out


def _elementary_fields(support) -> dict[str, float]:
    """The :class:`ErrorModel` fields of a declaration's ``elementary_error`` (all 0 when it has none)."""
    el = getattr(support, "elementary_error", None)
    if el is None:
        return {}
    return {"exp_ulps": el.exp, "exp_arg_ulps": el.exp_per_arg, "log_ulps": el.log, "tanh_ulps": el.tanh}


#: Arguments of exp beyond which float64 overflows; a logit error this large leaves a bound of no use anyway.
_EXP_MAX = 700.0


def _sech2(t: torch.Tensor) -> torch.Tensor:
    """sech²(t), 0 where cosh overflows."""
    return torch.cosh(t).reciprocal().square()


def _p_expm1(p: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """p·(e^a − 1), exactly 0 where p = 0 (a clamped below float64's overflow: beyond it the bound says nothing)."""
    return torch.where(p > 0, p * torch.expm1(a.clamp(max=_EXP_MAX)), torch.zeros_like(p))


def lse_error_bound(T_plus: torch.Tensor, T_minus: torch.Tensor) -> torch.Tensor:
    """E* = max(log1p(T⁺), −log1p(T⁻)): |lse(z + δ) − lse(z)| for any |δ_j| ≤ e_j, given the row totals
    T^± = Σ_j p_j·expm1(±e_j) (step 2 of the module docstring; attained at δ = ±e)."""
    return torch.maximum(torch.log1p(T_plus), -torch.log1p(T_minus))


def logp_error_bound(p: torch.Tensor, e: torch.Tensor, T_plus: torch.Tensor, T_minus: torch.Tensor) -> torch.Tensor:
    """The bound on |δ log p_j| for any logit errors |δ_k| ≤ e_k of the row (step 2), element-wise:
    max(log1p((1−p)(e^e − 1) + D⁺e^e), −log1p((1−p)(e^{−e} − 1) + D⁻e^{−e})) with D^± = T^± − p·expm1(±e), the
    second side at most −log p (p cannot pass 1). Attained at δ_j = ∓e_j, δ_k = ±e_k (k ≠ j)."""
    em1_p, em1_m = torch.expm1(e), torch.expm1(-e)
    Dp = (T_plus - _p_expm1(p, e)).clamp_min(0)
    Dm = (T_minus - _p_expm1(p, -e)).clamp_max(0)
    up = torch.log1p((1 - p) * em1_p + Dp * torch.exp(e))
    lo_arg = ((1 - p) * em1_m + Dm * torch.exp(-e)).clamp_min(-1.0)
    down = torch.minimum(-torch.log1p(lo_arg), -torch.log(p))
    return torch.maximum(up, down).clamp_min(0)


def sweep_key(m: ErrorModel) -> ErrorModel:
    """The part of ``m`` the block sweep reads: ``m`` without the returned outputs' roundings (``u_out``,
    ``eta_out``) and the target-product term, which only the finish (:func:`_finish`) adds. Models with one
    sweep key share every accumulated tensor."""
    return dataclasses.replace(m, u_out={}, eta_out={}, target_products=False)


def _gradient_key(m: ErrorModel) -> ErrorModel:
    """The part of ``m`` that |δG| reads (everything of :func:`sweep_key` but the accumulation paths, which only
    scale the shared |G||W| and |G|ᵀ|x|): models with one gradient key share |δG| and its two products."""
    return dataclasses.replace(
        sweep_key(m), grad_accumulation="fp32", chunks=1, grad_x_accumulation="fp32", chunks_x=1, u_p=0.0, u_pb=None
    )


class _BlockShared:
    """A block's products that no error model changes, each formed once however many models a sweep
    evaluates: |x|, |W|, |x||W|ᵀ + |b|, |G|, |G||W|, |G|ᵀ|x| and Σ_i |G_i| (the same operations, so the same bits,
    as forming them per model)."""

    def __init__(self, blk: Block) -> None:
        self.blk = blk
        self._got: dict[str, torch.Tensor] = {}

    def _once(self, name: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The product ``name``, made by ``make`` on first use and kept for the block's other sweeps."""
        if name not in self._got:
            self._got[name] = make()
        return self._got[name]

    @property
    def x_abs(self) -> torch.Tensor:
        """|x| of the block's rows."""
        return self._once("x_abs", lambda: self.blk.x.abs())

    @property
    def w_abs(self) -> torch.Tensor:
        """|W| of the block's vocabulary rows."""
        return self._once("w_abs", lambda: self.blk.w.abs())

    @property
    def mag(self) -> torch.Tensor:
        """|x||W|ᵀ (+ |b|): the logits' magnitude of step 1."""

        def make() -> torch.Tensor:
            mag = self.x_abs @ self.w_abs.T
            return mag + self.blk.b.abs() if self.blk.b is not None else mag

        return self._once("mag", make)

    @property
    def G_abs(self) -> torch.Tensor:
        """|G|: the oracle's gradient of the loss w.r.t. the block's logits, in magnitude."""
        return self._once("G_abs", lambda: self.blk.G.abs())

    @property
    def GW(self) -> torch.Tensor:
        """|G||W|: the block's share of grad_x's magnitude."""
        return self._once("GW", lambda: self.G_abs @ self.w_abs)

    @property
    def GX(self) -> torch.Tensor:
        """|G|ᵀ|x|: the block's share of grad_W's magnitude."""
        return self._once("GX", lambda: self.G_abs.T @ self.x_abs)

    @property
    def G_sum(self) -> torch.Tensor:
        """Σ_i |G_i|: the block's share of grad_b's magnitude."""
        return self._once("G_sum", lambda: self.G_abs.sum(dim=0))


@dataclass
class _Accumulator:
    """The gradient bounds of one sweep key, summed block by block: grad_x over vocabulary blocks with the factor
    ``s_x`` = γ_V + a_x on |G||W|, grad_W over row blocks with ``s_w`` = γ_N + a_path on |G|ᵀ|x|, grad_b with
    ``s_b`` = γ_N + a_path,b on Σ_i|G_i|."""

    s_x: float
    s_w: float
    gx: torch.Tensor
    gw: torch.Tensor
    gb: torch.Tensor
    s_b: float = 0.0


class _Sweep:
    """Observer of the oracle's block sweep for the error models of one gradient key (:func:`_gradient_key`; the
    first is ``m``); ``phase`` 1 accumulates the row totals T⁺_i, T⁻_i (step 2), the entropy and row maximum
    (for the declared elementary-function errors) and the first-order loss sums; phase 2 the gradient bounds (one
    :class:`_Accumulator` per sweep key) and the loss's second-order term (they need the finished row totals)."""

    def __init__(
        self,
        p: Problem,
        t: Tensors,
        m: ErrorModel,
        N: int,
        H: int,
        V: int,
        dev: torch.device,
        models: Sequence[ErrorModel] = (),
    ) -> None:
        f64 = torch.float64
        self.p, self.m, self.V = p, m, V
        o = t.options
        self.eps = float(o.label_smoothing)
        self.d_eps = abs(round_at(self.eps, m.u_ce) - self.eps)  # ε as the CE arithmetic holds it (step 4)
        self.lam = float(o.z_loss_scale)
        self.s = o.softcap
        self.cw = o.class_weights.to(dev, f64) if o.class_weights is not None else None
        self.S_w = float(self.cw.sum()) if self.cw is not None else float(V)
        valid = t.target != o.ignore_index
        self.tgt = torch.where(valid, t.target, torch.zeros_like(t.target)).long().to(dev)
        self.g_H = gamma(H + (1 if t.bias is not None else 0), U_ACC, m.level)
        self.g_V = gamma(V, U_ACC, m.level)
        self.g_N = gamma(N, U_ACC, m.level)
        self.phase = 1
        zeros = lambda *shape: torch.zeros(*shape, dtype=f64, device=dev)  # noqa: E731
        self.T_plus, self.T_minus = zeros(N), zeros(N)
        self.entropy = zeros(N)
        self.zmax = torch.full((N,), -math.inf, dtype=f64, device=dev)
        self.S_ce, self.S_2 = zeros(N), zeros(N)
        self.S_eps = zeros(N)  # ∂ℓ_i/∂ε = Σ_j ∂q_ij/∂ε·(lse_i − z'_ij): the loss's slope in the smoothing factor
        self.R = self.dlse = zeros(N)
        self.accumulators: dict[str, _Accumulator] = {}
        for model in (m, *models):
            key = repr(sweep_key(model))
            if key not in self.accumulators:
                self.accumulators[key] = _Accumulator(
                    self.g_V + model.path_term_x(),
                    self.g_N + model.path_term(),
                    zeros(N, H),
                    zeros(V, H),
                    zeros(V),
                    self.g_N + model.path_term_b(),
                )

    def accumulator(self, m: ErrorModel) -> _Accumulator:
        """The accumulated gradient bounds of model ``m`` (one of this sweep's)."""
        return self.accumulators[repr(sweep_key(m))]

    def _logit_error(self, blk: Block, sh: _BlockShared) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.m
        mag = sh.mag
        e_z = self.g_H * mag + (m.u_L + 2 * U_ACC) * blk.z.abs() + m.eta_c
        if blk.b is not None:
            # The matmul's output may be rounded to the logits dtype before the bias is added (Liger adds it
            # in place after the bf16 matmul): one more rounding of |x·Wᵀ| ≤ |z| + |b|.
            e_z = e_z + m.u_L * (blk.z.abs() + blk.b.abs())
        if m.bias_rounding and blk.b is not None:
            e_z = e_z + m.u_c * blk.b.abs()
        if blk.dzc_dz is None:
            return e_z, e_z
        # tanh' = sech² decreases in |t|: over |δz| ≤ e_z the softcap's slope is at most sech²(t_lo).
        t_lo = (blk.z.abs() - e_z).clamp_min(0) / self.s
        return e_z, _sech2(t_lo) * e_z + (3 * m.u_L + m.kappa_tanh()) * blk.zc.abs()

    def _row_terms(self, blk: Block, rows: RowStats) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r, c = blk.rows, blk.cols
        eps, V = self.eps, self.V
        w_t = rows.w_target[r]
        C = (1 - eps) * w_t + (eps / V) * self.S_w
        q = (eps / V) * (self.cw[c][None, :] if self.cw is not None else torch.ones_like(blk.p))
        q = q.expand_as(blk.p).clone()
        t_r = self.tgt[r]
        inside = (t_r >= c.start) & (t_r < c.stop) & rows.valid[r]
        if bool(inside.any()):
            idx = inside.nonzero().squeeze(1)
            q[idx, t_r[idx] - c.start] += (1 - eps) * w_t[idx]
        q = q * rows.valid[r][:, None]
        return C, q, rows.valid[r]

    def _smoothing_slope(self, blk: Block, rows: RowStats) -> tuple[torch.Tensor, torch.Tensor]:
        """``(∂C_i/∂ε, ∂q_ij/∂ε)``: C_i = (1−ε)w_{y_i} + (ε/V)S_w and q_ij = (1−ε)w_{y_i}δ_{j,y_i} + (ε/V)w_j are
        linear in ε, so their slopes are S_w/V − w_{y_i} and w_j/V − w_{y_i}δ_{j,y_i} (0 on ignored rows)."""
        r, c = blk.rows, blk.cols
        V = self.V
        w_t = rows.w_target[r]
        dC = self.S_w / V - w_t
        w = self.cw[c][None, :] if self.cw is not None else torch.ones_like(blk.p)
        dq = (w / V).expand_as(blk.p).clone()
        t_r = self.tgt[r]
        inside = (t_r >= c.start) & (t_r < c.stop) & rows.valid[r]
        if bool(inside.any()):
            idx = inside.nonzero().squeeze(1)
            dq[idx, t_r[idx] - c.start] -= w_t[idx]
        valid = rows.valid[r]
        return dC * valid, dq * valid[:, None]

    def finish_rows(self, lse: torch.Tensor) -> None:
        """After phase 1: R_i (evaluating lse, with the declared elementary errors) and the bound
        |δlse_i| ≤ E*_i + R_i, E*_i = max(log1p(T⁺_i), −log1p(T⁻_i))."""
        m = self.m
        R = self.g_V + 3 * U_ACC + m.u_ce * (1 + 3 * lse.abs())
        log_s = (lse - self.zmax).clamp_min(0).nan_to_num(0.0, posinf=0.0, neginf=0.0)
        ex = 2 * m.u_ce
        # Each term exp(z' − m) (and each online rescale of a partial sum) errs relatively by the declared ulps;
        # the argument-proportional part sums along a term's path to m − z'_j, weighted by p: H − log s.
        R = R + ex * (m.exp_ulps + m.exp_arg_ulps * (self.entropy - log_s).clamp_min(0))
        R = R + ex * m.log_ulps * log_s.clamp_min(1.0)
        self.R = R
        self.dlse = lse_error_bound(self.T_plus, self.T_minus) + R

    def block(self, blk: Block, rows: RowStats, sh: _BlockShared | None = None) -> None:
        """One block of the oracle's sweep: phase 1 adds to the row totals, phase 2 to the gradient bounds."""
        sh = sh if sh is not None else _BlockShared(blk)
        e_z, e_zc = self._logit_error(blk, sh)
        C, q, valid = self._row_terms(blk, rows)
        p = blk.p * valid[:, None]
        lse = rows.lse[blk.rows]
        ecl = e_zc.clamp(max=_EXP_MAX)
        if self.phase == 1:
            self._row_totals(blk, rows, p, lse, ecl, e_zc, C, q, valid)
            return
        dp = self._probability_error(blk, p, lse, ecl, e_zc, C)
        dg, g_abs = self._coefficient_error(blk, rows, sh, p, lse, dp, C, q)
        dG = self._through_softcap(blk, dg, g_abs, e_z) if blk.dzc_dz is not None else dg
        self._accumulate_gradients(blk, sh, dG, valid)

    def _row_totals(
        self,
        blk: Block,
        rows: RowStats,
        p: torch.Tensor,
        lse: torch.Tensor,
        ecl: torch.Tensor,
        e_zc: torch.Tensor,
        C: torch.Tensor,
        q: torch.Tensor,
        valid: torch.Tensor,
    ) -> None:
        """Phase 1: the block's share of T⁺_i, T⁻_i, the entropy, the row maximum and the first-order loss sums."""
        r = blk.rows
        self.T_plus[r] += _p_expm1(p, ecl).sum(dim=1)
        self.T_minus[r] += _p_expm1(p, -ecl).sum(dim=1)
        self.entropy[r] += torch.where(p > 0, p * (lse[:, None] - blk.zc), torch.zeros_like(p)).sum(dim=1)
        zc = torch.where(valid[:, None], blk.zc, torch.full_like(blk.zc, -math.inf))
        self.zmax[r] = torch.maximum(self.zmax[r], zc.amax(dim=1))
        self.S_ce[r] += ((C[:, None] * p - q).abs() * e_zc).sum(dim=1)
        if self.eps:
            _, dq = self._smoothing_slope(blk, rows)
            gap = torch.where(valid[:, None], lse[:, None] - blk.zc, torch.zeros_like(blk.zc))
            self.S_eps[r] += (dq * gap).sum(dim=1)

    def _probability_error(
        self, blk: Block, p: torch.Tensor, lse: torch.Tensor, ecl: torch.Tensor, e_zc: torch.Tensor, C: torch.Tensor
    ) -> torch.Tensor:
        """Phase 2: |δp| of the block's probabilities from |δ log p|, and the loss's second-order term."""
        m = self.m
        r = blk.rows
        R = self.R[r]
        logp = blk.zc - lse[:, None]
        L = logp_error_bound(p, ecl, self.T_plus[r][:, None], self.T_minus[r][:, None])
        ex = 2 * m.u_ce
        rho = m.u_L * logp.abs() + 2 * U_ACC + ex * (m.exp_ulps + m.exp_arg_ulps * logp.abs())
        dlogp = L + R[:, None] + rho
        dp = _p_expm1(p, dlogp)  # |δp| ≤ p·(e^{|δ log p|} − 1)
        # Loss (mean value theorem): |C p̃ − q| ≤ |C p − q| + C·|δp| at the intermediate point.
        self.S_2[r] += (C[:, None] * _p_expm1(p, L) * e_zc).sum(dim=1)
        return dp

    def _coefficient_error(
        self,
        blk: Block,
        rows: RowStats,
        sh: _BlockShared,
        p: torch.Tensor,
        lse: torch.Tensor,
        dp: torch.Tensor,
        C: torch.Tensor,
        q: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Phase 2: ``(|δg|, |g|)`` for the gradient of the loss in the (soft-capped) logits, g = c·(C p − q) +
        c_z·2λ·lse·p, before the softcap's derivative."""
        m = self.m
        r = blk.rows
        dlse = self.dlse[r]
        cc = rows.coef_ce[r].abs()[:, None]
        cz = rows.coef_z[r].abs()[:, None]
        lam2 = 2 * self.lam
        if blk.dzc_dz is not None:
            # |g| from its terms, not |G|/d: the oracle's d = 1 − tanh² cancels to exactly 0 once |z/s| ≳ 18.7
            # (and underflows past ~355) while a correct fp32 d is off by up to 3u_L there (docs/error-analysis.md,
            # "Outputs whose exact value is zero"): the |g|·3u_L term below must see the true |g|.
            g_abs = (
                rows.coef_ce[r][:, None] * (C[:, None] * p - q) + rows.coef_z[r][:, None] * lam2 * lse[:, None] * p
            ).abs()
        else:
            g_abs = sh.G_abs
        dg = cc * C[:, None] * dp
        if self.lam:  # δ(lse·p) ≤ |lse|·|δp| + |δlse|·(p + |δp|)
            dg = dg + cz * lam2 * (lse.abs()[:, None] * dp + dlse[:, None] * (p + dp))
        dg = dg + 3 * m.u_ce * (cc * (C[:, None] * p + q) + cz * lam2 * lse.abs()[:, None] * p)
        if self.d_eps:
            # The smoothing factor itself held at u_ce (a Triton kernel's float argument is fp32): fl(ε) − ε is
            # up to u·ε, and 1 − fl(ε) is exact, so (1−ε)'s relative error is up to u·ε/(1−ε), 211u at ε = 0.9953
            # (seen on CUDA: chunked_triton's true-class grad_weight at 1.36× the bound without this term).
            # g moves by c·(∂C/∂ε·p − ∂q/∂ε)·δε: c·(1 − 1/V)·δε at the target, c·δε/V elsewhere.
            dC, dq = self._smoothing_slope(blk, rows)
            dg = dg + self.d_eps * cc * (dC[:, None] * p - dq).abs()
        # p below the normal range may flush to 0 before it is scaled by the row's coefficients (Liger multiplies
        # p by 1 + 2λ·lse, then by the upstream scalar: seen on CUDA, grad_weight 0 for 3.6e-37 at λ = 0.5).
        dg = dg + m.eta_ce * (cc * C[:, None] + cz * lam2 * lse.abs()[:, None])
        if m.class_weight_rounding:
            dg = dg + 2 * m.u_c * g_abs
        return dg, g_abs

    def _accumulate_gradients(self, blk: Block, sh: _BlockShared, dG: torch.Tensor, valid: torch.Tensor) -> None:
        """Phase 2: |δG| of the stored G, through the three gradient products into every accumulator."""
        m = self.m
        r = blk.rows
        G_abs = sh.G_abs
        # Stored G rounds once (u_G|G| + η); with CE arithmetic in the compute dtype p is stored too, a second η.
        # An underflowed G scaled afterwards by the upstream gradient u carries |u|·η, then rounds again.
        eta_G = m.eta_c * (2 if m.u_ce != U_ACC else 1) * m.upstream_scale
        dG = (dG + m.u_G * G_abs + eta_G) * valid[:, None]
        dGW, dGX, dG_sum = dG @ sh.w_abs, dG.T @ sh.x_abs, dG.sum(dim=0)
        for a in self.accumulators.values():
            a.gx[r] += dGW + a.s_x * sh.GW
            a.gw[blk.cols] += dGX + a.s_w * sh.GX
            a.gb[blk.cols] += dG_sum + a.s_b * sh.G_sum

    def _through_softcap(self, blk: Block, dg: torch.Tensor, g_abs: torch.Tensor, e_z: torch.Tensor) -> torch.Tensor:
        """|δG| for G = g·d, d = 1 − tanh²(z/s) (step 4): |δG| ≤ |δg|·min(d + |δd|, sech²(t_lo)) + |g|·(|δd| +
        roundings of d), |δd| ≤ 2·tanh(t_hi)·sech²(t_lo)·e_z/s (mean value theorem; sech² falls and tanh rises
        in |t|), t_lo = max(|z| − e_z, 0)/s, t_hi = (|z| + e_z)/s."""
        m, s = self.m, self.s
        # d from sech² rather than the oracle's 1 − tanh², whose float64 cancellation is 1e-16 absolute: more than
        # d itself once |z/s| > 17, which would let the first term stand on a wrong d.
        d = _sech2(blk.z.abs() / s)
        sech2_lo = _sech2((blk.z.abs() - e_z).clamp_min(0) / s)
        dd = 2 * torch.tanh((blk.z.abs() + e_z) / s) * sech2_lo * e_z / s
        t = (blk.zc / s).abs()
        # d = 1 − t̂²: tanh's declared extra error κ doubles in the square and enters d absolutely (2κ·t²).
        rounding = 3 * m.u_L + 2 * m.kappa_tanh() * t * t
        return dg * torch.minimum(d + dd, sech2_lo) + g_abs * (dd + rounding)


class _Batch:
    """Shows every block to each sweep, with the block's shared products (:class:`_BlockShared`) formed once."""

    def __init__(self, sweeps: Sequence[_Sweep]) -> None:
        self.sweeps = sweeps

    def block(self, blk: Block, rows: RowStats) -> None:
        sh = _BlockShared(blk)
        for s in self.sweeps:
            s.block(blk, rows, sh)


@dataclass(frozen=True)
class SweepResult:
    """What the block sweep accumulated for one error model: everything :func:`finish_bounds` needs. ``acc`` is
    the model's own gradient bounds; ``sweep`` gives the row figures (O(N)) shared by its gradient key, and after
    :func:`sweep_bounds` holds no accumulator, so a result keeps no sibling's gradient bounds alive."""

    sweep: _Sweep
    acc: _Accumulator

    @property
    def nbytes(self) -> int:
        """The memory its accumulated gradient bounds hold."""
        return sum(v.numel() * v.element_size() for v in (self.acc.gx, self.acc.gw, self.acc.gb))


def sweep_bounds(
    p: Problem, t: Tensors, oracle: LinearCEResult, models: Sequence[ErrorModel]
) -> dict[str, SweepResult]:
    """The block sweep of every model in ``models`` at once, keyed by ``repr(sweep_key(m))``: the oracle's pass 1
    once (:func:`reference.linear_ce.block_walker`), its blocks walked twice (phase 1, phase 2) without
    re-accumulating the oracle's gradients, the model-independent products of each block formed once
    (:class:`_BlockShared`), |δG| and its two products once per gradient key. Every figure is the one a sweep of
    that model alone gives, bit for bit (tests/self/properties/test_tolerance_paths.py)."""
    from numcheck.properties.linear_ce.harness import oracle_operands, oracle_row_chunk

    x, w, b = oracle_operands(p, t)
    N, H = x.shape
    V = w.shape[0]
    groups: dict[str, list[ErrorModel]] = {}
    for m in models:
        groups.setdefault(repr(_gradient_key(m)), []).append(m)
    sweeps = [_Sweep(p, t, ms[0], N, H, V, x.device, ms[1:]) for ms in groups.values()]
    _, walk = block_walker(
        x, w, t.target, b, options=t.options, upstream=t.upstream, all_ignored="zero", row_chunk=oracle_row_chunk(N, V)
    )
    batch = _Batch(sweeps)
    for phase in (1, 2):
        for s in sweeps:
            s.phase = phase
        walk(batch)
        if phase == 1:
            for s in sweeps:
                s.finish_rows(oracle.stats.lse)
    out = {}
    for s, ms in zip(sweeps, groups.values()):
        for m in ms:
            key = repr(sweep_key(m))
            if key not in out:  # each accumulator handed to its own result only: dropping one frees it
                out[key] = SweepResult(s, s.accumulators.pop(key))
    return out


def linear_ce_bounds(p: Problem, t: Tensors, oracle: LinearCEResult, m: ErrorModel) -> dict[str, torch.Tensor]:
    """Element-wise absolute error bounds for ``loss``, ``z_loss``, ``grad_x``, ``grad_weight``, ``grad_bias``.

    ``oracle`` must be the oracle on the same operands (:func:`properties.linear_ce.harness.run_oracle`); the sweep
    walks its blocks twice (:func:`sweep_bounds`).
    """
    return linear_ce_bounds_many(p, t, oracle, [m])[0]


def linear_ce_bounds_many(
    p: Problem, t: Tensors, oracle: LinearCEResult, models: Sequence[ErrorModel]
) -> list[dict[str, torch.Tensor]]:
    """:func:`linear_ce_bounds` of each model, from one shared sweep (:func:`sweep_bounds`)."""
    swept = sweep_bounds(p, t, oracle, models)
    return [finish_bounds(p, t, oracle, m, swept[repr(sweep_key(m))]) for m in models]


def _linear_ce_bounds_two_runs(
    p: Problem, t: Tensors, oracle: LinearCEResult, m: ErrorModel
) -> dict[str, torch.Tensor]:
    """The straightforward evaluation :func:`sweep_bounds` is tested against: the whole oracle run twice with
    one model's sweep as its observer, every product of a block formed for that model alone."""
    from numcheck.properties.linear_ce.harness import oracle_operands, oracle_row_chunk

    x, w, b = oracle_operands(p, t)
    N, H = x.shape
    V = w.shape[0]
    sweep = _Sweep(p, t, m, N, H, V, x.device)
    for phase in (1, 2):
        sweep.phase = phase
        linear_ce(
            x,
            w,
            t.target,
            b,
            options=t.options,
            upstream=t.upstream,
            all_ignored="zero",
            observer=sweep,
            row_chunk=oracle_row_chunk(N, V),
        )
        if phase == 1:
            sweep.finish_rows(oracle.stats.lse)
    return finish_bounds(p, t, oracle, m, SweepResult(sweep, sweep.accumulator(m)))


def _row_loss_errors(
    p: Problem, t: Tensors, oracle: LinearCEResult, m: ErrorModel, sweep: _Sweep
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ce_row, z_row, d_ce, d_z)``: each row's cross-entropy and z-loss terms and their error bounds from the
    sweep's row sums (0 on ignored rows)."""
    from numcheck.properties.linear_ce.harness import oracle_operands

    H, V = t.x.shape[1], t.weight.shape[0]
    st = oracle.stats
    lse = st.lse
    valid = st.valid
    R = sweep.R
    ce_row = oracle.per_row - torch.where(valid, t.options.z_loss_scale * lse * lse, torch.zeros_like(lse))
    C = (1 - sweep.eps) * st.w_target + (sweep.eps / V) * sweep.S_w
    d_ce = sweep.S_ce + sweep.S_2 + C * R + (m.u_L + 4 * U_ACC) * ce_row.abs()
    # ε held at u_ce (step 4's smoothing term): δℓ_i = ∂ℓ_i/∂ε·δε, δε = fl(ε) − ε.
    d_ce = d_ce + sweep.d_eps * sweep.S_eps.abs()
    if m.class_weight_rounding:
        d_ce = d_ce + 3 * m.u_c * ce_row.abs()
    if m.target_products:
        # Declared target_logit="rounded_products": z_y = Σ_k fl_c(x_k·w_yk) summed in fp32, beside the lse's
        # own logits. Each product rounds at u_c (η_c below the normal range); the fp32 sum is within the
        # logits' own term. It enters ℓ_i with the target's coefficient (1−ε)·w_{y_i}.
        x, w, _ = oracle_operands(p, t)
        tgt = torch.where(valid, t.target, torch.zeros_like(t.target))
        prod = (x * w[tgt]).abs().sum(-1)
        d_ce = d_ce + (1 - sweep.eps) * st.w_target * (m.u_c * prod + H * m.eta_c)
    z_row = oracle.per_row - ce_row
    # ζ = λ·lse²: δζ = λ(2·lse·δlse + δlse²), exactly.
    dlse = sweep.dlse
    d_z = sweep.lam * (2 * lse.abs() * dlse + dlse * dlse) + 4 * U_ACC * z_row.abs()
    return ce_row, z_row, d_ce * valid, d_z * valid


def _reduced_loss_bounds(
    t: Tensors,
    oracle: LinearCEResult,
    m: ErrorModel,
    sweep: _Sweep,
    rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bounds of the returned loss and z-loss: the rows' bounds (:func:`_row_loss_errors`) through the
    reduction's sum (γ_N) and division, and the outputs' last roundings."""
    ce_row, z_row, d_ce, d_z = rows
    st = oracle.stats
    red = t.options.reduction
    u_loss = m.u_out.get("loss", U_ACC)
    u_z = m.u_out.get("z_loss", U_ACC)
    if red == "none":
        loss_b = d_ce + d_z + u_loss * oracle.loss.abs()
        z_b = d_z + u_z * oracle.z_loss.abs()
    elif red == "sum":
        loss_b = (d_ce + d_z).sum() + sweep.g_N * oracle.per_row.abs().sum() + u_loss * oracle.loss.abs()
        z_b = d_z.sum() + sweep.g_N * z_row.abs().sum() + u_z * oracle.z_loss.abs()
    else:
        n = max(st.n_valid, 1)
        D = st.normalizer if st.normalizer else 1.0
        loss_b = (d_ce.sum() + sweep.g_N * ce_row.abs().sum()) / D + (d_z.sum() + sweep.g_N * z_row.abs().sum()) / n
        if m.class_weight_rounding:
            loss_b = loss_b + m.u_c * (ce_row.sum() / D).abs()
        loss_b = loss_b + u_loss * oracle.loss.abs().nan_to_num(0.0)
        z_b = (d_z.sum() + sweep.g_N * z_row.abs().sum()) / n + u_z * oracle.z_loss.abs().nan_to_num(0.0)
    return loss_b, z_b


def finish_bounds(
    p: Problem, t: Tensors, oracle: LinearCEResult, m: ErrorModel, swept: SweepResult
) -> dict[str, torch.Tensor]:
    """The bounds of ``m`` from its sweep (:func:`sweep_bounds`): the loss and z-loss from the row sums, the last
    roundings of every output."""
    sweep, acc = swept.sweep, swept.acc
    loss_b, z_b = _reduced_loss_bounds(t, oracle, m, sweep, _row_loss_errors(p, t, oracle, m, sweep))
    chunk_eta = {
        "grad_x": m.path_eta(m.grad_x_accumulation, m.chunks_x),
        "grad_weight": m.path_eta(m.grad_accumulation, m.chunks),
        "grad_bias": m.path_eta(m.grad_accumulation, m.chunks),
    }

    def final(name: str, acc: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        # The last rounding, into the dtype the impl returned the output in, and the chunk partials' underflow.
        return (
            acc
            + m.u_out.get(name, U_ACC) * value.abs().nan_to_num(0.0)
            + m.eta_out.get(name, 0.0)
            + chunk_eta.get(name, 0.0)
        )

    red = t.options.reduction
    out = {
        "loss": loss_b + m.eta_out.get("loss", 0.0) + (m.eta_c if red != "mean" else 0.0),
        "z_loss": z_b + m.eta_out.get("z_loss", 0.0),
        "grad_x": final("grad_x", acc.gx, oracle.grad_x),
        "grad_weight": final("grad_weight", acc.gw, oracle.grad_weight),
    }
    if oracle.grad_bias is not None:
        out["grad_bias"] = final("grad_bias", acc.gb, oracle.grad_bias)
    return out
