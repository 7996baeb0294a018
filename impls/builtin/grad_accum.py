"""The built-ins' gradient accumulators: the paths of :mod:`numcheck.reference.numerics.accumulation` with this
device's capability probe, and the split fp32 accumulator (a Triton kernel, :mod:`impls.builtin.split_accum`).

The steps, the buffers they fill, the declarations (``GRAD_ACCUMULATION``) and their derivations live in
:mod:`numcheck.reference.numerics.accumulation`, where numcheck's own evaluation of a declared path
(:mod:`numcheck.properties.linear_ce.declared_path`) takes them from too; here the ``addmm_out_dtype`` step is bound to
:func:`impls.measure.capabilities.addmm_out_dtype`, the probe that says where ``addmm(out_dtype=float32)`` works.
"""

from __future__ import annotations

import torch

from numcheck.impls.builtin.split_accum import SplitAccumulator
from numcheck.impls.measure import capabilities
from numcheck.reference.numerics import accumulation
from numcheck.reference.numerics.accumulation import (
    ALL_PATHS,
    SPLIT,
    Accumulator,
    BufferAccumulator,
    Step,
    operand_dtype,
    path_steps,
)

#: Path name → step function, the ``addmm_out_dtype`` step asking this device's probe.
PATHS: dict[str, Step] = path_steps(capabilities.addmm_out_dtype)


def resolved_path(path: str, device: str | torch.device, dtype: torch.dtype) -> str:
    """The name of the path that actually runs when ``path`` is asked for with operands of ``dtype`` on ``device``
    (:func:`numcheck.reference.numerics.accumulation.resolved_path` asking
    :func:`impls.measure.capabilities.addmm_out_dtype`)."""
    return accumulation.resolved_path(path, device, dtype, capabilities.addmm_out_dtype)


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
        return BufferAccumulator("addmm_out_dtype", PATHS["addmm_out_dtype"], shape, param_dtype, device)
    return BufferAccumulator(path, PATHS[path], shape, param_dtype, device)
