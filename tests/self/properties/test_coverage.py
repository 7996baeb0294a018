"""The covering rows (properties/linear_ce/coverage.py) and the example budgets (properties/core/runner.py): every pair of values
covered, the same rows and draws in every process, a small budget that still meets the pair a bug needs."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis.errors import UnsatisfiedAssumption

from numcheck.errors import PropertyFailure
from numcheck.impls.protocols.fp8_linear import FP8_KIND
from numcheck.impls.protocols.grouped_fp8_linear import GROUPED_KIND
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND, FunctionImpl, LinearCESupport
from numcheck.properties.core.rows import seeded_data
from numcheck.properties.core.runner import MIN_RANDOM, SuiteProperty, budget, rows, run_rows
from numcheck.properties.fp8.grouped.suite import GROUPED_SUITE
from numcheck.properties.fp8.suite import FP8_SUITE
from numcheck.properties.linear_ce.coverage import EVERY_DIMENSION, covering_rows, uncovered_pairs
from numcheck.properties.linear_ce.strategies import determinism_layout, pinned_row, problems
from numcheck.properties.linear_ce.suite import SUITE

_SUPPORTS = {
    "everything": LinearCESupport(),
    "no none, no AMP": LinearCESupport(reductions=frozenset({"mean", "sum"}), autocast=frozenset()),
    "bf16 only, two options": LinearCESupport(
        dtypes=frozenset({torch.bfloat16}), autocast=frozenset(), options=frozenset({"bias", "softcap"})
    ),
    "excluded pair": LinearCESupport(option_combinations_excluded=frozenset({frozenset({"softcap", "z_loss"})})),
}
_DESIGNS = {"every": EVERY_DIMENSION, **{name: p.dimensions for name, p in SUITE.items() if p.dimensions}}


@pytest.mark.parametrize("support", list(_SUPPORTS), ids=list(_SUPPORTS))
@pytest.mark.parametrize("design", list(_DESIGNS), ids=list(_DESIGNS))
def test_every_valid_pair_is_covered(support, design):
    """Every pair of values of two dimensions that some valid problem holds is in some covering row."""
    s, dims = _SUPPORTS[support], _DESIGNS[design]
    design_rows = covering_rows(dims, s, "cpu")
    assert not uncovered_pairs(dims, s, "cpu", design_rows)
    excluded = [tuple(pair) for pair in s.option_combinations_excluded]
    for row in design_rows:
        v = dict(row.values)
        assert not any(v.get(a) == "on" and v.get(b) == "on" for a, b in excluded), row.label()


def test_rows_are_problems_the_support_declares():
    """Each row of the full design, drawn through problems(), gives a Problem inside the declaration with the
    row's fields."""
    s = LinearCESupport()
    for i, row in enumerate(covering_rows(EVERY_DIMENSION, s, "cpu")):
        for attempt in range(8):
            try:
                with pinned_row(row), seeded_data(f"test {i} {attempt}") as data:
                    p = data.draw(problems(s))
            except UnsatisfiedAssumption:  # a rejection (assume) tries the next seed
                continue
            for name, value in row.force.items():
                assert getattr(p, name) == value, (row.label(), p)
            for option in row.require:
                assert option in p.features, (row.label(), p)
            break
        else:
            pytest.fail(f"row {row.label()} rejected on 8 seeds")


def test_a_property_own_force_wins_over_the_row():
    """Inside a row, a field the property pins itself keeps the property's value."""
    row = covering_rows(("reduction",), LinearCESupport(), "cpu")[0]
    with pinned_row(row), seeded_data("own force") as data:
        p = data.draw(
            problems(LinearCESupport(), force={"reduction": "sum" if row.force["reduction"] != "sum" else "mean"})
        )
    assert p.reduction != row.force["reduction"]


_SCRIPT = """
import sys
from numcheck.properties.linear_ce.coverage import covering_rows, EVERY_DIMENSION
from numcheck.properties.core.rows import seeded_data
from numcheck.properties.linear_ce.strategies import pinned_row, problems
from numcheck.impls.protocols.linear_ce import LinearCESupport
s = LinearCESupport()
rows = covering_rows(EVERY_DIMENSION, s, "cpu")
out = [r.label() for r in rows]
with pinned_row(rows[3]), seeded_data("scope") as data:
    out.append(repr(data.draw(problems(s))))
print("\\n".join(out))
"""


def _design_here() -> str:
    s = LinearCESupport()
    design_rows = covering_rows(EVERY_DIMENSION, s, "cpu")
    out = [r.label() for r in design_rows]
    with pinned_row(design_rows[3]), seeded_data("scope") as data:
        out.append(repr(data.draw(problems(s))))
    return "\n".join(out)


def test_rows_and_their_draws_are_the_same_in_another_process():
    """A fresh process importing only the strategies gets the same rows and seeded draws as this one, which has
    the whole suite loaded (hypothesis' constants from loaded modules never enter a row's draws)."""
    fresh = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True).stdout
    assert fresh.strip() == _design_here()


