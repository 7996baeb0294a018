"""The protocol of a distributed (vocabulary-parallel) linear+CE implementation.

A distributed impl is an object with ``name``, ``kind = "dist_linear_ce"``, ``support`` (a
:class:`~numcheck.impls.protocol.LinearCESupport`: the numerics of one rank's part, read by the tolerance
model exactly as for a single-device impl), ``dist`` (a :class:`DistSupport`: what is sharded, the world sizes
and backends, the label-smoothing convention, determinism) and

``rank_call(x, weight_shard, target, bias_shard, *, group, vocab_start, vocab_size, **options) -> loss``
    called on every rank of ``group`` with the full ``x`` [N, H] and ``target`` [N], the rank's vocabulary
    shard ``weight_shard`` [V_r, H] (classes ``vocab_start … vocab_start + V_r − 1`` of ``vocab_size``) and its
    bias shard (or ``None``); the options are the single-device protocol's (``class_weights`` is the full [V]
    tensor). It returns the loss (the same on every rank), connected to autograd; after
    ``loss.backward(upstream)`` on every rank, ``x.grad`` must be the *full* grad_x (the impl all-reduces it)
    and ``weight_shard.grad`` / ``bias_shard.grad`` the rank's shards of grad_W / grad_b.

Shard rule (:func:`shard_bounds`): rank r of P owns ⌊V/P⌋ classes, one more for r < V mod P, in rank order:
contiguous, sizes differing by at most one. An impl declaring ``uneven_vocab=False`` is only given V divisible
by P.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from numcheck.impls.protocol import LinearCESupport

DIST_KIND = "dist_linear_ce"


def shard_bounds(V: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s classes under the shard rule of the module docstring."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if V < world_size:
        raise ValueError(f"V={V} classes cannot give each of {world_size} ranks at least one")
    base, extra = divmod(V, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class DistSupport:
    """What a distributed impl declares beyond one rank's numerics.

    Attributes:
        sharded: what is split across ranks (``"vocab"``: the output projection's classes).
        world_sizes: the world sizes it runs at.
        backends: the torch.distributed backends it runs on (``"gloo"``, ``"nccl"``).
        uneven_vocab: whether V need not be divisible by the world size.
        smoothing: the label-smoothing convention (:mod:`numcheck.reference.smoothing`): ``"torch"`` (ε/V over
            all classes) or ``"megatron"`` (ε/(V−1) over the others); judged against the oracle with it.
        deterministic: repeated calls at one world size give bitwise equal outputs.
        grad_x_reduce_dtype: ``"input"`` when each rank's grad_x partial is rounded to x's dtype and all-reduced
            in it (the model charges P roundings: :mod:`numcheck.properties.dist_tolerance`), ``"float32"`` when
            the partials are reduced in fp32 and rounded once.
    """

    sharded: Literal["vocab"] = "vocab"
    world_sizes: tuple[int, ...] = (1, 2, 4)
    backends: tuple[str, ...] = ("gloo", "nccl")
    uneven_vocab: bool = True
    smoothing: Literal["torch", "megatron"] = "torch"
    deterministic: bool = True
    grad_x_reduce_dtype: Literal["input", "float32"] = "input"

    def __post_init__(self) -> None:
        if self.sharded != "vocab":
            raise ValueError(f"DistSupport.sharded={self.sharded!r}: only 'vocab' is known for linear+CE")
        if not self.world_sizes or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.world_sizes):
            raise ValueError(f"DistSupport.world_sizes must be positive ints, got {self.world_sizes!r}")
        bad = set(self.backends) - {"gloo", "nccl"}
        if bad or not self.backends:
            raise ValueError(f"DistSupport.backends must be a non-empty subset of ('gloo', 'nccl'), got {self.backends!r}")
        if self.smoothing not in ("torch", "megatron"):
            raise ValueError(f"DistSupport.smoothing={self.smoothing!r} is not 'torch' or 'megatron'")
        if self.grad_x_reduce_dtype not in ("input", "float32"):
            raise ValueError(f"DistSupport.grad_x_reduce_dtype={self.grad_x_reduce_dtype!r} is not 'input' or 'float32'")


@dataclass(frozen=True)
class DistFunctionImpl:
    """A distributed impl from a module-level function ``fn`` with ``rank_call``'s signature (picklable by
    reference, so the ranks can run it)."""

    name: str
    fn: Callable[..., Any]
    support: LinearCESupport
    dist: DistSupport = field(default_factory=DistSupport)
    description: str = ""
    kind: str = DIST_KIND

    def rank_call(self, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``: see the module docstring."""
        return self.fn(*args, **kwargs)
