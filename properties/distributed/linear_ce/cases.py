"""The case of distributed linear+CE: a :class:`DistCase` is a single-device
:class:`~numcheck.properties.linear_ce.cases.Problem`, a world size, a backend and a target placement:
``"as_built"`` (the problem's own targets), ``"boundary"`` (every non-ignored target on the first or last class of
some shard) or ``"one_rank"`` (every target in one rank's shard: the others own none)."""

from __future__ import annotations

from dataclasses import dataclass

from numcheck.impls.protocols.dist_linear_ce import shard_bounds
from numcheck.properties.linear_ce.cases import Problem

PLACEMENTS: tuple[str, ...] = ("as_built", "boundary", "one_rank")


@dataclass(frozen=True)
class DistCase:
    """One distributed case: ``problem`` run at ``world_size`` on ``backend`` with the targets ``placement``
    (:data:`PLACEMENTS`) puts them at; ``owner``: the rank owning every target under ``"one_rank"``;
    ``placement_world_size``: the world size whose shard layout the placement follows (``None``: ``world_size``;
    world-size invariance runs one case at P = 1, 2, 4 with the targets of the largest P's layout, so that every
    P sees the same problem)."""

    problem: Problem
    world_size: int
    backend: str = "gloo"
    placement: str = "as_built"
    owner: int = 0
    placement_world_size: int | None = None

    @property
    def layout_world_size(self) -> int:
        """The world size whose shards ``placement`` and ``owner`` refer to."""
        return self.placement_world_size or self.world_size

    def short(self) -> str:
        """Compact label for tables: world size, backend, placement and the problem's label."""
        return f"P{self.world_size}-{self.backend}-{self.placement}-{self.problem.short()}"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"DistCase.placement={self.placement!r} is not one of {PLACEMENTS}")
        if not 0 <= self.owner < self.layout_world_size:
            raise ValueError(f"DistCase.owner={self.owner} is outside world size {self.layout_world_size}")
        shard_bounds(self.problem.V, self.world_size, 0)  # V >= world size
        shard_bounds(self.problem.V, self.layout_world_size, 0)
