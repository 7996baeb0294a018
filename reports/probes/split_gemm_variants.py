"""Probe: how fast can one step of the split fp32 accumulator (``hi:lo += Gᵀ·x``, impls/split_accum.py) run?

The speed target of issue 8 needs this step at about 1.6 ms for one chunk (C=640, V=131072, H=4096, bf16), where
the current pointer-based Triton GEMM takes 2.6 ms and cuBLAS' fp32 ``addmm`` (the same 8 bytes of accumulator
traffic per element) 1.75 ms. The floors: 2·C·V·H flops at the bf16 rate (about 1.0 ms) and 8·V·H bytes at the
HBM rate (about 0.9 ms), so only overlapping the two gets there. This times, at a few C:

- ``cublas_fp32``: ``torch.addmm(acc32, Gᵀ, x, out_dtype=float32)`` style, the fp32-buffer yardstick;
- ``pointer``: the kernel in impls/split_accum.py with its autotuner's choice for C=640;
- ``tma``: a persistent kernel reading G, x, hi and lo through TMA descriptors, the accumulator tile loaded
  before the main loop (``PREFETCH``) or after it, optionally the tile loop flattened into the K loop
  (``FLATTEN``: the next tile's loads issued under this tile's epilogue), over several tile shapes;

and checks each result against the pointer kernel's (the same fp32 sum, in another order inside one tile:
at most a few fp32 ulps apart).

Usage (device): python -m reports.probes.split_gemm_variants [C ...]
"""
from __future__ import annotations

import sys

import torch

from reports.probes import split_case
from reports.probes.timing import median_ms


