"""Chunked fused linear + cross-entropy (the Liger design), registered once per grad_weight accumulation path.

Forward loops over chunks of ``chunk_rows`` tokens. For each chunk it computes the logits ``x_c·Wᵀ + b`` in
the compute dtype (the autocast dtype under AMP, else the inputs' dtype), runs cross-entropy on them in fp32
math (:func:`reference.numerics.ce_block.ce_block_`, or the Triton kernel of :mod:`impls.builtin.triton_ce`),
which overwrites the chunk with the gradient G, and then at once computes ``grad_x_c = G·W`` and accumulates
``grad_W += Gᵀ·x_c``, ``grad_b += Σ G`` through the chosen step of :mod:`impls.builtin.grad_accum`. The [N, V] logits
never exist; the [V, H] grad_W accumulator is held from forward to backward, and backward only multiplies
the stored gradients by the scalar ``grad_output`` (``mean``/``sum``).

``reduction='none'``: the per-row upstream gradient u must scale the rows of G *before* the matmuls
(grad_W = Gᵀ·diag(u)·x cannot be recovered from Gᵀ·x), and u is unknown during forward. So for ``none`` this
impl defers all gradient work to backward: forward computes the per-row losses and softmax statistics only,
backward recomputes the logits chunk by chunk with the coefficients c_i = u_i and accumulates through the same
path (:class:`impls.builtin.recompute.RecomputeFunction`, the ``recompute`` algorithm). Exact; costs 8·N·H·V flops
instead of 6·N·H·V, and holds only O(N) between forward and backward.

Conventions declared by every impl here:

* all-ignored ``mean``: PyTorch's (NaN loss = 0/0, zero gradients); ``sum``/``none`` give 0.
* the loss (and z_loss) is returned in fp32, whatever the compute dtype; gradients in the dtype of the
  tensor they belong to (``x``, ``weight``, ``bias``), also under autocast with fp32 parameters and a bias
  of another dtype. The call returns ``(loss, z_loss)`` (z_loss reduced like loss, not differentiable).
* G is rounded to the compute dtype before the grad_x/grad_W matmuls (``logits_dtype="compute"``).
* no host synchronisation inside the chunk loop (targets are range-checked once per call: a ValueError on
  CPU, a device-side assert elsewhere).
* ``mean``/``sum`` backward scales the stored gradients in place (no [V, H] temporary), so it may run once
  per graph: a second backward with ``retain_graph=True`` raises (``recompute`` and ``none`` have no such
  limit).

Default chunk: :data:`DEFAULT_CHUNK_ROWS` = 2048 tokens, the chunk of the seed's measurement. At V=131072 a
bf16 logits chunk is 512 MiB and the torch CE path's fp32 working copies about 1 GiB each, comfortable on an
80–141 GiB GPU, while few chunks keep the per-chunk read-modify-write of the fp32 [V, H] accumulator cheap
(``docs/accumulation-and-memory.md``). Tests pick small chunks with :meth:`ChunkedLinearCE.with_chunk_rows`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from numcheck.impls.builtin.chunk_sweep import run_sweep
from numcheck.impls.builtin.recompute import RecomputeFunction
from numcheck.impls.protocols.linear_ce import FLOAT_DTYPES, LINEAR_CE_KIND, LinearCESupport
from numcheck.reference.numerics import accumulation
from numcheck.reference.numerics.ce_block import CEKernel, ce_block_
from numcheck.reference.numerics.sweep import Plan, autocast_off, reduce_rows
from numcheck.reference.options import CEOptions, options_from_kwargs

DEFAULT_CHUNK_ROWS = 2048


# -- the call -------------------------------------------------------------------------------------------
def compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the matmuls run in: the autocast dtype when autocast is on for ``x``'s device, else the
    inputs' dtype (``x`` and ``weight`` must then agree)."""
    dev = x.device.type
    if torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    if x.dtype != weight.dtype:
        raise ValueError(f"x has dtype {x.dtype} but weight has {weight.dtype}; outside autocast they must agree")
    return x.dtype


