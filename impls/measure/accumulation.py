"""The grad_weight-accumulation comparison of the report: how far each chunked accumulation path of
:mod:`impls.builtin.grad_accum` drifts from float64 as chunks pile up.

Setup (``docs/accumulation-and-memory.md`` records the same on an H200 after 64 chunks with
V=4096, H=1024, C=256): K chunks of C rows, G_k ``[C, V]`` and x_k ``[C, H]`` drawn N(0, 1) and rounded to
the low-precision dtype, accumulated by each path's own step function (the code the chunked impls run)
into its accumulator (fp32; the parameter dtype for ``lowp_accum``). The exact answer is the float64 sum
Σ_k G_kᵀ·x_k of the same rounded values, so only accumulation error is measured. The figure is the
relative Frobenius error ‖gw − exact‖_F / ‖exact‖_F after K chunks, for K = 1, 2, 4, ... .

What to expect (bounds derived in ``tests/test_grad_accum.py``; the typical sizes here follow from treating
roundings as independent): fp32 accumulation (``fp32_operands``, ``addmm_out_dtype``) stays near 2⁻²⁴ times a
slowly growing factor; ``fallback`` rounds each chunk's product once, so every chunk contributes a relative
error of order u_c and the sum keeps that relative size — flat in K at a fraction of u_c (2⁻⁸ = 3.9e-3 for
bf16); ``lowp_accum`` rounds the growing running sum after every chunk, so its relative error grows like
u_c·√(K/2). On a device where ``addmm(out_dtype=fp32)`` does not work the ``addmm_out_dtype`` step runs the
fp32-operand addmm (the "runs as" column says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from numcheck.impls.measure import capabilities
from numcheck.reference.numerics.accumulation import accumulator_dtype, path_steps, resolved_path

_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class AccumulationTable:
    """Relative Frobenius error of every path after each checkpoint number of chunks.

    Attributes:
        V, H, C: accumulator shape and rows per chunk. dtype: operand dtype name. device: where it ran.
        chunks: the checkpoints K. errors: path → one error per checkpoint. runs_as: path → the step that
        actually ran on this device and dtype.
    """

    V: int
    H: int
    C: int
    dtype: str
    device: str
    chunks: tuple[int, ...]
    errors: dict[str, list[float]] = field(default_factory=dict)
    runs_as: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "V": self.V,
            "H": self.H,
            "C": self.C,
            "dtype": self.dtype,
            "device": self.device,
            "chunks": list(self.chunks),
            "errors": self.errors,
            "runs_as": self.runs_as,
        }


def accumulation_table(
    *,
    V: int = 256,
    H: int = 64,
    C: int = 256,
    max_chunks: int = 64,
    dtype: str = "bfloat16",
    device: str = "cpu",
    seed: int = 0,
) -> AccumulationTable:
    """Accumulate ``max_chunks`` chunks through every path, recording the error at K = 1, 2, 4, ... (module docstring)."""
    if dtype not in _DT:
        raise ValueError(f"dtype={dtype!r} must be one of {sorted(_DT)} (the low-precision operand dtypes)")
    for name, v in (("V", V), ("H", H), ("C", C), ("max_chunks", max_chunks)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    dt = _DT[dtype]
    dev = torch.device(device)
    checkpoints = []
    k = 1
    while k <= max_chunks:
        checkpoints.append(k)
        k *= 2
    if checkpoints[-1] != max_chunks:
        checkpoints.append(max_chunks)
    steps = path_steps(capabilities.addmm_out_dtype)  # the built-ins' steps (impls.builtin.grad_accum.PATHS)
    paths = list(steps)
    gws = {p: torch.zeros(V, H, dtype=accumulator_dtype(p, dt), device=dev) for p in paths}
    exact = torch.zeros(V, H, dtype=torch.float64, device=dev)
    errors: dict[str, list[float]] = {p: [] for p in paths}
    g = torch.Generator(device="cpu").manual_seed(seed)
    for k in range(1, max_chunks + 1):
        G = torch.randn(C, V, generator=g).to(dt).to(dev)
        x = torch.randn(C, H, generator=g).to(dt).to(dev)
        exact += G.double().T @ x.double()
        for p in paths:
            steps[p](gws[p], G, x)
        if k in checkpoints:
            norm = float(exact.norm())
            for p in paths:
                errors[p].append(float((gws[p].double() - exact).norm()) / norm if norm > 0 else 0.0)
    runs_as = {p: resolved_path(p, dev, dt, capabilities.addmm_out_dtype) for p in paths}
    return AccumulationTable(V, H, C, dtype, dev.type, tuple(checkpoints), errors, runs_as)