def main(cs: list[int]) -> None:
    """Print one line per (variant, C): ms, TFLOP/s, max |difference| to the pointer kernel in fp32 ulps."""
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    from impls import split_accum

    @triton.jit
    def tma_kernel(g_desc, x_desc, hi_desc, lo_desc, HI, LO, V, H, C, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, PREFETCH: tl.constexpr,
                   FLATTEN: tl.constexpr, STAGES: tl.constexpr, PTR_EPI: tl.constexpr, WS: tl.constexpr):
        start = tl.program_id(0)
        n_m = tl.cdiv(V, BLOCK_M)
        n_n = tl.cdiv(H, BLOCK_N)
        k_tiles = tl.cdiv(C, BLOCK_K)
        num_tiles = n_m * n_n
        per_group = GROUP_M * n_n
        for tile in tl.range(start, num_tiles, NUM_SMS, flatten=FLATTEN):
            group = tile // per_group
            first_m = group * GROUP_M
            size_m = tl.minimum(n_m - first_m, GROUP_M)
            om = (first_m + (tile % per_group) % size_m) * BLOCK_M
            on = ((tile % per_group) // size_m) * BLOCK_N
            if PREFETCH:
                hi = hi_desc.load([om, on])
                lo = lo_desc.load([om, on])
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for ki in tl.range(k_tiles, num_stages=STAGES, warp_specialize=WS):
                a = g_desc.load([ki * BLOCK_K, om])  # [BK, BM] of G: Gᵀ's tile, transposed in shared memory
                b = x_desc.load([ki * BLOCK_K, on])
                acc = tl.dot(a.T, b, acc)
            if PTR_EPI:  # plain loads and stores of the accumulator tile (no shared-memory staging)
                rm = om + tl.arange(0, BLOCK_M)
                rn = on + tl.arange(0, BLOCK_N)
                offs = rm.to(tl.int64)[:, None] * H + rn[None, :]
                msk = (rm < V)[:, None] & (rn < H)[None, :]
                hi = tl.load(HI + offs, mask=msk, other=0)
                lo = tl.load(LO + offs, mask=msk, other=0)
                run = ((hi.to(tl.int32) << 16) | (lo.to(tl.int32) & 0xFFFF)).to(tl.float32, bitcast=True)
                bits = (run + acc).to(tl.int32, bitcast=True)
                tl.store(HI + offs, (bits >> 16).to(tl.int16), mask=msk)
                tl.store(LO + offs, (bits & 0xFFFF).to(tl.int16), mask=msk)
            else:
                if not PREFETCH:
                    hi = hi_desc.load([om, on])
                    lo = lo_desc.load([om, on])
                run = ((hi.to(tl.int32) << 16) | (lo.to(tl.int32) & 0xFFFF)).to(tl.float32, bitcast=True)
                bits = (run + acc).to(tl.int32, bitcast=True)
                hi_desc.store([om, on], (bits >> 16).to(tl.int16))
                lo_desc.store([om, on], (bits & 0xFFFF).to(tl.int16))

    dev = "cuda"
    V, H = split_case.V, split_case.H
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    start32, hi0, lo0 = split_case.start_halves(dev)
    print(f"V={V} H={H} SMs={sms} torch {torch.__version__} triton {triton.__version__}", flush=True)
    for C in cs:
        G, x = split_case.chunk(C, dev)
        flops = 2.0 * C * V * H

        acc32 = start32.clone()
        ms = median_ms(lambda: torch.addmm(acc32, G.t(), x, out_dtype=torch.float32, out=acc32))
        print(f"C={C} cublas_fp32 {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)

        ref = split_accum.SplitAccumulator((V, H), dev)
        ref.hi.view(torch.int16).copy_(hi0)
        ref.lo.copy_(lo0)
        ref.add_(G, x)
        want = ref.value().clone()
        acc = split_accum.SplitAccumulator((V, H), dev)
        ms = median_ms(lambda: acc.add_(G, x))
        print(f"C={C} pointer {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
        del acc

        hi = torch.empty_like(hi0)
        lo = torch.empty_like(lo0)
        # (BM, BN, BK, warps, stages, prefetch, flatten, programs per SM (0: one per tile), ptr epilogue, ws)
        for bm, bn, bk, warps, stages, prefetch, flatten, per_sm, ptr_epi, ws in (
                (128, 256, 64, 8, 3, False, False, 1, False, False), (128, 256, 64, 8, 3, False, False, 1, True, False),
                (128, 256, 64, 8, 2, False, True, 1, False, False), (128, 256, 64, 8, 2, False, True, 1, True, False),
                (128, 256, 64, 8, 3, False, True, 1, True, False), (128, 128, 64, 8, 3, False, False, 2, False, False),
                (128, 128, 64, 4, 3, False, False, 2, True, False), (128, 128, 64, 8, 3, False, False, 0, False, False),
                (128, 128, 64, 4, 3, False, False, 0, True, False), (128, 256, 64, 8, 3, False, False, 1, False, True),
                (128, 128, 64, 8, 3, False, True, 2, False, False), (256, 128, 64, 8, 3, False, False, 1, False, False),
                (128, 256, 64, 8, 4, False, False, 1, False, False), (128, 256, 64, 8, 3, False, False, 1, True, True)):
            name = (f"tma[{bm}x{bn}x{bk},w{warps},s{stages},{'pre' if prefetch else 'post'}{',flat' if flatten else ''}"
                    f",{per_sm or 'all'}/SM{',ptr-epi' if ptr_epi else ''}{',ws' if ws else ''}]")
            try:
                gd = TensorDescriptor.from_tensor(G, [bk, bm])
                xd = TensorDescriptor.from_tensor(x, [bk, bn])
                hd = TensorDescriptor.from_tensor(hi, [bm, bn])
                ld = TensorDescriptor.from_tensor(lo, [bm, bn])

                progs = per_sm * sms if per_sm else triton.cdiv(V, bm) * triton.cdiv(H, bn)

                def run() -> None:
                    tma_kernel[(progs,)](gd, xd, hd, ld, hi, lo, V, H, C, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                         GROUP_M=8, NUM_SMS=progs, PREFETCH=prefetch, FLATTEN=flatten,
                                         STAGES=stages, PTR_EPI=ptr_epi, WS=ws, num_warps=warps, num_stages=stages)

                hi.copy_(hi0)
                lo.copy_(lo0)
                run()
                got = ((hi.to(torch.int32) << 16) | (lo.to(torch.int32) & 0xFFFF)).view(torch.float32)
                ulp = ((got - want).abs() / (want.abs() * 2.0**-23).clamp_min(2.0**-149)).max().item()
                ms = median_ms(run)
                print(f"C={C} {name} {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s max diff {ulp:.1f} ulp", flush=True)
            except Exception as exc:  # noqa: BLE001 - a probe: report the variant that does not compile, go on
                print(f"C={C} {name} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        del G, x


if __name__ == "__main__":
    main([int(c) for c in sys.argv[1:]] or [640])
