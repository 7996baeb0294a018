"""Probe: the bench's large case of the split_fp32 impls with their split step on the ping-pong Gluon kernel.

``numcheck bench`` times ``chunked_triton[split_fp32]`` and ``recompute_triton[split_fp32]`` with the impl's TMA
kernel. This probe times the same cases (``reports.bench.bench_impl``: BT=8192, H=4096, V=131072, bf16, mean,
10% ignored) in one process, first as registered, then with ``SplitAccumulator._add_tma`` replaced by the
ping-pong kernel of ``split_gluon.py`` (a probe kernel: Gluon has no interpreter, so the CPU tier could not test
it as an impl), and with 704-row chunks (the most that keeps a bf16 logits chunk and the lower half under
1200 MiB). The gradients of the patched run are compared bit for bit with the registered ones; the share of
the floor uses the best bf16 matmul rate measured before and after, as the bench does.

    python -m reports.probes.bench_pingpong [I ...]   # indices into split_gluon.PINGPONG (default 9)
"""
from __future__ import annotations

import sys

import torch
import triton

from impls import registry, split_accum
from reports import bench
from reports.probes import split_gluon

BT, H, V = 8192, 4096, 131072
REP_MS = 400.0


def pingpong_add(cfg: split_gluon.Config):
    """A replacement for ``SplitAccumulator._add_tma`` that runs the ping-pong kernel with ``cfg``."""

    def add(self: split_accum.SplitAccumulator, G: torch.Tensor, x: torch.Tensor) -> None:
        v, h = self.shape
        hi = self.hi.view(torch.int16)
        descs = split_gluon.descriptors(G, x, hi, self.lo, cfg.bm, cfg.bn, cfg.bk, cfg.pieces)
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        split_gluon._launch(cfg, descs, hi, self.lo, v, h, G.shape[0], sms)

    return add


def grads(impl) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_w) of one forward+backward of the bench case."""
    x, w, t = bench._case(BT, H, V, torch.device("cuda"))
    xr, wr = x.requires_grad_(), w.requires_grad_()
    out = impl(xr, wr, t, None, reduction="mean", ignore_index=-100)
    (out[0] if isinstance(out, tuple) else out).backward()
    return xr.grad, wr.grad


def main(indices: list[int]) -> None:
    """Print ms, share of the floor and extra peak of ``chunked_triton[split_fp32]`` as registered and on each
    ping-pong configuration (``recompute_triton[split_fp32]``, and 704-row chunks, on the first only), one
    process, one machine."""
    dev = torch.device("cuda")
    cfgs = [split_gluon.PINGPONG[i] for i in indices]
    rates = bench.matmul_rates(dev, REP_MS)
    print(f"torch {torch.__version__} triton {triton.__version__}", flush=True)
    chunked = registry.builtin("chunked_triton[split_fp32]")
    recompute = registry.builtin("recompute_triton[split_fp32]")
    want = {im.name: grads(im) for im in (chunked, recompute)}
    runs = [("impl TMA kernel", None, chunked), ("impl TMA kernel", None, recompute)]
    for k, cfg in enumerate(cfgs):
        runs.append((cfg.name, cfg, chunked))
        if k == 0:
            runs += [(cfg.name, cfg, recompute), (cfg.name + ", 704-row chunks", cfg, chunked.with_chunk_rows(704))]
    rows = []
    original = split_accum.SplitAccumulator._add_tma
    for label, cfg, im in runs:
        split_accum.SplitAccumulator._add_tma = pingpong_add(cfg) if cfg else original
        try:
            if cfg and im.chunk_rows == chunked.chunk_rows:
                same = all(torch.equal(a, b) for a, b in zip(grads(im), want[im.name]))
                print(f"{im.name} on {label}: gradients {'bit-identical' if same else 'DIFFER'} to the impl "
                      f"kernel's", flush=True)
            r = bench.bench_impl(im, BT, H, V, dev, REP_MS)
        finally:
            split_accum.SplitAccumulator._add_tma = original
        rows.append((im.name, label, r))
        print(f"{im.name} [{label}]: {r['ms']:.2f} ms, extra peak {r['extra_peak_mib']:.0f} MiB", flush=True)
    rates += bench.matmul_rates(dev, REP_MS)
    rate = max(rates)
    floor_ms = 6 * BT * H * V / rate * 1e3
    print(f"bf16 matmul rate: best {rate / 1e12:.0f} TFLOP/s of {[round(r / 1e12) for r in rates]}; "
          f"floor {floor_ms:.2f} ms")
    for name, label, r in rows:
        print(f"| {name} | {label} | {r['ms']:.2f} | {floor_ms / r['ms']:.2f} | {r['extra_peak_mib']:.0f} |")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [9])
