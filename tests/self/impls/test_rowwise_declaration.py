"""Declarations of the rowwise recipe kinds: where they are taken (the grouped family judging them per expert), where
refused with one clear error, and the built-in's refusal of a mode rowwise_gw_hp has no meaning for.

Cost: a few seconds (three small grouped cases against the float64 oracle)."""

from __future__ import annotations

import pytest
import torch

from numcheck.errors import InvalidDeclaration
from numcheck.impls.builtin.fp8_linear import fp8_linear_impls
from numcheck.impls.protocols.fp8_linear import Fp8LinearSupport, predicted_columnwise_x_bytes
from numcheck.impls.protocols.grouped_fp8_linear import GROUPED_KIND
from numcheck.impls.protocols.tp_fp8_linear import TPFp8Support
from numcheck.reference.fp8_recipes import Fp8Recipe


def test_single_device_support_takes_the_rowwise_kinds_by_name():
    """``recipes=("rowwise", "rowwise_gw_hp")`` declares both kinds with their defaults (E4M3, power-of-2 scales)."""
    s = Fp8LinearSupport(recipes=("rowwise", "rowwise_gw_hp"), save_original_input=(True,))
    assert s.recipes == (Fp8Recipe("rowwise"), Fp8Recipe("rowwise_gw_hp"))


def test_tp_support_refuses_the_rowwise_kinds():
    """The tensor-parallel oracle has no rowwise kind: declaring one is refused, naming the recipe and where to
    declare it."""
    with pytest.raises(InvalidDeclaration, match=r"declares \['rowwise_gw_hp-e4m3-pow2'\].*no rowwise kind"):
        TPFp8Support(recipes=("rowwise_gw_hp",))


def test_grouped_judges_the_rowwise_kinds_per_expert():
    """The grouped declaration takes the rowwise kinds (the grouped oracle is the single one per expert, each
    expert's columns scaled over its own rows): a loop of the rowwise built-in per expert passes accuracy on a
    small scale-block grid with an empty expert and equals the single linear per expert; run with fp32 scales while
    declaring power-of-2 ones, it fails accuracy; declaring rowwise_gw_hp with only save_original_input=True, the
    mode comparison is skipped with the reason (torchao's grouped GEMM saves x itself)."""
    from numcheck.errors import PropertyFailure
    from numcheck.impls.builtin.grouped_fp8_linear import GroupedLoopLinear
    from numcheck.properties.core.runner import judge
    from numcheck.properties.fp8.grouped import props as checks
    from numcheck.properties.fp8.grouped.cases import GroupedCase
    from numcheck.properties.fp8.grouped.suite import GROUPED_SUITE
    from numcheck.properties.fp8.suite import mode_comparison_refusal

    recipe = Fp8Recipe("rowwise", amax_epsilon=1e-12)
    loop = GroupedLoopLinear("rowwise_loop", recipes=(recipe,), bitwise_per_expert=True)
    case = GroupedCase(recipe, (8, 0, 5), 48, 8, dtype="bfloat16", regime="block_exponents", seed=3)
    judge(checks.accuracy, loop, case)
    judge(checks.per_expert_linear, loop, case.replace(regime="normal"))

    fp32_scales = Fp8Recipe("rowwise", amax_epsilon=1e-12, power_of_2_scales=False)
    wrong = GroupedLoopLinear("fp32_scales", recipes=(recipe, fp32_scales))

    def mislabelled(x, weights, biases=None, *, recipe, **kw):
        return wrong(x, weights, biases, recipe=fp32_scales, **kw)

    with pytest.raises(PropertyFailure, match="beyond bound"):
        judge(checks.accuracy, _Callable("fp32_scales", loop.support, mislabelled), case)
    hp = GroupedLoopLinear(
        "hp", recipes=(Fp8Recipe("rowwise_gw_hp", amax_epsilon=1e-12),), save_original_input=frozenset({True})
    )
    assert "declares only save_original_input=True" in (mode_comparison_refusal(hp) or "")
    assert GROUPED_SUITE["grouped_save_original_input_is_bitwise_identical"].skip(hp)


class _Callable:
    """A grouped impl made of a name, a declaration and a function."""

    def __init__(self, name, support, fn):
        self.name, self.support, self.fn = name, support, fn
        self.kind = GROUPED_KIND

    def __call__(self, *args, **kw):
        return self.fn(*args, **kw)


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
