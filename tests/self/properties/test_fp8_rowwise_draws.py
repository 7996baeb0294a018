"""The FP8 draws reach the rowwise kinds from an impl's declaration: the recipes it declares, the modes it declares,
and on the scale-block grids (``block_exponents``) rows and columns whose own scales all differ from their
neighbours' — where a per-row scale applied to another row, or along the wrong axis, shows.

Cost: a few seconds (the draws and two small float64 quantizations)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numcheck.impls.builtin.fp8_linear import fp8_linear_impls
from numcheck.properties.fp8.cases import Fp8Case, build_fp8
from numcheck.properties.fp8.strategies import fp8_cases
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.fp8_scaling import quantize_operand

ROWWISE = {i.name: i for i in fp8_linear_impls() if "rowwise" in i.name}


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(data=st.data(), name=st.sampled_from(sorted(ROWWISE)))
def test_draws_stay_inside_a_rowwise_declaration(data, name):
    """Every drawn case of a rowwise built-in has one of its recipes and a mode it declares (rowwise_gw_hp: x saved
    itself only, its wgrad reads x in high precision)."""
    support = ROWWISE[name].support
    case = data.draw(fp8_cases(support, device="cpu"))
    assert case.recipe in support.recipes and case.save_original_input in support.save_original_input
    if case.recipe.kind == "rowwise_gw_hp":
        assert case.save_original_input


def test_scale_block_grids_give_each_row_and_column_its_own_rowwise_scale():
    """A ``block_exponents`` case of a rowwise recipe (power-of-2 scales, where rows of one binade share a scale):
    no two neighbouring rows of x share a per-row scale and the grid's rows take several, and the per-column scales
    (wgrad's usage) differ from one 32-column K-block to the next; on N(0,1) rows most share one."""
    recipe = Fp8Recipe("rowwise", amax_epsilon=1e-12)
    grid = build_fp8(Fp8Case(recipe, 40, 96, 65, regime="block_exponents", seed=5))
    rows = quantize_operand(grid.x, recipe, "x", "rowwise").scale.flatten()
    cols = quantize_operand(grid.x, recipe, "x", "columnwise").scale.flatten()
    assert bool((rows[1:] != rows[:-1]).all()) and len(set(rows.tolist())) >= 5, rows
    assert len({float(cols[j]) for j in (0, 32, 64)}) == 3, cols
    normal = build_fp8(Fp8Case(recipe, 40, 96, 65, regime="normal", seed=5))
    plain = quantize_operand(normal.x, recipe, "x", "rowwise").scale.flatten()
    assert torch.mode(plain).values.eq(plain).sum() > len(plain) // 2, plain
