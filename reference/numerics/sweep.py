"""The chunk loop shared by every chunked linear+CE and by numcheck's evaluation of a declared path: one pass over
the token chunks, and what a pass needs.

A chunked impl (:mod:`impls.builtin.chunked`) never forms the [N, V] logits: :func:`sweep` computes them
``chunk_rows`` tokens at a time in the compute dtype, hands each chunk to the plan's CE kernel
(:func:`reference.numerics.ce_block.ce_block_` or the Triton one), and, when gradients are asked for, turns the
chunk (now holding G) into ``grad_x`` rows and ``grad_W``/``grad_b`` contributions through the accumulators it is
given (:class:`reference.numerics.accumulation.Accumulator`). :func:`reduce_rows` turns the per-row parts into the
reduction's loss. The built-ins' whole pass, with their accumulators, is :func:`impls.builtin.chunk_sweep.run_sweep`;
numcheck's evaluation of a declared path (:mod:`numcheck.properties.linear_ce.declared_path`) runs :func:`sweep` itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from numcheck.reference.numerics.accumulation import Accumulator
from numcheck.reference.numerics.ce_block import (
    CEKernel,
    Coefficients,
    SoftmaxStats,
)
from numcheck.reference.options import CEOptions


def autocast_off(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """Autocast disabled for ``device_type`` (a no-op where autocast does not exist, e.g. ``meta``): inside the
    autograd functions every cast is explicit, and fp32 helper matmuls must stay fp32."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Plan:
    """Everything about one call that is not a tensor: options, path, chunking, kernel, compute dtype."""

    options: CEOptions
    path: str
    chunk_rows: int
    kernel: CEKernel
    compute_dtype: torch.dtype


def operands(
    plan: Plan, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``x, weight, bias`` in the compute dtype (no copy when they already are; one [V, H] cast of fp32
    parameters under autocast, as autocast's own linear would make)."""
    c = plan.compute_dtype
    return x.to(c), weight.to(c), bias.to(c) if bias is not None else None


# -- one pass ---------------------------------------------------------------------------------------------
def sweep(
    plan: Plan,
    xc: torch.Tensor,
    wc: torch.Tensor,
    bc: torch.Tensor | None,
    target: torch.Tensor,
    *,
    coef: Coefficients | None = None,
    stats: SoftmaxStats | None = None,
    want_loss: bool = True,
    gx: torch.Tensor | None = None,
    gw: Accumulator | None = None,
    gb: Accumulator | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, SoftmaxStats]:
    """One pass over the token chunks.

    Each chunk's logits are computed in the compute dtype and handed to ``plan.kernel``. With ``coef``, the
    kernel writes G into the chunk and the sweep computes ``gx[chunk] = G·W`` (when ``gx`` is given) and
    accumulates ``gw += Gᵀ·x_c``, ``gb += Σ G`` (accumulators of ``plan.path``, when given). ``stats`` (the rows'
    fp32 (m, log s), ``[N]`` each) are reused instead of recomputed when given. Returns per-row fp32
    ``(ce, z, stats)``; ``ce`` and ``z`` are ``None`` without ``want_loss``. The loop bound is a Python int:
    no host synchronisation.
    """
    o = plan.options
    N = xc.shape[0]
    dev = xc.device
    ce_rows, z_rows, rows = _row_buffers(N, dev, want_loss, stats)
    cc, cz = _gradient_coefficients(coef, N, dev)
    wt = wc.t()
    ones = torch.ones((min(N, plan.chunk_rows), 1), dtype=wc.dtype, device=dev) if gb is not None else None
    for start in range(0, N, plan.chunk_rows):
        r = slice(start, min(N, start + plan.chunk_rows))
        x_r = xc[r]
        logits = torch.mm(x_r, wt) if bc is None else torch.addmm(bc, x_r, wt)
        res = plan.kernel(
            logits,
            target[r],
            cc[r],
            cz[r],
            ignore_index=o.ignore_index,
            label_smoothing=o.label_smoothing,
            class_weights=o.class_weights,
            softcap=o.softcap,
            z_loss_scale=o.z_loss_scale,
            stats=SoftmaxStats(stats.m[r], stats.log_s[r]) if stats is not None else None,
            want_loss=want_loss,
            want_grad=coef is not None,
        )
        if want_loss:
            ce_rows[r] = res.ce  # type: ignore[index]
            z_rows[r] = res.z  # type: ignore[index]
        if stats is None:
            rows.m[r] = res.stats.m
            rows.log_s[r] = res.stats.log_s
        if coef is not None:
            _chunk_gradients(logits, x_r, wc, gx[r] if gx is not None else None, gw, gb, ones)
        del logits, res  # released before the next chunk's logits exist: one [C, V] chunk alive, not two
    return ce_rows, z_rows, rows


def _gradient_coefficients(coef: Coefficients | None, N: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(coef_ce, coef_z)`` for the kernel: the call's, or fp32 zeros on a pass that forms no gradient (the
    kernel takes them either way)."""
    if coef is None:
        zeros = torch.zeros(N, dtype=torch.float32, device=dev)
        return zeros, zeros
    return coef.coef_ce, coef.coef_z


def _row_buffers(
    N: int, dev: torch.device, want_loss: bool, stats: SoftmaxStats | None
) -> tuple[torch.Tensor | None, torch.Tensor | None, SoftmaxStats]:
    """The per-row fp32 outputs :func:`sweep` fills: ``ce`` and ``z`` (``None`` without ``want_loss``), and the
    rows' statistics (``stats`` itself when given, only read then)."""
    f32 = torch.float32
    ce_rows = torch.empty(N, dtype=f32, device=dev) if want_loss else None
    z_rows = torch.empty(N, dtype=f32, device=dev) if want_loss else None
    rows = (
        stats
        if stats is not None
        else SoftmaxStats(torch.empty(N, dtype=f32, device=dev), torch.empty(N, dtype=f32, device=dev))
    )
    return ce_rows, z_rows, rows


def _chunk_gradients(
    G: torch.Tensor,
    x_r: torch.Tensor,
    wc: torch.Tensor,
    gx_r: torch.Tensor | None,
    gw: Accumulator | None,
    gb: Accumulator | None,
    ones: torch.Tensor | None,
) -> None:
    """One chunk's share of the gradients from its G: ``gx_r = G·W`` (the chunk's rows of grad_x), ``gw += Gᵀ·x_r``
    and ``gb += Σ G``, each where its buffer is given."""
    if gx_r is not None:
        torch.mm(G, wc, out=gx_r)
    if gw is not None:
        gw.add_(G, x_r)
    if gb is not None:
        gb.add_(G, ones)


def reduce_rows(
    reduction: str, ce: torch.Tensor, z: torch.Tensor, coef: Coefficients
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, z_loss)`` from per-row fp32 CE parts and z-losses: ``mean`` divides Σ CE by D and Σ z by |M|
    (0/0 = NaN when every row is ignored), ``sum`` adds, ``none`` keeps rows."""
    if reduction == "mean":
        zl = z.sum() / coef.n_valid
        return ce.sum() / coef.D + zl, zl
    if reduction == "sum":
        zl = z.sum()
        return ce.sum() + zl, zl
    return ce + z, z