def check_call(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None, opts: CEOptions
) -> None:
    """Validate shapes and dtypes (metadata only), and the target range once per call: a ValueError naming
    the row on CPU, a device-side assert on accelerators (no host synchronisation), nothing on ``meta``."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t))}")
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    N, H = x.shape
    V, H2 = weight.shape
    if H != H2:
        raise ValueError(f"x has H={H} columns but weight has {H2} (weight must be [V, H])")
    if not isinstance(target, torch.Tensor) or tuple(target.shape) != (N,):
        raise ValueError(f"target must have shape [N]=[{N}], got {getattr(target, 'shape', type(target))}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(f"target must hold integer class indices, got dtype {target.dtype}")
    if bias is not None and (tuple(bias.shape) != (V,) or bias.dtype not in FLOAT_DTYPES):
        raise ValueError(f"bias must be a float tensor of shape [V]=[{V}], got {tuple(bias.shape)} {bias.dtype}")
    cw = opts.class_weights
    if cw is not None and tuple(cw.shape) != (V,):
        raise ValueError(f"class_weights must have shape [V]=[{V}], got {tuple(cw.shape)}")
    for name, t in (("weight", weight), ("target", target), ("bias", bias), ("class_weights", cw)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    bad = (target != opts.ignore_index) & ((target < 0) | (target >= V))
    if target.device.type == "cpu":
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"target[{i}]={int(target[i])} is outside [0, V={V}) and is not ignore_index={opts.ignore_index}"
            )
    elif target.device.type != "meta":
        torch._assert_async(~bad.any(), f"target outside [0, V={V}) and not ignore_index={opts.ignore_index}")


# -- the fused autograd function --------------------------------------------------------------------------
class FusedFunction(torch.autograd.Function):
    """``mean``/``sum``: every gradient computed during forward, scaled by the scalar grad_output in backward."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor, plan: Plan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        o = plan.options
        if o.reduction == "none":
            raise ValueError("FusedFunction handles reduction 'mean' and 'sum'; 'none' is deferred (RecomputeFunction)")
        with autocast_off(x.device.type):
            res = run_sweep(plan, x, weight, bias, target, needs=tuple(ctx.needs_input_grad[:3]))
            loss, z_loss = reduce_rows(o.reduction, res.ce, res.z, res.coef)  # type: ignore[arg-type]
        grads = res.grads  # never None: needs was given
        ctx.save_for_backward(grads.x)  # type: ignore[union-attr]
        ctx.accumulators = (grads.weight, grads.bias)  # type: ignore[union-attr]  # not tensors: released with ctx
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.mark_non_differentiable(z_loss)
        return loss, z_loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, grad_z: torch.Tensor | None):  # type: ignore[override]
        if getattr(ctx, "consumed", False):
            raise RuntimeError(
                "the fused chunked linear+CE backward ran twice on one graph: its stored gradients are "
                "scaled in place by the first backward (retain_graph=True is not supported; use the "
                "'recompute' impl for that)"
            )
        ctx.consumed = True
        (gx,) = ctx.saved_tensors
        gw, gb = ctx.accumulators
        ctx.accumulators = (None, None)
        dx, dw, db = ctx.dtypes
        g = grad_loss.to(torch.float32)
        with autocast_off(grad_loss.device.type):
            return (
                accumulation.scaled_(gx, g, dx) if gx is not None else None,
                gw.finish(g, dw) if gw is not None else None,
                gb.finish(g, db) if gb is not None else None,
                None,
                None,
            )


# -- the impl object --------------------------------------------------------------------------------------
class ChunkedLinearCE:
    """A chunked linear+CE impl following :mod:`impls.protocols.linear_ce`.

    Args:
        name: registered name.
        path: grad_weight accumulation path, a key of :data:`numcheck.reference.numerics.accumulation.ALL_PATHS`.
        chunk_rows: tokens per chunk (>= 1).
        kernel: the per-chunk CE (:func:`reference.numerics.ce_block.ce_block_` or the Triton one).
        recompute: defer every gradient to backward for every reduction (the ``recompute`` impl); otherwise
            only ``none`` is deferred.
        support: the declaration (``chunk_rows`` and ``grad_accumulation`` are filled in here).
        description: one line for listings.
    """

    kind = LINEAR_CE_KIND

    def __init__(
        self,
        name: str,
        *,
        path: str,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        kernel: CEKernel = ce_block_,
        recompute: bool = False,
        support: LinearCESupport | None = None,
        description: str = "",
    ) -> None:
        if path not in accumulation.ALL_PATHS:
            raise ValueError(f"path must be one of {sorted(accumulation.ALL_PATHS)}, got {path!r}")
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ValueError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
        base = support if support is not None else LinearCESupport(returns_z_loss=True, all_ignored="nan")
        self.name = name
        self.path = path
        self.chunk_rows = chunk_rows
        self.kernel = kernel
        self.recompute = recompute
        self.description = description
        self.support = dataclasses.replace(
            base, chunk_rows=chunk_rows, grad_accumulation=accumulation.GRAD_ACCUMULATION[path]
        )  # type: ignore[arg-type]

    def with_chunk_rows(self, n: int) -> "ChunkedLinearCE":
        """A copy with ``n`` tokens per chunk (same name, path, kernel and declaration otherwise)."""
        return ChunkedLinearCE(
            self.name,
            path=self.path,
            chunk_rows=n,
            kernel=self.kernel,
            recompute=self.recompute,
            support=self.support,
            description=self.description,
        )

    def __repr__(self) -> str:
        return f"ChunkedLinearCE({self.name!r}, path={self.path!r}, chunk_rows={self.chunk_rows})"

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
        **options: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, z_loss)`` of linear + CE (see the module docstring for conventions)."""
        opts = options_from_kwargs(**options)
        check_call(x, weight, target, bias, opts)
        plan = Plan(
            options=opts,
            path=self.path,
            chunk_rows=self.chunk_rows,
            kernel=self.kernel,
            compute_dtype=compute_dtype(x, weight),
        )
        if self.recompute or opts.reduction == "none":
            return RecomputeFunction.apply(x, weight, bias, target, plan)
        return FusedFunction.apply(x, weight, bias, target, plan)


def chunked(path: str, *, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> ChunkedLinearCE:
    """The built-in ``chunked[<path>]`` impl."""
    return ChunkedLinearCE(
        f"chunked[{path}]",
        path=path,
        chunk_rows=chunk_rows,
        description=f"chunked FLCE (Liger design, torch CE), grad_weight via {path}",
    )


def chunked_impls() -> list[ChunkedLinearCE]:
    """``chunked[addmm_out_dtype]``, ``chunked[fallback]``, ``chunked[fp32_operands]``, ``chunked[lowp_accum]``."""
    return [chunked(p) for p in ("addmm_out_dtype", "fallback", "fp32_operands", "lowp_accum")]


def recompute(*, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> ChunkedLinearCE:
    """The built-in ``recompute`` impl (:class:`impls.builtin.recompute.RecomputeFunction` for every reduction)."""
    return ChunkedLinearCE(
        "recompute",
        path="addmm_out_dtype",
        chunk_rows=chunk_rows,
        recompute=True,
        description="forward keeps x, W, target, bias and per-row (max, log-sum); backward recomputes the logits chunk by chunk",
    )


def recompute_impls() -> list[ChunkedLinearCE]:
    """``recompute``."""
    return [recompute()]
