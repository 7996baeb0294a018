"""CUDA timings as ``numcheck bench`` takes them: the median of CUDA events, the bf16 matmul rate, and the time,
extra peak and bytes held across backward of one forward+backward step (``torch.cuda`` memory statistics).

Triton's ``do_bench`` is imported when a timing is taken (it needs triton, which a CPU install may lack).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def median_ms(fn: Callable[[], Any], rep_ms: float) -> float:
    """Median milliseconds of ``fn`` over CUDA events (``triton.testing.do_bench``: ``rep_ms`` of repetitions
    after a warm-up of a quarter of that, at least 25 ms)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=max(25.0, rep_ms / 4), rep=rep_ms, return_mode="median"))


#: How many times the matmul rate is measured at each end of a run.
RATE_SAMPLES = 3


def matmul_rates(dev: torch.device, rep_ms: float, samples: int = RATE_SAMPLES) -> list[float]:
    """Measured bf16 matmul rates in FLOP/s (8192³, random data; inputs 128 MiB each, beyond L2), ``samples``
    median-of-``rep_ms`` measurements one after the other."""
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    return [2 * n**3 / (median_ms(lambda: a @ b, rep_ms) * 1e-3) for _ in range(samples)]


def measure_fwd_bwd(
    leaves: list[torch.Tensor],
    forward: Callable[[], torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    dev: torch.device,
    rep_ms: float,
    returned_bytes: int = 0,
) -> dict[str, float]:
    """Median time, extra peak and bytes held across backward of one forward+backward step.

    Each step clears the ``leaves``' .grad first. A warm-up step runs (compiles, and allocates the .grad
    buffers). Extra peak: above the inputs and the previous step's .grad buffers (freed at the start of a
    step, so a gradient that reuses them costs nothing). Held across backward: allocated bytes when forward
    has returned, above those just before it (the .grad buffers already freed), less ``returned_bytes`` (the
    forward's own output)."""
    record: dict[str, int] = {}

    def step(measure: bool = False) -> None:
        for t in leaves:
            t.grad = None
        if measure:
            torch.cuda.synchronize()
            record["before"] = torch.cuda.memory_allocated(dev)
        out = forward()
        if measure:
            torch.cuda.synchronize()
            record["held"] = torch.cuda.memory_allocated(dev) - record["before"] - returned_bytes
        backward(out)

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    step(measure=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated(dev) - base
    ms = median_ms(step, rep_ms)
    return {"ms": ms, "extra_peak_mib": extra / 2**20, "held_mib": record["held"] / 2**20}
