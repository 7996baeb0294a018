"""Evidence for the ``fp8_linear[hopper]`` built-ins: does mmaemu's CPU model return a Hopper GPU's FP8 GEMM bits?

numcheck's ``fp8_linear[hopper]`` and ``fp8_linear[hopper_fast]`` (``impls/builtin/fp8_hopper.py``) compute their
GEMMs with mmaemu 0.1.0's ``hopper`` profile on its exact float64 reference backend (``splitk=1``), and the suite's
bound for truncating block steps (``properties/fp8/tolerance.py``) is judged on the CPU against that arithmetic. mmaemu
was validated on an H100 PCIe (cuBLASLt 12.8.3.14, torch 2.7.1); its README lists the H200 as not modelled. This
script measures, on the CUDA device it runs on, how much of ``torch._scaled_mm``'s output mmaemu reproduces:

* ``torch._scaled_mm`` with tensorwise E4M3 operands (current scaling: s = 448 / amax in fp32, a saturating cast),
  fp32 output, ``use_fast_accum`` off and on, for six shapes up to K = 16384 and two data kinds: ``normal``
  (N(0, 1), random signs) and ``same_sign`` (|N(0, 1)|, where truncation's one-signed errors add up along K);
* the same call through ``mmaemu.scaled_mm(..., profile="hopper", backend="reference")`` on the CPU, with
  ``splitk=1`` (what numcheck's built-ins use) and with ``splitk="auto"`` (mmaemu's split-K decision from the
  H100 PCIe's table; ``n/a`` where the table and envelope decide nothing and mmaemu raises ``SplitKUnknownError``);
* a plain fp32 GEMM of the dequantized operands on the CPU (``a.float() @ b.float().t()``, then the scales).

For each it prints the fraction of elements bit-equal to the GPU's, and the largest error against the exact
float64 product of the dequantized operands, relative to that product's largest element. ``mmaemu_h200.txt`` beside
this file is its output on an H200.

Usage (torch ≥ 2.6 and mmaemu 0.1.0 importable, e.g. the wheel unpacked on ``PYTHONPATH``; no numcheck needed)::

    python docs/evidence/mmaemu_h200.py                 # on a CUDA machine: the table above
    python docs/evidence/mmaemu_h200.py --cpu-selftest  # no GPU: mmaemu's splitk=1 result stands in for the
                                                        # device's, so its column must read 100% (checks the script)
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings

import torch

#: (M, N, K): K from 128 to 16384, M·N shrinking as K grows so each reference GEMM stays seconds on one CPU core.
SHAPES: tuple[tuple[int, int, int], ...] = (
    (256, 256, 128),
    (256, 256, 512),
    (128, 128, 1024),
    (64, 64, 4096),
    (32, 32, 8192),
    (32, 32, 16384),
)
SELFTEST_SHAPES = SHAPES[:3]
DATA = ("normal", "same_sign")
#: Why a cell reads n/a (mmaemu's error per configuration), printed after the table.
NOTES: list[str] = []
E4M3_MAX = 448.0


def operands(M: int, N: int, K: int, data: str, seed: int) -> tuple[torch.Tensor, ...]:
    """E4M3 ``a [M, K]``, ``b [N, K]`` and their fp32 dequantization scales (tensorwise current scaling), on the CPU."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    if data == "same_sign":
        x, w = x.abs(), w.abs()
    out = []
    for t in (x, w):
        scale = torch.tensor(E4M3_MAX, dtype=torch.float32) / t.abs().amax()
        q = (t * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        out += [q, (torch.ones((), dtype=torch.float32) / scale).reshape(())]
    return tuple(out)


def on_device(a, sa, b, sb, fast: bool, device: str) -> torch.Tensor:
    """``torch._scaled_mm`` on ``device``: fp32 output, tensorwise scales; returned on the CPU."""
    d = torch.device(device)
    y = torch._scaled_mm(
        a.to(d), b.to(d).t(), scale_a=sa.to(d), scale_b=sb.to(d), out_dtype=torch.float32, use_fast_accum=fast
    )
    return y.cpu()


def emulated(a, sa, b, sb, fast: bool, splitk) -> torch.Tensor | None:
    """mmaemu's reference backend on the CPU; ``None`` where it cannot decide the split (``splitk="auto"``)."""
    import mmaemu

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return mmaemu.scaled_mm(
                a,
                b.t(),
                sa.reshape(1),
                sb.reshape(1),
                out_dtype=torch.float32,
                use_fast_accum=fast,
                profile="hopper",
                splitk=splitk,
                backend="reference",
            )
    except mmaemu.MmaemuError as exc:  # SplitKUnknownError above all; with splitk=1 nothing is expected
        if splitk == 1:
            raise
        NOTES.append(f"{a.shape[0]}x{b.shape[0]}x{a.shape[1]} fast={fast} splitk={splitk!r}: {type(exc).__name__}")
        return None


def plain_fp32(a, sa, b, sb) -> torch.Tensor:
    """The dequantized operands' fp32 GEMM on the CPU, then the two scales (what an IEEE fp32 accumulator gives)."""
    return (a.float() @ b.float().t()) * (sa * sb)


def bit_equal(x: torch.Tensor | None, ref: torch.Tensor) -> str:
    """Percentage of elements of ``x`` whose fp32 bits equal ``ref``'s."""
    if x is None:
        return "n/a"
    same = (x.view(torch.int32) == ref.view(torch.int32)).float().mean().item()
    return f"{100 * same:.1f}%"


def rel_err(x: torch.Tensor | None, exact: torch.Tensor) -> str:
    """max |x − exact| / max |exact| (float64)."""
    if x is None:
        return "n/a"
    return f"{((x.double() - exact).abs().max() / exact.abs().max()).item():.2e}"


def row(M: int, N: int, K: int, data: str, fast: bool, device: str | None, seed: int) -> list[str]:
    """One configuration's cells (see :data:`HEADER`)."""
    a, sa, b, sb = operands(M, N, K, data, seed)
    exact = (a.double() * sa.double()) @ (b.double() * sb.double()).t()
    emu1 = emulated(a, sa, b, sb, fast, 1)
    emua = emulated(a, sa, b, sb, fast, "auto")
    gpu = on_device(a, sa, b, sb, fast, device) if device else emu1
    f32 = plain_fp32(a, sa, b, sb)
    return [
        f"{M}x{N}x{K}",
        data,
        "on" if fast else "off",
        bit_equal(emu1, gpu),
        bit_equal(emua, gpu),
        bit_equal(f32, gpu),
        rel_err(gpu, exact),
        rel_err(emu1, exact),
        rel_err(f32, exact),
    ]


HEADER = (
    "M x N x K",
    "data",
    "fast accum",
    "mmaemu splitk=1 bit-equal",
    "mmaemu splitk=auto bit-equal",
    "fp32 sum bit-equal",
    "device rel err",
    "mmaemu rel err",
    "fp32 rel err",
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-selftest", action="store_true", help="no GPU: mmaemu's splitk=1 result stands in for it")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        import mmaemu
    except ImportError as exc:  # numpy too: mmaemu's split-K tables need it on every call
        print(f"mmaemu 0.1.0 is not importable ({exc}): put the unpacked wheel on PYTHONPATH", file=sys.stderr)
        return 2

    if not args.cpu_selftest and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or pass --cpu-selftest", file=sys.stderr)
        return 2
    device = None if args.cpu_selftest else "cuda"
    if device is None:
        name = "none (--cpu-selftest: the device columns are mmaemu splitk=1's)"
    else:
        sm = "".join(map(str, torch.cuda.get_device_capability(0)))
        name = f"{torch.cuda.get_device_name(0)} (sm_{sm}), CUDA {torch.version.cuda}"
    print(f"# mmaemu {mmaemu.__version__} (profile hopper, reference backend, CPU) against torch._scaled_mm")
    print(f"# torch {torch.__version__}, Python {platform.python_version()}; device: {name}; seed {args.seed}")
    print("# tensorwise E4M3 x E4M3 (current scaling), fp32 output; rel err = max |y - exact| / max |exact|")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + " --- |" * len(HEADER))
    start = time.time()
    for M, N, K in SELFTEST_SHAPES if device is None else SHAPES:
        for data in DATA:
            for fast in (False, True):
                print("| " + " | ".join(row(M, N, K, data, fast, device, args.seed)) + " |", flush=True)
    for note in dict.fromkeys(NOTES):
        print(f"# n/a: {note}")
    print(f"# {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
