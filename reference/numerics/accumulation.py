"""The four grad_weight accumulation steps of a chunked linear+CE, one function per path, and the buffers they fill.

A chunked FLCE accumulates ``grad_W = Σ_chunks G_cᵀ·x_c`` into a ``[V, H]`` buffer ``gw``. Each step here is
``step(gw, G_chunk, x_chunk) -> None``: it adds ``G_chunkᵀ·x_chunk`` (``G_chunk`` ``[C, V]``, ``x_chunk``
``[C, H]``) into ``gw`` in place, with no host synchronisation. The same steps accumulate ``grad_b`` when
called with ``x_chunk`` a ``[C, 1]`` column of ones (see :func:`accumulate_bias`).

Paths (``docs/accumulation-and-memory.md``; the extra peak is for one chunk with bf16 operands and
an fp32 ``gw``, V=131072, H=4096, C=2048):

``addmm_out_dtype``
    ``torch.addmm(gw, Gᵀ, x, out_dtype=float32, out=gw)``: low-precision multiply, fp32 accumulation straight
    into ``gw``; extra peak 0. ``out=`` ops are not autocast, so both operands are aligned by hand to one
    low-precision dtype (:func:`operand_dtype`). Used only where the probe the caller passes
    (:func:`numcheck.impls.measure.capabilities.addmm_out_dtype`, :data:`OutDtypeProbe`) says it works for that
    device and dtype; elsewhere (CPU, torch < 2.8, fp32 operands) the step runs the ``fp32_operands`` path instead,
    so the path's declared fp32 accumulation stays true. :func:`resolved_path` says which one runs. On the
    ``meta`` device the probe cannot check values and answers False; measure this path there under
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
    Not a step on a buffer: an :class:`Accumulator` holding the exact fp32 sum as the bf16 gradient's storage
    plus an int16 lower half, added to by one Triton GEMM per chunk (:mod:`impls.builtin.split_accum`); extra
    V·H·2 bytes in all = 1024 MiB, instead of an fp32 buffer's 2048 MiB. Declares ``"fp32"``. For parameters that
    are not bf16, and for biases, it is the ``addmm_out_dtype`` buffer. Being a Triton kernel, it stays with the
    built-ins (:func:`impls.builtin.grad_accum.make_accumulator`).

The chunked impls hold their gradients in :class:`Accumulator` objects
(:func:`impls.builtin.grad_accum.make_accumulator`), which pair a buffer with its step (:class:`BufferAccumulator`)
and finish it into the gradient (:func:`scaled_`, one rounding); numcheck's evaluation of a declared path
(:mod:`numcheck.properties.linear_ce.declared_path`) uses the same buffers and steps.

The steps that need no capability probe are module functions; :func:`path_steps` binds the probe of the
``addmm_out_dtype`` step and gives all four by name (the built-ins' :data:`impls.builtin.grad_accum.PATHS`).

With fp32 operands (no low-precision dtype among ``G_chunk``/``x_chunk``) every path is the plain fp32
``torch.addmm(gw, Gᵀ, x, out=gw)``.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

#: Low-precision dtypes a matmul operand may have.
LOW_PRECISION: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
#: Whether ``addmm(out_dtype=float32)`` works on a device (type or device) for operands of a dtype
#: (:func:`numcheck.impls.measure.capabilities.addmm_out_dtype`).
OutDtypeProbe = Callable[[str | torch.device, torch.dtype], bool]

#: The paths that are a step on a buffer (:func:`path_steps` gives their steps), in this order.
PATH_NAMES: tuple[str, ...] = ("addmm_out_dtype", "fallback", "fp32_operands", "lowp_accum")


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


def resolved_path(path: str, device: str | torch.device, dtype: torch.dtype, out_dtype_works: OutDtypeProbe) -> str:
    """The name of the path that actually runs when ``path`` is asked for with operands of ``dtype`` on
    ``device``: ``addmm_out_dtype`` becomes ``fp32_operands`` where the capability probe ``out_dtype_works``
    says no (asked only then) or the operands are not low precision; ``fallback`` becomes ``fp32_operands`` for
    fp32 operands (the same plain fp32 addmm); the others run as named."""
    if path not in PATH_NAMES:
        raise ValueError(f"unknown grad_weight accumulation path {path!r}; known: {sorted(PATH_NAMES)}")
    if path in ("addmm_out_dtype", "fallback") and dtype not in LOW_PRECISION:
        return "fp32_operands"
    if path == "addmm_out_dtype" and not out_dtype_works(torch.device(device).type, dtype):
        return "fp32_operands"
    return path


def fp32_operands(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor) -> None:
    """``gw += Gᵀ·x`` with both operands cast to fp32 (a no-op for fp32 operands); ``gw`` must be fp32."""
    _check(gw, G, x, fp32_gw=True)
    torch.addmm(gw, G.t().float(), x.float(), out=gw)


def addmm_out_dtype(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor, out_dtype_works: OutDtypeProbe) -> None:
    """``gw += Gᵀ·x`` by ``addmm(out_dtype=float32, out=gw)`` on operands aligned to one low-precision dtype,
    where the probe ``out_dtype_works`` allows it; else the fp32-operand addmm. ``gw`` must be fp32."""
    _check(gw, G, x, fp32_gw=True)
    dt = operand_dtype(G, x)
    if resolved_path("addmm_out_dtype", gw.device, dt, out_dtype_works) != "addmm_out_dtype":
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


def path_steps(out_dtype_works: OutDtypeProbe) -> dict[str, Step]:
    """Path name → step function, in :data:`PATH_NAMES`' order, the ``addmm_out_dtype`` step asking
    ``out_dtype_works`` (at each call, so a pinned probe, ``capabilities.forced``, takes effect)."""

    def addmm_out_dtype_step(gw: torch.Tensor, G: torch.Tensor, x: torch.Tensor) -> None:
        addmm_out_dtype(gw, G, x, out_dtype_works)

    addmm_out_dtype_step.__doc__ = addmm_out_dtype.__doc__
    return {
        "addmm_out_dtype": addmm_out_dtype_step,
        "fallback": fallback,
        "fp32_operands": fp32_operands,
        "lowp_accum": lowp_accum,
    }


#: The steps that ask no capability probe, by name: what numcheck's evaluation of a declared path uses
#: (:mod:`numcheck.properties.linear_ce.declared_path`).
PROBE_FREE_STEPS: dict[str, Step] = {"fallback": fallback, "fp32_operands": fp32_operands, "lowp_accum": lowp_accum}

#: The accumulator that is not a buffer plus a step: an exact fp32 sum held as the bf16 gradient plus a
#: 16-bit lower half (:mod:`impls.builtin.split_accum`); for non-bf16 parameters and for biases it is the fp32
#: ``addmm_out_dtype`` buffer.
SPLIT = "split_fp32"

#: Every accumulation a chunked impl may name.
ALL_PATHS: tuple[str, ...] = (*PATH_NAMES, SPLIT)

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
    if path not in PATH_NAMES:
        raise ValueError(f"unknown grad_weight accumulation path {path!r}; known: {sorted(PATH_NAMES)}")
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
    """A buffer of :func:`accumulator_dtype` and the step of one path of :data:`PATH_NAMES`.

    Args:
        path: a name of :data:`PATH_NAMES`.
        step: that path's step (:func:`path_steps`).
        shape: ``(V, H)`` for grad_weight or ``(V,)`` for grad_bias.
        param_dtype: the dtype of the parameter the gradient belongs to.
        device: where the buffer lives.
    """

    def __init__(
        self, path: str, step: Step, shape: tuple[int, ...], param_dtype: torch.dtype, device: torch.device | str
    ) -> None:
        if len(shape) not in (1, 2):
            raise ValueError(f"an accumulator is [V, H] or [V], got shape {shape}")
        self.path = path
        self.step = step
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
