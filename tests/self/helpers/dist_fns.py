"""Rank functions for the distributed harness's self tests (module level, so the ranks can import them)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist


def allreduce_rank(rank: int, world_size: int, group: Any, args: Any) -> torch.Tensor:
    """The sum of every rank's ``rank + 1``, all-reduced over ``group``."""
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=group)
    return t


def raise_on_rank(rank: int, world_size: int, group: Any, bad: int) -> int:
    """Raise on rank ``bad`` before any collective; the others return their rank."""
    if rank == bad:
        raise ZeroDivisionError(f"rank {rank} divides by zero on purpose")
    return rank


def raise_then_others_wait(rank: int, world_size: int, group: Any, bad: int) -> torch.Tensor:
    """Rank ``bad`` raises; the others enter an all-reduce it never joins (they hang until killed)."""
    if rank == bad:
        raise ValueError(f"rank {rank} fails before the all-reduce")
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    return t


def hang_on_rank(rank: int, world_size: int, group: Any, bad: int) -> torch.Tensor:
    """Rank ``bad`` skips the all-reduce and sleeps; every rank then deadlocks or sleeps past any timeout."""
    if rank == bad:
        time.sleep(3600)
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    return t


def kill_rank(rank: int, world_size: int, group: Any, bad: int) -> int:
    """Rank ``bad`` kills its own process (as a segfault would); the others wait at a barrier."""
    if rank == bad:
        os._exit(9)
    dist.barrier(group=group)
    return rank


def leak_group(rank: int, world_size: int, group: Any, args: Any) -> int:
    """Create a process group and leave it undestroyed."""
    dist.new_group(list(range(world_size)))
    return rank


def matmul_flags_rank(rank: int, world_size: int, group: Any, args: Any) -> dict[str, Any]:
    """The GEMM precision flags as the rank's call sees them (numcheck.properties.core.matmul_precision)."""
    from numcheck.properties.core.matmul_precision import _flags

    return {**_flags(), "float32": torch.get_float32_matmul_precision()}
