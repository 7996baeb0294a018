"""The four grad_weight accumulation steps of a chunked linear+CE, one function per path.

A chunked FLCE accumulates ``grad_W = Σ_chunks G_cᵀ·x_c`` into a ``[V, H]`` buffer ``gw``. Each step here is
``step(gw, G_chunk, x_chunk) -> None``: it adds ``G_chunkᵀ·x_chunk`` (``G_chunk`` ``[C, V]``, ``x_chunk``
``[C, H]``) into ``gw`` in place, with no host synchronisation. The same steps accumulate ``grad_b`` when
called with ``x_chunk`` a ``[C, 1]`` column of ones (see :func:`accumulate_bias`).

Paths (``docs/accumulation-and-memory.md``; the extra peak is for one chunk with bf16 operands and
an fp32 ``gw``, V=131072, H=4096, C=2048):

``addmm_out_dtype``
    ``torch.addmm(gw, Gᵀ, x, out_dtype=float32, out=gw)``: low-precision multiply, fp32 accumulation straight
    into ``gw``; extra peak 0. ``out=`` ops are not autocast, so both operands are aligned by hand to one
    low-precision dtype (:func:`operand_dtype`). Used only where
    :func:`impls.measure.capabilities.addmm_out_dtype` says it works for that device and dtype; elsewhere (CPU,
    torch < 2.8, fp32 operands) the step runs the ``fp32_operands`` path instead, so the path's declared
    fp32 accumulation stays true. :func:`resolved_path` says which one runs. On the ``meta`` device the probe
    cannot check values and answers False; measure this path there under
    ``capabilities.forced(addmm_out_dtype=True)``.
``fallback``
    ``gw += torch.mm(Gᵀ, x).float()``: the product is rounded to the operand dtype once per chunk, then added
    in fp32 (grad_accumulation ``"per_chunk_rounding"``); extra peak V·H·(2+4) bytes = 3072 MiB.
``fp32_operands``
    ``torch.addmm(gw, Gᵀ.float(), x.float(), out=gw)``: fp32 multiply and accumulation; extra peak the two
    casts, V·C·4 + C·H·4 bytes = 1056 MiB.
``lowp_accum``
    ``torch.addmm(gw, Gᵀ, x, out=gw)`` with ``gw`` in the parameter dtype (Liger's ``accum_dtype=None``): the
    running sum is rounded to that dtype after every chunk (grad_accumulation ``"param_dtype"``). Operands
    are aligned to ``gw``'s dtype.
``split_fp32``
    Not a step on a buffer: an :class:`Accumulator` (:func:`make_accumulator`) holding the exact fp32 sum as
    the bf16 gradient's storage plus an int16 lower half, added to by one Triton GEMM per chunk
    (:mod:`impls.builtin.split_accum`); extra V·H·2 bytes in all = 1024 MiB, instead of an fp32 buffer's 2048 MiB.
    Declares ``"fp32"``. For parameters that are not bf16, and for biases, it is the ``addmm_out_dtype``
    buffer.

The chunked impls hold their gradients in :class:`Accumulator` objects (:func:`make_accumulator`), which
pair a buffer with its step and finish it into the gradient (:func:`scaled_`, one rounding).

With fp32 operands (no low-precision dtype among ``G_chunk``/``x_chunk``) every path is the plain fp32
``torch.addmm(gw, Gᵀ, x, out=gw)``.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from numcheck.impls.measure import capabilities
from numcheck.impls.builtin.split_accum import SplitAccumulator

#: Low-precision dtypes a matmul operand may have.
LOW_PRECISION: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def _check(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor, *, fp32_gw: bool) -> None:
    """Shape/dtype checks (metadata only: no host sync)."""
    for name, t in (("gw", gw), ("G_chunk", G), ("x_chunk", x)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
            raise ValueError(
                f"{name} must be a 2-D floating tensor, got {getattr(t, 'shape', type(t))} {getattr(t, 'dtype', '')}"
            )
    if G.shape[0] != x.shape[0]:
        raise ValueError(f"G_chunk has {G.shape[0]} rows but x_chunk has {x.shape[0]} (both must be [C, ...])")
    if tuple(gw.shape) != (G.shape[1], x.shape[1]):
        raise ValueError(
            f"gw has shape {tuple(gw.shape)}; expected [V, H] = [{G.shape[1]}, {x.shape[1]}] "
            "from G_chunk [C, V] and x_chunk [C, H]"
        )
    if fp32_gw and gw.dtype != torch.float32:
        raise ValueError(f"gw must be float32 for an fp32-accumulating path, got {gw.dtype}")


def operand_dtype(G: torch.Tensor, x: torch.Tensor) -> torch.dtype:
    """The one dtype both matmul operands are aligned to: ``G``'s if low precision, else ``x``'s if low
    precision, else float32. (Under AMP ``G`` is in the autocast dtype while ``x`` may be an fp32 param.)"""
    if G.dtype in LOW_PRECISION:
        return G.dtype
    if x.dtype in LOW_PRECISION:
        return x.dtype
    return torch.float32


def resolved_path(path: str, device: str | torch.device, dtype: torch.dtype) -> str:
    """The name of the path that actually runs when ``path`` is asked for with operands of ``dtype`` on
    ``device``: ``addmm_out_dtype`` becomes ``fp32_operands`` where the capability probe says no or the
    operands are not low precision; ``fallback`` becomes ``fp32_operands`` for fp32 operands (the same
    plain fp32 addmm); the others run as named."""
    if path not in PATHS:
        raise ValueError(f"unknown grad_weight accumulation path {path!r}; known: {sorted(PATHS)}")
    if path in ("addmm_out_dtype", "fallback") and dtype not in LOW_PRECISION:
        return "fp32_operands"
    if path == "addmm_out_dtype" and not capabilities.addmm_out_dtype(torch.device(device).type, dtype):
        return "fp32_operands"
    return path


def fp32_operands(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor) -> None:
    """``gw += Gᵀ·x`` with both operands cast to fp32 (a no-op for fp32 operands); ``gw`` must be fp32."""
    _check(gw, G, x, fp32_gw=True)
    torch.addmm(gw, G.t().float(), x.float(), out=gw)


def addmm_out_dtype(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor) -> None:
    """``gw += Gᵀ·x`` by ``addmm(out_dtype=float32, out=gw)`` on operands aligned to one low-precision dtype,
    where the probe allows it; else the fp32-operand addmm. ``gw`` must be fp32."""
    _check(gw, G, x, fp32_gw=True)
    dt = operand_dtype(G, x)
    if resolved_path("addmm_out_dtype", gw.device, dt) != "addmm_out_dtype":
        # Same operand values as the out_dtype call (aligned to `dt`), multiplied in fp32.
        torch.addmm(gw, G.t().to(dt).float(), x.to(dt).float(), out=gw)
        return
    torch.addmm(gw, G.t().to(dt), x.to(dt), out_dtype=torch.float32, out=gw)


def fallback(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor) -> None:
    """``gw += mm(Gᵀ, x).float()``: product in the operands' low-precision dtype, rounded per chunk, added
    in fp32. With fp32 operands, the plain fp32 addmm. ``gw`` must be fp32."""
    _check(gw, G, x, fp32_gw=True)
    dt = operand_dtype(G, x)
    if dt not in LOW_PRECISION:
        torch.addmm(gw, G.t(), x, out=gw)
        return
    gw += torch.mm(G.t().to(dt), x.to(dt)).float()


def lowp_accum(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor) -> None:
    """``gw += Gᵀ·x`` with ``gw`` in the parameter dtype and operands aligned to it: the running sum is
    rounded to ``gw.dtype`` after every chunk (Liger's ``accum_dtype=None``)."""
    _check(gw, G, x, fp32_gw=False)
    dt = gw.dtype
    torch.addmm(gw, G.t().to(dt), x.to(dt), out=gw)


#: Path name → step function.
PATHS: dict[str, Step] = {
    "addmm_out_dtype": addmm_out_dtype,
    "fallback": fallback,
    "fp32_operands": fp32_operands,
    "lowp_accum": lowp_accum,
}

#: The accumulator that is not a buffer plus a step: an exact fp32 sum held as the bf16 gradient plus a
#: 16-bit lower half (:mod:`impls.builtin.split_accum`); for non-bf16 parameters and for biases it is the fp32
#: ``addmm_out_dtype`` buffer.
SPLIT = "split_fp32"

#: Every accumulation a chunked impl may name.
ALL_PATHS: tuple[str, ...] = (*PATHS, SPLIT)

#: What each path declares as :attr:`impls.protocols.linear_ce.LinearCESupport.grad_accumulation`.
GRAD_ACCUMULATION: dict[str, str] = {
    "addmm_out_dtype": "fp32",
    "fallback": "per_chunk_rounding",
    "fp32_operands": "fp32",
    "lowp_accum": "param_dtype",
    SPLIT: "fp32",
}


def accumulator_dtype(path: str, param_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the ``gw`` buffer a path accumulates into: the parameter dtype for ``lowp_accum``,
    float32 otherwise."""
    if path not in PATHS:
        raise ValueError(f"unknown grad_weight accumulation path {path!r}; known: {sorted(PATHS)}")
    return param_dtype if path == "lowp_accum" else torch.float32


def accumulate_bias(step: Step, gb: torch.Tensor, G: torch.Tensor, ones: torch.Tensor | None = None) -> None:
    """``gb += Σ_rows G`` through ``step`` (a ``[V, 1]`` view of ``gb`` against a ``[C, 1]`` column of ones),
    so grad_bias follows the same accumulation path as grad_weight. ``gb`` must be contiguous ``[V]``.
    ``ones``: a ``[≥C, 1]`` column of ones in ``G``'s dtype to reuse across chunks (made here when ``None``)."""
    if gb.dim() != 1 or gb.shape[0] != G.shape[1]:
        raise ValueError(f"gb must have shape [V]=[{G.shape[1]}], got {tuple(gb.shape)}")
    C = G.shape[0]
    if ones is None:
        ones = torch.ones((C, 1), dtype=G.dtype, device=G.device)
    elif ones.dim() != 2 or ones.shape[0] < C or ones.shape[1] != 1:
        raise ValueError(f"ones must have shape [>= {C}, 1], got {tuple(ones.shape)}")
    step(gb.view(-1, 1), G, ones[:C])


#: Rows of a low-precision buffer widened at a time by :func:`scaled_` (bounds its fp32 temporary).
SCALE_BLOCK_ROWS = 1024


def scaled_(buf: torch.Tensor, g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``buf·g`` returned in ``dtype``, multiplied in fp32 (``g`` is fp32; one rounding to ``dtype``).
    ``buf`` is consumed: an fp32 buffer is scaled in place (no [V, H] fp32 temporary in backward); a bf16/fp16
    buffer bound for its own dtype is widened :data:`SCALE_BLOCK_ROWS` rows at a time and written back. (Its
    own in-place ``mul_`` would round g to bf16/fp16 first on CUDA: a loss scale of 2^17 becomes inf in fp16,
    and a zero gradient NaN.)"""
    if buf.dtype.itemsize >= 4:  # fp32 (or wider): scaled in place, in its own dtype
        return buf.mul_(g).to(dtype)
    if dtype.itemsize > buf.dtype.itemsize:
        return buf.to(dtype).mul_(g)
    out = buf if buf.dtype == dtype else torch.empty(buf.shape, dtype=dtype, device=buf.device)
    rows = buf.shape[0] if buf.dim() else 1
    flat_in, flat_out = buf.reshape(rows, -1), out.reshape(rows, -1)
    for i in range(0, rows, SCALE_BLOCK_ROWS):
        flat_out[i : i + SCALE_BLOCK_ROWS] = (flat_in[i : i + SCALE_BLOCK_ROWS].to(torch.float32) * g).to(dtype)
    return out


class Accumulator(Protocol):
    """A running ``Σ_chunks G_cᵀ·x_c`` (``[V, H]``) or ``Σ_chunks Σ_rows G_c`` (``[V]``, a bias)."""

    def add_(self, G: torch.Tensor, x: torch.Tensor | None = None) -> None:
        """Add one chunk: ``G`` ``[C, V]`` with ``x`` ``[C, H]``, or (a bias accumulator) ``x`` a ``[≥C, 1]``
        column of ones or ``None``."""

    def finish(self, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The gradient in ``dtype``: the sum times ``scale`` (when given), the accumulator consumed."""


class BufferAccumulator:
    """A buffer of :func:`accumulator_dtype` and the step of one path of :data:`PATHS`.

    Args:
        path: a key of :data:`PATHS`.
        shape: ``(V, H)`` for grad_weight or ``(V,)`` for grad_bias.
        param_dtype: the dtype of the parameter the gradient belongs to.
        device: where the buffer lives.
    """

    def __init__(self, path: str, shape: tuple[int, ...], param_dtype: torch.dtype, device: torch.device | str) -> None:
        if len(shape) not in (1, 2):
            raise ValueError(f"an accumulator is [V, H] or [V], got shape {shape}")
        self.path = path
        self.step = PATHS[path]
        self.buf = torch.zeros(shape, dtype=accumulator_dtype(path, param_dtype), device=device)

    def add_(self, G: torch.Tensor, x: torch.Tensor | None = None) -> None:
        """``buf += Gᵀ·x`` through the path's step (a bias: ``buf += Σ_rows G``, ``x`` the ones column)."""
        if self.buf.dim() == 1:
            accumulate_bias(self.step, self.buf, G, x)
        elif x is None:
            raise ValueError("a [V, H] accumulator needs x_chunk")
        else:
            self.step(self.buf, G, x)

    def finish(self, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """``buf·scale`` in ``dtype`` (:func:`scaled_`), or ``buf`` in ``dtype`` without a scale."""
        buf, self.buf = self.buf, None  # type: ignore[assignment]
        if buf is None:
            raise RuntimeError("the accumulator was already finished")
        return scaled_(buf, scale, dtype) if scale is not None else buf.to(dtype)


class _SplitWeightAccumulator:
    """:class:`impls.builtin.split_accum.SplitAccumulator` behind the :class:`Accumulator` interface (bf16 only)."""

    def __init__(self, shape: tuple[int, int], device: torch.device | str) -> None:
        self.acc = SplitAccumulator(shape, device)

    def add_(self, G: torch.Tensor, x: torch.Tensor | None = None) -> None:
        """``acc += Gᵀ·x`` with operands aligned to one dtype (as :func:`operand_dtype` picks)."""
        if x is None:
            raise ValueError("a [V, H] accumulator needs x_chunk")
        dt = operand_dtype(G, x)
        self.acc.add_(G.to(dt), x.to(dt))

    def finish(self, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The bf16 gradient, rounded once from the exact fp32 sum (times ``scale``)."""
        if dtype != torch.bfloat16:
            raise ValueError(f"the split fp32 accumulator yields a bfloat16 gradient, not {dtype}")
        return self.acc.finish(scale)


def make_accumulator(
    path: str, shape: tuple[int, ...], param_dtype: torch.dtype, device: torch.device | str
) -> Accumulator:
    """A zeroed accumulator for a gradient of ``shape`` and ``param_dtype`` that adds chunks the way ``path``
    (a name of :data:`ALL_PATHS`) says. ``split_fp32``: the split accumulator for a bf16 ``[V, H]``
    gradient, else the ``addmm_out_dtype`` buffer (same fp32 accumulation, full fp32 buffer)."""
    if path not in ALL_PATHS:
        raise ValueError(f"unknown grad_weight accumulation path {path!r}; known: {sorted(ALL_PATHS)}")
    if path == SPLIT:
        if len(shape) == 2 and param_dtype == torch.bfloat16:
            return _SplitWeightAccumulator(shape, device)  # type: ignore[arg-type]
        return BufferAccumulator("addmm_out_dtype", shape, param_dtype, device)
    return BufferAccumulator(path, shape, param_dtype, device)
