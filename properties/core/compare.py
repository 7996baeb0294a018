"""Comparing one output of an impl with the oracle under an element-wise bound, and saying so clearly."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

#: What a :class:`Comparison` compared: ``"compared"`` (element-wise, under the bound), ``"missing"`` (the impl
#: produced no value), ``"shape_differs"`` (no element-wise comparison possible) or ``"nonfinite_mismatch"``
#: (NaN/inf where the oracle has none, or the other way round).
COMPARISON_STATES: tuple[str, ...] = ("compared", "missing", "shape_differs", "nonfinite_mismatch")


@dataclass(frozen=True)
class Comparison:
    """Error metrics of one output against the oracle, and whether every element is within its bound.

    ``ratio`` is max over elements of |impl − oracle| / bound (0/0 counts as 0); ``ok`` is ``ratio ≤ 1`` with
    NaN/inf exactly where the oracle has them — or ±inf where a value within the bound of the exact one
    overflows the format the value was held in (the impl's dtype, or the narrower ``range_dtype`` given to
    :func:`compare`: correct rounding; such elements count as error 0 and ``extra["overflowed"]`` counts them).
    ``worst`` is the index of the element with the largest ratio. ``max_rel`` is taken over the elements whose
    oracle value is not 0 (a relative error is undefined there); ``max_abs_zero`` is the largest |error| over those
    whose oracle value is 0.
    ``state`` (one of :data:`COMPARISON_STATES`) says what was compared; ``nonfinite`` describes a non-finite
    mismatch (empty otherwise); ``impl_shape`` / ``oracle_shape`` are the two shapes.
    """

    output: str
    ok: bool
    ratio: float
    max_abs: float
    max_rel: float
    rmse: float
    max_ulp: float
    worst: tuple[int, ...]
    impl_value: float
    oracle_value: float
    bound_value: float
    n_bad: int
    numel: int
    state: str = "compared"
    nonfinite: str = ""
    impl_shape: tuple[int, ...] | None = None
    oracle_shape: tuple[int, ...] = ()
    dtype: str = ""
    extra: dict = field(default_factory=dict)
    max_abs_zero: float = 0.0

    def __post_init__(self) -> None:
        if self.state not in COMPARISON_STATES:
            raise ValueError(f"Comparison.state must be one of {COMPARISON_STATES}, got {self.state!r}")

    def describe(self) -> str:
        """Multi-line text in the style of ``torch.testing`` for failure messages."""
        if self.state == "missing":
            return f"{self.output}: the impl produced no value (gradient missing: not connected to autograd?)"
        if self.state == "shape_differs":
            return f"{self.output}: shape {self.impl_shape} differs from the oracle's {self.oracle_shape}"
        if self.state == "nonfinite_mismatch":
            return f"{self.output}: {self.nonfinite}"
        return (
            f"{self.output} ({self.dtype}): {self.n_bad} / {self.numel} elements beyond bound; "
            f"worst at index {list(self.worst)}: impl {self.impl_value:.9g}, oracle {self.oracle_value:.9g}, "
            f"|error| {abs(self.impl_value - self.oracle_value):.3g} > bound {self.bound_value:.3g} "
            f"(error/bound {self.ratio:.3g}); max abs error {self.max_abs:.3g}, {self.rel_text()}, "
            f"RMSE {self.rmse:.3g}, max ULP {self.max_ulp:.3g}"
        )

    def rel_text(self) -> str:
        """The largest relative error where the oracle is not 0, and the largest absolute one where it is."""
        zero = f"where the oracle is 0 max abs error {self.max_abs_zero:.3g}" if self.max_abs_zero > 0 else ""
        if self.max_rel == 0 and zero:
            return zero
        return f"max rel error {self.max_rel:.3g}" + (f" ({zero})" if zero else "")


def _not_compared(output: str, state: str, oracle: torch.Tensor, impl: torch.Tensor | None) -> Comparison:
    """The failed :class:`Comparison` of an output that could not be compared element-wise (``state``
    ``"missing"`` or ``"shape_differs"``): every error infinite, every value NaN, every element counted bad."""
    return Comparison(
        output=output,
        ok=False,
        ratio=math.inf,
        max_abs=math.inf,
        max_rel=math.inf,
        rmse=math.inf,
        max_ulp=math.inf,
        worst=(),
        impl_value=math.nan,
        oracle_value=math.nan,
        bound_value=math.nan,
        n_bad=oracle.numel(),
        numel=oracle.numel(),
        state=state,
        impl_shape=tuple(impl.shape) if impl is not None else None,
        oracle_shape=tuple(oracle.shape),
        dtype=str(impl.dtype) if impl is not None else "",
    )


def ulp_of(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at each value (float64), subnormal spacing below the smallest normal."""
    fi = torch.finfo(dtype)
    a = values.abs().to(torch.float64).clamp_min(fi.tiny)
    return torch.exp2(torch.floor(torch.log2(a))) * fi.eps


