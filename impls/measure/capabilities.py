"""Capability probes: "does this device and dtype support X", answered by trying X once.

Versions lie: ``torch.addmm(..., out_dtype=torch.float32)`` exists from torch 2.8 but raises
NotImplementedError on CPU even in 2.13; eager casts to ``float8_e4m3fn`` saturate only in newer releases;
``float8_e8m0fnu`` does not exist in 2.6. So every path choice in :mod:`impls` asks a probe here, and each
probe runs a tiny instance of the operation on the device in question, once per process (cached).

Tests (and ``--force-capability``-style experiments) can pin any probe with :func:`forced`, so fallback
paths are exercised on releases where the capability exists.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Iterator

import torch

_overrides: dict[str, bool] = {}
_lock = threading.Lock()


def _device_type(device: str | torch.device) -> str:
    return torch.device(device).type


def _probe(name: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Decorate a probe: cache its answer per arguments; an exception means "no"; :func:`forced` wins."""

    def wrap(fn: Callable[..., bool]) -> Callable[..., bool]:
        @functools.lru_cache(maxsize=None)
        def cached(*args: object) -> bool:
            try:
                return bool(fn(*args))
            except Exception:
                return False

        @functools.wraps(fn)
        def probe(*args: object) -> bool:
            args = tuple(_device_type(a) if isinstance(a, torch.device) else a for a in args)
            if name in _overrides:
                return _overrides[name]
            return cached(*args)

        probe.probe_name = name  # type: ignore[attr-defined]
        probe.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        PROBES[name] = probe
        return probe

    return wrap


PROBES: dict[str, Callable[..., bool]] = {}


@contextlib.contextmanager
def forced(**values: bool) -> Iterator[None]:
    """Pin probes by name (``forced(addmm_out_dtype=False)``) inside the block."""
    unknown = set(values) - set(PROBES)
    if unknown:
        raise ValueError(f"unknown capability probe(s) {sorted(unknown)}; known: {sorted(PROBES)}")
    with _lock:
        saved = dict(_overrides)
        _overrides.update(values)
    try:
        yield
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)


@_probe("addmm_out_dtype")
def addmm_out_dtype(device: str, dtype: torch.dtype) -> bool:
    """``torch.addmm(acc_fp32, a, b, out_dtype=torch.float32, out=acc_fp32)`` with ``dtype`` operands works."""
    dev = _device_type(device)
    acc = torch.zeros(2, 2, dtype=torch.float32, device=dev)
    a = torch.ones(2, 3, dtype=dtype, device=dev)
    b = torch.ones(3, 2, dtype=dtype, device=dev)
    torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    return bool((acc == 3).all())


@_probe("addmm_out_dtype_meta")
def addmm_out_dtype_meta(dtype: torch.dtype) -> bool:
    """On the ``meta`` device, ``torch.addmm(acc_fp32, a, b, out_dtype=torch.float32, out=acc_fp32)`` with
    ``dtype`` operands traces: it runs and leaves ``acc`` fp32 ``[M, N]`` (meta has shapes, no values). Memory
    accounting needs it to measure the out_dtype path on meta (torch 2.11 decomposes it wrongly there)."""
    acc = torch.empty(2, 5, dtype=torch.float32, device="meta")
    a = torch.empty(2, 3, dtype=dtype, device="meta")
    b = torch.empty(3, 5, dtype=dtype, device="meta")
    out = torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    return out.dtype == torch.float32 and tuple(out.shape) == (2, 5) and out.device.type == "meta"


@_probe("dtype_exists")
def dtype_exists(name: str) -> bool:
    """``torch.<name>`` exists and is a dtype (``float8_e8m0fnu`` is missing in torch 2.6)."""
    return isinstance(getattr(torch, name, None), torch.dtype)


@_probe("fp8_dtype")
def fp8_dtype(device: str, name: str) -> bool:
    """Tensors of ``torch.<name>`` can be created on ``device`` and cast back to float32."""
    dt = getattr(torch, name)
    t = torch.tensor([1.0, 2.0, 0.5], device=_device_type(device)).to(dt)
    return bool((t.to(torch.float32).cpu() == torch.tensor([1.0, 2.0, 0.5])).all())


@_probe("eager_fp8_cast_saturates")
def eager_fp8_cast_saturates(device: str, name: str) -> bool:
    """An eager ``.to(torch.<name>)`` of an out-of-range finite value gives ±max rather than NaN/inf."""
    dt = getattr(torch, name)
    fmax = torch.finfo(dt).max
    t = torch.tensor([fmax * 4.0], device=_device_type(device)).to(dt).to(torch.float32)
    return bool(t.item() == fmax)


