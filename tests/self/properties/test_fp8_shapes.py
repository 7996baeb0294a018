"""The FP8 draws and fixed cases inside an impl's declared shapes (``dim_multiple``): every drawn and built shape
is a multiple of what each dimension declares, every shape regime is reached where the multiple allows it and named
with the field where it does not, the report's grid and property cases follow, and without a declared multiple the
draws are the ones they were. Also: an impl refusing a non-contiguous operand with its own ``assert`` refuses
loudly, as any other exception (torchao's MXFP8 ``to_mx``: ``assert data_hp.is_contiguous()``).

Cost: about a second (draws, case lists, three small FP8 linears on the CPU)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.fp8_linear import Fp8Linear
from numcheck.impls.protocols.fp8_linear import make_fp8_support
from numcheck.properties.core.runner import judge
from numcheck.properties.fp8 import props as checks
from numcheck.properties.fp8.cases import Fp8Case
from numcheck.properties.fp8.shapes import SHAPE_REGIMES, fitted, regime_refusal
from numcheck.properties.fp8.strategies import _K_EDGES, _M_EDGES, _N_EDGES, drawn_shapes, fp8_cases, grid_sizes
from numcheck.reference.fp8_recipes import Fp8Recipe

MX, BLOCK, CURRENT = Fp8Recipe("mxfp8"), Fp8Recipe("blockwise"), Fp8Recipe("current")
SUPPORTS = {
    "all16": make_fp8_support(recipes=(CURRENT, BLOCK, MX), dim_multiple=16),
    "mx32": make_fp8_support(recipes=(MX,), dim_multiple=32),
    "K32": make_fp8_support(recipes=(BLOCK, MX), dim_multiple={"K": 32}),
}


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(data=st.data(), name=st.sampled_from(sorted(SUPPORTS)))
def test_draws_stay_inside_the_declared_shapes(data, name):
    """Every drawn case, every regime (the scale-block grids included), is a shape the declaration takes."""
    support = SUPPORTS[name]
    case = data.draw(fp8_cases(support, device="cpu"))
    assert support.shape_refusal(case.M, case.K, case.N) is None, (name, case)


def test_without_a_multiple_the_draws_are_unchanged():
    """No ``dim_multiple``: the edge lists and the scale-block grids' sizes as before, so the shipped draws and
    baselines stay."""
    support = make_fp8_support(recipes=(BLOCK, MX))
    assert grid_sizes(support, MX) == ((40, 65, 95), (48, 80, 96, 112, 160), (40, 65, 95))
    shapes = set(drawn_shapes(support, MX))
    assert {(m, k, n) for m in _M_EDGES for k in _K_EDGES for n in _N_EDGES} <= shapes


@pytest.mark.parametrize(
    "name,reached,skipped",
    [
        ("all16", set(SHAPE_REGIMES), set()),
        ("mx32", {"K_block_times_odd"}, {"partial_K_block", "partial_row_block", "K_below_block"}),
        ("K32", {"partial_row_block", "K_block_times_odd", "partial_K_block", "K_below_block"}, set()),
    ],
)
def test_shape_regimes_reached_or_named(name, reached, skipped):
    """A regime is reached wherever a declared recipe's shapes allow it (K = 32·odd below a 128-block under a K
    multiple of 32, a partial 128-block at K = 160), and where none does the reason names ``dim_multiple`` and the
    dimension's multiple."""
    support = SUPPORTS[name]
    for regime in reached:
        assert regime_refusal(support, regime, drawn_shapes) is None, (name, regime)
    for regime in skipped:
        why = regime_refusal(support, regime, drawn_shapes) or ""
        assert "dim_multiple" in why and "multiple of 32" in why, (name, regime, why)
    only_current = make_fp8_support(recipes=(CURRENT,), dim_multiple=16)
    assert "concerns no declared recipe" in (regime_refusal(only_current, "partial_K_block", drawn_shapes) or "")


def test_fixed_cases_and_the_report_follow_the_declaration():
    """A fixed case is rounded up into the declared shapes, keeping what it is for (33 × 40 × 24 → 48 × 48 × 32);
    the report's grid builds only declared shapes, and its scale-grid row gives a K form the declaration rules out as
    a case the family's refusal names, with the field."""
    from numcheck.reports.report.grid import QUICK
    from numcheck.reports.report.property_grid import _scale_grids, fp8_refused

    support = SUPPORTS["mx32"]
    case = fitted(support, Fp8Case(MX, 33, 40, 24))
    assert (case.M, case.K, case.N) == (64, 64, 32)
    assert fitted(make_fp8_support(), Fp8Case(MX, 33, 40, 24)) == Fp8Case(MX, 33, 40, 24)
    from numcheck.reports.report.families.fp8_linear import fp8_cases as grid_cases

    built = grid_cases(QUICK, support)
    assert built and all(support.shape_refusal(g.case.M, g.case.K, g.case.N) is None for g in built)
    stub = type("Stub", (), {"name": "mx32", "support": support})()
    grids = list(_scale_grids(stub, QUICK, "cpu"))
    refusals = [fp8_refused(stub, "accuracy", c) for _, c in grids]
    assert [r is None for r in refusals] == [False, True], grids
    assert "dim_multiple" in refusals[0] and "K=48" in refusals[0]


class _AssertsContiguous(Fp8Linear):
    """Refuses a non-contiguous x with a bare ``assert`` (torchao's ``to_mx``)."""

    def __call__(self, x, weight, bias=None, **kw):
        assert x.is_contiguous(), "unsupported"
        return super().__call__(x, weight, bias, **kw)


