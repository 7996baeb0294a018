"""An A/B pair for ``numcheck premerge --impl NEW --base OLD``: a chunked fused linear+cross-entropy whose grad_weight
accumulation a pull request changes, the way the seed's PR did (``examples/numcheck-claims.toml`` states its claims).

``old``: every chunk adds ``torch.mm(Gᵀ, x).float()`` into the fp32 grad_weight buffer: the bf16 product [V, H] and
its fp32 copy exist at once (V·H·(2+4) bytes: 3072 MiB at V=131072, H=4096).

``new``: ``torch.addmm(gw, Gᵀ, x, out_dtype=torch.float32, out=gw)`` where that works — torch ≥ 2.8, a device
whose addmm takes ``out_dtype`` (CUDA; not the CPU, even in 2.13), bf16/fp16 operands into an fp32 buffer — so
nothing of size [V, H] is allocated; everywhere else the unchanged ``mm(...).float()`` line. The gate is the PR's
module-level version constant plus the device's answer to numcheck's ``addmm_out_dtype`` probe (the PR's "is it
CUDA", asked of the device; premerge pins the probe to the CPU's answer when it traces on ``meta``). So on CPU
``new`` takes the old path and saves nothing, which is what premerge measures and the claims file's "everywhere"
claim gets wrong.

Both expose their grad_weight accumulation step as ``accumulation_step(gw, G, x)`` on the wrapped function
(``new.fn.accumulation_step``), so premerge measures the step the claim is about (one chunk's update) on its own:
``step_extra_mib`` in ``numcheck-claims.toml``.

Both declare what they do: bf16 or fp32 inputs (no autocast), ``mean``/``sum``, ``ignore_index``, logits and G in
the compute dtype, 2048-row chunks, grad_weight rounded per chunk (``per_chunk_rounding``: ``old``'s path, and the
looser of ``new``'s two, so ``new``'s declaration is true on every device). Only torch is needed; copy the file
into your repository and run::

    numcheck premerge --impl accumulation_change:new --base accumulation_change:old --claims numcheck-claims.toml
"""

from __future__ import annotations

import torch
from packaging.version import Version

from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.linear_ce import linear_ce_impl

CHUNK_ROWS = 2048
#: ``addmm(..., out_dtype=)`` exists from torch 2.8 (checked once, at import).
_ADDMM_SUPPORTS_OUT_DTYPE = Version(Version(torch.__version__).base_version) >= Version("2.8")
_LOW = (torch.bfloat16, torch.float16)


def accumulate_old(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor) -> None:
    """``gw += mm(Gᵀ, x).float()``: the product in the operands' dtype, then an fp32 copy of it."""
    gw += torch.mm(G.t(), x).float()


def accumulate_new(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor) -> None:
    """``addmm(out_dtype=float32, out=gw)`` with torch ≥ 2.8 on a device that supports it (CUDA) and low-precision
    operands; else the old line."""
    if (
        _ADDMM_SUPPORTS_OUT_DTYPE
        and gw.dtype == torch.float32
        and G.dtype in _LOW
        and capabilities.addmm_out_dtype(gw.device.type, G.dtype)
    ):
        torch.addmm(gw, G.t(), x.to(G.dtype), out_dtype=torch.float32, out=gw)
    else:
        accumulate_old(gw, G, x)


class _ChunkedLinearCE(torch.autograd.Function):
    """Every gradient formed in forward, chunk by chunk; backward scales them by the upstream scalar."""

    @staticmethod
    def forward(ctx, x, weight, target, reduction, ignore_index, accumulate):
        N, H = x.shape
        V = weight.shape[0]
        valid = target != ignore_index
        count = valid.sum().to(torch.float32)
        gx = torch.empty_like(x)
        gw = torch.zeros(V, H, dtype=torch.float32, device=x.device)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        for s in range(0, N, CHUNK_ROWS):
            xc, tc, vc = x[s : s + CHUNK_ROWS], target[s : s + CHUNK_ROWS], valid[s : s + CHUNK_ROWS]
            logits = (xc @ weight.t()).float()  # [C, V] in the compute dtype, then fp32 math
            lse = torch.logsumexp(logits, dim=-1)
            idx = torch.where(vc, tc, torch.zeros_like(tc))[:, None]
            total += ((lse - logits.gather(1, idx)[:, 0]) * vc).sum()
            G = torch.exp(logits.sub_(lse[:, None]))  # softmax, in place of the logits
            G.scatter_add_(1, idx, -torch.ones_like(idx, dtype=G.dtype))
            G *= vc[:, None]
            if reduction == "mean":
                G /= count.clamp_min(1)  # all rows ignored: zero gradients, NaN loss (0/0), as PyTorch
            G = G.to(x.dtype)
            gx[s : s + CHUNK_ROWS] = G @ weight
            accumulate(gw, G, xc)
        loss = total / count if reduction == "mean" else total
        ctx.save_for_backward(gx)
        ctx.gw, ctx.w_dtype = gw, weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        (gx,) = ctx.saved_tensors
        gw, ctx.gw = ctx.gw, None
        g = grad.to(torch.float32)
        return gx.float().mul_(g).to(gx.dtype), gw.mul_(g).to(ctx.w_dtype), None, None, None, None


_DECLARATION = dict(
    dtypes=("float32", "bfloat16"),
    autocast=(),
    options=("ignore_index",),
    reductions=("mean", "sum"),
    logits_dtype="compute",
    all_ignored="nan",
    grad_accumulation="per_chunk_rounding",
    chunk_rows=CHUNK_ROWS,
)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dtype != weight.dtype:
        raise ValueError(f"x is {x.dtype} but weight is {weight.dtype}; they must agree")


@linear_ce_impl(name="flce_mm_float", **_DECLARATION)
def old(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """Chunked FLCE, grad_weight += mm(Gᵀ, x).float() per chunk (the code before the change)."""
    _check(x, weight)
    return _ChunkedLinearCE.apply(x, weight, target, reduction, ignore_index, accumulate_old)


@linear_ce_impl(name="flce_addmm_out_dtype", **_DECLARATION)
def new(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """Chunked FLCE, grad_weight by addmm(out_dtype=float32, out=gw) where supported (the change)."""
    _check(x, weight)
    return _ChunkedLinearCE.apply(x, weight, target, reduction, ignore_index, accumulate_new)


# The grad_weight accumulation step of each side, for premerge's step-level memory metric (docs/premerge-ab.md).
old.fn.accumulation_step = accumulate_old
new.fn.accumulation_step = accumulate_new
