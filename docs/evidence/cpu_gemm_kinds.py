"""Two CPU GEMM facts the suite's data rests on, measured on the machine that runs this.

1. A bf16 GEMM whose operand is a column slice of a wider buffer (row stride H + 3), padding NaN or finite:
   NaN in the product with NaN padding, and the error against float64 with finite padding. On CPUs whose torch
   runs oneDNN's AMX / AVX512-BF16 kernels the padding's NaN leaks while finite padding gives the contiguous
   operand's product bit for bit (the elements past the row are loaded and multiplied by zero), which is why
   ``properties.core.tensors.strided_copy`` pads with a finite ``PAD``, not NaN.
2. grad_weight of torch's chunked ``F.linear_cross_entropy`` on confident rows (the known divergence's
   cases), error/bound by N and seed, beside eager: how far past the bound depends on the CPU's fp32 GEMM.

Run: ``python docs/evidence/cpu_gemm_kinds.py`` (torch 2.13 with numcheck installed)."""

from __future__ import annotations

import platform

import torch

from numcheck.impls.registry import builtin_impls
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem


def cpu_flags() -> str:
    """The bf16/AMX-related flags of /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ""
    return " ".join(sorted(f for f in flags if f.startswith(("amx", "avx512_bf16", "avx512f"))))


def strided_bf16(n: int, h: int, v: int, fill: float | None) -> tuple[int, float]:
    """(NaN count, max |error| against float64) of x @ w.T with x a column slice padded with ``fill``
    (``None``: x contiguous)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=g).to(torch.bfloat16)
    if fill is not None:
        buf = torch.full((n, h + 3), fill, dtype=torch.bfloat16)
        buf[:, :h] = x
        x = buf[:, :h]
    w = torch.randn(v, h, generator=g).to(torch.bfloat16)
    y = x @ w.t()
    err = (y.double() - x.double() @ w.double().t()).abs().max().item()
    return int(torch.isnan(y).sum()), err


def main() -> None:
    """Print both measurements."""
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}, flags: {cpu_flags() or 'unknown'}"
    )
    print("1. bf16 x[:, :H] @ w.T, x a slice of an [N, H+3] buffer: (NaN elements, max |err|)")
    for n, h, v in [(76, 77, 99), (17, 3, 127), (64, 64, 64)]:
        print(
            f"   N={n} H={h} V={v}: NaN padding {strided_bf16(n, h, v, float('nan'))}, "
            f"padding 2**15 {strided_bf16(n, h, v, 2.0**15)}, contiguous {strided_bf16(n, h, v, None)}"
        )
    impls = {e.name: e.impl for e in builtin_impls()}
    chunked, eager = impls["torch_native[chunked,acc=accurate]"], impls["eager"]
    print("2. grad_weight error/bound, fp32, H=4, V=2, regime confident: torch_native[chunked] / eager")
    for n, seed in [(2049, 0), (8193, 0), (32769, 2), (131073, 0), (131073, 1)]:
        p = Problem(N=n, H=4, V=2, regime="confident", seed=seed)
        a, b = (check_accuracy(i, p, relative=False).analytic["grad_weight"].ratio for i in (chunked, eager))
        print(f"   N={n} seed={seed}: {a:.3f} / {b:.4f}")


if __name__ == "__main__":
    main()
