"""Probe: can a chunk's grad_x GEMM hide the split accumulator step's memory traffic if the two run at once?

Per 640-row chunk of the chunked FLCE at V=131072, H=4096 (bf16) the step ``hi:lo += Gᵀ·x`` (impls/split_accum.py)
takes about 2.0 ms: about 1.0 ms of MMAs and 8·V·H = 4.3 GB of accumulator traffic that its persistent kernel
does not overlap with them. ``grad_x = G·W`` (cuBLAS, about 0.9 ms) reads the same G and is independent of it.
Run side by side on two streams, one kernel's tensor-core time could cover the other's memory time: the floors
are about 1.9 ms of MMAs and 5.5 GB of traffic for both, against about 2.9 ms one after the other.

Timed (CUDA events, median of 15 after two warm-ups), each as the fork/join a chunk would do:

- ``grad_x`` alone, ``split`` alone (the impl's TMA kernel, one program per SM), both in sequence;
- ``streams[P, first]``: the split kernel with P programs on the current stream and grad_x on a side stream,
  launched grad_x first or split first;
- ``dynamic[P, first]``: the same with a split kernel whose programs take tiles from an atomic counter, so a
  program that starts late (its SM busy with grad_x) takes fewer tiles instead of delaying the end;

and checks every split result against the sequential one (the same tiles, the same order: bit-identical).

Usage (device): python -m reports.probes.split_overlap [C ...]
"""
from __future__ import annotations

import sys

import torch

from reports.probes import split_case
from reports.probes.timing import median_ms


def main(cs: list[int]) -> None:
    """Print one line per (variant, C): ms, and whether the split result equals the sequential one."""
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    from impls import split_accum

    @triton.jit
    def dyn_kernel(g_desc, x_desc, hi_desc, lo_desc, COUNTER, V, H, C, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr):
        # The impl's TMA kernel, but each program takes its next tile from an atomic counter.
        n_m = tl.cdiv(V, BLOCK_M)
        n_n = tl.cdiv(H, BLOCK_N)
        num_tiles = n_m * n_n
        per_group = GROUP_M * n_n
        tile = tl.atomic_add(COUNTER, 1)
        while tile < num_tiles:
            first_m = (tile // per_group) * GROUP_M
            size_m = tl.minimum(n_m - first_m, GROUP_M)
            om = (first_m + (tile % per_group) % size_m) * BLOCK_M
            on = ((tile % per_group) // size_m) * BLOCK_N
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in tl.range(0, C, BLOCK_K, num_stages=STAGES):
                a = g_desc.load([k0, om])
                b = x_desc.load([k0, on])
                acc = tl.dot(a.T, b, acc)
            hi = hi_desc.load([om, on]).to(tl.int32)
            lo = lo_desc.load([om, on]).to(tl.int32)
            bits = (((hi << 16) | (lo & 0xFFFF)).to(tl.float32, bitcast=True) + acc).to(tl.int32, bitcast=True)
            hi_desc.store([om, on], (bits >> 16).to(tl.int16))
            lo_desc.store([om, on], (bits & 0xFFFF).to(tl.int16))
            tile = tl.atomic_add(COUNTER, 1)

    dev = "cuda"
    V, H = split_case.V, split_case.H
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = dict(split_accum.TMA_CONFIG)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    torch.manual_seed(0)
    start32, hi0, lo0 = split_case.start_halves(dev)
    W = (torch.randn(V, H, device=dev) * 0.02).to(torch.bfloat16)
    side = torch.cuda.Stream()
    print(f"V={V} H={H} SMs={sms} torch {torch.__version__} triton {triton.__version__} split tiles {cfg}", flush=True)
    for C in cs:
        G, x = split_case.chunk(C, dev)
        gx = torch.empty(C, H, device=dev, dtype=torch.bfloat16)
        acc = split_accum.SplitAccumulator((V, H), dev)
        hi, lo = acc.hi.view(torch.int16), acc.lo
        gd = TensorDescriptor.from_tensor(G, [bk, bm])
        xd = TensorDescriptor.from_tensor(x, [bk, bn])
        hd = TensorDescriptor.from_tensor(hi, [bm, bn])
        ld = TensorDescriptor.from_tensor(lo, [bm, bn])
        counter = torch.zeros(1, dtype=torch.int32, device=dev)
        tiles = triton.cdiv(V, bm) * triton.cdiv(H, bn)

        def split_static(progs: int) -> None:
            split_accum._addmm_split_tma_jit[(progs,)](gd, xd, hd, ld, V, H, C, progs, UPCAST=False, **cfg)

        def split_dynamic(progs: int) -> None:
            counter.zero_()
            dyn_kernel[(progs,)](gd, xd, hd, ld, counter, V, H, C, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                 GROUP_M=cfg["GROUP_M"], STAGES=cfg["STAGES"], num_warps=cfg["num_warps"])

        def grad_x() -> None:
            torch.mm(G, W, out=gx)

        def forked(split, first: str):
            def run() -> None:
                side.wait_stream(torch.cuda.current_stream())
                if first == "split":
                    split()
                with torch.cuda.stream(side):
                    grad_x()
                if first == "gx":
                    split()
                torch.cuda.current_stream().wait_stream(side)
            return run

        hi.copy_(hi0)
        lo.copy_(lo0)
        split_static(min(tiles, sms))
        want = acc.value().clone()
        gx_want = torch.mm(G, W)

        def check(run) -> str:
            hi.copy_(hi0)
            lo.copy_(lo0)
            gx.zero_()
            run()
            torch.cuda.synchronize()
            same = torch.equal(acc.value(), want)
            gx_same = torch.equal(gx, gx_want)
            return f"split {'identical' if same else 'DIFFERS'}, grad_x {'identical' if gx_same else 'DIFFERS'}"

        print(f"C={C} grad_x {median_ms(grad_x):.3f} ms", flush=True)
        print(f"C={C} split {median_ms(lambda: split_static(min(tiles, sms))):.3f} ms", flush=True)
        print(f"C={C} split+grad_x in sequence {median_ms(lambda: (grad_x(), split_static(min(tiles, sms)))):.3f} ms",
              flush=True)
        for progs in (sms, sms - 16, sms - 32, sms - 48, sms - 66):
            for first in ("gx", "split"):
                for kind, fn in (("streams", split_static), ("dynamic", split_dynamic)):
                    run = forked(lambda p=progs, f=fn: f(p), first)
                    try:
                        verdict = check(run)
                        ms = median_ms(run)
                        print(f"C={C} {kind}[{progs} programs, {first} first] {ms:.3f} ms ({verdict})", flush=True)
                    except Exception as exc:  # noqa: BLE001 - a probe: report and go on
                        print(f"C={C} {kind}[{progs}, {first}] FAILED {type(exc).__name__}: {str(exc)[:300]}",
                              flush=True)


if __name__ == "__main__":
    main([int(c) for c in sys.argv[1:]] or [640])
