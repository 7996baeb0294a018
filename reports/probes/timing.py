"""How the device probes time one call: CUDA events around it, the median of several runs after warm-ups."""
from __future__ import annotations

import statistics
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], reps: int = 15) -> float:
    """Median milliseconds of ``fn`` over ``reps`` runs, CUDA events on the current stream, after two warm-ups
    (each run synchronised, so one run's tail does not overlap the next)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)
