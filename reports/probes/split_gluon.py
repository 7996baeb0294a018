"""Probe: the split accumulator step as a hand-scheduled Gluon kernel, the accumulator tile fetched under the MMAs.

The Triton TMA kernel of impls/split_accum.py spends about 2.0 ms per 640-row chunk at V=131072, H=4096: its
epilogue reads the (hi, lo) tile only after the main loop, so the 8·V·H bytes of accumulator traffic and the
MMAs take turns (run N; two streams did not overlap them either: reports/probes/split_overlap.py). Here the
schedule is explicit (Gluon, Hopper):

- a persistent program walks its tiles; the operand loads (G and x, TMA) form one ring of ``STAGES`` slots over
  the flattened sequence of (tile, k) steps, so the next tile's first loads are in flight during this tile's
  epilogue;
- at the start of each tile the (hi, lo) tile is requested by TMA into shared memory, to land while the MMAs
  of that tile run; the epilogue adds from shared memory and TMA-stores the halves back without waiting;
- one wgmma stays in flight while the next slot is refilled.

Three kernels: ``split_gluon_kernel`` (the schedule above, with switches for the (hi, lo) path, ``prmt`` and
``inc``), ``split_gluon_deferred_kernel`` (tile i's epilogue after tile i+1's first wgmmas are issued) and
``split_gluon_pingpong_kernel`` (two consumer warpgroups on alternate tiles and a producer warp). Their barrier
protocols are simulated by reports/probes/split_gluon_protocol.py.

Checked against the impl's kernel bit for bit (the same fp32 sum per tile: K order within a tile is the same),
then timed like split_overlap.py.

Result (runs T–AB in reports/h200-torch2.11/README.md): every configuration that finishes is exact, and none is
faster than the impl's kernel. The best tie with it at about 2.0 ms: the halves joined and split by byte
permutes (``prmt``) with the ring positions carried instead of divided (``inc``), or the deferred epilogue.
The ping-pong kernel hangs on the H200, even cut down to one consumer without the epilogue (run AB).

Usage (device): python -m reports.probes.split_gluon [--only 'WORD|WORD'] [C ...]
                python -m reports.probes.split_gluon --once [INDEX]     (one launch each, for Nsight Compute)
                python -m reports.probes.split_gluon --pp-debug         (ping-pong reductions, 40 s each)
        (here): python -m reports.probes.split_gluon --compile-only     (sm_90 without a GPU: shared memory,
                                                                          registers and spills)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from reports.probes import split_case
from reports.probes.timing import median_ms


@dataclass(frozen=True)
class Config:
    """One launch configuration of :func:`split_gluon_kernel` (shared memory: STAGES·BK·(BM+BN)·2 bytes for
    the operand ring plus BM·BN·4 for the accumulator tile, unless ``epi`` is 4)."""

    bm: int
    bn: int
    bk: int
    stages: int
    warps: int
    epi: int
    per_sm: int = 1  # programs per SM (more than one where shared memory and registers allow)
    prmt: bool = False
    inc: bool = False
    deferred: bool = False  # split_gluon_deferred_kernel (TMA epilogue with prmt, incremental ring positions)
    pingpong: int = 0  # split_gluon_pingpong_kernel with this many registers per consumer thread (warps: 4 + 4 + 1)
    halves: bool = False  # ping-pong only: the epilogue on column halves (no spills)
    pieces: int = 1  # ping-pong with halves only: (hi, lo) staged 1/pieces of a tile at a time (1, 2 or 4)
    group_m: int = 8  # ping-pong only: tiles of GROUP_M row blocks run column by column (L2 reuse of G)
    do_mma: bool = True  # the three below only for the diagnostics
    do_epi: bool = True
    do_loads: bool = True

    @property
    def name(self) -> str:
        """The configuration in the probe's output."""
        extra = "".join(f", {f}" for f in ("prmt", "inc", "deferred") if getattr(self, f))
        if self.pingpong:
            extra += f", ping-pong {self.pingpong} regs" + (", epilogue halves" if self.halves else "")
            extra += f", staged in {self.pieces} pieces" if self.pieces > 1 else ""
            extra += f", GROUP_M {self.group_m}" if self.group_m != 8 else ""
        return (f"gluon[{self.bm}x{self.bn}x{self.bk}, {self.stages} stages, {self.warps} warps, epilogue {self.epi},"
                f" {self.per_sm}/SM{extra}]")

    def constexprs(self) -> dict:
        """The kernel's constexpr arguments."""
        if self.deferred:
            return {"GROUP_M": 8, "STAGES": self.stages, "num_warps": self.warps}
        if self.pingpong:
            return {"GROUP_M": self.group_m, "STAGES": self.stages, "CONSUMER_REGS": self.pingpong, "num_warps": 4, "NCONS": 2,
                    "EPI_ON": True, "EPI_PART": 0, "EPI_HALVES": self.halves}
        return {"GROUP_M": 8, "STAGES": self.stages, "EPI": self.epi, "num_warps": self.warps, "DO_MMA": self.do_mma,
                "DO_EPI": self.do_epi, "DO_LOADS": self.do_loads, "PRMT": self.prmt, "INC": self.inc}


#: Run T's configurations (reports/h200-torch2.11/README.md), then the cheaper epilogue and index arithmetic.
CONFIGS = (Config(128, 128, 64, 4, 8, 0), Config(128, 128, 64, 4, 8, 1), Config(128, 128, 64, 4, 8, 2),
           Config(128, 128, 64, 4, 8, 3), Config(128, 256, 32, 4, 8, 1), Config(128, 256, 32, 4, 8, 2),
           Config(128, 256, 64, 2, 8, 1), Config(128, 128, 64, 3, 4, 4, per_sm=2),
           Config(128, 128, 64, 2, 4, 4, per_sm=2), Config(128, 128, 32, 4, 4, 4, per_sm=2),
           Config(64, 128, 64, 3, 4, 4, per_sm=3),
           Config(128, 128, 64, 4, 8, 0, prmt=True), Config(128, 128, 64, 4, 8, 0, inc=True),
           Config(128, 128, 64, 4, 8, 0, prmt=True, inc=True), Config(128, 128, 64, 4, 8, 1, prmt=True, inc=True),
           Config(128, 256, 64, 2, 8, 0, prmt=True, inc=True), Config(128, 256, 32, 4, 8, 0, prmt=True, inc=True),
           Config(128, 128, 64, 4, 8, 0, deferred=True), Config(128, 128, 32, 8, 8, 0, deferred=True),
           Config(128, 128, 64, 3, 8, 0, deferred=True), Config(128, 256, 64, 2, 8, 0, deferred=True),
           Config(128, 256, 32, 4, 8, 0, deferred=True),
           Config(128, 128, 32, 3, 4, 0, prmt=True, inc=True, per_sm=2),
           Config(128, 128, 32, 2, 4, 0, prmt=True, inc=True, per_sm=2),
           Config(128, 128, 64, 2, 4, 0, prmt=True, inc=True, per_sm=1))