# -- a transposed weight meeting an upstream gradient that is not 1 (Liger 0.2.1–0.8.2) -----------------------
class _IgnoresUpstreamIfTransposed(torch.autograd.Function):
    """grad_weight formed with an upstream gradient of 1 when the weight's storage is transposed."""

    @staticmethod
    def forward(ctx, x, w, target, reduction, ignore_index):
        ctx.save_for_backward(x, w, target)
        ctx.opts = reduction, ignore_index
        return F.cross_entropy(F.linear(x, w).float(), target, reduction=reduction, ignore_index=ignore_index)

    @staticmethod
    def backward(ctx, g):
        x, w, target = ctx.saved_tensors
        reduction, ignore_index = ctx.opts
        with torch.enable_grad():
            logits = (x.detach().float() @ w.detach().float().T).requires_grad_()
            loss = F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)
            (G,) = torch.autograd.grad(loss, logits, g, retain_graph=True)
            (G1,) = torch.autograd.grad(loss, logits, torch.ones_like(g)) if not w.is_contiguous() else (G,)
        return (G @ w.float()).to(x.dtype), (G1.T @ x.float()).to(w.dtype), None, None, None


def _transposed_bug(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    return _IgnoresUpstreamIfTransposed.apply(x, weight, target, reduction, ignore_index)


_TRANSPOSED_BUG = FunctionImpl(
    "mutant_transposed_weight_ignores_upstream",
    _transposed_bug,
    LinearCESupport(
        options=frozenset({"ignore_index"}),
        all_ignored="nan",
        logits_dtype="float32",
        dtypes=frozenset({torch.float32}),
        autocast=frozenset(),
        slow=True,
    ),
)


def test_strided_rows_meet_a_scalar_upstream_for_every_liger_impl():
    """strided_inputs' rows hold a scalar upstream gradient (with the transposed weight the property always
    passes) for each Liger impl, in each reduction that takes one."""
    from numcheck.impls.registry import discover

    ligers = [e.impl for e in discover([]) if e.kind == "linear-ce" and e.name.startswith("liger")]
    if not ligers:
        pytest.skip("no Liger impl registered here")
    for impl in ligers:
        got = {
            (dict(r.values).get("reduction"), dict(r.values)["upstream"]) for r in rows(SUITE["strided_inputs"], impl)
        }
        for red in {"mean", "sum"} & set(impl.support.reductions):
            assert (red, "scalar") in got, (impl.name, sorted(got))


def test_rows_alone_catch_the_transposed_weight_bug_of_a_slow_impl():
    """A slow impl whose grad_weight ignores the upstream gradient when the weight is transposed fails
    strided_inputs in its covering rows, before any random draw."""
    with pytest.raises(PropertyFailure, match="grad_weight"):
        run_rows(SUITE["strided_inputs"], _TRANSPOSED_BUG)


# -- budgets ------------------------------------------------------------------------------------------------
def test_budget_takes_rows_out_of_the_share_and_keeps_random_draws():
    """Slow impls: max(2, share/4) random examples, or rows + MIN_RANDOM in all when the rows outnumber them;
    budget_scale multiplies the share; a property without rows keeps its share."""
    prop = SUITE["strided_inputs"]
    n_rows = len(rows(prop, _TRANSPOSED_BUG))
    assert n_rows > 3
    assert budget(_TRANSPOSED_BUG, 12, prop) == MIN_RANDOM
    assert budget(_TRANSPOSED_BUG, 1000, prop) == 250 - n_rows
    assert budget(_TRANSPOSED_BUG, 12, SUITE["grad_dtypes"]) == 3
    assert not rows(SUITE["determinism"], _TRANSPOSED_BUG) and budget(_TRANSPOSED_BUG, 12, SUITE["determinism"]) == 3
    cheap = FP8_SUITE["save_original_input_is_bitwise_identical"]
    assert cheap.budget_scale > 1
    assert (
        budget(type("Q", (), {"support": type("S", (), {"slow": False})(), "kind": "fp8-linear"})(), 12, cheap)
        == 12 * cheap.budget_scale
    )
    with pytest.raises(ValueError, match="budget_scale"):
        SuiteProperty("x", SUITE["accuracy"].check, SUITE["accuracy"].draw, budget_scale=0)


@pytest.mark.parametrize(
    "module,kind,table",
    [
        ("numcheck.tests.suite.test_properties", LINEAR_CE_KIND, SUITE),
        ("numcheck.tests.suite.test_fp8_impls", FP8_KIND, FP8_SUITE),
        ("numcheck.tests.suite.test_grouped_fp8", GROUPED_KIND, GROUPED_SUITE),
    ],
)
def test_every_drawn_suite_test_names_its_entry(module, kind, table):
    """Each @given test of a suite module is an entry of its kind's table in the properties registry, which numcheck's
    plugin reads (its name without test_, [param] for a parametrized one), so its rows and budget apply."""
    import importlib

    from numcheck.properties.suites import SUITES

    mod = importlib.import_module(module)
    assert SUITES[kind].table is table
    names = {n.split("[")[0] for n in table}
    given = [
        name
        for name, fn in inspect.getmembers(mod, inspect.isfunction)
        if name.startswith("test_") and hasattr(fn, "hypothesis")
    ]
    assert given
    for name in given:
        assert name.removeprefix("test_") in names, name


def test_determinism_draws_span_several_chunks():
    """The determinism draws run a chunked impl as 7-row chunks on N past two of them (SEVERAL_CHUNKS: a first, an
    interior and a last chunk), and span as many of a declared chunk size."""
    from numcheck.impls.registry import discover
    from numcheck.properties.linear_ce.chunks import SEVERAL_CHUNKS

    impls = {e.name: e.impl for e in discover([]) if e.kind == "linear-ce"}
    variant, layout, _ = determinism_layout(impls["recompute"])
    assert variant.support.chunk_rows == 7 and layout.n_range(SEVERAL_CHUNKS)[0] == (SEVERAL_CHUNKS - 1) * 7 + 1
    declared = FunctionImpl("chunky", _transposed_bug, LinearCESupport(chunk_rows=16, chunk_cols=32))
    _, layout, min_v = determinism_layout(declared)
    min_n = layout.n_range(SEVERAL_CHUNKS)[0]
    assert (min_n, min_v) == ((SEVERAL_CHUNKS - 1) * 16 + 1, 33)
    ((impl, draw),) = SUITE["determinism"].variants(declared)
    drawn = []
    for i in range(40):
        try:
            with seeded_data(f"determinism {i}") as data:
                drawn.append(draw(impl, data))
        except UnsatisfiedAssumption:  # a draw outside the declaration, as under @given
            continue
    assert len(drawn) >= 30 and all(p.N >= min_n and p.V >= 33 for p in drawn)
    assert sum(p.dtype == "float32" and p.autocast is None for p in drawn) >= len(drawn) // 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt_max", [448.0, 57344.0])
def test_scale_edges_sit_beside_fp8_max_times_a_power_of_two(dtype, fmt_max):
    """plant_scale_edges: every 32-run of every row has its amax within 2 ulps (of dtype) of fp8_max·2^k, exact in
    dtype, and every other element of the row below half of it."""
    from numcheck.properties.fp8.cases import EDGE_RUN, MANTISSA_BITS, plant_scale_edges

    g = torch.Generator().manual_seed(7)
    t = plant_scale_edges(torch.randn(9, 70, generator=g, dtype=torch.float64), g, fmt_max, dtype)
    for c0 in range(0, 70, EDGE_RUN):
        amax = t[:, c0 : c0 + EDGE_RUN].abs().amax(dim=1)
        assert torch.equal(amax.to(getattr(torch, dtype)).double(), amax), "edge values not exact in the dtype"
        k = torch.round(torch.log2(amax / fmt_max))
        base = fmt_max * torch.exp2(k)
        ulp = torch.exp2(torch.floor(torch.log2(base)) - MANTISSA_BITS[dtype])
        assert bool(((amax - base).abs() <= 2 * ulp).all())
    row_max = t.abs().amax(dim=1, keepdim=True)
    near = t.abs() > 0.51 * row_max
    assert int(near.sum()) == 9 * 3  # one edge value per 32-run, every other element at most half of the row amax


@pytest.mark.parametrize("block", [32, 128])
def test_block_exponents_give_every_block_its_own_exponent(block):
    """plant_block_exponents: every block's amax (1×b along K, b×1 along the rows, b×b tiles) is 2^e·m with m in
    [1, 2): e differs between K-neighbours (the last and the first too), between row-block neighbours, and between a
    tile and its transpose; neighbouring rows differ; exact in bf16."""
    from numcheck.properties.fp8.cases import plant_block_exponents

    g = torch.Generator().manual_seed(3)
    R, C = 3 * block, 3 * block + 8  # a 3×4 grid, the last K-block partial
    t = plant_block_exponents(torch.randn(R, C, generator=g, dtype=torch.float64), g, block)
    assert torch.equal(t.to(torch.bfloat16).double(), t)

    def exps(rb: int, cb: int) -> torch.Tensor:
        a = F.pad(t.abs(), (0, -C % cb, 0, -R % rb)).view(-(-R // rb), rb, -(-C // cb), cb).amax(dim=(1, 3))
        return torch.floor(torch.log2(a))

    row_blocks, col_blocks, tiles = exps(1, block), exps(block, 1), exps(block, block)
    assert bool((row_blocks != row_blocks.roll(1, dims=1)).all())  # along K, cyclically
    assert bool((row_blocks[1:] != row_blocks[:-1]).all())  # neighbouring rows
    assert bool((col_blocks[1:] != col_blocks[:-1]).all())  # b×1 blocks down the rows
    assert bool((tiles != tiles.roll(1, dims=1)).all()) and bool((tiles[1:] != tiles[:-1]).all())
    square = tiles[:3, :3]
    assert bool((square != square.t()).fill_diagonal_(True).all())  # a transposed tile index lands elsewhere
