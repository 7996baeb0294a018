"""The toy family's case, :class:`ToyCase`, and its inputs (:func:`build`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ToyCase:
    """``n`` elements uniform in [-1, 1) in ``dtype``, from ``seed``, on ``device``."""

    n: int
    dtype: str = "float32"
    seed: int = 0
    device: str = "cpu"

    def short(self) -> str:
        """The case in a few words (report tables)."""
        return f"n={self.n}"

    def replace(self, **fields: object) -> ToyCase:
        """A copy with ``fields`` changed."""
        return dataclasses.replace(self, **fields)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def build(case: ToyCase) -> torch.Tensor:
    """The case's input, in its dtype."""
    g = torch.Generator().manual_seed(case.seed)
    return (torch.rand(case.n, generator=g, dtype=torch.float64) * 2 - 1).to(case.torch_dtype).to(case.device)