#: The ping-pong kernel's configurations. They hung on the H200 in runs Y, Z and AB (the consumer freed every
#: ring slot through the tile's first one: reports/probes/triton_carry.py), so main() runs them only with
#: ``--only`` (``--only ping-pong`` for all of them).
PINGPONG = (Config(128, 128, 64, 3, 4, 0, pingpong=232), Config(128, 128, 32, 6, 4, 0, pingpong=232),
            Config(128, 128, 64, 3, 4, 0, pingpong=208), Config(128, 128, 64, 3, 4, 0, pingpong=232, halves=True),
            Config(128, 128, 32, 6, 4, 0, pingpong=232, halves=True),
            Config(128, 128, 16, 12, 4, 0, pingpong=232, halves=True),
            Config(128, 128, 32, 5, 4, 0, pingpong=232, halves=True),
            Config(128, 128, 32, 10, 4, 0, pingpong=232, halves=True, pieces=2),
            Config(128, 128, 32, 8, 4, 0, pingpong=232, halves=True, pieces=2),
            Config(128, 128, 64, 5, 4, 0, pingpong=232, halves=True, pieces=2),
            Config(128, 128, 32, 12, 4, 0, pingpong=232, halves=True, pieces=4),
            Config(128, 128, 64, 6, 4, 0, pingpong=232, halves=True, pieces=4),
            Config(128, 128, 64, 4, 4, 0, pingpong=232, halves=True, pieces=2),
            Config(128, 128, 64, 5, 4, 0, pingpong=232, halves=True, pieces=2, group_m=4),
            Config(128, 128, 64, 5, 4, 0, pingpong=232, halves=True, pieces=2, group_m=16))

#: Only the configurations whose name holds one of these ``|``-separated words (``--only 'A|B'``); all when empty.
ONLY = ""

#: Runs that time one half of the work alone (the results are then wrong).
DIAGNOSTICS = (Config(128, 128, 64, 4, 8, 0, do_epi=False), Config(128, 128, 64, 4, 8, 0, do_mma=False),
               Config(128, 128, 64, 4, 8, 0, do_epi=False, do_loads=False),
               Config(128, 128, 64, 4, 8, 0, do_loads=False),
               Config(128, 128, 64, 4, 8, 0, prmt=True, inc=True, do_loads=False))
# (Run V also timed prmt+inc with neither the epilogue nor the loads: 0.39 ms, faster than the tensor cores can
# go, so the compiler had dropped the unused MMAs. That diagnostic is not repeated.)


