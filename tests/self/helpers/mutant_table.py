"""A mutant module's table: every mutant declared once, next to what must catch it.

A mutant is a passing built-in with one seam overridden (its bug); the table gives the mutants in order (what
``--impl <module>:MUTANTS`` loads) and, by name, the property or suite test that must flag each
(``CAUGHT_BY``), so a name is written once and cannot differ between the two.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence, TypeVar

from numcheck.reference.fp8_recipes import Fp8Recipe, standard_recipes


class _Named(Protocol):
    name: str


M = TypeVar("M", bound=_Named)


def recipes_of(*kinds: str) -> tuple[Fp8Recipe, ...]:
    """The standard recipes (:func:`reference.fp8_recipes.standard_recipes`) of the given kinds, in their order."""
    return tuple(r for r in standard_recipes() if r.kind in kinds)


def caught_by_table(
    rows: Sequence[tuple[M, str]], after: Mapping[str, str] | None = None
) -> tuple[list[M], dict[str, str]]:
    """The mutants of ``rows`` (each ``(mutant, what must catch it)``) in order, and mutant name → catcher,
    continuing the table ``after`` when given (an earlier section's); ``ValueError`` naming a mutant named twice."""
    caught = dict(after or {})
    for mutant, by in rows:
        if mutant.name in caught:
            raise ValueError(f"mutant table: {mutant.name!r} is named twice")
        caught[mutant.name] = by
    return [m for m, _ in rows], caught
