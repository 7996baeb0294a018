"""Declarations of the rowwise recipe kinds: where they are taken, where refused with one clear error, and the
built-in's refusal of a mode rowwise_gw_hp has no meaning for.

Cost: well under a second."""

from __future__ import annotations

import pytest
import torch

from numcheck.errors import InvalidDeclaration
from numcheck.impls.builtin.fp8_linear import fp8_linear_impls
from numcheck.impls.protocols.fp8_linear import Fp8LinearSupport, predicted_columnwise_x_bytes
from numcheck.impls.protocols.grouped_fp8_linear import GroupedFp8Support
from numcheck.impls.protocols.tp_fp8_linear import TPFp8Support
from numcheck.reference.fp8_recipes import Fp8Recipe


def test_single_device_support_takes_the_rowwise_kinds_by_name():
    """``recipes=("rowwise", "rowwise_gw_hp")`` declares both kinds with their defaults (E4M3, power-of-2 scales)."""
    s = Fp8LinearSupport(recipes=("rowwise", "rowwise_gw_hp"), save_original_input=(True,))
    assert s.recipes == (Fp8Recipe("rowwise"), Fp8Recipe("rowwise_gw_hp"))


@pytest.mark.parametrize("support", [GroupedFp8Support, TPFp8Support])
def test_grouped_and_tp_supports_refuse_the_rowwise_kinds(support):
    """The grouped and tensor-parallel oracles have no rowwise kind: declaring one is refused, naming the recipe and
    where to declare it."""
    with pytest.raises(InvalidDeclaration, match=r"declares \['rowwise_gw_hp-e4m3-pow2'\].*no rowwise kind"):
        support(recipes=("rowwise_gw_hp",))


def test_rowwise_gw_hp_has_no_fp8_copy_of_x():
    """rowwise_gw_hp's wgrad reads x in high precision: the built-in declares only save_original_input=True, refuses
    False naming why, and the predicted columnwise copy of x is 0 bytes (rowwise: M·K codes + K fp32 scales)."""
    impl = next(i for i in fp8_linear_impls() if i.name == "fp8_linear[rowwise_gw_hp]")
    assert impl.support.save_original_input == frozenset({True})
    recipe = impl.support.recipes[0]
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with pytest.raises(ValueError, match="save_original_input=False is not available.*high precision"):
        impl(x, w, recipe=recipe, save_original_input=False)
    assert predicted_columnwise_x_bytes(recipe, 4, 8) == 0
    assert predicted_columnwise_x_bytes(Fp8Recipe("rowwise"), 4, 8) == 4 * 8 + 8 * 4