@gluon.jit
def _origin(tile, n_m, n_n, GROUP_M: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    per_group = GROUP_M * n_n
    first_m = (tile // per_group) * GROUP_M
    size_m = gl.minimum(n_m - first_m, GROUP_M)
    om = (first_m + (tile % per_group) % size_m) * BM
    on = ((tile % per_group) // size_m) * BN
    return om, on


@gluon.jit
def _issue(step, total, k_tiles, pid, nprog, n_m, n_n, g_desc, x_desc, a_bufs, b_bufs, bars,
           GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    # The operand loads of flattened step `step` (tile step // k_tiles of this program, k block step % k_tiles).
    BK: gl.constexpr = g_desc.block_type.shape[0]
    BM: gl.constexpr = g_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    pred = step < total
    t = step // k_tiles
    kk = step - t * k_tiles
    om, on = _origin(pid + t * nprog, n_m, n_n, GROUP_M, BM, BN)
    s = step % STAGES
    bar = bars.index(s)
    mbarrier.expect(bar, g_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(g_desc, [kk * BK, om], bar, a_bufs.index(s), pred)
    tma.async_copy_global_to_shared(x_desc, [kk * BK, on], bar, b_bufs.index(s), pred)


@gluon.jit
def _issue_next(ld_i, ld_kk, ld_om, ld_on, ld_slot, my_tiles, k_tiles, pid, nprog, n_m, n_n, g_desc, x_desc,
                a_bufs, b_bufs, bars, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    # The operand loads of the step at (local tile ld_i, k block ld_kk), then the position one step on; no
    # divisions except one tile origin per tile.
    BK: gl.constexpr = g_desc.block_type.shape[0]
    BM: gl.constexpr = g_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    pred = ld_i < my_tiles
    bar = bars.index(ld_slot)
    mbarrier.expect(bar, g_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(g_desc, [ld_kk * BK, ld_om], bar, a_bufs.index(ld_slot), pred)
    tma.async_copy_global_to_shared(x_desc, [ld_kk * BK, ld_on], bar, b_bufs.index(ld_slot), pred)
    ld_kk += 1
    if ld_kk == k_tiles:
        ld_kk = 0
        ld_i += 1
        ld_om, ld_on = _origin(pid + ld_i * nprog, n_m, n_n, GROUP_M, BM, BN)
    ld_slot += 1
    if ld_slot == STAGES:
        ld_slot = 0
    return ld_i, ld_kk, ld_om, ld_on, ld_slot


@gluon.jit
def _combine(hi, lo, acc):
    # (hi, lo) <- split(fp32(hi, lo) + acc) for two elements per instance: each 32-bit register holds two int16
    # of hi (or lo), element 0 in the low half; acc comes as two fp32 registers.
    return gl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 f0, f1;
        prmt.b32 f0, $3, $2, 0x5410;
        prmt.b32 f1, $3, $2, 0x7632;
        add.f32 f0, f0, $4;
        add.f32 f1, f1, $5;
        prmt.b32 $0, f0, f1, 0x7632;
        prmt.b32 $1, f0, f1, 0x5410;
        }
        """,
        constraints="=r,=r,r,r,r,r", args=[hi, lo, acc], dtype=(gl.int16, gl.int16), is_pure=True, pack=2)


@gluon.jit
def _schedule(V, H, C, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    # This program's place in the persistent schedule: (pid, programs, row and column tiles, its tile count,
    # k blocks per tile).
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    n_m = gl.cdiv(V, BM)
    n_n = gl.cdiv(H, BN)
    return pid, nprog, n_m, n_n, gl.cdiv(n_m * n_n - pid, nprog), gl.cdiv(C, BK)


@gluon.jit
def _operand_ring(g_desc, x_desc, STAGES: gl.constexpr):
    # The operand ring: STAGES slots of G and x blocks, and one initialised barrier a slot.
    BK: gl.constexpr = g_desc.block_type.shape[0]
    BM: gl.constexpr = g_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(g_desc.dtype, [STAGES, BK, BM], g_desc.layout)
    b_bufs = gl.allocate_shared_memory(g_desc.dtype, [STAGES, BK, BN], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    return a_bufs, b_bufs, bars


@gluon.jit
def split_gluon_kernel(g_desc, x_desc, hi_desc, lo_desc, HI, LO, V, H, C, GROUP_M: gl.constexpr,
                       STAGES: gl.constexpr, EPI: gl.constexpr, num_warps: gl.constexpr, DO_MMA: gl.constexpr = True,
                       DO_EPI: gl.constexpr = True, DO_LOADS: gl.constexpr = True, PRMT: gl.constexpr = False,
                       INC: gl.constexpr = False):
    # EPI, how the (hi, lo) tile moves: 0 TMA load at tile start, TMA store; 1 cp.async load (not through the
    # TMA unit, so the operand loads do not queue behind it), TMA store; 2 cp.async load, plain vector stores;
    # 3 plain loads into registers at tile start, plain stores; 4 plain loads after the main loop, plain stores
    # (no shared memory for the tile: small enough for two programs per SM, one's epilogue under the other's MMAs).
    # INC: the ring's positions carried from step to step instead of divided out of a step counter.
    # PRMT: join and split the halves two elements at a time with byte permutes (6 instructions a pair).
    # DO_MMA / DO_EPI / DO_LOADS (diagnostics only; the result is then wrong): without the main loop, without
    # the accumulator tile's traffic, or with the main loop's MMAs on whatever shared memory holds (no operand
    # loads from L2).
    BK: gl.constexpr = g_desc.block_type.shape[0]
    BM: gl.constexpr = g_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BN, 16])
    # 16-byte vectors per thread, a row of BN int16 across BN // 8 threads.
    vec: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // (BN // 8), BN // 8],
                                         warps_per_cta=[num_warps, 1], order=[1, 0])
    a_bufs, b_bufs, bars = _operand_ring(g_desc, x_desc, STAGES)
    if EPI == 4:  # a token allocation: the tile never passes through shared memory
        hi_s = gl.allocate_shared_memory(gl.int16, [8, 64], hi_desc.layout)
        lo_s = hi_s
    else:
        hi_s = gl.allocate_shared_memory(gl.int16, [BM, BN], hi_desc.layout)
        lo_s = gl.allocate_shared_memory(gl.int16, [BM, BN], lo_desc.layout)
    acc_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(acc_bar, count=1)
    vrows = gl.arange(0, BM, layout=gl.SliceLayout(1, vec))
    vcols = gl.arange(0, BN, layout=gl.SliceLayout(0, vec))
    mrows = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    mcols = gl.arange(0, BN, layout=gl.SliceLayout(0, layout))

    pid, nprog, n_m, n_n, my_tiles, k_tiles = _schedule(V, H, C, BM, BN, BK)
    total = my_tiles * k_tiles
    if not DO_MMA or not DO_LOADS:
        total = 0
    ld_i = 0
    ld_kk = 0
    ld_slot = 0
    ld_om, ld_on = _origin(pid, n_m, n_n, GROUP_M, BM, BN)
    if not DO_MMA or not DO_LOADS:
        ld_i = my_tiles
    for first in gl.static_range(STAGES - 1):
        if INC:
            ld_i, ld_kk, ld_om, ld_on, ld_slot = _issue_next(ld_i, ld_kk, ld_om, ld_on, ld_slot, my_tiles, k_tiles,
                                                             pid, nprog, n_m, n_n, g_desc, x_desc, a_bufs, b_bufs,
                                                             bars, GROUP_M, STAGES)
        else:
            _issue(first, total, k_tiles, pid, nprog, n_m, n_n, g_desc, x_desc, a_bufs, b_bufs, bars, GROUP_M,
                   STAGES)
    c_slot = 0
    c_phase = 0

    acc = gl.zeros((BM, BN), gl.float32, layout)
    hi_r = gl.zeros((BM, BN), gl.int16, layout)
    lo_r = gl.zeros((BM, BN), gl.int16, layout)
    g = 0
    for i in range(my_tiles):
        om, on = _origin(pid + i * nprog, n_m, n_n, GROUP_M, BM, BN)
        voffs = (om + vrows).to(gl.int64)[:, None] * H + (on + vcols)[None, :]
        moffs = (om + mrows).to(gl.int64)[:, None] * H + (on + mcols)[None, :]
        if DO_EPI:
            if EPI == 0:
                tma.store_wait(pendings=0)  # the previous tile's stores have read hi_s / lo_s
                mbarrier.expect(acc_bar, hi_desc.block_type.nbytes + lo_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(hi_desc, [om, on], acc_bar, hi_s)
                tma.async_copy_global_to_shared(lo_desc, [om, on], acc_bar, lo_s)
            elif EPI == 1 or EPI == 2:
                if EPI == 1:
                    tma.store_wait(pendings=0)
                gl.thread_barrier()  # every thread is done with hi_s / lo_s of the previous tile
                async_copy.async_copy_global_to_shared(hi_s, HI + voffs)
                async_copy.async_copy_global_to_shared(lo_s, LO + voffs)
                async_copy.commit_group()
            elif EPI == 3:
                hi_r = gl.load(HI + moffs)
                lo_r = gl.load(LO + moffs)
        for kk in range(k_tiles if DO_MMA else 0):
            if INC:
                slot = c_slot
                phase = c_phase
                c_slot += 1
                if c_slot == STAGES:
                    c_slot = 0
                    c_phase ^= 1
            else:
                slot = g % STAGES
                phase = (g // STAGES) & 1
            if DO_LOADS:
                mbarrier.wait(bars.index(slot), phase)
            acc = warpgroup_mma(a_bufs.index(slot).permute((1, 0)), b_bufs.index(slot), acc, use_acc=kk > 0,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            # step g-1's wgmma is done: its slot, (g + STAGES - 1) % STAGES, takes the load STAGES - 1 ahead
            if INC:
                ld_i, ld_kk, ld_om, ld_on, ld_slot = _issue_next(ld_i, ld_kk, ld_om, ld_on, ld_slot, my_tiles,
                                                                 k_tiles, pid, nprog, n_m, n_n, g_desc, x_desc,
                                                                 a_bufs, b_bufs, bars, GROUP_M, STAGES)
            else:
                _issue(g + STAGES - 1, total, k_tiles, pid, nprog, n_m, n_n, g_desc, x_desc, a_bufs, b_bufs, bars,
                       GROUP_M, STAGES)
            g += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if DO_EPI:
            if EPI == 0:
                mbarrier.wait(acc_bar, i & 1)
            elif EPI == 1 or EPI == 2:
                async_copy.wait_group(0)
                gl.thread_barrier()
            if PRMT and EPI <= 2:
                new_hi, new_lo = _combine(hi_s.load(layout), lo_s.load(layout), acc)
            else:
                if EPI == 3:
                    hi = hi_r.to(gl.int32)
                    lo = lo_r.to(gl.int32)
                elif EPI == 4:
                    hi = gl.load(HI + moffs).to(gl.int32)
                    lo = gl.load(LO + moffs).to(gl.int32)
                else:
                    hi = hi_s.load(layout).to(gl.int32)
                    lo = lo_s.load(layout).to(gl.int32)
                bits = (((hi << 16) | (lo & 0xFFFF)).to(gl.float32, bitcast=True) + acc).to(gl.int32, bitcast=True)
                new_hi = (bits >> 16).to(gl.int16)
                new_lo = (bits & 0xFFFF).to(gl.int16)
            if EPI == 0 or EPI == 1:
                hi_s.store(new_hi)
                lo_s.store(new_lo)
                fence_async_shared()
                tma.async_copy_shared_to_global(hi_desc, [om, on], hi_s)
                tma.async_copy_shared_to_global(lo_desc, [om, on], lo_s)
            elif EPI == 2:
                gl.thread_barrier()
                hi_s.store(new_hi)
                lo_s.store(new_lo)
                gl.thread_barrier()
                gl.store(HI + voffs, hi_s.load(vec))
                gl.store(LO + voffs, lo_s.load(vec))
            else:
                gl.store(HI + moffs, new_hi)
                gl.store(LO + moffs, new_lo)
    tma.store_wait(pendings=0)


@gluon.jit
def _epilogue(acc, hi_s, lo_s, hi_desc, lo_desc, om, on, acc_bar, phase, layout: gl.constexpr):
    # hi:lo of tile (om, on) += acc: the halves from shared memory (TMA-loaded under acc_bar), back by TMA store.
    mbarrier.wait(acc_bar, phase)
    new_hi, new_lo = _combine(hi_s.load(layout), lo_s.load(layout), acc)
    hi_s.store(new_hi)
    lo_s.store(new_lo)
    fence_async_shared()
    tma.async_copy_shared_to_global(hi_desc, [om, on], hi_s)
    tma.async_copy_shared_to_global(lo_desc, [om, on], lo_s)


@gluon.jit
def split_gluon_deferred_kernel(g_desc, x_desc, hi_desc, lo_desc, V, H, C, GROUP_M: gl.constexpr,
                                STAGES: gl.constexpr, num_warps: gl.constexpr):
    # Tile i's epilogue runs after tile i+1's first STAGES-1 wgmmas are issued, so the tensor cores work through
    # it; two accumulators live at once. The operand ring is refilled by catching up to STAGES-1 steps ahead of
    # the newest issued wgmma. Needs ceil(C / BK) >= STAGES - 1. The (hi, lo) tile of tile i is fetched once
    # tile i-1's epilogue has stored its own.
    BK: gl.constexpr = g_desc.block_type.shape[0]
    BM: gl.constexpr = g_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    P: gl.constexpr = STAGES - 1
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BN, 16])
    a_bufs, b_bufs, bars = _operand_ring(g_desc, x_desc, STAGES)
    hi_s = gl.allocate_shared_memory(gl.int16, [BM, BN], hi_desc.layout)
    lo_s = gl.allocate_shared_memory(gl.int16, [BM, BN], lo_desc.layout)
    acc_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(acc_bar, count=1)

    pid, nprog, n_m, n_n, my_tiles, k_tiles = _schedule(V, H, C, BM, BN, BK)
    total = my_tiles * k_tiles
    ld_i = 0
    ld_kk = 0
    ld_slot = 0
    ld_pos = 0
    ld_om, ld_on = _origin(pid, n_m, n_n, GROUP_M, BM, BN)
    for first in gl.static_range(STAGES):  # every slot: (a) issues P steps without refilling, (c) waits on the next
        ld_i, ld_kk, ld_om, ld_on, ld_slot = _issue_next(ld_i, ld_kk, ld_om, ld_on, ld_slot, my_tiles, k_tiles, pid,
                                                         nprog, n_m, n_n, g_desc, x_desc, a_bufs, b_bufs, bars,
                                                         GROUP_M, STAGES)
    ld_pos = STAGES
    om, on = _origin(pid, n_m, n_n, GROUP_M, BM, BN)
    mbarrier.expect(acc_bar, hi_desc.block_type.nbytes + lo_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(hi_desc, [om, on], acc_bar, hi_s)
    tma.async_copy_global_to_shared(lo_desc, [om, on], acc_bar, lo_s)

    acc = gl.zeros((BM, BN), gl.float32, layout)
    prev = gl.zeros((BM, BN), gl.float32, layout)
    prev_om = om
    prev_on = on
    c_slot = 0
    c_phase = 0
    g = 0
    for i in range(my_tiles):
        om, on = _origin(pid + i * nprog, n_m, n_n, GROUP_M, BM, BN)
        # (a) the tile's first P wgmmas, on operands already requested
        for kk in gl.static_range(P):
            mbarrier.wait(bars.index(c_slot), c_phase)
            acc = warpgroup_mma(a_bufs.index(c_slot).permute((1, 0)), b_bufs.index(c_slot), acc, use_acc=kk > 0,
                                is_async=True)
            c_slot += 1
            if c_slot == STAGES:
                c_slot = 0
                c_phase ^= 1
            g += 1
        # no wait in effect (exactly P are outstanding): it gives the loop below a plain tensor to carry
        acc = warpgroup_mma_wait(num_outstanding=P, deps=(acc, ))
        # (b) the previous tile's epilogue under them; then this tile's (hi, lo) is requested
        if i > 0:
            _epilogue(prev, hi_s, lo_s, hi_desc, lo_desc, prev_om, prev_on, acc_bar, (i - 1) & 1, layout)
            tma.store_wait(pendings=0)
            mbarrier.expect(acc_bar, hi_desc.block_type.nbytes + lo_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(hi_desc, [om, on], acc_bar, hi_s)
            tma.async_copy_global_to_shared(lo_desc, [om, on], acc_bar, lo_s)
        # (c) the rest of the tile, refilling freed slots up to P steps ahead of the newest wgmma
        for kk in range(P, k_tiles):
            mbarrier.wait(bars.index(c_slot), c_phase)
            acc = warpgroup_mma(a_bufs.index(c_slot).permute((1, 0)), b_bufs.index(c_slot), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            c_slot += 1
            if c_slot == STAGES:
                c_slot = 0
                c_phase ^= 1
            while (ld_pos < g + STAGES) & (ld_pos < total):
                ld_i, ld_kk, ld_om, ld_on, ld_slot = _issue_next(ld_i, ld_kk, ld_om, ld_on, ld_slot, my_tiles,
                                                                 k_tiles, pid, nprog, n_m, n_n, g_desc, x_desc,
                                                                 a_bufs, b_bufs, bars, GROUP_M, STAGES)
                ld_pos += 1
            g += 1
        prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        acc = prev
        prev_om = om
        prev_on = on
        while (ld_pos < g + STAGES) & (ld_pos < total):  # every slot is free: up to STAGES steps ahead
            ld_i, ld_kk, ld_om, ld_on, ld_slot = _issue_next(ld_i, ld_kk, ld_om, ld_on, ld_slot, my_tiles, k_tiles,
                                                             pid, nprog, n_m, n_n, g_desc, x_desc, a_bufs, b_bufs,
                                                             bars, GROUP_M, STAGES)
            ld_pos += 1
    if my_tiles > 0:
        _epilogue(prev, hi_s, lo_s, hi_desc, lo_desc, prev_om, prev_on, acc_bar, (my_tiles - 1) & 1, layout)
    tma.store_wait(pendings=0)


@gluon.jit
def _column_halves(acc):
    # The accumulator's column halves, split in registers (their registers are ones it already holds).
    BM: gl.constexpr = acc.shape[0]
    BN: gl.constexpr = acc.shape[1]
    return gl.split(gl.permute(gl.reshape(acc, [BM, 2, BN // 2]), [0, 2, 1]))


@gluon.jit
def _combine_into(a, hi_s, lo_s):
    # (hi_s, lo_s) <- split(fp32(hi_s, lo_s) + a), in shared memory, in a's layout.
    n_hi, n_lo = _combine(hi_s.load(a.type.layout), lo_s.load(a.type.layout), a)
    hi_s.store(n_hi)
    lo_s.store(n_lo)


@gluon.jit
def _staged_piece(a, hi_s, lo_s, hi_desc, lo_desc, acc_bar, om, col, parity, NEXT: gl.constexpr, next_col):
    # One staged piece of the tile's columns: combine it into the staging, store it and, when another piece
    # follows, request that one into the same staging once the store has read it.
    mbarrier.wait(acc_bar, parity)
    _combine_into(a, hi_s, lo_s)
    fence_async_shared()
    tma.async_copy_shared_to_global(hi_desc, [om, col], hi_s)
    tma.async_copy_shared_to_global(lo_desc, [om, col], lo_s)
    if NEXT:
        tma.store_wait(pendings=0)
        mbarrier.expect(acc_bar, hi_desc.block_type.nbytes + lo_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(hi_desc, [om, next_col], acc_bar, hi_s)
        tma.async_copy_global_to_shared(lo_desc, [om, next_col], acc_bar, lo_s)


@gluon.jit
def _combine_halves(acc, hi_s, lo_s):
    # The epilogue on column halves of the tile, so only half of the (hi, lo) tile is live in registers at a
    # time (the whole one spills at 232 registers).
    BN: gl.constexpr = acc.shape[1]
    a0, a1 = _column_halves(acc)
    _combine_into(a0, hi_s.slice(0, BN // 2, dim=1), lo_s.slice(0, BN // 2, dim=1))
    _combine_into(a1, hi_s.slice(BN // 2, BN // 2, dim=1), lo_s.slice(BN // 2, BN // 2, dim=1))


@gluon.jit
def _pp_consumer(g_desc, x_desc, hi_desc, lo_desc, a_bufs, b_bufs, hi_bufs, lo_bufs, ready, empty, acc_bars, turn,
                 pid, nprog, n_m, n_n, my_tiles, k_tiles, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                 WG: gl.constexpr, NCONS: gl.constexpr, EPI_ON: gl.constexpr, EPI_PART: gl.constexpr,
                 EPI_HALVES: gl.constexpr):
    # One of two consumer warpgroups: local tiles WG, WG + 2, ... . Per tile: request the (hi, lo) tile into this
    # warpgroup's staging, run the k steps from the shared operand ring (freeing each slot once the wgmma that
    # read it is done), then the epilogue, while the other warpgroup's wgmmas keep the tensor cores busy.
    # The two take turns at the ring (turn barriers): a parity wait tells only adjacent phases apart, so a
    # consumer must not wait on a slot more than one phase ahead of it, which the other's tile would be.
    # NCONS=1 / EPI_ON=False (to find where it hangs): warpgroup 0 takes every tile; no (hi, lo) traffic.
    # EPI_PART (diagnostics, wrong results): 1 = the epilogue's work in the SM only (no TMA load or store of the
    # (hi, lo) tile); 2 = its memory traffic only (the tile loaded and stored back unchanged, no combine).
    # Staging in pieces (hi_desc's blocks a half or a quarter of a tile wide): the staging holds one piece; the
    # next is requested once the previous is stored, which frees shared memory for a deeper operand ring.
    BM: gl.constexpr = g_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    BNS: gl.constexpr = hi_desc.block_type.shape[1]
    gl.static_assert((BNS == BN) | (((2 * BNS == BN) | (4 * BNS == BN)) & (EPI_PART == 0)),
                     "staging in pieces: halves or quarters, full epilogue only")
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    hi_s = hi_bufs.index(WG)
    lo_s = lo_bufs.index(WG)
    acc_bar = acc_bars.index(WG)
    acc = gl.zeros((BM, BN), gl.float32, layout)
    n = 0
    for j in range(WG, my_tiles if NCONS == 2 or WG == 0 else 0, NCONS):
        om, on = _origin(pid + j * nprog, n_m, n_n, GROUP_M, BM, BN)
        if EPI_ON and EPI_PART != 1:
            tma.store_wait(pendings=0)
            mbarrier.expect(acc_bar, hi_desc.block_type.nbytes + lo_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(hi_desc, [om, on], acc_bar, hi_s)
            tma.async_copy_global_to_shared(lo_desc, [om, on], acc_bar, lo_s)
        if NCONS == 2 and j > 0:
            mbarrier.wait(turn.index(WG), (n - (1 - WG)) & 1)
        step = j * k_tiles
        slot = step % STAGES
        phase = (step // STAGES) & 1
        for kk in range(k_tiles):
            mbarrier.wait(ready.index(slot), phase)
            acc = warpgroup_mma(a_bufs.index(slot).permute((1, 0)), b_bufs.index(slot), acc, use_acc=kk > 0,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            # The previous step's wgmma is done: free its slot. Worked out from `slot`, not kept as
            # `prev_slot = slot`: Triton's frontend does not carry a name whose in-loop value is another
            # carried name's entry value, so every arrive went to the tile's first slot (runs Y-AB hung;
            # reports/probes/triton_carry.py shows the miscompile in six lines).
            mbarrier.arrive(empty.index((slot + STAGES - 1) % STAGES), pred=kk > 0)
            slot += 1
            if slot == STAGES:
                slot = 0
                phase ^= 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((slot + STAGES - 1) % STAGES))
        if NCONS == 2:
            mbarrier.arrive(turn.index(1 - WG))
        if EPI_ON and 2 * BNS == BN:  # two completions of acc_bar per tile: parities 0, 1
            a0, a1 = _column_halves(acc)
            _staged_piece(a0, hi_s, lo_s, hi_desc, lo_desc, acc_bar, om, on, 0, True, on + BNS)
            _staged_piece(a1, hi_s, lo_s, hi_desc, lo_desc, acc_bar, om, on + BNS, 1, False, on)
        elif EPI_ON and 4 * BNS == BN:  # four: 0, 1, 0, 1
            a0, a1 = _column_halves(acc)
            a00, a01 = _column_halves(a0)
            a10, a11 = _column_halves(a1)
            _staged_piece(a00, hi_s, lo_s, hi_desc, lo_desc, acc_bar, om, on, 0, True, on + BNS)
            _staged_piece(a01, hi_s, lo_s, hi_desc, lo_desc, acc_bar, om, on + BNS, 1, True, on + 2 * BNS)
            _staged_piece(a10, hi_s, lo_s, hi_desc, lo_desc, acc_bar, om, on + 2 * BNS, 0, True, on + 3 * BNS)
            _staged_piece(a11, hi_s, lo_s, hi_desc, lo_desc, acc_bar, om, on + 3 * BNS, 1, False, on)
        elif EPI_ON:
            if EPI_PART != 1:
                mbarrier.wait(acc_bar, n & 1)
            if EPI_PART != 2:
                if EPI_HALVES:
                    _combine_halves(acc, hi_s, lo_s)
                else:
                    new_hi, new_lo = _combine(hi_s.load(layout), lo_s.load(layout), acc)
                    hi_s.store(new_hi)
                    lo_s.store(new_lo)
                fence_async_shared()
            if EPI_PART != 1:
                tma.async_copy_shared_to_global(hi_desc, [om, on], hi_s)
                tma.async_copy_shared_to_global(lo_desc, [om, on], lo_s)
        n += 1
    tma.store_wait(pendings=0)


@gluon.jit
def _pp_producer(g_desc, x_desc, hi_desc, lo_desc, a_bufs, b_bufs, hi_bufs, lo_bufs, ready, empty, acc_bars, turn,
                 pid, nprog, n_m, n_n, my_tiles, k_tiles, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    # One warp: every operand step of this program in order, each into the next ring slot once it is free
    # (the single-partition kernels' _issue_next, with a wait on the slot's release before it).
    BM: gl.constexpr = g_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    slot = 0
    phase = 0
    kk = 0
    t = 0
    om, on = _origin(pid, n_m, n_n, GROUP_M, BM, BN)
    for _ in range(my_tiles * k_tiles):
        mbarrier.wait(empty.index(slot), phase ^ 1)  # a fresh barrier passes parity 1 at once
        t, kk, om, on, slot = _issue_next(t, kk, om, on, slot, my_tiles, k_tiles, pid, nprog, n_m, n_n, g_desc,
                                          x_desc, a_bufs, b_bufs, ready, GROUP_M, STAGES)
        if slot == 0:
            phase ^= 1


@gluon.jit
def split_gluon_pingpong_kernel(g_desc, x_desc, hi_desc, lo_desc, V, H, C, GROUP_M: gl.constexpr,
                                STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
                                NCONS: gl.constexpr = 2, EPI_ON: gl.constexpr = True, EPI_PART: gl.constexpr = 0,
                                EPI_HALVES: gl.constexpr = False):
    # Ping-pong warp specialisation: two consumer warpgroups (the default partition, 4 warps, and a worker)
    # take alternate tiles; a one-warp producer fills the shared operand ring. Launch with num_warps=4.
    BK: gl.constexpr = g_desc.block_type.shape[0]
    BM: gl.constexpr = g_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    a_bufs, b_bufs, ready = _operand_ring(g_desc, x_desc, STAGES)
    hi_bufs = gl.allocate_shared_memory(gl.int16, [2, BM, hi_desc.block_type.shape[1]], hi_desc.layout)
    lo_bufs = gl.allocate_shared_memory(gl.int16, [2, BM, lo_desc.block_type.shape[1]], lo_desc.layout)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    acc_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(acc_bars.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    pid, nprog, n_m, n_n, my_tiles, k_tiles = _schedule(V, H, C, BM, BN, BK)
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    # (spelled out: a tuple concatenated in the kernel loses its constexprs)
    gl.warp_specialize([
        (_pp_consumer, (g_desc, x_desc, hi_desc, lo_desc, a_bufs, b_bufs, hi_bufs, lo_bufs, ready, empty, acc_bars,
                        turn, pid, nprog, n_m, n_n, my_tiles, k_tiles, GROUP_M, STAGES, WG0, NCONS, EPI_ON,
                        EPI_PART, EPI_HALVES)),
        (_pp_consumer, (g_desc, x_desc, hi_desc, lo_desc, a_bufs, b_bufs, hi_bufs, lo_bufs, ready, empty, acc_bars,
                        turn, pid, nprog, n_m, n_n, my_tiles, k_tiles, GROUP_M, STAGES, WG1, NCONS, EPI_ON,
                        EPI_PART, EPI_HALVES)),
        (_pp_producer, (g_desc, x_desc, hi_desc, lo_desc, a_bufs, b_bufs, hi_bufs, lo_bufs, ready, empty, acc_bars,
                        turn, pid, nprog, n_m, n_n, my_tiles, k_tiles, GROUP_M, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])


def descriptors(G: torch.Tensor, x: torch.Tensor, hi16: torch.Tensor, lo: torch.Tensor, bm: int, bn: int, bk: int,
                pieces: int = 1):
    """Gluon TMA descriptors of the four operands for tiles (bm, bn, bk), the (hi, lo) blocks bn/pieces wide."""
    bs = bn // pieces
    gdt = gl.bfloat16 if G.dtype == torch.bfloat16 else gl.float16
    return (TensorDescriptor.from_tensor(G, [bk, bm], gl.NVMMASharedLayout.get_default_for([bk, bm], gdt)),
            TensorDescriptor.from_tensor(x, [bk, bn], gl.NVMMASharedLayout.get_default_for([bk, bn], gdt)),
            TensorDescriptor.from_tensor(hi16, [bm, bs], gl.NVMMASharedLayout.get_default_for([bm, bs], gl.int16)),
            TensorDescriptor.from_tensor(lo, [bm, bs], gl.NVMMASharedLayout.get_default_for([bm, bs], gl.int16)))


def _ptxas_usage(ptx: str) -> str:
    """Registers and spills of ``ptx`` for sm_90a, from Triton's bundled ptxas -v."""
    import os
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler as nv

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run([nv.get_ptxas(90).path, "-v", "--gpu-name=sm_90a", path, "-o", os.path.join(d, "k.o")],
                             capture_output=True, text=True)
    return " ".join(line.split("ptxas info    :")[-1].strip() for line in out.stderr.splitlines()
                    if "registers" in line or "spill" in line)


def compile_only(configs: tuple[Config, ...] | None = None) -> None:
    """Compile every configuration (``CONFIGS`` and ``PINGPONG`` unless given) for sm_90 here (no GPU): print
    shared memory, registers and spills."""
    configs = CONFIGS + PINGPONG if configs is None else configs
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    V, H, C = 131072, 4096, 640
    G = torch.empty(C, V, dtype=torch.bfloat16)
    x = torch.empty(C, H, dtype=torch.bfloat16)
    hi = torch.empty(V, H, dtype=torch.int16)
    lo = torch.empty(V, H, dtype=torch.int16)
    for cfg in configs:
        descs = descriptors(G, x, hi, lo, cfg.bm, cfg.bn, cfg.bk, cfg.pieces)
        kernel = (split_gluon_pingpong_kernel if cfg.pingpong else split_gluon_deferred_kernel if cfg.deferred
                  else split_gluon_kernel)
        names = kernel.arg_names
        sig = {n: mangle_type(d) for n, d in zip(("g_desc", "x_desc", "hi_desc", "lo_desc"), descs)}
        sig.update(V="i32", H="i32", C="i32")
        if not cfg.deferred and not cfg.pingpong:
            sig.update(HI="*i16", LO="*i16")
        consts = cfg.constexprs()
        sig.update({k: "constexpr" for k in consts})
        # what the launcher would specialise on: 16-byte aligned pointers, H a multiple of 16
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("HI", "LO", "H") if n in names}
        try:
            k = triton.compile(GluonASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": consts["num_warps"]})
            print(f"{cfg.name}: shared {k.metadata.shared} B; {_ptxas_usage(k.asm['ptx'])}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a probe: report the configuration that fails, go on
            print(f"{cfg.name}: FAILED {type(exc).__name__}: {str(exc)[:1500]}", flush=True)


def _launch(cfg: Config, descs: tuple, hi: torch.Tensor, lo: torch.Tensor, V: int, H: int, C: int, sms: int) -> None:
    progs = min(cfg.per_sm * sms, triton.cdiv(V, cfg.bm) * triton.cdiv(H, cfg.bn))
    if cfg.pingpong:
        split_gluon_pingpong_kernel[(progs,)](*descs, V, H, C, **cfg.constexprs())
    elif cfg.deferred:
        split_gluon_deferred_kernel[(progs,)](*descs, V, H, C, **cfg.constexprs())
    else:
        split_gluon_kernel[(progs,)](*descs, hi, lo, V, H, C, **cfg.constexprs())


def main(cs: list[int]) -> None:
    """Per C and configuration: ms, TFLOP/s, and whether the sum equals the impl kernel's."""
    from impls import split_accum

    dev = "cuda"
    V, H = split_case.V, split_case.H
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    start32, hi0, lo0 = split_case.start_halves(dev)
    print(f"V={V} H={H} SMs={sms} torch {torch.__version__} triton {triton.__version__}", flush=True)
    for C in cs:
        G, x = split_case.chunk(C, dev)
        flops = 2.0 * C * V * H
        acc = split_accum.SplitAccumulator((V, H), dev)
        hi, lo = acc.hi.view(torch.int16), acc.lo
        hi.copy_(hi0)
        lo.copy_(lo0)
        acc.add_(G, x, kernel="tma")
        want = acc.value().clone()
        ms = median_ms(lambda: acc.add_(G, x, kernel="tma"))
        print(f"C={C} impl tma kernel {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
        ms = median_ms(lambda: (hi.add_(1), lo.add_(1)))
        print(f"C={C} streaming read+write of hi and lo (torch add_): {ms:.3f} ms, "
              f"{4 * 2 * V * H / ms / 1e6:.0f} GB/s", flush=True)
        for cfg in DIAGNOSTICS if not ONLY else ():
            descs = descriptors(G, x, hi, lo, cfg.bm, cfg.bn, cfg.bk, cfg.pieces)
            ms = median_ms(lambda: _launch(cfg, descs, hi, lo, V, H, C, sms))
            parts = [p for p, on in (("main loop", cfg.do_mma), ("accumulator traffic", cfg.do_epi)) if on]
            print(f"C={C} diagnostic {cfg.name} {' + '.join(parts)}"
                  f"{'' if cfg.do_loads else ' (no operand loads)'} only: {ms:.3f} ms", flush=True)
        for cfg in CONFIGS + (PINGPONG if ONLY else ()):
            if ONLY and not any(word in cfg.name for word in ONLY.split("|")):
                continue
            try:
                descs = descriptors(G, x, hi, lo, cfg.bm, cfg.bn, cfg.bk, cfg.pieces)
                hi.copy_(hi0)
                lo.copy_(lo0)
                _launch(cfg, descs, hi, lo, V, H, C, sms)
                torch.cuda.synchronize()
                got = acc.value()
                same = torch.equal(got, want)
                ulp = ((got - want).abs() / (want.abs() * 2.0**-23).clamp_min(2.0**-149)).max().item()
                ms = median_ms(lambda: _launch(cfg, descs, hi, lo, V, H, C, sms))
                print(f"C={C} {cfg.name} {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s, "
                      f"{'bit-identical' if same else f'DIFFERS (max {ulp:.1f} ulp)'}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a probe: report the configuration that fails, go on
                print(f"C={C} {cfg.name} FAILED {type(exc).__name__}: {str(exc)[:600]}", flush=True)


def once(cfg: Config = CONFIGS[0]) -> None:
    """One launch of ``cfg`` and of the impl's TMA kernel (after one warm-up each), for a profiler (ncu)."""
    from impls import split_accum

    V, H, C = split_case.V, split_case.H, 640
    G, x = split_case.chunk(C)
    acc = split_accum.SplitAccumulator((V, H), "cuda")
    hi = acc.hi.view(torch.int16)
    descs = descriptors(G, x, hi, acc.lo, cfg.bm, cfg.bn, cfg.bk, cfg.pieces)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for _ in range(2):
        _launch(cfg, descs, hi, acc.lo, V, H, C, sms)
        acc.add_(G, x, kernel="tma")
    torch.cuda.synchronize()


def pp_one(ncons: int, epi_on: bool, epi_part: int = 0, cfg: Config = PINGPONG[0]) -> None:
    """One ping-pong variant at C=640: launch, check against the impl's kernel (full epilogue only), time."""
    from impls import split_accum

    V, H, C = split_case.V, split_case.H, 640
    torch.manual_seed(0)
    G, x = split_case.chunk(C)
    ref = split_accum.SplitAccumulator((V, H), "cuda")
    ref.add_(G, x, kernel="tma")
    acc = split_accum.SplitAccumulator((V, H), "cuda")
    hi = acc.hi.view(torch.int16)
    descs = descriptors(G, x, hi, acc.lo, cfg.bm, cfg.bn, cfg.bk, cfg.pieces)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    progs = min(sms, triton.cdiv(V, cfg.bm) * triton.cdiv(H, cfg.bn))
    consts = dict(cfg.constexprs(), NCONS=ncons, EPI_ON=epi_on, EPI_PART=epi_part)

    def run() -> None:
        split_gluon_pingpong_kernel[(progs,)](*descs, V, H, C, **consts)

    run()
    torch.cuda.synchronize()
    full = epi_on and not epi_part
    verdict = ("bit-identical" if torch.equal(acc.value(), ref.value()) else "DIFFERS") if full else "not checked"
    part = {0: "", 1: " (in-SM work only)", 2: " (memory traffic only)"}[epi_part] if epi_on else ""
    print(f"{cfg.name} consumers={ncons} epilogue={epi_on}{part}: finished, {verdict}, "
          f"{median_ms(run, reps=5):.3f} ms", flush=True)


#: pp_debug's variants (consumers, epilogue on, epilogue part, index in PINGPONG): run AB's reductions, then the
#: epilogue's in-SM work and its memory traffic each alone, with the whole-tile epilogue and with halves.
PP_VARIANTS = ((1, False, 0, 0), (1, True, 0, 0), (2, False, 0, 0), (2, True, 0, 0), (2, True, 1, 0), (2, True, 2, 0),
               (1, True, 0, 3), (2, True, 1, 3), (2, False, 0, 4), (2, True, 2, 4), (2, True, 1, 4),
               (2, False, 0, 5), (2, True, 2, 5))


def pp_debug(variants: tuple[tuple[int, bool, int, int], ...] = PP_VARIANTS, timeout_s: float = 40.0) -> None:
    """Each ping-pong variant in its own process, cut after ``timeout_s`` (a hang costs no more)."""
    import subprocess

    for ncons, epi_on, part, idx in variants:
        try:
            out = subprocess.run([sys.executable, "-m", "reports.probes.split_gluon", "--pp-one", str(ncons),
                                  str(int(epi_on)), str(part), str(idx)], capture_output=True, text=True,
                                 timeout=timeout_s)
            lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "Warning" not in ln]
            print("\n".join(lines[-3:]) or f"consumers={ncons} epilogue={epi_on}: exit {out.returncode}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"consumers={ncons} epilogue={epi_on} part={part}: HUNG (killed after {timeout_s:.0f} s)",
                  flush=True)


if __name__ == "__main__":
    if "--pp-debug" in sys.argv:  # optionally followed by comma-separated indices into PP_VARIANTS
        at = sys.argv.index("--pp-debug") + 1
        pick = [int(i) for i in sys.argv[at].split(",")] if len(sys.argv) > at else range(len(PP_VARIANTS))
        pp_debug(tuple(PP_VARIANTS[i] for i in pick))
    elif "--pp-one" in sys.argv:
        at = sys.argv.index("--pp-one")
        rest = [int(a) for a in sys.argv[at + 3:at + 5]] + [0, 0]
        pp_one(int(sys.argv[at + 1]), bool(int(sys.argv[at + 2])), rest[0], PINGPONG[rest[1]])
    elif "--compile-only" in sys.argv:
        compile_only()
    elif "--once" in sys.argv:
        once(CONFIGS[int(sys.argv[sys.argv.index("--once") + 1])] if len(sys.argv) > sys.argv.index("--once") + 1
             else CONFIGS[0])
    else:
        args = sys.argv[1:]
        if "--only" in args:
            ONLY = args[args.index("--only") + 1]
            del args[args.index("--only"):args.index("--only") + 2]
        main([int(c) for c in args] or [640])
