"""Built-in FP8 quantized linears: ``fp8_linear[<kind>]``, one per recipe kind, ``save_original_input`` both ways.

``fp8_linear[<kind>]`` implements every variant of one recipe kind from
:func:`reference.fp8_recipes.standard_recipes` under the protocol of :mod:`impls.protocols.fp8_linear`. Its numerics
(quantization, GEMMs, the autograd functions, the declared accumulation and their derivations) are
:mod:`numcheck.reference.numerics.fp8_linear`'s, which the judge's ``per_expert_linear`` yardstick runs too; here
they get this device's ``_scaled_mm`` probe (:func:`impls.measure.capabilities.scaled_mm`), a name, a declaration,
the protocol's argument checks and quantizer.

The seams the suite's mutants (``tests/self/helpers/fp8_mutants.py``) override are the methods of
:class:`numcheck.reference.numerics.fp8_linear.Fp8LinearNumerics`. The call's recipe checks
(:func:`check_recipe_call`) are shared with the tensor-parallel built-in (:mod:`impls.builtin.tp_fp8_linear`).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch

from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.fp8_linear import FP8_KIND, DelayedScalingState, Fp8LinearSupport, QuantizedTensor
from numcheck.reference.fp8_recipes import ROWWISE_KINDS, Fp8Recipe, rowwise_recipes, standard_recipes
from numcheck.reference.numerics.fp8_linear import NAME, Fp8LinearNumerics, declaration, recipes_kind

_Impl = TypeVar("_Impl")


def check_recipe_call(
    name: str, kind: str, recipe: Any, save_original_input: bool, scaling_state: DelayedScalingState | None
) -> None:
    """A protocol call's recipe arguments for impl ``name`` (recipes of ``kind``): ``ValueError`` for a recipe of
    another kind, ``save_original_input=True`` under delayed scaling, or delayed scaling without a state."""
    if not isinstance(recipe, Fp8Recipe) or recipe.kind != kind:
        raise ValueError(f"{name}: recipe must be an Fp8Recipe of kind {kind!r}, got {recipe!r}")
    if save_original_input and not recipe.allows_save_original_input:
        raise ValueError(
            f"{name}: save_original_input=True is not supported with delayed scaling "
            "(the amax history changes between forward and backward)"
        )
    if recipe.kind == "delayed" and not isinstance(scaling_state, DelayedScalingState):
        raise ValueError(f"{name}: delayed scaling needs scaling_state=DelayedScalingState(recipe)")


class Fp8Linear(Fp8LinearNumerics):
    """A quantized-linear impl for the recipes of one kind (see the module docstring)."""

    kind = FP8_KIND

    def __init__(self, name: str, recipes: tuple[Fp8Recipe, ...], description: str = "") -> None:
        super().__init__(recipes_kind(recipes, f"Fp8Linear {name!r}"), capabilities.scaled_mm)
        self.name = name
        self.description = description
        self.support = Fp8LinearSupport(**declaration(recipes, self.recipe_kind))

    def __repr__(self) -> str:
        return f"Fp8Linear({self.name!r})"

    # -- the protocol call ----------------------------------------------------------------------------
    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        recipe: Fp8Recipe,
        save_original_input: bool,
        scaling_state: DelayedScalingState | None = None,
    ) -> torch.Tensor:
        check_recipe_call(self.name, self.recipe_kind, recipe, save_original_input, scaling_state)
        if not save_original_input and not recipe.quantizes("wgrad"):
            raise ValueError(
                f"{self.name}: save_original_input=False is not available with {recipe.name}: its wgrad GEMM reads x "
                "in high precision, so x itself is saved (there is no FP8 copy of x to save instead)"
            )
        if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
            raise ValueError(
                f"{self.name}: x must be [M, K] and weight [N, K]; got {tuple(x.shape)}, {tuple(weight.shape)}"
            )
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"{self.name}: bias must be [N]={weight.shape[0]}, got {tuple(bias.shape)}")
        return self.apply(x, weight, bias, recipe, save_original_input, scaling_state)

    def quantize(
        self,
        t: torch.Tensor,
        *,
        recipe: Fp8Recipe,
        role: str,
        usage: str,
        scaling_state: DelayedScalingState | None = None,
    ) -> QuantizedTensor:
        """The protocol's quantizer: ``t`` quantized for (role, usage), in ``t``'s orientation."""
        q = self.quantize_operand(t, recipe, role, usage, scaling_state, record=False)
        if usage == "columnwise":
            code = q.code.t() if q.code is not None else None
            si = q.scale_inv if q.per_tensor else q.scale_inv.t()
            return QuantizedTensor(q.data.t(), si.reshape(1, 1) if q.per_tensor else si, code)
        return QuantizedTensor(q.data, q.scale_inv.reshape(1, 1) if q.per_tensor else q.scale_inv, q.code)


_DESCRIPTIONS = {
    "delayed": "per-tensor delayed scaling (stored scales from the suite's amax history); save_original_input=True raises",
    "current": "per-tensor current scaling; columnwise copy = transposed bits",
    "blockwise": "1x128 activations/gradients, 128x128 weight tiles, fp32 or power-of-2 scales",
    "mxfp8": "MXFP8 1x32/32x1 blocks, E8M0 scales (RCEIL or FLOOR), emulated GEMMs",
    "rowwise": "one scale per row over the whole reduction (torchao's rowwise), emulated GEMMs",
    "rowwise_gw_hp": "rowwise fprop/dgrad, per-tensor W for dgrad, wgrad in high precision (torchao's "
    "rowwise_with_gw_hp); x saved itself",
}


def one_per_recipe_kind(
    make: Callable[[str, tuple[Fp8Recipe, ...], str], _Impl], family: str, descriptions: dict[str, str]
) -> list[_Impl]:
    """One built-in per recipe kind of :func:`standard_recipes`, ``make("family[kind]", the kind's standard recipes,
    descriptions[kind])``, in their order."""
    return [
        make(f"{family}[{k}]", tuple(r for r in standard_recipes() if r.kind == k), descriptions[k])
        for k in dict.fromkeys(r.kind for r in standard_recipes())
    ]


def fp8_linear_impls() -> list[Fp8Linear]:
    """One built-in per recipe kind, each declaring that kind's standard variants (the rowwise kinds: those of
    :func:`reference.fp8_recipes.rowwise_recipes`)."""
    rowwise = [
        Fp8Linear(f"{NAME}[{k}]", tuple(r for r in rowwise_recipes() if r.kind == k), _DESCRIPTIONS[k])
        for k in ROWWISE_KINDS
    ]
    return one_per_recipe_kind(Fp8Linear, NAME, _DESCRIPTIONS) + rowwise
