"""The matmul precision every impl runs under while numcheck judges it.

The tolerance model takes a GEMM an impl calls through torch (``torch.mm``, ``@``, ``F.linear``, ``addmm``) to
accumulate each output in fp32 and round it once to the output dtype (``properties.linear_ce.tolerance``: γ_H at fp32's unit
roundoff plus one rounding). On CUDA, torch's defaults let cuBLAS break that: with
``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction`` (and its fp16 twin) ``True``, the default,
cuBLAS may pick a split-K kernel that rounds each slice's partial sum to bf16/fp16 and adds the partials in that
dtype. How many slices it uses is a heuristic of the shape, so no bound follows from the documentation. On the
H200 (torch 2.11) a 13×48×141 bf16 GEMM came back up to 2401 ulps (of the exact value) from the correctly rounded
product, 743 of 1833 outputs beyond half an ulp, while the 26×48×141 one was correctly rounded; with the flag off
every output was within half an ulp (``docs/evidence/liger_cuda_cases.txt``). Two Liger-Kernel sweep failures
(two_calls at 1.61×, earlier_calls at 1.08×) were this and pass with the flag off. TF32 (``allow_tf32``, float32
matmul precision ``high``/``medium``) rounds fp32 operands to 10 mantissa bits: off by default, but a user's
conftest may turn it on.

So numcheck verifies the impl's own arithmetic under full-precision GEMM reductions: :func:`pinned` sets the flags
below for the duration of a judgement (each numcheck test, ``assert_linear_ce`` / ``assert_fp8_linear``, every
judging subcommand of the command line, every distributed rank; ``bench`` and ``memory`` measure under the caller's
settings) and restores the caller's afterwards. A kernel that accumulates in bf16 itself
(its own Triton or CUDA code, or a ``torch.mm`` on bf16 partials) is judged as before: the flags only stop cuBLAS
from doing so behind the impl's back. Use :func:`describe` to record the state in an environment header.

Example::

    >>> import torch
    >>> with pinned():
    ...     torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    False
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

#: ``torch.backends.cuda.matmul`` attributes numcheck sets while it judges, and the value it sets
#: (those a torch release lacks are left alone: ``allow_fp16_accumulation`` is new in torch 2.7).
PINNED_FLAGS: dict[str, bool] = {
    "allow_bf16_reduced_precision_reduction": False,
    "allow_fp16_reduced_precision_reduction": False,
    "allow_fp16_accumulation": False,
    "allow_tf32": False,
}
#: ``torch.set_float32_matmul_precision`` while numcheck judges: fp32 GEMMs in fp32, no TF32 or bf16x3.
FLOAT32_PRECISION = "highest"


def _flags() -> dict[str, bool]:
    """The current value of every pinned flag this torch has."""
    m = torch.backends.cuda.matmul
    out = {}
    for name in PINNED_FLAGS:
        try:
            out[name] = bool(getattr(m, name))
        except AttributeError:  # not in this torch release
            continue
    return out


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """Full-precision GEMM reductions and fp32 matmuls in fp32 (:data:`PINNED_FLAGS`,
    :data:`FLOAT32_PRECISION`) inside the block; the caller's settings are restored on leaving it, also on an
    exception. Nests."""
    m = torch.backends.cuda.matmul
    saved = _flags()
    saved_fp32 = torch.get_float32_matmul_precision()
    try:
        for name in saved:
            setattr(m, name, PINNED_FLAGS[name])
        torch.set_float32_matmul_precision(FLOAT32_PRECISION)
        yield
    finally:
        for name, value in saved.items():
            setattr(m, name, value)
        torch.set_float32_matmul_precision(saved_fp32)


def describe() -> str:
    """One line for an environment header: what numcheck pins while it judges."""
    flags = ", ".join(f"{k}={v}" for k, v in PINNED_FLAGS.items() if k in _flags())
    return f"judged with torch.backends.cuda.matmul {flags}; float32 matmul precision {FLOAT32_PRECISION!r}"
