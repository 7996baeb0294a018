"""Scales and block quantization for every FP8 recipe, bit-exact, in float64/integer arithmetic.

**The common cast.** ``q = fp8(fp32(x · s))``: the source value times the block's scale ``s`` is rounded to
binary32 (what the kernels compute), then to FP8 with round-to-nearest-even and saturation (overflow and
±inf → ±max, NaN stays NaN). Dequantization multiplies by ``s_inv``: ``fp32(1/s)`` for fp32 scales,
``2^(c−127)`` for an E8M0 code ``c``. (Both roundings are computed from exact float64 products and
quotients: a binary32 rounding of a float64 result equals the direct binary32 operation because
53 ≥ 2·24 + 2, so no double-rounding error arises.)

**amax.** ``max |x|`` over a block, *ignoring NaN elements* (TransformerEngine reduces with ``fmaxf``,
which drops NaN); an all-NaN block has amax 0. An inf element makes amax inf.

**Scale from amax** (current and blockwise; TE's ``compute_scale_from_amax``):
``a = max(amax, epsilon)``; if ``a`` is 0, inf or NaN → ``s = 1``; else ``s = fp32(fp8_max / a)``; an
infinite ``s`` (amax < fp8_max / FLT_MAX, i.e. tiny or subnormal) → ``value_for_inf`` (FLT_MAX for
per-tensor scales, the input dtype's largest finite value for blockwise); with power-of-2 scales ``s`` is
then rounded down to ``2^floor(log2 s)`` (TE keeps sign and exponent bits only).

**Delayed scaling** (:func:`delayed_scale_update`): quantize with the stored scale; after a step,
``amax = max`` over the last ``amax_history_len`` recorded amaxes (or the most recent one), and
``s = fp32(fp32(fp8_max · 2^−margin) / amax)`` when amax is finite and > 0, else the previous scale.
Initial scale 1. *Suite's choice where TE is undefined:* an ``s`` that overflows to inf (amax below
fp8_max / FLT_MAX) is replaced by FLT_MAX, as current scaling does (TE's delayed kernel would store inf).

**MXFP8** (:func:`mx_scale_code`), E8M0 code ``c``, block scale ``X = 2^(c−127)``, elements ``x / X``:

- ``"rceil"`` (TransformerEngine, torchao RCEIL): ``d = fp32(amax · fp32(1/fp8_max))``,
  ``c = clamp(ceil(log2 d) + 127, 0, 254)``; d = 0 → 0. Every element then fits: |x/X| ≤ fp8_max.
- ``"floor"`` (OCP MX v1.0, torchao's default FLOOR): ``c = clamp(floor(log2 amax) − emax + 127, 0, 254)``
  with emax = 8 (E4M3) or 15 (E5M2); elements above fp8_max·X saturate (up to 12.5 % error).
- Both: amax NaN → 255 (a NaN scale), amax inf → 254.
  *Suite's choices where implementations disagree:* elements are always divided by exactly X, also for
  c = 0 (TE and torchao multiply by 1 there, flushing blocks with amax < ~2^-118 to zero) and for c = 254
  from an inf amax (TE's pre-Blackwell path multiplies by 0, making the block NaN; torchao RCEIL uses
  2^-127 like this oracle); torchao FLOOR derives 2^120 for an inf amax from the exponent bits.
  The properties only draw such blocks where the contract in :mod:`impls.protocols.fp8_linear` says so.

**Shapes not divisible by the block.** Blocks tile the tensor from index 0; the last block along a
dimension is partial and covers the remainder. Its amax is taken over the elements present — the same
as zero padding to a multiple of the block, since zeros never raise an amax and an all-zero block gets
the same scale either way. Scale tensors therefore have ``ceil(R/br) × ceil(C/bc)`` entries, unpadded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numcheck.reference.fp8_formats import (
    DTYPE_MAX,
    E8M0_BIAS,
    E8M0_NAN,
    F64,
    FP32_MAX,
    Fp8Format,
    decode_fp8,
    encode_fp8,
    get_format,
    round_to_fp32,
)
from numcheck.reference.fp8_recipes import ROWWISE_KINDS, Fp8Recipe
from numcheck.reference.fp8_recipes import Block as RecipeBlock

#: A concrete block (:func:`effective_block`): ``(rows, cols)`` of one scale.
Block = tuple[int, int]


# -- blocks -------------------------------------------------------------------------------------------
def effective_block(shape: tuple[int, int], block: RecipeBlock | None) -> Block:
    """``block`` with its sides made concrete: ``None`` (one scale per tensor) is the whole tensor, a ``None`` side
    (the rowwise kinds: one scale per row or column over the whole reduction) that whole dimension; validates the
    shape."""
    if len(shape) != 2:
        raise ValueError(f"quantization works on 2-D tensors, got shape {tuple(shape)}")
    if block is None:
        block = (None, None)
    br, bc = (max(1, n) if b is None else b for b, n in zip(block, shape))
    if br < 1 or bc < 1:
        raise ValueError(f"block={block!r} must have positive sides")
    return (br, bc)


def block_grid(shape: tuple[int, int], block: RecipeBlock | None) -> tuple[int, int]:
    """Number of blocks along each dimension, ``(ceil(R/br), ceil(C/bc))``."""
    br, bc = effective_block(shape, block)
    return (-(-shape[0] // br), -(-shape[1] // bc))


def _padded_blocks(t: torch.Tensor, block: Block) -> torch.Tensor:
    """``t`` zero-padded to block multiples, viewed as ``[nbR, br, nbC, bc]``."""
    R, C = t.shape
    br, bc = block
    nr, nc = -(-R // br), -(-C // bc)
    p = torch.zeros(nr * br, nc * bc, dtype=t.dtype, device=t.device)
    p[:R, :C] = t
    return p.view(nr, br, nc, bc)


def block_amax(x: torch.Tensor, block: RecipeBlock | None) -> torch.Tensor:
    """float64 ``[nbR, nbC]``: max |x| per block, NaN elements ignored (an all-NaN block gives 0)."""
    x = x.to(F64)
    eb = effective_block(tuple(x.shape), block)
    a = x.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return _padded_blocks(a, eb).amax(dim=(1, 3))


def expand_blocks(s: torch.Tensor, shape: tuple[int, int], block: RecipeBlock | None) -> torch.Tensor:
    """A per-block tensor ``[nbR, nbC]`` broadcast back to ``shape`` (partial blocks cropped)."""
    br, bc = effective_block(shape, block)
    return s.repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)[: shape[0], : shape[1]]


# -- scale rules --------------------------------------------------------------------------------------
def _pow2_floor(s: torch.Tensor) -> torch.Tensor:
    """2^floor(log2 s) for positive finite s (what keeping only the exponent bits of a binary32 does)."""
    _, e = torch.frexp(s)
    return torch.ldexp(torch.ones_like(s), (e.to(torch.int64) - 1).to(F64))


def scale_from_amax(
    amax: torch.Tensor,
    fp8_max: float,
    *,
    power_of_2: bool = False,
    epsilon: float = 0.0,
    value_for_inf: float = FP32_MAX,
) -> torch.Tensor:
    """Quantization scale(s) from amax, TE's rule (module docstring); float64 holding binary32 values."""
    a = torch.as_tensor(amax, dtype=F64)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    a = torch.where(a < epsilon, torch.full_like(a, epsilon), a)  # NaN compares false and stays NaN
    special = torch.isinf(a) | (a == 0) | torch.isnan(a)
    safe = torch.where(special, torch.ones_like(a), a)
    s = round_to_fp32(fp8_max / safe)
    s = torch.where(torch.isinf(s), torch.full_like(s, value_for_inf), s)
    if power_of_2:
        s = _pow2_floor(s)
    return torch.where(special, torch.ones_like(s), s)


