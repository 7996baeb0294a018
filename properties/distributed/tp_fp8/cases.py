"""A tensor-parallel FP8 case as one printable value, its shards per rank, and the assembly of the ranks' outputs.

The global tensors are those of the single-device :class:`~properties.fp8.cases.Fp8Case` of the same shape
(:func:`~properties.fp8.cases.build_fp8`), so the unsharded float64 oracle judges them unchanged. Shards are
contiguous, rank-ordered slices (the layouts of :mod:`impls.protocols.tp_fp8_linear`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numcheck.properties.fp8.cases import Fp8Case, Fp8CaseFields, Fp8Tensors, build_fp8

#: The block edge a sharded weight dimension's local size must be a multiple of, per recipe kind (a shard never
#: splits a 128×128 tile, a 1×128 or a 1×32 block).
SHARD_EDGE: dict[str, int] = {"delayed": 1, "current": 1, "blockwise": 128, "mxfp8": 32}


@dataclass(frozen=True, kw_only=True)
class TPFp8Case(Fp8CaseFields):
    """One tensor-parallel quantized-linear case: the global shape and values (:class:`Fp8CaseFields`), and,
    by keyword, the world size and the layout.

    ``steps``: delayed scaling runs this many steps with one state per rank (the drawn suite runs 2, so the second
    step quantizes with the scales the first step's reduced amaxes gave).
    """

    world: int
    parallel: str = "column"
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        if self.parallel not in ("column", "row"):
            raise ValueError(f"TPFp8Case.parallel={self.parallel!r} must be 'column' or 'row'")
        if not isinstance(self.world, int) or self.world < 1:
            raise ValueError(f"TPFp8Case.world must be a positive int, got {self.world!r}")
        edge = SHARD_EDGE[self.recipe.kind]
        split = self.N if self.parallel == "column" else self.K
        what = "N" if self.parallel == "column" else "K"
        if split % (self.world * edge):
            raise ValueError(
                f"TPFp8Case: {what}={split} is not a multiple of world·{edge} = {self.world * edge} "
                f"({self.recipe.kind} blocks must not cross a {self.parallel}-parallel shard)"
            )
        if self.sequence_parallel and self.M % self.world:
            raise ValueError(f"TPFp8Case: M={self.M} is not a multiple of world={self.world} (sequence parallel)")
        self.single()  # validates the rest

    def single(self) -> Fp8Case:
        """The single-device case of the same global tensors."""
        return Fp8Case(
            self.recipe,
            self.M,
            self.K,
            self.N,
            dtype=self.dtype,
            bias=self.bias,
            regime=self.regime,
            seed=self.seed,
            steps=self.steps,
        )

    def short(self) -> str:
        sp = "-sp" if self.sequence_parallel else ""
        return f"P{self.world}-{self.parallel}{sp}-{self.single().short()}"


def _part(n: int, world: int, rank: int) -> slice:
    s = n // world
    return slice(rank * s, (rank + 1) * s)


def shard(case: TPFp8Case, t: Fp8Tensors, rank: int) -> Fp8Tensors:
    """Rank ``rank``'s x, weight, bias and upstream gradient (its share of dy in y's layout)."""
    P = case.world
    if case.parallel == "column":
        n = _part(case.N, P, rank)
        x = t.x[_part(case.M, P, rank)] if case.sequence_parallel else t.x
        b = t.bias[n] if t.bias is not None else None
        return Fp8Tensors(
            x=x.contiguous(),
            weight=t.weight[n].contiguous(),
            dy=t.dy[:, n].contiguous(),
            bias=None if b is None else b.contiguous(),
        )
    k = _part(case.K, P, rank)
    dy = t.dy[_part(case.M, P, rank)] if case.sequence_parallel else t.dy
    return Fp8Tensors(x=t.x[:, k].contiguous(), weight=t.weight[:, k].contiguous(), dy=dy.contiguous(), bias=t.bias)


def steps_tensors(case: TPFp8Case) -> list[Fp8Tensors]:
    """The global tensors of every step."""
    return [build_fp8(case.single(), step) for step in range(case.steps)]


#: How each output of each rank is placed in the global one: ``("cat", dim)`` concatenated in rank order, or
#: ``"same"`` (every rank holds the whole output; they must agree bitwise), or ``"partial"`` (every rank holds a
#: partial sum over its rows: row-parallel SP's bias gradient).
def placement(case: TPFp8Case, output: str) -> Any:
    """Where ``output`` of each rank goes (see above)."""
    sp = case.sequence_parallel
    if case.parallel == "column":
        return {"y": ("cat", 1), "dgrad": ("cat", 0) if sp else "same", "wgrad": ("cat", 0), "bgrad": ("cat", 0)}[
            output
        ]
    return {
        "y": ("cat", 0) if sp else "same",
        "dgrad": ("cat", 1),
        "wgrad": ("cat", 1),
        "bgrad": "partial" if sp else "same",
    }[output]


def operand_slices(case: TPFp8Case, role: str, rank: int) -> tuple[slice, slice]:
    """The rows and columns of the global tensor ``role`` (source orientation) that rank ``rank``'s GEMM operand
    covers: its shard, or everything for a gathered or replicated operand."""
    full = slice(None)
    P = case.world
    if case.parallel == "column":
        n = _part(case.N, P, rank)
        return {"x": (full, full), "w": (n, full), "dy": (full, n)}[role]
    k = _part(case.K, P, rank)
    return {"x": (full, k), "w": (full, k), "dy": (full, full)}[role]


def row_parts(case: TPFp8Case) -> list[slice]:
    """The rows of dy each rank sums for a partial bias gradient (row-parallel SP)."""
    return [_part(case.M, case.world, r) for r in range(case.world)]


def reduction_parts(case: TPFp8Case, output: str) -> list[slice] | None:
    """The slices of the reduction dimension the ranks' partial sums cover, for an output whose reduction is
    sharded (column-parallel dgrad over N, row-parallel y over K); ``None`` for the others."""
    if case.parallel == "column" and output == "dgrad":
        return [_part(case.N, case.world, r) for r in range(case.world)]
    if case.parallel == "row" and output == "y":
        return [_part(case.K, case.world, r) for r in range(case.world)]
    return None


def refusal(support: Any, case: TPFp8Case) -> str | None:
    """Why a :class:`~impls.protocols.tp_fp8_linear.TPFp8Support` leaves out a tensor-parallel case (its fields
    against the declaration, its recipe first), or ``None``."""
    dtypes = {str(d).replace("torch.", "") for d in support.dtypes}
    recipes = ", ".join(sorted(r.name for r in support.recipes))
    checks = (
        (case.recipe in support.recipes, f"recipe {case.recipe.name} is not declared (recipes: {recipes})"),
        (case.dtype in dtypes, f"dtype {case.dtype} not declared"),
        (case.parallel in support.parallel, f"{case.parallel}-parallel not declared"),
        (
            case.sequence_parallel in support.sequence_parallel,
            f"sequence_parallel={case.sequence_parallel} not declared",
        ),
        (
            case.save_original_input in support.save_original_input,
            f"save_original_input={case.save_original_input} not declared",
        ),
        (
            not case.save_original_input or case.recipe.allows_save_original_input,
            f"save_original_input=True not allowed by recipe {case.recipe.name}",
        ),
        (not case.bias or support.bias, "bias not declared"),
        (case.world in support.world_sizes, f"world size {case.world} not declared"),
    )
    return next((why for ok, why in checks if not ok), None)
