"""An exact fp32 grad_weight accumulator that costs 2 bytes per element beyond the bf16 gradient itself.

An IEEE fp32 number is 32 bits; its upper 16 bits are a bfloat16 (sign, the same 8-bit exponent, the top 7
mantissa bits) and its lower 16 bits are the remaining 16 mantissa bits. :class:`SplitAccumulator` keeps a
``[V, H]`` fp32 running sum as those two halves in two separate tensors: ``hi`` (bfloat16, **the storage that
is returned as grad_weight**) and ``lo`` (int16, the only extra memory: V·H·2 bytes = 1024 MiB at V=131072,
H=4096, instead of the fp32 buffer's 2048 MiB). Nothing is approximated: every step reassembles the exact
fp32 value, adds the chunk's fp32 product with one fp32 rounding, and splits the result again, so the running
sum is bit-for-bit the one an fp32 ``addmm(out_dtype=float32)`` accumulator would hold for the same
per-chunk products. :meth:`SplitAccumulator.finish` forms ``fp32(hi, lo)·g`` (one fp32 rounding), rounds it
once to bf16 (round to nearest even) and writes it over ``hi``; ``lo`` is released.

The step is one Triton GEMM, ``acc += Gᵀ·x`` with ``G`` ``[C, V]`` and ``x`` ``[C, H]`` in a 16-bit dtype
(or fp32, multiplied in IEEE fp32, not TF32): each program computes a ``[BLOCK_M, BLOCK_N]`` tile of the
product in fp32 (``tl.dot``'s accumulator) and, in the same kernel, reads the two halves of that tile, adds,
and writes them back. Two kernels do this: a persistent one that moves every tile (G, x and both halves)
through TMA descriptors, for 16-bit operands whose rows are 16-byte aligned where Triton has tensor
descriptors (Hopper and later, and the interpreter); and a pointer-based one for the rest. On the H200 at
C=640, V=131072, H=4096 the TMA kernel took 1.99–2.04 ms and the pointer kernel's autotuned best 2.71–2.73 ms
(cuBLAS' fp32 ``addmm`` with the same accumulator traffic: 1.84–1.87 ms; ``docs/accumulation-and-memory.md``,
"Speed on one H200"). Per chunk the accumulator traffic is 4 + 4 bytes per element, the same as an fp32
``addmm`` with β = 1, and no ``[V, H]`` temporary exists. The fp32 product inside one tile is a sum of C
bf16×bf16 products (exact in fp32) accumulated in fp32, as cuBLAS does, so the error model is the one of
:data:`impls.builtin.grad_accum.GRAD_ACCUMULATION` ``"fp32"``.

Only a bf16 gradient has an fp32 upper half. For any other parameter dtype (fp32 parameters under AMP, fp16)
:func:`impls.builtin.grad_accum.make_accumulator` uses a plain fp32 buffer with the ``addmm_out_dtype`` step.

Runs compiled on CUDA and on CPU under ``TRITON_INTERPRET=1`` (which numcheck's entry points set through
:func:`impls.interpreter.arrange` when CUDA is absent; :mod:`impls.triton_lang` reads the mode). On ``meta``
tensors the kernels are not launched (shapes and allocations only, for memory accounting).
"""

from __future__ import annotations

import torch

from numcheck.impls.triton_lang import INTERPRET, tl, triton, unavailable_reason

TensorDescriptor = None  # triton.tools.tensor_descriptor's, where this Triton has it (set below)

#: The GEMM kernels :meth:`SplitAccumulator.add_` can be asked for.
KERNELS: tuple[str, ...] = ("auto", "tma", "pointer")
#: Dtypes the GEMM operands may have.
OPERAND_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)