def scale_inverse(scale: torch.Tensor) -> torch.Tensor:
    """Dequantization scale ``fp32(1/s)`` of an fp32 scale (float64 holding binary32 values)."""
    return round_to_fp32(1.0 / torch.as_tensor(scale, dtype=F64))


def delayed_scale_update(
    history: list[float] | torch.Tensor, prev_scale: float, fp8_max: float, *, margin: int = 0, algo: str = "max"
) -> float:
    """The next delayed-scaling scale from the recorded amaxes (oldest first) and the previous scale."""
    h = torch.as_tensor(history, dtype=F64).reshape(-1)
    if algo == "max":
        finite_or_inf = h[~torch.isnan(h)]
        amax = float(finite_or_inf.max()) if finite_or_inf.numel() else 0.0
    elif algo == "most_recent":
        amax = float(h[-1]) if h.numel() else 0.0
    else:
        raise ValueError(f"algo={algo!r} must be 'max' or 'most_recent'")
    if not (amax > 0.0 and amax != float("inf")):
        return float(prev_scale)
    scaled_max = float(round_to_fp32(torch.tensor(fp8_max * 2.0 ** (-margin), dtype=F64)))
    s = float(round_to_fp32(torch.tensor(scaled_max / amax, dtype=F64)))
    return FP32_MAX if s == float("inf") else s


