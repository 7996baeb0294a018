"""What an impl costs, measured for premerge's A/B comparison of two impls (``numcheck premerge --base``): extra
peak memory and bytes held across backward at the seed's shapes, the bytes of the grad_weight accumulation step,
the time of a forward and backward, and the matmul ops a call dispatches (its accumulation path).

Each ``*_ab(new, base, device)`` measures both sides the same way and returns JSON-able figures; the CLI judges
and renders them (:mod:`numcheck.reports.premerge.ab`).
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Any, Callable

TIME_REP_MS = 100.0


#: The problem of the code-path trace (small, bf16, runs on the device itself).
TRACE_SHAPE = (64, 32, 96)


#: Matmul-family ops whose dtypes show the accumulation path.
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "_scaled_mm", "linear", "addmv", "mv", "dot")


MiB = 2**20


# -- memory -----------------------------------------------------------------------------------------------
def pinned_probes(device: str) -> contextlib.AbstractContextManager[None]:
    """Every accumulation-gating probe pinned to ``device``'s own answer (for calls traced on ``meta``, whose
    tensors have no values, so a probe run there would answer "no" for reasons of its own)."""
    import torch

    from numcheck.impls.measure import capabilities

    return capabilities.forced(addmm_out_dtype=capabilities.addmm_out_dtype(device, torch.bfloat16))


def _seed_problem() -> Any:
    from numcheck.impls.measure.memory import SEED_SHAPE
    from numcheck.properties.linear_ce.cases import Problem

    N, H, V = SEED_SHAPE
    return Problem(N=N, H=H, V=V, dtype="bfloat16", device="cpu")


def _device_inputs(device: str, shape: tuple[int, int, int], seed: int = 0) -> Any:
    """Random bf16 inputs of ``shape`` made on ``device`` itself (the seed's shapes: no float64 oracle needed)."""
    import torch

    from numcheck.impls.measure.memory import Inputs

    N, H, V = shape
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(N, H, device=device, dtype=torch.bfloat16, generator=g).requires_grad_(True)
    w = (torch.randn(V, H, device=device, dtype=torch.bfloat16, generator=g) * H**-0.5).requires_grad_(True)
    t = torch.randint(0, V, (N,), device=device, generator=g)
    return Inputs(x, w, t, None, {"reduction": "mean", "ignore_index": -100}, None)


def memory_ab(new: Any, base: Any, device: str) -> dict[str, Any]:
    """Extra peak and bytes held across backward of both at the seed's shapes (module docstring)."""
    import torch

    from numcheck.impls.measure.memory import SEED_SHAPE, call_memory, fresh
    from numcheck.properties.linear_ce.memory import make_inputs

    dev = torch.device(device).type
    rows = {}
    if dev == "cuda":
        inputs = _device_inputs(device, SEED_SHAPE)
        for side, impl in (("base", base), ("new", new)):
            call_memory(impl, fresh(_device_inputs(device, TRACE_SHAPE)), device)  # warm-up: cuBLAS workspaces
            m = call_memory(impl, fresh(inputs), device)
            rows[side] = _mem_row(m, m.cuda_peak)
        del inputs
        torch.cuda.empty_cache()
        where = f"cuda ({torch.cuda.get_device_name()}), torch.cuda.max_memory_allocated"
    else:
        with pinned_probes(device):
            inputs = make_inputs(_seed_problem(), "meta")
            for side, impl in (("base", base), ("new", new)):
                rows[side] = _mem_row(call_memory(impl, fresh(inputs), "meta"), None)
        where = f"meta (allocations traced, nothing allocated), probes pinned to {dev}'s answers"
    N, H, V = SEED_SHAPE
    return {"shape": [N, H, V], "dtype": "bfloat16", "reduction": "mean", "where": where, **rows}


def _mem_row(m: Any, cuda_peak: int | None) -> dict[str, Any]:
    """One side's memory figures in MiB from a :func:`impls.measure.memory.call_memory` result; the peak is
    ``cuda_peak`` (``torch.cuda.max_memory_allocated``'s) when given, else the tracker's; ``{"error"}`` if it failed."""
    if m.error:
        return {"error": m.error}
    peak = cuda_peak if cuda_peak is not None else m.total_peak
    return {
        "peak_mib": peak / MiB,
        "held_mib": m.held / MiB,
        "tracked_peak_mib": m.total_peak / MiB,
        "forward_peak_mib": m.forward_peak / MiB,
        "opaque": sorted(m.opaque),
    }


# -- the grad_weight accumulation step ----------------------------------------------------------------------
def accumulation_step(impl: Any) -> Callable[..., Any] | None:
    """The ``accumulation_step(gw, G, x)`` an impl exposes (on itself or on the function it wraps), else None."""
    for owner in (impl, getattr(impl, "fn", None)):
        step = getattr(owner, "accumulation_step", None)
        if callable(step):
            return step
    return None


def _step_bytes(step: Callable[..., Any], V: int, H: int, C: int, device: str) -> int:
    """Extra peak bytes of one ``step(gw, G, x)``: traced on meta with the probes pinned to ``device``'s answers
    on a non-CUDA device; ``torch.cuda.max_memory_allocated``'s rise (after a warm-up call) on CUDA."""
    import torch

    from numcheck.impls.measure.memory import cuda_cross_check, extra_peak

    if torch.device(device).type == "cuda":
        gw = torch.zeros(V, H, dtype=torch.float32, device=device)
        G = torch.zeros(C, V, dtype=torch.bfloat16, device=device)
        x = torch.zeros(C, H, dtype=torch.bfloat16, device=device)
        try:
            return cuda_cross_check(lambda: step(gw, G, x))[1]
        finally:
            del gw, G, x
            torch.cuda.empty_cache()
    with pinned_probes(device):
        gw = torch.zeros(V, H, dtype=torch.float32, device="meta")
        G = torch.empty(C, V, dtype=torch.bfloat16, device="meta")
        x = torch.empty(C, H, dtype=torch.bfloat16, device="meta")
        return extra_peak(step, gw, G, x)


def step_ab(new: Any, base: Any, device: str) -> dict[str, Any]:
    """Each side's grad_weight accumulation step's extra peak at the seed's chunk (module docstring), MiB."""
    import torch

    from numcheck.impls.measure.memory import SEED_CHUNK, SEED_SHAPE

    _, H, V = SEED_SHAPE
    dev = torch.device(device).type
    out: dict[str, Any] = {
        "V": V,
        "H": H,
        "chunk": SEED_CHUNK,
        "where": "cuda, torch.cuda.max_memory_allocated"
        if dev == "cuda"
        else f"meta, probes pinned to {dev}'s answers",
    }
    for side, impl in (("base", base), ("new", new)):
        step = accumulation_step(impl)
        if step is None:
            out[side] = {
                "error": f"not measurable for this impl: {impl.name} exposes no accumulation_step(gw, G, x) "
                f"(docs/premerge-ab.md)"
            }
            continue
        try:
            out[side] = {"extra_mib": _step_bytes(step, V, H, SEED_CHUNK, device) / MiB}
        except Exception as exc:  # noqa: BLE001 - a step that breaks is shown with its error, not fatal
            out[side] = {"error": f"{impl.name}'s accumulation_step failed: {type(exc).__name__}: {exc}"[:300]}
    return out


# -- time -------------------------------------------------------------------------------------------------
def _step(impl: Any, inputs: Any) -> Callable[[], None]:
    """One forward+backward of ``impl`` on ``inputs`` (gradients cleared first), as a call for timing and tracing."""

    def step() -> None:
        inputs.x.grad = None
        inputs.weight.grad = None
        out = impl(inputs.x, inputs.weight, inputs.target, inputs.bias, **inputs.kwargs)
        (out[0] if isinstance(out, tuple) else out).backward()

    return step


def time_ab(new: Any, base: Any, device: str, repeats: int) -> dict[str, Any]:
    """CUDA: NEW/BASE forward+backward time, interleaved repeats (module docstring); elsewhere not measured."""
    import torch

    if torch.device(device).type != "cuda":
        return {
            "measured": False,
            "reason": f"not measured here ({torch.device(device).type}: time is measured on CUDA)",
        }
    from numcheck.impls.measure.memory import SEED_SHAPE
    from numcheck.impls.measure.timing import median_ms

    inputs = _device_inputs(device, SEED_SHAPE)
    steps = {"new": _step(new, inputs), "base": _step(base, inputs)}
    ms: dict[str, list[float]] = {"new": [], "base": []}
    for _ in range(repeats):
        for side in ("new", "base"):
            ms[side].append(median_ms(steps[side], TIME_REP_MS))
    ratios = [a / b for a, b in zip(ms["new"], ms["base"])]
    return {
        "measured": True,
        "repeats": repeats,
        "rep_ms": TIME_REP_MS,
        "new_ms": ms["new"],
        "base_ms": ms["base"],
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "new_median_ms": statistics.median(ms["new"]),
        "base_median_ms": statistics.median(ms["base"]),
    }


# -- code paths -------------------------------------------------------------------------------------------
def _dt(v: Any) -> str:
    """A tensor's dtype, or a dtype, as its short name (``bfloat16``)."""
    import torch

    if isinstance(v, torch.Tensor):
        return str(v.dtype).replace("torch.", "")
    return str(v).replace("torch.", "")


def matmul_ops(impl: Any, device: str) -> dict[str, int]:
    """The matmul-family ops one bf16 forward+backward of ``impl`` dispatches on ``device`` (TRACE_SHAPE), as
    ``"aten.addmm(bfloat16, bfloat16, out_dtype=float32) -> float32": count``. Kernels launched outside the
    dispatcher (Triton) do not appear."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from numcheck.impls.measure.memory import fresh

    seen: dict[str, int] = {}

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            base = func.name().split("::")[-1].split(".")[0]
            if base in MATMUL_OPS:
                ins = ", ".join(_dt(a) for a in args if isinstance(a, torch.Tensor))
                extra = f", out_dtype={_dt(kwargs['out_dtype'])}" if kwargs.get("out_dtype") is not None else ""
                res = out[0] if isinstance(out, (tuple, list)) else out
                key = f"aten.{base}({ins}{extra}) -> {_dt(res)}"
                seen[key] = seen.get(key, 0) + 1
            return out

    inputs = fresh(_device_inputs(device, TRACE_SHAPE))
    with Ops():
        _step(impl, inputs)()
    return seen


def paths_ab(new: Any, base: Any, device: str) -> dict[str, Any]:
    """The gating probes on ``device``, and per side its declared accumulation, resolved built-in path and ops."""
    import torch

    from numcheck.impls.measure import capabilities
    from numcheck.reference.numerics import accumulation

    probes = {
        f"addmm_out_dtype[{d}]": capabilities.addmm_out_dtype(device, getattr(torch, d))
        for d in ("bfloat16", "float16")
    }
    out: dict[str, Any] = {"device": torch.device(device).type, "probes": probes}
    for side, impl in (("base", base), ("new", new)):
        row: dict[str, Any] = {"declared": impl.support.grad_accumulation}
        path = getattr(impl, "path", None)
        if path in accumulation.PATH_NAMES:
            runs = accumulation.resolved_path(path, device, torch.bfloat16, capabilities.addmm_out_dtype)
            row["resolved"] = f"{path} runs as {runs} (bf16)"
        try:
            row["ops"] = matmul_ops(impl, device)
        except Exception as exc:  # noqa: BLE001 - the trace is information; its failure is shown, not fatal
            row["ops_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        out[side] = row
    return out