def _scaled_mm_try(device: str, mode: str, a_dtype: str = "float8_e4m3fn", b_dtype: str = "float8_e4m3fn") -> bool:
    # Several scale blocks along K (and two 128x128 tiles along N) so that a wrong scale layout cannot pass;
    # small-integer operands and power-of-2 scales make every product and sum exact in fp32, whatever the
    # summation order, so the result must equal the float64 product exactly.
    dev = _device_type(device)
    # K = 512: K/128 = 4 blocks, a multiple of 4, so releases that pad the 128x128 scale stride to 4 and
    # those that do not accept the same layout (impls use the block paths only for such K).
    M, K, N = 32, 512, 256
    g = torch.Generator().manual_seed(0)
    a_int = torch.randint(-4, 5, (M, K), generator=g).to(torch.float64)
    b_int = torch.randint(-4, 5, (N, K), generator=g).to(torch.float64)
    a = a_int.to(torch.float32).to(dev).to(getattr(torch, a_dtype))
    b = b_int.to(torch.float32).to(dev).to(getattr(torch, b_dtype))

    def pow2(*shape: int) -> torch.Tensor:
        return torch.exp2(torch.randint(-2, 3, shape, generator=g).to(torch.float64))

    if mode == "tensorwise":
        sa64, sb64 = pow2(1, 1), pow2(1, 1)
        sa, sb = sa64.reshape(()), sb64.reshape(())
        fa, fb = sa64.expand(M, K), sb64.expand(N, K)
    elif mode == "rowwise":
        sa64, sb64 = pow2(M, 1), pow2(N, 1)
        sa, sb = sa64, sb64.t()
        fa, fb = sa64.expand(M, K), sb64.expand(N, K)
    elif mode in ("blockwise_1x128", "blockwise_128x128"):
        sa64 = pow2(M, K // 128)  # one scale per 1x128 block of a, passed outer-dim-major
        sa = sa64.t().contiguous().t()
        fa = sa64.repeat_interleave(128, dim=1)
        if mode == "blockwise_1x128":
            sb64 = pow2(N, K // 128)
            sb = sb64.t().contiguous()  # [K/128, N]
            fb = sb64.repeat_interleave(128, dim=1)
        else:
            sb64 = pow2(N // 128, K // 128)  # one scale per 128x128 tile of b
            sb = sb64.t()  # [K/128, N/128], a transposed view
            fb = sb64.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    else:
        raise ValueError(f"unknown _scaled_mm mode {mode!r}")
    expected = (a_int * fa) @ (b_int * fb).t()
    sa = sa.to(dev, torch.float32)
    sb = sb.to(dev, torch.float32)
    out = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    return bool(torch.equal(out.cpu().to(torch.float64), expected))


@_probe("scaled_mm")
def scaled_mm(device: str, mode: str, a_dtype: str = "float8_e4m3fn", b_dtype: str = "float8_e4m3fn") -> bool:
    """``torch._scaled_mm`` runs and is exactly right with ``a_dtype`` × ``b_dtype`` operands (E4M3 by
    default) and the given scaling ``mode``: ``tensorwise``, ``rowwise``, ``blockwise_1x128`` (1×128 ×
    1×128) or ``blockwise_128x128`` (1×128 × 128×128). Scale layouts: tensorwise 0-d; rowwise ``[M, 1]`` and
    ``[1, N]``; blockwise ``scale_a`` ``[M, K/128]`` outer-dim-major, ``scale_b`` ``[K/128, N]`` row-major
    (1×128) or ``[K/128, N/128]`` as the transpose of a row-major ``[N/128, K/128]`` (128×128)."""
    return _scaled_mm_try(device, mode, a_dtype, b_dtype)


@_probe("autocast_dtype")
def autocast_dtype(device: str, dtype: torch.dtype) -> bool:
    """``torch.autocast(device, dtype)`` turns an fp32 matmul into ``dtype``."""
    dev = _device_type(device)
    a = torch.ones(2, 2, device=dev)
    with torch.autocast(dev, dtype=dtype):
        out = a @ a
    return out.dtype == dtype


@_probe("linear_cross_entropy")
def linear_cross_entropy(device: str) -> bool:
    """``torch.nn.functional.linear_cross_entropy`` exists and runs on ``device`` (torch >= 2.13)."""
    import torch.nn.functional as F

    dev = _device_type(device)
    x = torch.ones(2, 3, device=dev)
    w = torch.ones(4, 3, device=dev)
    out = F.linear_cross_entropy(x, w, torch.zeros(2, dtype=torch.long, device=dev))
    return bool(torch.isfinite(out))


def summary(device: str | torch.device = "cpu") -> dict[str, bool]:
    """Every probe's answer for ``device``, as a flat ``{label: bool}`` (for ``numcheck list`` and reports)."""
    dev = _device_type(device)
    out: dict[str, bool] = {}
    for dt in (torch.bfloat16, torch.float16):
        out[f"addmm_out_dtype[{dt}]"] = addmm_out_dtype(dev, dt)
        out[f"autocast[{dt}]"] = autocast_dtype(dev, dt)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
        out[f"dtype_exists[{name}]"] = dtype_exists(name)
        if dtype_exists(name):
            out[f"fp8_dtype[{name}]"] = fp8_dtype(dev, name)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if dtype_exists(name):
            out[f"eager_fp8_cast_saturates[{name}]"] = eager_fp8_cast_saturates(dev, name)
    for mode in ("tensorwise", "rowwise", "blockwise_1x128", "blockwise_128x128"):
        out[f"scaled_mm[{mode}]"] = scaled_mm(dev, mode)
    out["linear_cross_entropy"] = linear_cross_entropy(dev)
    for form in ("2d_3d", "2d_2d"):
        out[f"scaled_grouped_mm[{form}]"] = scaled_grouped_mm(dev, form)
    return out


def _scaled_grouped_mm_try(device: str, form: str) -> bool:
    # Three groups of 16 rows (the split ends must be multiples of 16), K = N = 32, small-integer E4M3 operands and
    # power-of-2 per-row scales: every product and sum is exact in fp32 and every result exact in bf16 (|result| <=
    # 2^7 · 4 with at most 8 significant bits), so the output must equal the float64 product exactly.
    dev = _device_type(device)
    G, m, K, N = 3, 16, 32, 32
    g = torch.Generator().manual_seed(0)
    e4m3 = torch.float8_e4m3fn

    def ints(*shape: int) -> torch.Tensor:
        return torch.randint(-2, 3, shape, generator=g).to(torch.float64)

    def pow2(*shape: int) -> torch.Tensor:
        return torch.exp2(torch.randint(-1, 2, shape, generator=g).to(torch.float64))

    offs = torch.tensor([m, 2 * m, 3 * m], dtype=torch.int32, device=dev)
    if form == "2d_3d":  # y_i = A[rows_i] · B_iᵀ, A [G·m, K], B [G, N, K]
        a, b, sa, sb = ints(G * m, K), ints(G, N, K), pow2(G * m), pow2(G, N)
        expected = torch.cat(
            [(a[i * m : (i + 1) * m] * sa[i * m : (i + 1) * m, None]) @ (b[i] * sb[i][:, None]).t() for i in range(G)]
        )
        mat_b = b.to(torch.float32).to(dev).to(e4m3).transpose(-2, -1)
    elif form == "2d_2d":  # out_i = A[:, cols_i] · B[:, cols_i]ᵀ, A [m, G·K'], B [N, G·K'] with K' = 16
        a, b, sa, sb = ints(m, G * m), ints(N, G * m), pow2(G * m), pow2(G * N)
        expected = torch.stack(
            [
                (a[:, i * m : (i + 1) * m] * sa[i * m : (i + 1) * m, None])
                @ (b[:, i * m : (i + 1) * m] * sb[i * N : (i + 1) * N, None]).t()
                for i in range(G)
            ]
        )
        mat_b = b.to(torch.float32).to(dev).to(e4m3).t()
    else:
        raise ValueError(f"unknown _scaled_grouped_mm form {form!r}")
    mat_a = a.to(torch.float32).to(dev).to(e4m3)
    out = torch._scaled_grouped_mm(
        mat_a, mat_b, sa.to(dev, torch.float32), sb.to(dev, torch.float32), offs=offs, out_dtype=torch.bfloat16
    )
    return bool(torch.equal(out.cpu().to(torch.float64), expected))


@_probe("scaled_grouped_mm")
def scaled_grouped_mm(device: str, form: str = "2d_3d") -> bool:
    """``torch._scaled_grouped_mm`` runs on ``device`` and is exactly right with E4M3 operands, per-row fp32 scales,
    int32 ``offs`` (the groups' ends, multiples of 16) and bf16 output, in ``form``: ``2d_3d`` (A ``[M, K]`` split by
    rows, B ``[G, N, K]`` passed transposed, scales ``[M]`` and ``[G, N]``: fprop and dgrad of a grouped linear) or
    ``2d_2d`` (A ``[m, Ktot]`` and B ``[n, Ktot]`` split along the reduction, scales ``[G·m]`` and ``[G·n]``: wgrad).
    No CPU kernel exists (torch 2.13): the probe answers no there, never from a version string."""
    return _scaled_grouped_mm_try(device, form)
