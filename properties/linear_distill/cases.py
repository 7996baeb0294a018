"""The linear-distill case, :class:`DistillCase` (its ``repr`` is the repro line's ``--problem``), and its inputs
(:func:`build`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistillCase:
    """A student and a teacher head on N rows: x ``[N, H]`` standard normal, W ``[V, H]`` normal of standard
    deviation ``scale``/√H (so logits of standard deviation about ``scale``; the teacher's ``teacher_scale``), all
    rounded to ``dtype``; ``ignored`` rows (chosen by the seed) carry ``ignore_index``; ``upstream`` is the gradient
    the loss receives (exact in bf16 and fp16)."""

    N: int
    H: int
    V: int
    dtype: str = "float32"
    beta: float = 0.5
    temperature: float = 1.0
    ignored: int = 0
    ignore_index: int = -100
    scale: float = 2.0
    teacher_scale: float = 2.0
    upstream: float = 1.0
    seed: int = 0
    device: str = "cpu"

    def short(self) -> str:
        """The case in a few words (report tables)."""
        return f"N={self.N} H={self.H} V={self.V} β={self.beta} T={self.temperature} ign={self.ignored}"

    def replace(self, **fields: object) -> DistillCase:
        """A copy with ``fields`` changed."""
        return dataclasses.replace(self, **fields)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def options(self) -> frozenset[str]:
        """The declared options the case uses."""
        return frozenset({"ignore_index"} if self.ignored else set()) | frozenset(
            {"temperature"} if self.temperature != 1.0 else set()
        )


@dataclass(frozen=True)
class DistillTensors:
    """The case's inputs in its dtype on its device: student ``sx``, ``sw``, teacher ``tx``, ``tw``, ``target``."""

    sx: torch.Tensor
    sw: torch.Tensor
    tx: torch.Tensor
    tw: torch.Tensor
    target: torch.Tensor


def build(case: DistillCase) -> DistillTensors:
    """The case's tensors (the same bits for the same case on every run)."""
    g = torch.Generator().manual_seed(case.seed)
    f64 = torch.float64

    def normal(*shape: int, std: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, dtype=f64) * std).to(case.torch_dtype).to(case.device)

    sx, sw = normal(case.N, case.H), normal(case.V, case.H, std=case.scale / case.H**0.5)
    tx, tw = normal(case.N, case.H), normal(case.V, case.H, std=case.teacher_scale / case.H**0.5)
    target = torch.randint(0, case.V, (case.N,), generator=g)
    rows = torch.randperm(case.N, generator=g)[: case.ignored]
    target[rows] = case.ignore_index
    return DistillTensors(sx, sw, tx, tw, target.to(case.device))
