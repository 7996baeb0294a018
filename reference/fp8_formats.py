"""Bit-exact FP8 (E4M3, E5M2), E8M0 and binary32 rounding in float64/integer arithmetic.

Nothing here calls torch's own float8 casts: their overflow behaviour changed between releases (torch 2.6
and 2.11 turn |x| ≥ 465 into NaN for E4M3, 2.13 saturates), so the oracle rounds by hand.

Rounding (:func:`round_to_grid`): round-to-nearest, ties to even, on the grid of a binary format with
``mbits`` stored mantissa bits, minimum normal exponent ``emin`` (gradual underflow below it) and
largest finite value ``max_finite``. Overflow (a rounded magnitude above ``max_finite``) either saturates
to ±``max_finite`` (``saturate=True``, what every FP8 recipe does; ±inf too) or becomes ±inf / NaN
(``saturate=False``: IEEE behaviour, used to compare with libraries that do not saturate). NaN stays NaN,
the sign of zero is kept.

Encodings (``S`` sign, ``E`` exponent field, ``M`` mantissa field):

======  ====  ====  ====  ===========  ==========================================
format  bias  emin  mbits max finite   specials
======  ====  ====  ====  ===========  ==========================================
E4M3    7     -6    3     448          no inf; S.1111.111 is NaN (``e4m3fn``)
E5M2    15    -14   2     57344        S.11111.00 is ±inf; S.11111.{01,10,11} NaN
E8M0    127   —     0     2^127        unsigned; code c is 2^(c−127); 255 is NaN
======  ====  ====  ====  ===========  ==========================================

NaN payloads and the sign of NaN are not specified by the recipes and differ between libraries (torch
encodes an E5M2 NaN as 0x7F, ml_dtypes as 0x7E): :func:`encode_fp8` writes ``0x7F | sign``, and
comparisons of codes treat every NaN code as equal (:func:`same_codes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

F64 = torch.float64


@dataclass(frozen=True)
class Fp8Format:
    """An 8-bit float format: field widths, bias and the largest finite value.

    Attributes:
        name: ``"e4m3"`` or ``"e5m2"``.
        ebits, mbits: exponent and stored mantissa bits.
        bias: exponent bias.
        max_finite: largest finite magnitude (448 and 57344).
        has_inf: whether the format encodes infinities (E5M2 does, E4M3 ``fn`` does not).
        torch_dtype_name: the matching ``torch`` dtype name.
        mx_emax: exponent of the largest power of two in the format (8 and 15), the ``emax`` of the OCP MX
            scale rule.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max_finite: float
    has_inf: bool
    torch_dtype_name: str
    mx_emax: int

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (1 − bias)."""
        return 1 - self.bias

    @property
    def unit_roundoff(self) -> float:
        """u = 2^−(mbits+1): half the spacing at 1, the relative rounding error bound in the normal range."""
        return 2.0 ** -(self.mbits + 1)

    @property
    def min_subnormal(self) -> float:
        """Spacing of the subnormal grid, 2^(emin − mbits)."""
        return 2.0 ** (self.emin - self.mbits)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.torch_dtype_name)


E4M3 = Fp8Format(
    "e4m3", ebits=4, mbits=3, bias=7, max_finite=448.0, has_inf=False, torch_dtype_name="float8_e4m3fn", mx_emax=8
)
E5M2 = Fp8Format(
    "e5m2", ebits=5, mbits=2, bias=15, max_finite=57344.0, has_inf=True, torch_dtype_name="float8_e5m2", mx_emax=15
)
FORMATS: dict[str, Fp8Format] = {"e4m3": E4M3, "e5m2": E5M2}

#: binary32, as (mbits, emin, max finite): the intermediate precision of every FP8 cast.
FP32_MBITS, FP32_EMIN = 23, -126
FP32_MAX = float(torch.finfo(torch.float32).max)
#: The largest finite value of each input dtype (``value_for_inf`` of the blockwise scale rule).
DTYPE_MAX: dict[torch.dtype, float] = {
    torch.float32: FP32_MAX,
    torch.bfloat16: float(torch.finfo(torch.bfloat16).max),
    torch.float16: float(torch.finfo(torch.float16).max),
}


def get_format(name: str | Fp8Format) -> Fp8Format:
    """``"e4m3"``/``"e5m2"`` (any case) → the format; ValueError naming the argument otherwise."""
    if isinstance(name, Fp8Format):
        return name
    try:
        return FORMATS[str(name).lower()]
    except KeyError:
        raise ValueError(f"fmt={name!r} is not an FP8 format; use one of {sorted(FORMATS)}") from None


def _as_f64(v: torch.Tensor) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise ValueError(f"expected a tensor, got {type(v).__name__}")
    return v.to(F64)


def round_to_grid(
    v: torch.Tensor, *, mbits: int, emin: int, max_finite: float, saturate: bool, nan_on_overflow: bool = False
) -> torch.Tensor:
    """Round float64 ``v`` to the grid of a binary format, ties to even; returns float64.

    The magnitude ``a`` is split as ``a = q · 2^(e−mbits)`` with ``e = max(floor(log2 a), emin)``
    (``torch.frexp`` is exact); ``q`` is then rounded to an integer by comparing its fraction with ½ —
    every step is exact in float64 because ``q < 2^(mbits+1) ≤ 2^24`` and the scaling is by powers of
    two. A result above ``max_finite`` saturates, or becomes inf (NaN when ``nan_on_overflow``, the
    E4M3 ``fn`` convention).
    """
    v = _as_f64(v)
    a = v.abs()
    finite = torch.isfinite(a)
    a_f = torch.where(finite, a, torch.zeros_like(a))
    _, e = torch.frexp(a_f)  # a = m·2^e with m in [0.5, 1): floor(log2 a) = e − 1
    e = torch.clamp(e.to(torch.int64) - 1, min=emin)
    shift = (e - mbits).to(torch.int64)
    scaled = torch.ldexp(a_f, -shift.to(F64))
    fl = torch.floor(scaled)
    frac = scaled - fl
    odd = torch.remainder(fl, 2.0) == 1.0
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    r = torch.ldexp(fl + up.to(F64), shift.to(F64))
    over = (r > max_finite) | torch.isinf(a)
    if saturate:
        r = torch.where(over, torch.full_like(r, max_finite), r)
    else:
        r = torch.where(over, torch.full_like(r, float("nan") if nan_on_overflow else float("inf")), r)
    r = torch.copysign(r, v)
    return torch.where(torch.isnan(v), v, r)


def round_to_fp32(v: torch.Tensor) -> torch.Tensor:
    """IEEE binary32 round-to-nearest-even of float64 ``v`` (overflow → ±inf, subnormals kept), as float64."""
    return round_to_grid(v, mbits=FP32_MBITS, emin=FP32_EMIN, max_finite=FP32_MAX, saturate=False)


def round_to_fp8(v: torch.Tensor, fmt: str | Fp8Format, *, saturate: bool = True) -> torch.Tensor:
    """The FP8 value nearest to float64 ``v`` (ties to even), as float64. ``saturate=False`` gives the
    IEEE result: overflow → inf for E5M2, NaN for E4M3 (which has no inf)."""
    f = get_format(fmt)
    return round_to_grid(
        v, mbits=f.mbits, emin=f.emin, max_finite=f.max_finite, saturate=saturate, nan_on_overflow=not f.has_inf
    )


def encode_fp8(v: torch.Tensor, fmt: str | Fp8Format, *, saturate: bool = True) -> torch.Tensor:
    """Round float64 ``v`` to FP8 and return the codes (``uint8``). NaN → ``0x7F | sign``."""
    f = get_format(fmt)
    v = _as_f64(v)
    r = round_to_fp8(v, f, saturate=saturate)
    sign = torch.signbit(r).to(torch.int64) << 7
    a = r.abs()
    finite = torch.isfinite(a)
    a_f = torch.where(finite, a, torch.zeros_like(a))
    _, e = torch.frexp(a_f)
    e = e.to(torch.int64) - 1
    normal = a_f >= 2.0**f.emin
    e_n = torch.where(normal, e, torch.full_like(e, f.emin))
    mant_total = torch.ldexp(a_f, -(e_n - f.mbits).to(F64)).to(torch.int64)  # exact integer
    field_e = torch.where(normal, e_n + f.bias, torch.zeros_like(e_n))
    field_m = torch.where(normal, mant_total - (1 << f.mbits), mant_total)
    code = (field_e << f.mbits) | field_m
    inf_code = ((1 << f.ebits) - 1) << f.mbits
    code = torch.where(torch.isinf(a), torch.full_like(code, inf_code), code)
    code = torch.where(torch.isnan(a), torch.full_like(code, 0x7F), code)
    return (code | sign).to(torch.uint8)


def decode_fp8(codes: torch.Tensor, fmt: str | Fp8Format) -> torch.Tensor:
    """FP8 codes (any integer dtype, or a torch float8 tensor viewed as uint8) → float64 values."""
    f = get_format(fmt)
    if codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = codes.view(torch.uint8)
    c = codes.to(torch.int64) & 0xFF
    s = c >> 7
    E = (c >> f.mbits) & ((1 << f.ebits) - 1)
    M = c & ((1 << f.mbits) - 1)
    sub = torch.ldexp(M.to(F64), torch.full_like(M, f.emin - f.mbits).to(F64))
    nor = torch.ldexp(((1 << f.mbits) + M).to(F64), (E - f.bias - f.mbits).to(F64))
    val = torch.where(E == 0, sub, nor)
    top = E == (1 << f.ebits) - 1
    if f.has_inf:
        val = torch.where(top & (M == 0), torch.full_like(val, float("inf")), val)
        val = torch.where(top & (M != 0), torch.full_like(val, float("nan")), val)
    else:
        val = torch.where(top & (M == (1 << f.mbits) - 1), torch.full_like(val, float("nan")), val)
    return torch.where(s == 1, -val, val)


def all_codes() -> torch.Tensor:
    """The 256 byte values 0..255 as ``uint8``."""
    return torch.arange(256, dtype=torch.int64).to(torch.uint8)


def is_nan_code(codes: torch.Tensor, fmt: str | Fp8Format) -> torch.Tensor:
    """Which codes encode NaN in ``fmt``."""
    return torch.isnan(decode_fp8(codes, fmt))


def same_codes(a: torch.Tensor, b: torch.Tensor, fmt: str | Fp8Format) -> torch.Tensor:
    """Elementwise code equality where every NaN code equals every other NaN code."""
    a8 = a.view(torch.uint8) if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else a
    b8 = b.view(torch.uint8) if b.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else b
    a8, b8 = a8.to(torch.int64), b8.to(torch.int64)
    return (a8 == b8) | (is_nan_code(a8, fmt) & is_nan_code(b8, fmt))


# -- E8M0 (the MX block scale) ------------------------------------------------------------------------
E8M0_BIAS = 127
E8M0_NAN = 255


def decode_e8m0(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 codes → float64 2^(c−127); 255 → NaN."""
    c = codes.to(torch.int64)
    val = torch.ldexp(torch.ones_like(c, dtype=F64), (c - E8M0_BIAS).to(F64))
    return torch.where(c == E8M0_NAN, torch.full_like(val, float("nan")), val)
