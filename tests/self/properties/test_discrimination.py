"""Every FP8 and grouped property that judges an impl against the float64 oracle fails the trivial wrong answers of
tests/self/helpers/wrong_answers.py — zeros, a dropped last scale block, permuted block scales, E5M2 read as E4M3,
a gradient missing one micro-batch — on one fixed case each: no tolerance is wide enough to pass them.

The scale-block answers need a K spanning several scale blocks and block maxima that differ between blocks (the
``wide`` regime: every element its own exponent; with ``normal`` data neighbouring MXFP8 blocks often share an E8M0
code and a permutation lands on an equal scale). The correct built-in passes every case (so a failure is the wrong
answer's). Not here: the properties that compare an impl with itself (save_original_input on/off, expert
permutation, the split rules, empty experts' exact zeros, the bytes held), which a consistently wrong answer passes
by construction; the mutants of tests/self/mutants cover their defects. (The quantizer's E5M2-read-as-E4M3 row
returns the right bytes tagged ``float8_e4m3fn``: the quantizer property checks the returned dtype for that.)
"""

from __future__ import annotations

import pytest

from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.fp8_linear import Fp8Linear
from numcheck.impls.builtin.grouped_fp8_linear import GroupedLoopLinear
from numcheck.properties.fp8.cases import Fp8Case
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.properties.fp8.grouped.props import GROUPED_PROPERTIES
from numcheck.properties.fp8.props import FP8_PROPERTIES
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.tests.self.helpers.wrong_answers import WrongGroupedLoop, WrongLinear

#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")

CURRENT, HYBRID = Fp8Recipe("current", fp8_format="E4M3"), Fp8Recipe("current", fp8_format="HYBRID")
BLOCKWISE, MXFP8 = Fp8Recipe("blockwise"), Fp8Recipe("mxfp8")
MX_HYBRID = Fp8Recipe("mxfp8", fp8_format="HYBRID")


def _q(recipe: Fp8Recipe, regime: str = "normal") -> Fp8Case:
    """M = 32, K = 256 (two 128-blocks, eight 32-blocks along K), N = 128."""
    return Fp8Case(recipe, 32, 256, 128, regime=regime, seed=1)


def _g(recipe: Fp8Recipe, regime: str = "normal") -> GroupedCase:
    """Three experts (one empty), K = 128 (four 32-blocks), N = 64."""
    return GroupedCase(recipe, (32, 0, 48), 128, 64, regime=regime, seed=1)


#: (family, property, wrong answer, case).
ROWS = [
    ("fp8", "accuracy", "zeros", _q(CURRENT)),
    ("fp8", "accuracy", "dropped_last_scale_block", _q(BLOCKWISE, "wide")),
    ("fp8", "accuracy", "dropped_last_scale_block", _q(MXFP8, "wide")),
    ("fp8", "accuracy", "permuted_block_scales", _q(BLOCKWISE, "wide")),
    ("fp8", "accuracy", "permuted_block_scales", _q(MXFP8, "wide")),
    ("fp8", "accuracy", "e5m2_read_as_e4m3", _q(HYBRID)),
    ("fp8", "accuracy", "e5m2_read_as_e4m3", _q(MX_HYBRID)),
    ("fp8", "quantizer", "dropped_last_scale_block", _q(MXFP8, "wide")),
    ("fp8", "quantizer", "permuted_block_scales", _q(BLOCKWISE, "wide")),
    ("fp8", "quantizer", "e5m2_read_as_e4m3", _q(HYBRID)),
    ("fp8", "accumulate", "zeros", _q(CURRENT)),
    ("fp8", "accumulate", "missing_micro_batch", _q(CURRENT)),
    ("fp8", "optimizer_step", "zeros", _q(CURRENT)),
    ("fp8", "two_layers", "zeros", _q(CURRENT)),
    ("fp8", "strided", "zeros", _q(CURRENT)),
    ("grouped", "accuracy", "zeros", _g(CURRENT)),
    ("grouped", "accuracy", "dropped_last_scale_block", _g(MXFP8, "wide")),
    ("grouped", "accuracy", "permuted_block_scales", _g(MXFP8, "wide")),
    ("grouped", "accuracy", "e5m2_read_as_e4m3", _g(HYBRID)),
    ("grouped", "per_expert_linear", "zeros", _g(CURRENT)),
    ("grouped", "per_expert_linear", "permuted_block_scales", _g(MXFP8, "wide")),
    ("grouped", "per_expert_linear", "e5m2_read_as_e4m3", _g(HYBRID)),
    ("grouped", "wgrad_accumulation", "zeros", _g(CURRENT)),
    ("grouped", "wgrad_accumulation", "missing_micro_batch", _g(CURRENT)),
]


def _impls(family: str, wrong: str, recipe: Fp8Recipe):
    if family == "fp8":
        return WrongLinear(wrong, (recipe,)), Fp8Linear("right", (recipe,))
    return WrongGroupedLoop(wrong, (recipe,)), GroupedLoopLinear("right", recipes=(recipe,))


@pytest.mark.parametrize("family, prop, wrong, case", ROWS, ids=[f"{f}-{p}-{w}-{c.recipe.kind}" for f, p, w, c in ROWS])
def test_property_fails_the_trivial_wrong_answer(family, prop, wrong, case):
    """The property fails the wrong answer on the case, and passes the correct built-in there."""
    check = (FP8_PROPERTIES if family == "fp8" else GROUPED_PROPERTIES)[prop]
    bad, good = _impls(family, wrong, case.recipe)
    check(good, case)
    with pytest.raises(PropertyFailure):
        check(bad, case)
