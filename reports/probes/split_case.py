"""The split-step probes' problem: the accumulator's shape, a start value for it, and one chunk's operands.

Nothing here seeds: each probe seeds once and draws in its own order, so that its logged runs stay reproducible.
"""
from __future__ import annotations

import torch

#: The bench's large shape: grad_W is [V, H].
V, H = 131072, 4096


def start_halves(dev: str = "cuda") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A start value for the accumulator, N(0, 0.01²) in fp32, and its upper and lower 16 bits as int16
    (the split accumulator's hi and lo)."""
    start32 = torch.randn(V, H, device=dev) * 0.01
    bits = start32.view(torch.int32)
    return start32, (bits >> 16).to(torch.int16), (bits & 0xFFFF).to(torch.int16)


def chunk(C: int, dev: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's operands in bf16: G [C, V] ~ N(0, 1e-6) (gradient-sized) and x [C, H] ~ N(0, 1)."""
    G = (torch.randn(C, V, device=dev) * 1e-3).to(torch.bfloat16)
    x = torch.randn(C, H, device=dev).to(torch.bfloat16)
    return G, x
