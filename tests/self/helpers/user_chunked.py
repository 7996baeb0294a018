"""Chunked linear+CE impls written and declared as the README tells a user to: ``@numcheck.linear_ce_impl`` and
nothing else (no ``with_chunk_rows``, no other numcheck-specific method), each with its chunk size declared either
as ``chunk_rows`` or as a ``chunk_rule`` of the shapes.

Every impl here is one kernel: logits of each chunk in the input dtype then fp32, softmax and the gradient of the
logits in fp32, that gradient rounded to the input dtype, and each chunk's grad_weight product (rounded to the
input dtype by its matmul) added into a running sum across the chunks; each declares
``grad_accumulation="per_chunk_rounding"`` (the running sum in fp32). The twins differ in that running sum only:

* ``fp32_sum_*``: kept in fp32, as declared: correct.
* ``bf16_sum_*`` (declaring fp32 and bf16) and ``fp16_sum_*`` (fp32 and fp16): kept in the input's dtype, so a
  bf16 or fp16 call rounds it after every chunk (an fp32 call keeps it in fp32): the defect of a narrow
  accumulator across chunks, which shows only over many chunks.

Module-level names (``--impl numcheck.tests.self.helpers.user_chunked:<name>``): ``<sum>_c<rows>`` for each chunk
size of :data:`CHUNK_SIZES`, and ``<sum>_rule`` for the rule :func:`about_v_over_h_chunks` (Liger-Kernel's).
tests/self/reports/test_chunk_reach.py runs the plugin suite on them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

import numcheck

#: The declared chunk sizes the impls come in.
CHUNK_SIZES: tuple[int, ...] = (7, 64, 1024)
#: The running sum's dtype of each variant: ``None`` keeps it in fp32, ``"input"`` in the input's dtype.
SUMS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "fp32_sum": (None, ("float32", "bfloat16", "float16")),
    "bf16_sum": ("input", ("float32", "bfloat16")),
    "fp16_sum": ("input", ("float32", "float16")),
}


def about_v_over_h_chunks(N: int, H: int, V: int) -> int:
    """Rows per chunk so that one chunk's logits take about as much memory as the [N, H] input: ⌈N / ⌈V/H⌉⌉
    rounded up to a power of two (Liger-Kernel's rule), so about ⌈V/H⌉ chunks."""
    rows = -(-N // -(-V // H))
    return 1 << (rows - 1).bit_length()


class _ChunkedCE(torch.autograd.Function):
    """The loss in forward, chunk by chunk; the gradients in backward, recomputing each chunk's logits."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        target: torch.Tensor,
        reduction: str,
        ignore_index: int,
        rows: int,
        narrow_sum: bool,
    ) -> torch.Tensor:
        valid = target != ignore_index
        losses = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
        for s in range(0, x.shape[0], rows):
            z = F.linear(x[s : s + rows], weight, bias).float()
            t = target[s : s + rows].clamp(0, weight.shape[0] - 1)
            row = torch.logsumexp(z, dim=1) - z.gather(1, t[:, None]).squeeze(1)
            losses[s : s + rows] = torch.where(valid[s : s + rows], row, 0.0)
        ctx.save_for_backward(x, weight, bias, target)
        ctx.options = (reduction, ignore_index, rows, narrow_sum)
        if reduction == "none":
            return losses
        return losses.sum() / valid.sum() if reduction == "mean" else losses.sum()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        x, weight, bias, target = ctx.saved_tensors
        reduction, ignore_index, rows, narrow_sum = ctx.options
        valid = target != ignore_index
        per_row = g / valid.sum() if reduction == "mean" else g
        scale = torch.where(valid, per_row, 0.0).float().expand(x.shape[0])
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx = torch.empty_like(x) if need_x else None
        gw = torch.zeros(weight.shape, dtype=x.dtype if narrow_sum else torch.float32, device=x.device)
        gb = torch.zeros(weight.shape[0], dtype=torch.float32, device=x.device)
        for s in range(0, x.shape[0], rows):
            xc, c = x[s : s + rows], scale[s : s + rows]
            p = torch.softmax(F.linear(xc, weight, bias).float(), dim=1)
            t = target[s : s + rows].clamp(0, weight.shape[0] - 1)
            p = p - F.one_hot(t, weight.shape[0]).float()
            G = (p * c[:, None]).to(x.dtype)  # the gradient of the logits, in the input dtype
            if need_x:
                gx[s : s + rows] = G @ weight
            if need_w:
                gw += G.t() @ xc  # the chunk's product, rounded to the input dtype, into the running sum
            if need_b and bias is not None:
                gb += G.sum(0)
        return (
            gx,
            gw.to(weight.dtype) if need_w else None,
            gb.to(bias.dtype) if need_b and bias is not None else None,
            None,
            None,
            None,
            None,
            None,
        )


def _declared(
    name: str,
    sum_dtype: str | None,
    dtypes: tuple[str, ...],
    rows: int | None = None,
    rule: Callable[[int, int, int], int] | None = None,
) -> Any:
    """One impl, declared with the decorator: ``chunk_rows=rows`` or ``chunk_rule=rule``."""
    chunking: dict[str, Any] = {"chunk_rows": rows} if rows is not None else {"chunk_rule": rule}

    @numcheck.linear_ce_impl(
        name=name,
        dtypes=dtypes,
        options=("bias", "ignore_index"),
        autocast=(),
        all_ignored="nan",
        grad_accumulation="per_chunk_rounding",
        **chunking,
    )
    def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
        """Chunked linear+CE: logits per chunk in the input dtype then fp32, grad_weight summed across chunks."""
        size = rows if rows is not None else rule(x.shape[0], x.shape[1], weight.shape[0])
        return _ChunkedCE.apply(x, weight, bias, target, reduction, ignore_index, size, sum_dtype is not None)

    return impl


for _sum, (_dtype, _dtypes) in SUMS.items():
    for _rows in CHUNK_SIZES:
        globals()[f"{_sum}_c{_rows}"] = _declared(f"user_chunked[{_sum},c={_rows}]", _dtype, _dtypes, rows=_rows)
    globals()[f"{_sum}_rule"] = _declared(f"user_chunked[{_sum},rule]", _dtype, _dtypes, rule=about_v_over_h_chunks)
