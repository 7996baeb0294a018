"""numcheck's own evaluation of linear+CE along the path a declaration states: the yardstick of judgement (b) for
an output an impl declares coarser than eager keeps it (:mod:`numcheck.properties.linear_ce.accuracy`), and for every
output of a vocabulary-parallel impl (:mod:`numcheck.properties.distributed.linear_ce.yardstick`).

An honest implementation of a declaration rounds where the declaration says it may, and nowhere else. This module
is one, built from the numerics the chunked built-ins are made of (:mod:`numcheck.reference.numerics.sweep`,
:mod:`numcheck.reference.numerics.ce_block`, :mod:`numcheck.reference.numerics.accumulation`):

* logits ``x·Wᵀ + b`` in the compute dtype (``logits_dtype="compute"``: one rounding, as a low-precision matmul
  stores them) or in fp32 (``"float32"``: the operands' values multiplied and kept in fp32);
* the softmax, the loss and the gradient G of the logits in fp32 math
  (:func:`~numcheck.reference.numerics.ce_block.ce_block_`), G written back in the logits' dtype (the chunked
  built-ins' contract), with the reduction's coefficients and the upstream gradient;
* grad_W and grad_b over ``chunk_rows`` row chunks through the accumulator of the declared ``grad_accumulation``
  (``fp32``: an fp32 buffer; ``per_chunk_rounding``: each chunk's product rounded to the operands' dtype, then
  added in fp32; ``param_dtype``: the running sum rounded to the parameter's dtype after every chunk), one chunk
  per row where no ``chunk_rows`` is declared (the tolerance model's K = N);
* grad_x = G·W over vocabulary parts: the declared ``grad_x_accumulation`` over ``chunk_cols`` classes (one class a
  part where none is declared), or, for a vocabulary-parallel impl, the ranks' shards: each partial formed in
  the logits' dtype (fp32 partials where the reduction is declared in fp32), rounded to the reduce dtype and
  summed in it in rank order, then rounded to x's dtype;
* under ``upstream="loss_scale"``: every gradient formed before the scale is known and multiplied by it afterwards
  in fp32 (one rounding), as a fused forward does: what underflows before the scale stays lost.

Every rounding above is one an impl of the declaration may make; none is one it may not. Where a declaration
promises fp32 (logits, a reduction) the yardstick keeps fp32 there, so it is held to that promise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from numcheck.properties.linear_ce.cases import Problem, Tensors

#: The accumulation path (:data:`numcheck.reference.numerics.accumulation.PATH_NAMES`) that implements each declared
#: accumulation (none of them asks a capability probe).
PATH_OF: dict[str, str] = {"fp32": "fp32_operands", "per_chunk_rounding": "fallback", "param_dtype": "lowp_accum"}


@dataclass(frozen=True)
class DeclaredPath:
    """The parts of a declaration the yardstick follows (see the module docstring).

    ``grad_x_parts``: the vocabulary parts ``(start, stop)`` grad_x is summed over (``None``: one fp32-accumulated
    matmul);
    ``grad_x_path``: how the parts are added (a key of :data:`PATH_OF`, single-device) or ``None`` with
    ``reduce_dtype`` set (vocabulary-parallel: partials rounded to ``reduce_dtype`` and summed in it)."""

    logits_fp32: bool
    grad_accumulation: str
    chunk_rows: int
    grad_x_parts: tuple[tuple[int, int], ...] | None = None
    grad_x_path: str | None = None
    reduce_dtype: torch.dtype | None = None
    returns_z_loss: bool = False

    def describe(self) -> str:
        """A few words naming the path, for failure lines."""
        parts = [
            f"{'fp32' if self.logits_fp32 else 'compute-dtype'} logits",
            f"grad_W {self.grad_accumulation} over {self.chunk_rows}-row chunks",
        ]
        if self.reduce_dtype is not None:
            parts.append(
                f"grad_x partials of {len(self.grad_x_parts or ())} shards reduced in "
                f"{str(self.reduce_dtype).replace('torch.', '')}"
            )
        elif self.grad_x_path is not None:
            parts.append(f"grad_x {self.grad_x_path} over {len(self.grad_x_parts or ())} vocabulary chunks")
        return "the declared path (" + ", ".join(parts) + ")"


def single_device_path(support: Any, p: Problem) -> DeclaredPath:
    """The :class:`DeclaredPath` of a single-device declaration ``support`` on ``p``."""
    x_path = getattr(support, "grad_x_accumulation", "fp32")
    parts = None
    if x_path != "fp32":
        cols = getattr(support, "chunk_cols", None) or 1
        parts = tuple((s, min(p.V, s + cols)) for s in range(0, p.V, cols))
    # Under autocast the gradient matmuls return the compute dtype: at least one rounding per chunk, whatever the
    # declared path (the tolerance model's reading, :func:`numcheck.properties.linear_ce.tolerance.error_model`).
    amp_rounds = p.autocast is not None and support.grad_accumulation == "fp32"
    return DeclaredPath(
        logits_fp32=getattr(support, "logits_dtype", "compute") == "float32",
        grad_accumulation="per_chunk_rounding" if amp_rounds else support.grad_accumulation,
        chunk_rows=getattr(support, "chunk_rows", None) or 1,
        grad_x_parts=parts,
        grad_x_path=x_path if parts is not None else None,
        returns_z_loss=bool(getattr(support, "returns_z_loss", False)),
    )


class _Capture:
    """A stand-in grad_W accumulator for :func:`~numcheck.reference.numerics.sweep.sweep`: it keeps each chunk's
    G (the logits chunk after the CE kernel) instead of adding it up."""

    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []

    def add_(self, G: torch.Tensor, x: torch.Tensor | None = None) -> None:
        self.chunks.append(G.clone())


def _accumulate(
    path: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    pieces: Sequence[tuple[torch.Tensor, Any]],
    device: torch.device,
    scale: torch.Tensor | None,
) -> torch.Tensor:
    """Σ of ``Gᵀ·x`` over ``pieces`` through the accumulator of ``path`` (the built-ins' buffer and step), finished
    (times ``scale``, in fp32, when given) in ``dtype``."""
    from numcheck.reference.numerics import accumulation

    name = PATH_OF[path]
    acc = accumulation.BufferAccumulator(name, accumulation.PROBE_FREE_STEPS[name], shape, dtype, device)
    for G, x in pieces:
        acc.add_(G, x)
    return acc.finish(scale, dtype)


def _grad_x(
    path: DeclaredPath, G: torch.Tensor, wc: torch.Tensor, x_dtype: torch.dtype, scale: torch.Tensor | None
) -> torch.Tensor:
    """grad_x = G·W along ``path`` (module docstring), in x's dtype (times ``scale`` afterwards, when given)."""
    from numcheck.reference.numerics.accumulation import scaled_

    if path.grad_x_parts is None:
        gx = torch.mm(G, wc.to(G.dtype))
        return scaled_(gx, scale, x_dtype) if scale is not None else gx.to(x_dtype)
    if path.reduce_dtype is None:  # single device: vocabulary chunks through the declared accumulator
        pieces = [(G[:, a:b].t(), wc[a:b]) for a, b in path.grad_x_parts]
        return _accumulate(
            path.grad_x_path or "fp32", tuple(G.shape[:1]) + tuple(wc.shape[1:]), x_dtype, pieces, G.device, scale
        )
    form = torch.float32 if path.reduce_dtype == torch.float32 else G.dtype
    total = None
    for a, b in path.grad_x_parts:  # rank order, each partial rounded to the reduce dtype, summed in it
        part = torch.mm(G[:, a:b].to(form), wc[a:b].to(form)).to(path.reduce_dtype)
        total = part if total is None else total + part
    assert total is not None
    return scaled_(total, scale, x_dtype) if scale is not None else total.to(x_dtype)


def declared_path_outputs(path: DeclaredPath, p: Problem, t: Tensors) -> dict[str, torch.Tensor]:
    """``loss`` (and ``z_loss``), ``grad_x``, ``grad_weight`` and ``grad_bias`` of ``p``'s tensors ``t`` evaluated along
    ``path`` (module docstring), each in the dtype that path returns it in."""
    from numcheck.properties.linear_ce.harness import oracle_operands
    from numcheck.reference.numerics.ce_block import ce_block_, reduction_coefficients, row_weights
    from numcheck.reference.numerics.sweep import Plan, autocast_off, reduce_rows, sweep

    x, w, b = oracle_operands(p, t)  # the values the matmuls see (rounded to the autocast dtype under AMP)
    logits_dtype = torch.float32 if path.logits_fp32 else p.compute_dtype
    xc, wc = x.to(logits_dtype), w.to(logits_dtype)
    bc = b.to(logits_dtype) if b is not None else None
    o = t.options
    scale_after = p.upstream == "loss_scale"
    valid, _, w_t = row_weights(t.target, o.class_weights, o.ignore_index)
    coef = reduction_coefficients(valid, w_t, o.reduction, upstream=None if scale_after else t.upstream)
    plan = Plan(options=o, path="fp32_operands", chunk_rows=max(1, p.N), kernel=ce_block_, compute_dtype=logits_dtype)
    cap = _Capture()
    with autocast_off(x.device.type), torch.no_grad():
        ce, z, _ = sweep(plan, xc, wc, bc, t.target, coef=coef, gw=cap)
        loss, z_loss = reduce_rows(o.reduction, ce, z, coef)  # type: ignore[arg-type]
        G = cap.chunks[0] if cap.chunks else torch.zeros(0, p.V, dtype=logits_dtype)
        rows = [slice(s, min(p.N, s + path.chunk_rows)) for s in range(0, p.N, path.chunk_rows)]
        # A declared rounding per chunk is one of the compute dtype (the model's u_c): G enters those products there.
        Gw = G if path.grad_accumulation == "fp32" else G.to(p.compute_dtype)
        xw = xc if path.grad_accumulation == "fp32" else xc.to(p.compute_dtype)
        g = t.upstream.to(torch.float32) if scale_after and t.upstream is not None else None
        out = {
            "loss": loss,
            "grad_x": _grad_x(path, G, wc, t.x.dtype, g),
            "grad_weight": _accumulate(
                path.grad_accumulation,
                tuple(t.weight.shape),
                t.weight.dtype,
                [(Gw[r], xw[r]) for r in rows],
                x.device,
                g,
            ),
        }
        if t.bias is not None:
            ones = torch.ones((p.N, 1), dtype=Gw.dtype, device=G.device)
            out["grad_bias"] = _accumulate(
                path.grad_accumulation, tuple(t.bias.shape), t.bias.dtype, [(Gw[r], ones[r]) for r in rows], x.device, g
            )
        if path.returns_z_loss:
            out["z_loss"] = z_loss
    return out


def path_errors(path: DeclaredPath, p: Problem, t: Tensors, oracle: Any) -> dict[str, tuple[float, torch.dtype]]:
    """RMSE of :func:`declared_path_outputs` against ``oracle`` per output, with the dtype it comes back in (the
    yardstick's errors, as :func:`numcheck.properties.linear_ce.accuracy.eager_errors` gives eager's)."""
    got = declared_path_outputs(path, p, t)
    res = {}
    for name, v in got.items():
        ref = getattr(oracle, name, None)
        if ref is None:
            continue
        res[name] = (float((v.to(torch.float64) - ref).nan_to_num(0.0).square().mean().sqrt()), v.dtype)
    return res