def _ceil_log2(v: torch.Tensor) -> torch.Tensor:
    """ceil(log2 v) exactly, for positive finite float64 v."""
    m, e = torch.frexp(v)
    e = e.to(torch.int64)
    return torch.where(m == 0.5, e - 1, e)


def _floor_log2(v: torch.Tensor) -> torch.Tensor:
    """floor(log2 v) exactly, for positive finite float64 v."""
    _, e = torch.frexp(v)
    return e.to(torch.int64) - 1


def mx_scale_code(amax: torch.Tensor, fmt: str | Fp8Format, rounding: str = "rceil") -> torch.Tensor:
    """E8M0 code(s) (int64) of the MX block scale from amax, ``"rceil"`` or ``"floor"`` (module docstring)."""
    f = get_format(fmt)
    a = torch.as_tensor(amax, dtype=F64)
    nan, inf = torch.isnan(a), torch.isinf(a)
    safe = torch.where(nan | inf | (a <= 0), torch.ones_like(a), a)
    if rounding == "rceil":
        rcp = float(round_to_fp32(torch.tensor(1.0 / f.max_finite, dtype=F64)))
        d = round_to_fp32(safe * rcp)
        dz = d == 0  # amax so small that the descale underflows binary32
        e = torch.where(
            dz, torch.full_like(d, -(10**6), dtype=torch.int64), _ceil_log2(torch.where(dz, torch.ones_like(d), d))
        )
    elif rounding == "floor":
        e = _floor_log2(safe) - f.mx_emax
    else:
        raise ValueError(f"rounding={rounding!r} must be 'rceil' or 'floor'")
    code = torch.clamp(e + E8M0_BIAS, 0, 254)
    code = torch.where(a <= 0, torch.zeros_like(code), code)
    code = torch.where(inf, torch.full_like(code, 254), code)
    return torch.where(nan, torch.full_like(code, E8M0_NAN), code)