if triton is not None:
    #: The one launch configuration under the interpreter (no autotuning there: Triton 3.2's autotuner needs
    #: an active GPU driver even to be constructed).
    INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4, "PREFETCH": True}
    #: Compiled, below this many accumulator elements one fixed configuration runs (autotuning every small shape
    #: a test draws costs more than it could save); at and above it Triton's autotuner picks per (V, H, C).
    AUTOTUNE_MIN_ELEMENTS = 1 << 22
    SMALL_CONFIG = {
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "BLOCK_K": 32,
        "GROUP_M": 8,
        "PREFETCH": True,
        "num_warps": 4,
        "num_stages": 2,
    }

    def _configs() -> list["triton.Config"]:
        # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, PREFETCH). The accumulator's 8 bytes per element dominate
        # at short C, so the candidates either load the (hi, lo) tile before the main loop (its latency hidden
        # behind the MMAs) or use a shared-memory footprint small enough for two CTAs per SM (one CTA's
        # epilogue overlapping another's main loop), or both.
        cands = (
            (128, 256, 64, 8, 3, False),
            (128, 256, 64, 8, 4, False),
            (128, 128, 64, 8, 3, True),
            (128, 128, 64, 4, 3, True),
            (128, 128, 64, 4, 4, False),
            (128, 128, 64, 8, 4, True),
            (256, 128, 64, 8, 3, False),
            (64, 256, 64, 4, 3, True),
            (128, 256, 64, 8, 3, True),
        )
        return [
            triton.Config(
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "PREFETCH": pf}, num_warps=w, num_stages=st
            )
            for bm, bn, bk, w, st, pf in cands
        ]

    @triton.jit
    def _addmm_split_jit(
        G,
        X,
        HI,
        LO,
        V,
        H,
        C,
        stride_g,
        stride_x,
        stride_acc,
        IEEE: tl.constexpr,
        UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
        PREFETCH: tl.constexpr,
    ):
        # Tile (pid_m, pid_n) of acc[V, H] += G[C, V]ᵀ · X[C, H]; grouped order so X and a band of G stay in L2.
        pid = tl.program_id(0)
        n_m = tl.cdiv(V, BLOCK_M)
        n_n = tl.cdiv(H, BLOCK_N)
        per_group = GROUP_M * n_n
        group = pid // per_group
        first_m = group * GROUP_M
        size_m = tl.minimum(n_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % size_m
        pid_n = (pid % per_group) // size_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        mm = rm < V
        mn = rn < H
        offs = rm.to(tl.int64)[:, None] * stride_acc + rn[None, :]
        msk = mm[:, None] & mn[None, :]
        if PREFETCH:
            hi = tl.load(HI + offs, mask=msk, other=0)
            lo = tl.load(LO + offs, mask=msk, other=0)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, C, BLOCK_K):
            kk = k0 + rk
            mk = kk < C
            a = tl.load(
                G + kk.to(tl.int64)[None, :] * stride_g + rm[:, None], mask=mm[:, None] & mk[None, :], other=0.0
            )
            b = tl.load(
                X + kk.to(tl.int64)[:, None] * stride_x + rn[None, :], mask=mk[:, None] & mn[None, :], other=0.0
            )
            if UPCAST:  # the interpreter's 16-bit dot is wrong; the fp32 product of 16-bit values is exact
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            elif IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if not PREFETCH:
            hi = tl.load(HI + offs, mask=msk, other=0)
            lo = tl.load(LO + offs, mask=msk, other=0)
        hi32 = hi.to(tl.int32)
        lo32 = lo.to(tl.int32)
        run = ((hi32 << 16) | (lo32 & 0xFFFF)).to(tl.float32, bitcast=True)
        bits = (run + acc).to(tl.int32, bitcast=True)
        tl.store(HI + offs, (bits >> 16).to(tl.int16), mask=msk)
        tl.store(LO + offs, (bits & 0xFFFF).to(tl.int16), mask=msk)

    if INTERPRET:
        _addmm_split_kernel = _addmm_split_jit
    else:
        # restore_value: tuning runs the kernel several times on the live accumulator; each trial starts from a copy.
        _addmm_split_kernel = triton.autotune(
            configs=_configs(), key=["V", "H", "C", "IEEE", "UPCAST"], restore_value=["HI", "LO"]
        )(_addmm_split_jit)

    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # Triton before tensor descriptors (3.2, with torch 2.6): the pointer kernel only
        pass

    #: The TMA kernel's tiles: compiled (the probe's fastest at C=640 on the H200; 3 stages fit its shared
    #: memory, 4 do not) and under the interpreter (small, so CPU tests cover several tiles and a K tail).
    TMA_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "STAGES": 3}
    #: Compiled, the TMA kernel takes accumulators of at least this many elements. Measured on the H200 (``docs/accumulation-and-memory.md``,
    #: "Speed on one H200"): at V·H = 2^29 (131072 × 4096) a chunk's step fell from 2.73 to 1.97 ms, but at V·H = 2^26
    #: (32768 × 2048) the whole split FLCE was 1.6× slower than with the autotuned pointer kernel; and at
    #: V=8, H=16 its tiles did not fit shared memory.
    TMA_MIN_ELEMENTS = 1 << 28
    TMA_INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4, "STAGES": 1}

    @triton.jit
    def _addmm_split_tma_jit(
        g_desc,
        x_desc,
        hi_desc,
        lo_desc,
        V,
        H,
        C,
        NUM_PROGS,
        UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
        STAGES: tl.constexpr,
    ):
        # Persistent: program p takes tiles p, p + NUM_PROGS, ... of acc[V, H] += G[C, V]ᵀ · X[C, H] in grouped
        # order. TMA zero-fills loads past the edges (a K tail adds zeros) and clips stores to the tensor.
        n_m = tl.cdiv(V, BLOCK_M)
        n_n = tl.cdiv(H, BLOCK_N)
        per_group = GROUP_M * n_n
        for tile in tl.range(tl.program_id(0), n_m * n_n, NUM_PROGS, flatten=False):  # as the probe measured
            first_m = (tile // per_group) * GROUP_M
            size_m = tl.minimum(n_m - first_m, GROUP_M)
            om = (first_m + (tile % per_group) % size_m) * BLOCK_M
            on = ((tile % per_group) // size_m) * BLOCK_N
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in tl.range(0, C, BLOCK_K, num_stages=STAGES):
                a = g_desc.load([k0, om])  # [BLOCK_K, BLOCK_M] of G; Gᵀ's tile is its transpose
                b = x_desc.load([k0, on])
                if UPCAST:  # the interpreter's 16-bit dot is wrong; the fp32 product of 16-bit values is exact
                    acc = tl.dot(a.T.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(a.T, b, acc)
            hi = hi_desc.load([om, on]).to(tl.int32)
            lo = lo_desc.load([om, on]).to(tl.int32)
            bits = (((hi << 16) | (lo & 0xFFFF)).to(tl.float32, bitcast=True) + acc).to(tl.int32, bitcast=True)
            hi_desc.store([om, on], (bits >> 16).to(tl.int16))
            lo_desc.store([om, on], (bits & 0xFFFF).to(tl.int16))

    @triton.jit
    def _finish_kernel(HI, LO, SCALE, n, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
        # hi <- bf16(fp32(hi, lo) · scale), round to nearest even, in place.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        msk = offs < n
        hi = tl.load(HI + offs, mask=msk, other=0).to(tl.int32)
        lo = tl.load(LO + offs, mask=msk, other=0).to(tl.int32)
        v = ((hi << 16) | (lo & 0xFFFF)).to(tl.float32, bitcast=True)
        if HAS_SCALE:
            v = v * tl.load(SCALE).to(tl.float32)
        # Round to nearest even on the bits (the interpreter's fp32 -> bf16 cast truncates): add 0x7FFF plus the
        # kept part's lowest bit and drop 16 bits; overflow carries into the exponent (-> ±inf, as RNE does).
        # NaN keeps a quiet NaN (adding could turn a NaN whose payload is in the low half into inf).
        bits = v.to(tl.int32, bitcast=True)
        r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        r = tl.where(v != v, 0x7FC0, r)
        tl.store(HI + offs, r.to(tl.int16), mask=msk)


class SplitAccumulator:
    """An fp32 ``[V, H]`` running sum held as a bf16 upper half (the future gradient) and an int16 lower half.

    Args:
        shape: ``(V, H)``.
        device: where both halves live.
    """

    def __init__(self, shape: tuple[int, int], device: torch.device | str) -> None:
        if len(shape) != 2 or min(shape) < 0:
            raise ValueError(f"SplitAccumulator needs a 2-D shape (V, H), got {shape}")
        self.hi: torch.Tensor = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        self.lo: torch.Tensor | None = torch.zeros(shape, dtype=torch.int16, device=device)

    @property
    def shape(self) -> torch.Size:
        """``[V, H]``."""
        return self.hi.shape

    @property
    def device(self) -> torch.device:
        """The device of both halves."""
        return self.hi.device

    def value(self) -> torch.Tensor:
        """The exact fp32 running sum, as a new fp32 tensor (for tests; 4·V·H bytes)."""
        if self.lo is None:
            raise RuntimeError("SplitAccumulator.value: finish() already rounded the sum to bf16 and released lo")
        hi = self.hi.view(torch.int16).to(torch.int32)
        lo = self.lo.to(torch.int32) & 0xFFFF
        return ((hi << 16) | lo).view(torch.float32)

    def add_(self, G: torch.Tensor, x: torch.Tensor, *, kernel: str = "auto") -> None:
        """``acc += Gᵀ·x`` (``G`` ``[C, V]``, ``x`` ``[C, H]``, one dtype of :data:`OPERAND_DTYPES`), the product
        in fp32 and one fp32 rounding of the sum, in place, no host synchronisation. ``kernel``: ``"auto"``
        (the TMA kernel where :meth:`tma_eligible` and, compiled, from :data:`TMA_MIN_ELEMENTS` accumulator
        elements; else the pointer one), ``"tma"`` or ``"pointer"`` (tests compare the two)."""
        self._check_add(G, x, kernel)
        V, H = self.shape
        if G.shape[0] == 0 or V == 0 or H == 0 or self.device.type == "meta":
            return
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"SplitAccumulator: {reason}")
        G = G if G.stride(1) == 1 else G.contiguous()
        x = x if x.stride(1) == 1 else x.contiguous()
        tma_ok = self.tma_eligible(G, x)
        if kernel == "tma" and not tma_ok:
            raise ValueError(
                "SplitAccumulator.add_: kernel='tma' needs tensor descriptors here, 16-bit operands "
                "and 16-byte-aligned rows and bases (see tma_eligible)"
            )
        big = INTERPRET or V * H >= TMA_MIN_ELEMENTS
        if kernel == "tma" or (kernel == "auto" and tma_ok and big):
            self._add_tma(G, x)
        else:
            self._add_pointer(G, x)

    def _check_add(self, G: torch.Tensor, x: torch.Tensor, kernel: str) -> None:
        """Raise on a call :meth:`add_` cannot take: an unknown ``kernel``, a spent accumulator, or operands that
        are not ``[C, V]`` and ``[C, H]`` of one operand dtype on the accumulator's device."""
        if kernel not in KERNELS:
            raise ValueError(f"SplitAccumulator.add_: kernel must be one of {KERNELS}, got {kernel!r}")
        if self.lo is None:
            raise RuntimeError("SplitAccumulator.add_: finish() already ran; the accumulator is spent")
        for name, t in (("G_chunk", G), ("x_chunk", x)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t))}")
            if t.dtype not in OPERAND_DTYPES:
                raise ValueError(f"{name} must be one of {OPERAND_DTYPES}, got {t.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device} but the accumulator is on {self.device}")
        if G.dtype != x.dtype:
            raise ValueError(f"G_chunk ({G.dtype}) and x_chunk ({x.dtype}) must have one dtype")
        if G.shape[0] != x.shape[0]:
            raise ValueError(f"G_chunk has {G.shape[0]} rows but x_chunk has {x.shape[0]} (both must be [C, ...])")
        V, H = self.shape
        if (G.shape[1], x.shape[1]) != (V, H):
            raise ValueError(
                f"accumulator is [V, H] = [{V}, {H}] but G_chunk is {tuple(G.shape)} and x_chunk {tuple(x.shape)}"
            )

    def _add_pointer(self, G: torch.Tensor, x: torch.Tensor) -> None:
        """``acc += Gᵀ·x`` with the pointer kernel: fixed tile configurations under the interpreter and for small
        accumulators, autotuned otherwise."""
        V, H = self.shape
        C = G.shape[0]

        def grid(meta: dict) -> tuple[int]:
            return (triton.cdiv(V, meta["BLOCK_M"]) * triton.cdiv(H, meta["BLOCK_N"]),)

        if INTERPRET:
            kernel, fixed = _addmm_split_jit, INTERPRETER_CONFIG
        elif V * H < AUTOTUNE_MIN_ELEMENTS:
            kernel, fixed = _addmm_split_jit, SMALL_CONFIG
        else:
            kernel, fixed = _addmm_split_kernel, {}
        kernel[grid](
            G,
            x,
            self.hi.view(torch.int16),
            self.lo,
            V,
            H,
            C,
            G.stride(0),
            x.stride(0),
            self.hi.stride(0),
            IEEE=G.dtype == torch.float32,
            UPCAST=INTERPRET,
            **fixed,
        )

    def tma_eligible(self, G: torch.Tensor, x: torch.Tensor) -> bool:
        """Whether the TMA kernel can take ``G`` and ``x``: Triton has tensor descriptors, the device has TMA
        (compute capability 9 or later) or the interpreter runs, both operands are 16-bit, and every row
        stride and base address is a multiple of 16 bytes (a TMA descriptor's requirement)."""
        if TensorDescriptor is None or G.dtype not in (torch.bfloat16, torch.float16) or self.lo is None:
            return False
        if not INTERPRET and (self.device.type != "cuda" or torch.cuda.get_device_capability(self.device)[0] < 9):
            return False
        ts = (G, x, self.hi, self.lo)
        return all(
            t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0 for t in ts
        )

    def _add_tma(self, G: torch.Tensor, x: torch.Tensor) -> None:
        cfg = dict(TMA_INTERPRETER_CONFIG if INTERPRET else TMA_CONFIG)
        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        V, H = self.shape
        C = G.shape[0]
        tiles = triton.cdiv(V, bm) * triton.cdiv(H, bn)
        progs = min(tiles, 4 if INTERPRET else torch.cuda.get_device_properties(self.device).multi_processor_count)
        descs = (
            TensorDescriptor.from_tensor(G, [bk, bm]),
            TensorDescriptor.from_tensor(x, [bk, bn]),
            TensorDescriptor.from_tensor(self.hi.view(torch.int16), [bm, bn]),
            TensorDescriptor.from_tensor(self.lo, [bm, bn]),
        )
        _addmm_split_tma_jit[(progs,)](*descs, V, H, C, progs, UPCAST=INTERPRET, **cfg)

    def finish(self, scale: torch.Tensor | None = None) -> torch.Tensor:
        """The gradient: ``bf16(fp32_sum · scale)`` (one rounding to bf16; ``scale`` a 0-d or 1-element tensor
        on the accumulator's device, read on the device), written over ``hi``, which is returned. ``lo`` is
        released; the accumulator cannot be used again."""
        if self.lo is None:
            raise RuntimeError("SplitAccumulator.finish ran twice")
        if scale is not None and (scale.numel() != 1 or scale.device != self.device):
            raise ValueError(
                f"scale must be one element on {self.device}, got shape {tuple(scale.shape)} on {scale.device}"
            )
        n = self.hi.numel()
        if n and self.device.type != "meta":
            reason = unavailable_reason()
            if reason is not None:
                raise RuntimeError(f"SplitAccumulator: {reason}")
            block = 1024
            s = scale.to(torch.float32).reshape(1) if scale is not None else self.lo
            _finish_kernel[(triton.cdiv(n, block),)](
                self.hi.view(torch.int16), self.lo, s, n, HAS_SCALE=scale is not None, BLOCK=block
            )
        self.lo = None
        return self.hi
