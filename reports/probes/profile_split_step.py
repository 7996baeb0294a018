"""Probe: where one forward+backward of the bench's large ``chunked_triton[split_fp32]`` case spends its GPU time.

The bench gives one figure per case. This prints the CUDA kernels of one step (after a warm-up step) under
``torch.profiler``, grouped by kernel name with their count and total time, so the time outside the per-chunk
GEMMs, CE kernel and split step (memsets, the accumulator's finish, scaling, casts) can be read off; then the
step's wall time and the time between kernels (the GPU idle, waiting on the host).

    python -m reports.probes.profile_split_step [IMPL]    # default chunked_triton[split_fp32]
"""
from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from impls import registry
from reports import bench
from reports.probes import timing

BT, H, V = 8192, 4096, 131072


def main(name: str) -> None:
    """Profile one step of ``name`` at the bench's large shape and print its kernels by total time."""
    dev = torch.device("cuda")
    impl = registry.builtin(name)
    x, w, t = bench._case(BT, H, V, dev)
    xr, wr = x.requires_grad_(), w.requires_grad_()

    def step() -> None:
        xr.grad = wr.grad = None
        out = impl(xr, wr, t, None, reduction="mean", ignore_index=-100)
        (out[0] if isinstance(out, tuple) else out).backward()

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows: dict[str, list[float]] = {}
    spans = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            rows.setdefault(ev.name[:110], []).append(ev.device_time_total / 1e3)
            spans.append((ev.time_range.start, ev.time_range.end, ev.name[:60]))
    total = sum(sum(v) for v in rows.values())
    spans.sort()
    gaps = [(b[0] - a[1], a[2], b[2]) for a, b in zip(spans, spans[1:]) if b[0] > a[1]]
    wall = timing.median_ms(step, reps=5)
    print(f"{name} on {torch.cuda.get_device_name()}: one step {wall:.2f} ms (CUDA events, median of 5); "
          f"{total:.2f} ms of kernel time; first kernel to last {(spans[-1][1] - spans[0][0]) / 1e3:.2f} ms, "
          f"of which {sum(g[0] for g in gaps) / 1e3:.2f} ms with no kernel running ({len(gaps)} gaps)")
    for k, v in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(v):8.3f} ms  {len(v):4d}x  {k}")
    print("largest gaps:")
    for g, before, after in sorted(gaps, reverse=True)[:8]:
        print(f"{g / 1e3:8.3f} ms  after {before}  before {after}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "chunked_triton[split_fp32]")