def overflow_threshold(dtype: torch.dtype) -> float:
    """The magnitude from which round-to-nearest gives ±inf in ``dtype``: its max plus half an ulp of the max."""
    fi = torch.finfo(dtype)
    return fi.max + float(ulp_of(torch.tensor(fi.max, dtype=torch.float64), dtype)) / 2


def _narrowest(dt: torch.dtype, range_dtype: torch.dtype | None) -> torch.dtype:
    """Of the returned dtype and the format the value was held in before its last cast, the one of smaller range."""
    if range_dtype is None or not range_dtype.is_floating_point:
        return dt
    return range_dtype if torch.finfo(range_dtype).max < torch.finfo(dt).max else dt


def legitimate_overflow(
    impl: torch.Tensor, oracle: torch.Tensor, bound: torch.Tensor, range_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Where ``impl`` is ±inf as a correct rounding: the oracle is finite, the sign agrees, and some value within
    ``bound`` of the exact one reaches the overflow threshold of the format the value was held in whole
    (``range_dtype``, e.g. the fp16 output of a GEMM under autocast cast to fp32 afterwards; default: ``impl``'s
    own dtype). Elements of an impl whose dtype is not a narrower float never qualify."""
    dt = _narrowest(impl.dtype, range_dtype)
    a = impl.detach().to(device=oracle.device, dtype=torch.float64)
    o = oracle.to(torch.float64)
    if not dt.is_floating_point or dt == torch.float64:
        return torch.zeros_like(o, dtype=torch.bool)
    b = bound.to(device=o.device, dtype=torch.float64).expand_as(o)
    return (
        torch.isfinite(o) & torch.isinf(a) & (torch.sign(a) == torch.sign(o)) & (o.abs() + b >= overflow_threshold(dt))
    )


def compare(
    output: str,
    impl: torch.Tensor | None,
    oracle: torch.Tensor,
    bound: torch.Tensor,
    *,
    range_dtype: torch.dtype | None = None,
    overflow_upstream: str = "",
) -> Comparison:
    """Compare ``impl`` (any dtype) with the float64 ``oracle`` element-wise under ``bound``.

    ``range_dtype``: the narrowest format the output was held in whole before its last cast (the compute dtype of
    a gradient GEMM under autocast, whose result is cast to the fp32 parameters' dtype only afterwards): ±inf is
    accepted where a value within the bound of the exact one overflows *that* format (:func:`legitimate_overflow`).
    ``extra["overflowed"]`` counts the elements so accepted.

    ``overflow_upstream``: why an intermediate of the backward legitimately overflows on this problem (see
    :func:`properties.linear_ce.tolerance.upstream_overflow`; "" where none does): then every non-finite element of
    ``impl`` where the oracle is finite is accepted too (an inf formed upstream propagates as ±inf and NaN), and
    counted in ``extra["overflowed"]``; finite elements are judged as always."""
    if impl is None:
        return _not_compared(output, "missing", oracle, impl)
    if tuple(impl.shape) != tuple(oracle.shape):
        return _not_compared(output, "shape_differs", oracle, impl)
    dt = impl.dtype
    a = impl.detach().to(device=oracle.device, dtype=torch.float64)
    o = oracle.to(torch.float64)
    b = bound.to(device=o.device, dtype=torch.float64).expand_as(o)
    fin_o, fin_a = torch.isfinite(o), torch.isfinite(a)
    mismatch = (fin_o != fin_a) | (~fin_o & ~fin_a & ~((torch.isnan(o) & torch.isnan(a)) | (o == a)))
    # Overflow is a rounding: ±inf is the correct result when some value within the bound of the exact one
    # rounds to it in the format the value was held in (magnitude ≥ max + half an ulp of max).
    overflow = legitimate_overflow(impl, o, b, range_dtype) if dt.is_floating_point else torch.zeros_like(mismatch)
    if overflow_upstream and dt.is_floating_point:
        overflow = overflow | (fin_o & ~fin_a)
    mismatch = mismatch & ~overflow
    if bool(mismatch.any()):
        return _nonfinite_mismatch(output, impl, a, o, b, mismatch)
    err = torch.where(fin_o & torch.isfinite(a), (a - o).abs(), torch.zeros_like(o))
    ratio = torch.where(err == 0, torch.zeros_like(err), err / b)
    if o.numel() == 0:
        return _empty(output, impl, o)
    extra: dict = {"overflowed": int(overflow.sum())} if bool(overflow.any()) else {}
    if overflow_upstream and bool(overflow.any()):
        extra["overflow_upstream"] = overflow_upstream
    return _measured(output, impl, a, o, b, err, ratio, extra)


def _empty(output: str, impl: torch.Tensor, o: torch.Tensor) -> Comparison:
    """The comparison of an empty output: nothing to be wrong, every measure 0."""
    return Comparison(
        output=output,
        ok=True,
        ratio=0.0,
        max_abs=0.0,
        max_rel=0.0,
        rmse=0.0,
        max_ulp=0.0,
        worst=(),
        impl_value=0.0,
        oracle_value=0.0,
        bound_value=0.0,
        n_bad=0,
        numel=0,
        impl_shape=tuple(impl.shape),
        oracle_shape=tuple(o.shape),
        dtype=str(impl.dtype),
    )


def _nonfinite_mismatch(
    output: str, impl: torch.Tensor, a: torch.Tensor, o: torch.Tensor, b: torch.Tensor, mismatch: torch.Tensor
) -> Comparison:
    """The failed :class:`Comparison` of an output with NaN/inf where the oracle has none (or the other way round)
    at the elements ``mismatch`` marks: ``a`` the impl's values, ``o`` the oracle's, ``b`` the bound (float64)."""
    idx = tuple(int(i) for i in mismatch.nonzero()[0])
    return Comparison(
        output=output,
        ok=False,
        ratio=math.inf,
        max_abs=math.inf,
        max_rel=math.inf,
        rmse=math.inf,
        max_ulp=math.inf,
        worst=idx,
        impl_value=float(a[idx]),
        oracle_value=float(o[idx]),
        bound_value=float(b[idx]),
        n_bad=int(mismatch.sum()),
        numel=o.numel(),
        state="nonfinite_mismatch",
        impl_shape=tuple(impl.shape),
        oracle_shape=tuple(o.shape),
        dtype=str(impl.dtype),
        nonfinite=f"non-finite mismatch at index {list(idx)}: impl {float(a[idx])}, "
        f"oracle {float(o[idx])} ({int(mismatch.sum())} such elements)",
    )


def _measured(
    output: str,
    impl: torch.Tensor,
    a: torch.Tensor,
    o: torch.Tensor,
    b: torch.Tensor,
    err: torch.Tensor,
    ratio: torch.Tensor,
    extra: dict,
) -> Comparison:
    """The :class:`Comparison` of a non-empty output compared element-wise: ``a`` the impl's values, ``o`` the
    oracle's, ``b`` the bound, ``err`` |a − o| (0 where not finite) and ``ratio`` err/b (float64)."""
    dt = impl.dtype
    flat = int(torch.argmax(ratio.reshape(-1)))
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), o.shape)) if o.dim() else ()
    nonzero = o != 0
    rel = torch.where(nonzero, err / torch.where(nonzero, o.abs(), torch.ones_like(o)), torch.zeros_like(o))
    ulp = err / ulp_of(o, dt if dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else torch.float32)
    worst_ratio = float(ratio.reshape(-1)[flat])
    return Comparison(
        output=output,
        ok=bool(worst_ratio <= 1.0),
        ratio=worst_ratio,
        max_abs=float(err.max()),
        max_rel=float(rel.max()),
        max_abs_zero=float(torch.where(nonzero, torch.zeros_like(err), err).max()),
        rmse=float(err.square().mean().sqrt()),
        max_ulp=float(ulp.max()),
        worst=idx,
        impl_value=float(a.reshape(-1)[flat]),
        oracle_value=float(o.reshape(-1)[flat]),
        bound_value=float(b.reshape(-1)[flat]),
        n_bad=int((ratio > 1.0).sum()),
        numel=o.numel(),
        impl_shape=tuple(impl.shape),
        oracle_shape=tuple(o.shape),
        dtype=str(dt),
        extra=extra,
    )
