"""The shapes an FP8 linear's declaration admits (``dim_multiple``: M, K, N each a multiple of a declared int,
:class:`~numcheck.impls.protocols.fp8_linear.Fp8LinearSupport`) and the shape regimes the suite reaches in them.

Every draw and fixed case of the family is moved into the declared shapes by rounding each dimension up to its
multiple (:func:`fitted`: 33 × 40 × 24 becomes 48 × 48 × 32 under ``dim_multiple=16``), which keeps what the case
is for (a 3×3 grid of 128×128 tiles stays one; a partial 128-block stays partial) wherever the multiple allows it.
Some regimes are about the shape itself, and a multiple can rule them out: :data:`SHAPE_REGIMES` names them, and
:func:`regime_refusal` says, naming ``dim_multiple``, why an impl's declaration leaves one out (every dimension a
multiple of 32 leaves no partial 32-block), so the suite skips it with that reason instead of dropping it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from numcheck.properties.fp8.cases import scale_block
from numcheck.reference.fp8_recipes import Fp8Recipe

#: Recipe kinds whose scales are blocks of a fixed edge (partial blocks exist only for them).
BLOCK_KINDS: tuple[str, ...] = ("blockwise", "mxfp8")


def multiples(support: Any) -> dict[str, int]:
    """``{"M": m, "K": k, "N": n}`` declared by ``support`` (all 1 where it declares no ``dim_multiple``)."""
    return dict(getattr(support, "dim_multiples", None) or {"M": 1, "K": 1, "N": 1})


def round_up(v: int, m: int) -> int:
    """The least multiple of ``m`` that is at least ``v`` (and at least ``m``)."""
    return max(m, -(-v // m) * m)


def fitted_sizes(sizes: tuple[int, ...], m: int, cap: int | None = None) -> tuple[int, ...]:
    """``sizes`` rounded up to multiples of ``m``, in order, repeats dropped; those over ``cap`` left out unless none
    remains (then the smallest)."""
    out = tuple(dict.fromkeys(round_up(s, m) for s in sizes))
    kept = tuple(s for s in out if cap is None or s <= cap)
    return kept or (min(out),)


def fitted_shape(support: Any, M: int, K: int, N: int) -> tuple[int, int, int]:
    """``(M, K, N)`` with each dimension rounded up to the multiple ``support`` declares for it."""
    m = multiples(support)
    return round_up(M, m["M"]), round_up(K, m["K"]), round_up(N, m["N"])


def fitted(support: Any, case: Any) -> Any:
    """``case`` (any case with ``M``, ``K``, ``N`` and ``replace``) moved into ``support``'s declared shapes."""
    M, K, N = fitted_shape(support, case.M, case.K, case.N)
    return case if (M, K, N) == (case.M, case.K, case.N) else case.replace(M=M, K=K, N=N)


def fits(support: Any, M: int, K: int, N: int) -> bool:
    """Whether ``support`` declares x ``[M, K]``, W ``[N, K]``."""
    m = multiples(support)
    return not (M % m["M"] or K % m["K"] or N % m["N"])


class ShapeRegime(NamedTuple):
    """A regime that is a property of the shape: which recipes it concerns, and whether a shape is in it."""

    description: str
    applies: Callable[[Fp8Recipe], bool]
    holds: Callable[[Fp8Recipe, int, int, int], bool]
    #: the dimensions whose multiple decides it (named in the reason it cannot be reached)
    dims: tuple[str, ...]


def _below_block(r: Fp8Recipe, M: int, K: int, N: int) -> bool:
    """K = m·2^j with m odd and 1 < 2^j < b: a multiple of every split smaller than the block, not of the block."""
    b = scale_block(r)
    return K % b != 0 and K % 2 == 0 and (K & -K) < b


def _block_times_odd(r: Fp8Recipe, M: int, K: int, N: int) -> bool:
    b = scale_block(r)
    return K % b == 0 and (K // b) % 2 == 1 and K // b > 1


#: The shape regimes of the family, by name (the id of ``test_shape_regimes_in_the_declared_shapes``).
SHAPE_REGIMES: dict[str, ShapeRegime] = {
    "partial_K_block": ShapeRegime(
        "K not a multiple of the recipe's scale block (a partial last block along K)",
        lambda r: r.kind in BLOCK_KINDS,
        lambda r, M, K, N: K % scale_block(r) != 0,
        ("K",),
    ),
    "partial_row_block": ShapeRegime(
        "M or N not a multiple of the recipe's scale block (a partial columnwise block of wgrad or dgrad)",
        lambda r: r.kind in BLOCK_KINDS,
        lambda r, M, K, N: M % scale_block(r) != 0 or N % scale_block(r) != 0,
        ("M", "N"),
    ),
    "K_block_times_odd": ShapeRegime(
        "K = block × odd on the scale-block grids (whole blocks, more than two)",
        lambda r: True,
        _block_times_odd,
        ("K",),
    ),
    "K_below_block": ShapeRegime(
        "K = m·2^j with m odd and 2^j below the scale block on the scale-block grids (FBGEMM #6159)",
        lambda r: True,
        _below_block,
        ("K",),
    ),
}


def declared_multiples(support: Any) -> dict[str, tuple[str, int]]:
    """Each dimension's declared multiple with the declaration field that sets it (the single linear's
    ``dim_multiple``)."""
    return {d: ("dim_multiple", m) for d, m in multiples(support).items()}


def regime_refusal(
    support: Any,
    regime: str,
    shapes: Callable[[Any, Fp8Recipe], Any],
    regimes: dict[str, ShapeRegime] = SHAPE_REGIMES,
    fields: Callable[[Any], dict[str, tuple[str, int]]] = declared_multiples,
) -> str | None:
    """Why the declared recipes and shapes of ``support`` reach no shape of ``regimes[regime]`` among
    ``shapes(support, recipe)`` (the ``(M, K, N)`` the suite draws for it), naming the declaration fields
    (``fields(support)``: each dimension's field and multiple); ``None`` when one recipe reaches it."""
    rule = regimes[regime]
    recipes = [r for r in support.recipes if rule.applies(r)]
    if not recipes:
        return (
            f"{regime} ({rule.description}) concerns no declared recipe ({', '.join(r.name for r in support.recipes)})"
        )
    for r in recipes:
        if any(rule.holds(r, *s) for s in shapes(support, r)):
            return None
    declared = fields(support)
    named = ", ".join(f"{declared[d][0]}: {d} multiple of {declared[d][1]}" for d in rule.dims if declared[d][1] > 1)
    blocks = ", ".join(sorted({str(scale_block(r)) for r in recipes}))
    return (
        f"{regime} ({rule.description}) cannot be reached: the declaration ({named or 'its shapes'}) leaves no such "
        f"shape for scale block {blocks}"
    )