def test_an_assert_refusing_a_strided_operand_is_a_loud_refusal():
    """The strided property allows a loud refusal; an impl's own ``AssertionError`` is one (only the suite's verdicts
    propagate), while reading the wrong elements still fails."""
    case = Fp8Case(CURRENT, 16, 32, 16, bias=True)
    judge(checks.strided, _AssertsContiguous("asserts_contiguous", (CURRENT,)), case)

    class WrongRows(Fp8Linear):
        def __call__(self, x, weight, bias=None, **kw):
            return super().__call__(torch.as_strided(x, x.shape, (x.shape[1], 1)), weight, bias, **kw)

    with pytest.raises(PropertyFailure):
        judge(checks.strided, WrongRows("wrong_rows", (CURRENT,)), case)


def test_grouped_grids_keep_their_k_forms_and_name_the_alignments():
    """The grouped scale-block grids keep K's form under a feature alignment (K = 32·odd stays, K = 48 is not
    rounded into whole blocks), an expert of exactly one block of tokens stays under a split alignment of 32, and a
    K form the alignment rules out is named with ``feature_alignment``."""
    from numcheck.impls.protocols.grouped_fp8_linear import GroupedFp8Support
    from numcheck.properties.fp8.grouped.strategies import (
        GROUPED_SHAPE_REGIMES,
        grid_ks,
        grouped_drawn_shapes,
        grouped_multiples,
    )

    support = GroupedFp8Support(recipes=(MX,), split_alignment=32, feature_alignment=32)
    assert grid_ks(support, MX) == (96, 160) and grid_ks(GroupedFp8Support(recipes=(MX,)), MX) == (48, 80, 96, 112, 160)
    refusal = lambda regime: regime_refusal(  # noqa: E731
        support, regime, grouped_drawn_shapes, GROUPED_SHAPE_REGIMES, grouped_multiples
    )
    assert refusal("expert_of_one_block") is None and refusal("K_block_times_odd") is None
    assert "feature_alignment: K multiple of 32" in (refusal("K_below_block") or "")
    assert "split_alignment: M multiple of 32" in (refusal("partial_row_block") or "")


def _grouped_supports():
    from numcheck.impls.protocols.grouped_fp8_linear import GroupedFp8Support

    rowwise = Fp8Recipe("rowwise", power_of_2_scales=True)
    return {  # torchao's MoE grouped GEMM's declaration; the built-ins' recipes; no empty expert and at most 3
        "ao16": GroupedFp8Support(recipes=(rowwise,), split_alignment=16, feature_alignment=16),
        "builtin": GroupedFp8Support(recipes=(CURRENT, BLOCK, MX)),
        "dense3": GroupedFp8Support(recipes=(MX,), split_alignment=32, empty_splits=False, max_experts=3),
    }


@pytest.mark.parametrize("name", ["ao16", "builtin", "dense3"])
def test_grouped_draws_on_cuda_take_a_fixed_set_that_keeps_every_regime(name):
    """On CUDA the grouped draws take a fixed set (a GPU impl's Triton kernels autotune per new token count, expert
    count, K and N): per scale block at most two token counts, one expert count and two (K, N), every size inside the
    split rules, an expert of exactly one block in every draw, an empty expert where declared (in every draw that
    asks for one), and every shape regime the CPU draws reach for that declaration."""
    from numcheck.properties.fp8.cases import scale_block
    from numcheck.properties.fp8.grouped.strategies import (
        GROUPED_SHAPE_REGIMES,
        grouped_cases,
        grouped_drawn_shapes,
        grouped_multiples,
    )

    support, seen = _grouped_supports()[name], {}

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(data=st.data())
    def draws(data):
        empty = data.draw(st.sampled_from([None, True]))
        c = data.draw(grouped_cases(support, device="cuda", empty=empty))
        b = scale_block(c.recipe)
        assert support.split_refusal(c.m_splits, K=c.K, N=c.N) is None, c
        assert b in c.m_splits and (0 in c.m_splits or not (empty and support.empty_splits)), c
        assert 0 not in c.m_splits or support.empty_splits, c
        seen.setdefault(b, set()).add((sum(c.m_splits), len(c.m_splits), c.K, c.N))

    draws()
    for b, keys in seen.items():
        assert len({k[:2] for k in keys}) <= 2 and len({k[1] for k in keys}) == 1, (b, sorted(keys))
        assert len({k[2:] for k in keys}) <= 2, (b, sorted(keys))

    def reached(device):
        def shapes(s, r):
            return grouped_drawn_shapes(s, r, device)

        regimes = GROUPED_SHAPE_REGIMES
        return {g for g in regimes if not regime_refusal(support, g, shapes, regimes, grouped_multiples)}

    assert reached("cuda") == reached("cpu")


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_quantizer_tensors_follow_the_declared_shapes(data):
    """The quantizer property's drawn tensor has rows and columns that are multiples of every declared multiple (a
    tensor any role's declared shape admits)."""
    from numcheck.properties.fp8.suite import FP8_SUITE

    stub = type(
        "Stub", (), {"name": "q16", "support": make_fp8_support(recipes=(MX,), dim_multiple={"K": 32, "N": 16})}
    )
    case = FP8_SUITE["quantizer_bitwise_on_random_tensors"].draw(stub(), data)
    assert case.tensor.rows % 32 == 0 and case.tensor.cols % 32 == 0, case.tensor
