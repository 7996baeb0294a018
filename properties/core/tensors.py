"""Tensor helpers every family shares: :func:`strided_copy` (inputs as non-contiguous views of padded
buffers, :data:`PAD` in the unused elements), :func:`same_bits` (bitwise equality, NaN equal to NaN) and
:func:`kernel_store` (a Triton kernel's store into a low-precision buffer)."""

from __future__ import annotations

import torch

#: What the unused elements of :func:`strided_copy`'s buffers hold: 2**15, finite in every float format the
#: suite draws (fp16's largest is 65504) and far above any drawn input, so an element read in place of one of the
#: tensor's own moves an output by orders of magnitude past its bound. Not NaN: oneDNN's bf16 GEMM on CPUs with
#: AMX / AVX512-BF16 (torch 2.13 and 2.6, measured on a Xeon with amx_bf16) loads a strided operand's row past
#: its end and multiplies those elements by zero, which gives the exact product for any finite memory but NaN
#: from NaN padding (0 * NaN), so a NaN fill failed every correct impl there. What the property asks is that
#: the outputs depend on the tensor's own elements only; multiplying memory outside it by zero does not.
PAD = 2.0**15


def strided_copy(t: torch.Tensor, role: str) -> torch.Tensor:
    """A non-contiguous tensor with ``t``'s values, as real callers pass them.

    ``x``: a column slice of a wider buffer (a sliced hidden state: row stride H + 3). ``weight``: the
    transpose of a contiguous [H, V] buffer (an lm_head kept as [H, V]). ``bias``: every other element of a
    longer buffer. ``target``: every other element, the skipped ones class 0. The float buffers' unused
    elements hold :data:`PAD`, so a kernel that reads them as if the tensor were contiguous cannot go unnoticed."""
    if role == "weight":
        return t.detach().t().contiguous().t()
    if role == "x":
        buf = torch.full((t.shape[0], t.shape[1] + 3), PAD, dtype=t.dtype, device=t.device)
        buf[:, : t.shape[1]] = t.detach()
        return buf[:, : t.shape[1]]
    if role in ("bias", "target"):
        fill = 0 if role == "target" else PAD
        buf = torch.full((2 * t.shape[0],), fill, dtype=t.dtype, device=t.device)
        buf[::2] = t.detach()
        return buf[::2]
    raise ValueError(f"strided_copy: role must be 'x', 'weight', 'bias' or 'target', got {role!r}")


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of the same width (floats by their bit patterns: NaN equals NaN)."""
    if t.is_floating_point():
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold bitwise the same elements (shape and dtype included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a.detach()), bits(b.detach()))


def kernel_store(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 values ``v`` as a Triton kernel's ``tl.store`` into a ``dtype`` buffer leaves them: rounded to nearest,
    except bf16 under Triton's interpreter, which truncates toward zero (measured with Triton 3.9: 526 of 1024
    uniform values differ from round-to-nearest, every one below it; fp16 stores round to nearest). The emulations
    of vendors' stores in their known divergences use it (Liger's z-loss buffer, TransformerEngine's gradient)."""
    from numcheck.impls import interpreter

    if dtype == torch.bfloat16 and interpreter.active():
        return (v.contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    return v.to(dtype)
