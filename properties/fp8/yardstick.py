"""The single FP8 linear as the judge runs it: the yardstick of the grouped family's ``per_expert_linear``.

A grouped FP8 linear must equal the single FP8 linear called once per expert on its rows
(:func:`numcheck.properties.fp8.grouped.props.per_expert_linear`). The single linear the judge calls is made of
:mod:`numcheck.reference.numerics.fp8_linear`, the numerics the built-in ``fp8_linear[<kind>]`` is made of, with
the same ``_scaled_mm`` probe (:func:`numcheck.impls.measure.capabilities.scaled_mm`), declaration and name, so it
is that built-in bit for bit without the judge importing the built-ins
(``tests/self/reference/test_numerics_yardsticks.py`` compares the two).
"""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.fp8_linear import Fp8LinearSupport
from numcheck.reference.fp8_recipes import RECIPE_KINDS, Fp8Recipe, rowwise_recipes, standard_recipes
from numcheck.reference.numerics.fp8_linear import NAME, Fp8LinearNumerics, declaration


class SingleFp8Linear(Fp8LinearNumerics):
    """The single FP8 linear of one recipe kind, declared for that kind's standard (or rowwise) recipes; called as the
    protocol calls an impl (the judge's own arguments, not checked again)."""

    def __init__(self, kind: str) -> None:
        if kind not in RECIPE_KINDS:
            raise ValueError(f"recipe kind must be one of {RECIPE_KINDS}, got {kind!r}")
        super().__init__(kind, capabilities.scaled_mm)
        self.name = f"{NAME}[{kind}]"
        recipes = tuple(r for r in standard_recipes() + rowwise_recipes() if r.kind == kind)
        self.support = Fp8LinearSupport(**declaration(recipes, kind))

    def __repr__(self) -> str:
        return f"SingleFp8Linear({self.recipe_kind!r})"

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        recipe: Fp8Recipe,
        save_original_input: bool,
        scaling_state: Any = None,
    ) -> torch.Tensor:
        return self.apply(x, weight, bias, recipe, save_original_input, scaling_state)