def e8m0_scale(code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, s_inv)`` = ``(2^(127−c), 2^(c−127))`` as float64; code 255 → NaN for both."""
    c = code.to(torch.int64)
    s = torch.ldexp(torch.ones_like(c, dtype=F64), (E8M0_BIAS - c).to(F64))
    s_inv = torch.ldexp(torch.ones_like(c, dtype=F64), (c - E8M0_BIAS).to(F64))
    nan = c == E8M0_NAN
    return (
        torch.where(nan, torch.full_like(s, float("nan")), s),
        torch.where(nan, torch.full_like(s, float("nan")), s_inv),
    )


# -- quantization -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quantized:
    """One quantization of a 2-D tensor, in the source's orientation (a columnwise quantization of
    ``[R, C]`` is ``[R, C]`` with ``b×1`` blocks).

    Attributes:
        codes: ``uint8 [R, C]`` FP8 codes.
        fmt: the FP8 format.
        block: the effective block (the whole tensor for per-tensor scaling).
        amax: float64 ``[nbR, nbC]`` per-block amax (NaN ignored).
        scale: float64 ``[nbR, nbC]`` multiplier applied before rounding.
        scale_inv: float64 ``[nbR, nbC]`` dequantization multiplier.
        scale_code: int64 ``[nbR, nbC]`` E8M0 codes (MXFP8) or ``None``.
    """

    codes: torch.Tensor
    fmt: Fp8Format
    block: Block
    amax: torch.Tensor
    scale: torch.Tensor
    scale_inv: torch.Tensor
    scale_code: torch.Tensor | None = None

    @property
    def values(self) -> torch.Tensor:
        """The FP8 values (before the dequantization scale), float64 ``[R, C]``."""
        return decode_fp8(self.codes, self.fmt)

    @property
    def dequantized(self) -> torch.Tensor:
        """``values · s_inv`` in float64 (exact: a 4-bit by 24-bit product)."""
        return self.values * expand_blocks(self.scale_inv, tuple(self.codes.shape), self.block)

    def transposed(self) -> "Quantized":
        """The same quantization viewed as of the transposed tensor."""
        return Quantized(
            self.codes.t(),
            self.fmt,
            (self.block[1], self.block[0]),
            self.amax.t(),
            self.scale.t(),
            self.scale_inv.t(),
            None if self.scale_code is None else self.scale_code.t(),
        )


def cast_with_scale(x: torch.Tensor, scale_full: torch.Tensor, fmt: str | Fp8Format) -> torch.Tensor:
    """The common cast: codes of ``fp8_sat(fp32(fp32(x) · s))`` elementwise (``scale_full`` as ``x``'s shape)."""
    x32 = round_to_fp32(x.to(F64))
    return encode_fp8(round_to_fp32(x32 * scale_full), fmt, saturate=True)


def quantize(
    x: torch.Tensor,
    fmt: str | Fp8Format,
    block: RecipeBlock | None,
    *,
    scaling: str = "amax",
    power_of_2: bool = False,
    epsilon: float = 0.0,
    value_for_inf: float = FP32_MAX,
    stored_scale: float | None = None,
    mx_rounding: str = "rceil",
) -> Quantized:
    """Quantize a 2-D tensor (any float dtype; values are taken as binary32).

    ``scaling``: ``"amax"`` (scale from each block's amax: current and blockwise), ``"stored"`` (delayed:
    one given ``stored_scale`` for the whole tensor) or ``"mx"`` (E8M0 block scale, ``mx_rounding``).
    """
    f = get_format(fmt)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D, got shape {tuple(x.shape)}")
    shape = (int(x.shape[0]), int(x.shape[1]))
    eb = effective_block(shape, block)
    x64 = round_to_fp32(x.detach().to("cpu", F64))
    amax = block_amax(x64, eb)
    code = None
    if scaling == "amax":
        scale = scale_from_amax(amax, f.max_finite, power_of_2=power_of_2, epsilon=epsilon, value_for_inf=value_for_inf)
        scale_inv = scale_inverse(scale)
    elif scaling == "stored":
        if stored_scale is None:
            raise ValueError("scaling='stored' needs stored_scale")
        s = float(round_to_fp32(torch.tensor(float(stored_scale), dtype=F64)))
        if not (s > 0 and s != float("inf")):
            raise ValueError(f"stored_scale must be a positive finite binary32 value, got {stored_scale!r}")
        scale = torch.full_like(amax, s)
        scale_inv = scale_inverse(scale)
    elif scaling == "mx":
        code = mx_scale_code(amax, f, mx_rounding)
        scale, scale_inv = e8m0_scale(code)
    else:
        raise ValueError(f"scaling={scaling!r} must be 'amax', 'stored' or 'mx'")
    codes = cast_with_scale(x64, expand_blocks(scale, shape, eb), f)
    return Quantized(codes, f, eb, amax, scale, scale_inv, code)


def quantize_operand(
    t: torch.Tensor, recipe: Fp8Recipe, role: str, usage: str, *, stored_scale: float | None = None
) -> Quantized:
    """Quantize operand ``role`` (``"x" | "w" | "dy"``) for ``usage`` as ``recipe`` prescribes.

    ``t``'s dtype sets blockwise scaling's ``value_for_inf`` (its largest finite value). Delayed scaling
    needs ``stored_scale``. The rowwise kinds scale each row (``usage="rowwise"``) or column (``"columnwise"``) over
    the whole other dimension with current scaling's rule (torchao's ``amax_to_scale``: ``fp32(fp8_max /
    max(amax, eps))``, power-of-2 scales rounded *down*: ``2^floor(log2 s)`` of the exact binary32 ``s``); a
    (role, usage) the recipe does not quantize raises ``ValueError`` (:meth:`Fp8Recipe.block_of`).
    """
    fmt = recipe.format_of(role)
    block = recipe.block_of(role, usage)
    if recipe.kind == "delayed":
        return quantize(t, fmt, block, scaling="stored", stored_scale=stored_scale)
    if recipe.kind == "mxfp8":
        return quantize(t, fmt, block, scaling="mx", mx_rounding=recipe.mx_scale_rounding)
    # an fp32 scale that overflows: FLT_MAX for the per-tensor and per-row scales, blockwise (TE) the dtype's max
    vfi = FP32_MAX if recipe.kind in ("current",) + ROWWISE_KINDS else DTYPE_MAX.get(t.dtype, FP32_MAX)
    return quantize(
        t,
        fmt,
        block,
        scaling="amax",
        power_of_2=bool(recipe.power_of_2_scales),
        epsilon=recipe.amax_epsilon,
        value_for_inf=vfi,
    )


def tensor_amax(t: torch.Tensor) -> float:
    """max |t| over the whole tensor, NaN ignored (what delayed scaling records)."""
    return float(block_amax(t.reshape(1, -1) if t.dim() != 2 else t, None).max())
