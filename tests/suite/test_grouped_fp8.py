"""Every grouped FP8 linear property (mixture-of-experts) against every loaded grouped impl (built-in and plugged in).

Cases are drawn inside each impl's declaration (``properties/fp8/grouped/strategies.py``); the drawn tests are
:data:`numcheck.properties.fp8.grouped.suite.GROUPED_SUITE`, run by the suite's runner. Failures carry the impl, the
case, the output, the expert, error, bound, worst element and a repro command (``properties/fp8/grouped/props.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numcheck.impls.measure import capabilities
from numcheck.properties.core.device import DEVICE
from numcheck.properties.fp8.grouped import props as checks
from numcheck.properties.fp8.grouped.cases import EDGE_SPLIT_CASES, GroupedCase, fitted, refusal
from numcheck.properties.fp8.grouped.known_torchao import known_grouped_divergence
from numcheck.properties.fp8.grouped.strategies import GROUPED_SHAPE_REGIMES, grouped_drawn_shapes, grouped_multiples
from numcheck.properties.fp8.grouped.suite import GROUPED_SUITE
from numcheck.properties.fp8.shapes import regime_refusal
from numcheck.tests.suite.drawn import run_drawn

_FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")
pytestmark = [
    pytestmark,
    pytest.mark.torch_versions_impls(
        "grouped_fp8_linear[scaled_grouped_mm]",
        reason="the variant the scaled_grouped_mm probe switches (the others share fp8_linear's quantizers)",
    ),
]


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_accuracy_against_both_references(grouped_fp8_linear_impl, data):
    """Every expert's outputs within the accumulation bound of the dequantized reference and the FP8 bound of the
    original; delayed scaling's per-expert amax records exact."""
    run_drawn(GROUPED_SUITE["grouped_accuracy_against_both_references"], grouped_fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_accuracy_on_scale_block_grids(grouped_fp8_linear_impl, data):
    """Accuracy on grids of a few scale blocks each way whose every row, K-block and expert has its own exponent,
    with experts of exactly one block of tokens: a block scale read for the wrong block or expert shows."""
    run_drawn(GROUPED_SUITE["grouped_accuracy_on_scale_block_grids"], grouped_fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_equals_the_linear_per_expert(grouped_fp8_linear_impl, data):
    """The grouped call equals the single FP8 linear built-in per expert (bitwise where declared)."""
    run_drawn(GROUPED_SUITE["grouped_equals_the_linear_per_expert"], grouped_fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_empty_experts_exact_zero(grouped_fp8_linear_impl, data):
    """Experts without rows get exact-zero weight and bias gradients (after a call that gave them rows), and no
    output holds NaN or inf."""
    run_drawn(GROUPED_SUITE["grouped_empty_experts_exact_zero"], grouped_fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_split_rules_refused_outside(grouped_fp8_linear_impl, data):
    """m_splits outside the declared rules raise ValueError naming m_splits."""
    run_drawn(GROUPED_SUITE["grouped_split_rules_refused_outside"], grouped_fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_expert_permutation(grouped_fp8_linear_impl, data):
    """Permuting the experts permutes every output."""
    run_drawn(GROUPED_SUITE["grouped_expert_permutation"], grouped_fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_save_original_input_is_bitwise_identical(grouped_fp8_linear_impl, data):
    """save_original_input on and off give bitwise identical outputs (delayed scaling: on raises)."""
    run_drawn(GROUPED_SUITE["grouped_save_original_input_is_bitwise_identical"], grouped_fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_saved_bytes_measured(grouped_fp8_linear_impl, data):
    """Measured: on holds x itself, off the columnwise FP8 copy, and their difference is the predicted copy."""
    run_drawn(GROUPED_SUITE["grouped_saved_bytes_measured"], grouped_fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_grouped_wgrad_accumulation_over_micro_batches(grouped_fp8_linear_impl, data):
    """Three micro-batches accumulate wgrad into fp32 main_grad (fused) or weight.grad within the accumulated bound."""
    run_drawn(GROUPED_SUITE["grouped_wgrad_accumulation_over_micro_batches"], grouped_fp8_linear_impl, data)


def _first_dtype(impl) -> str:
    for name in ("bfloat16", "float32", "float16"):
        if any(str(d) == f"torch.{name}" for d in impl.support.dtypes):
            return name
    raise AssertionError(f"{impl.name} declares no dtype")


def _fit(impl, case: GroupedCase) -> GroupedCase | None:
    """``case`` moved into the impl's declaration (:func:`~properties.fp8.grouped.cases.fitted`), or ``None`` if it
    still is not declared."""
    case = fitted(impl.support, case)
    return None if refusal(impl.support, case) else case


#: The fixed cases (:data:`~properties.fp8.grouped.cases.EDGE_SPLIT_CASES`).
EDGE_CASES = EDGE_SPLIT_CASES


def test_grouped_edge_splits_every_recipe(grouped_fp8_linear_impl):
    """Fixed split patterns the draws seldom combine (:data:`EDGE_CASES`), for every declared recipe: accuracy of
    every expert, and the empty experts' exact zeros."""
    dtype = _first_dtype(grouped_fp8_linear_impl)
    for recipe in grouped_fp8_linear_impl.support.recipes:
        for m_splits, K, N, regime in EDGE_CASES:
            case = _fit(
                grouped_fp8_linear_impl,
                GroupedCase(
                    recipe,
                    m_splits,
                    K,
                    N,
                    dtype=dtype,
                    bias=True,
                    regime=regime,
                    seed=17,
                    steps=2 if recipe.kind == "delayed" else 1,
                    device=DEVICE,
                ),
            )
            if case is not None and known_grouped_divergence(grouped_fp8_linear_impl.name, "accuracy", case) is None:
                checks.accuracy(grouped_fp8_linear_impl, case)
                if regime == "outlier":  # its empty experts first and between, after a call that gave them rows
                    checks.empty_experts(grouped_fp8_linear_impl, case)


def test_grouped_delayed_scaling_per_gemm_histories(grouped_fp8_linear_impl):
    """Delayed scaling over six steps with experts of different magnitudes: each expert quantizes with its own
    stored scales and records its own amaxes (an empty expert's x and dy amax 0), exactly."""
    delayed = [r for r in grouped_fp8_linear_impl.support.recipes if r.kind == "delayed"]
    if not delayed:
        pytest.skip(f"{grouped_fp8_linear_impl.name} declares no delayed recipe")
    for recipe in delayed:
        case = _fit(
            grouped_fp8_linear_impl,
            GroupedCase(
                recipe,
                (48, 0, 17, 64),
                64,
                40,
                dtype=_first_dtype(grouped_fp8_linear_impl),
                steps=6,
                seed=2,
                device=DEVICE,
            ),
        )
        if case is not None:
            checks.accuracy(grouped_fp8_linear_impl, case)


def test_grouped_emulated_gemms(grouped_fp8_linear_impl):
    """With torch._scaled_mm forced off (exact emulation), outputs stay within bounds and bitwise per expert."""
    with capabilities.forced(scaled_mm=False):
        for recipe in grouped_fp8_linear_impl.support.recipes:
            case = _fit(
                grouped_fp8_linear_impl,
                GroupedCase(
                    recipe,
                    (32, 0, 16),
                    128,
                    48,
                    dtype=_first_dtype(grouped_fp8_linear_impl),
                    bias=True,
                    seed=4,
                    device=DEVICE,
                ),
            )
            if case is not None and known_grouped_divergence(grouped_fp8_linear_impl.name, "accuracy", case) is None:
                checks.accuracy(grouped_fp8_linear_impl, case)
                checks.per_expert_linear(grouped_fp8_linear_impl, case)


@pytest.mark.parametrize("regime", sorted(GROUPED_SHAPE_REGIMES))
def test_grouped_shape_regimes_in_the_declared_shapes(grouped_fp8_linear_impl, regime):
    """Every expert shape the suite draws lies in the impl's split and feature alignments, and a regime that is a
    property of the shape (a partial scale block along K or an expert's rows, the scale-block grids' K forms, an
    expert of exactly one block of tokens) is among them wherever the declaration allows it; where it does not,
    this test is skipped naming the field (``split_alignment``, ``feature_alignment``)."""
    support = grouped_fp8_linear_impl.support
    shapes = {(r.name, s) for r in support.recipes for s in grouped_drawn_shapes(support, r)}
    outside = {(name, (m, K, N)) for name, (m, K, N) in shapes if support.split_refusal((m,), m, K=K, N=N)}
    assert not outside, f"{grouped_fp8_linear_impl.name}: expert shapes outside its alignments: {sorted(outside)[:5]}"
    why = regime_refusal(support, regime, grouped_drawn_shapes, GROUPED_SHAPE_REGIMES, grouped_multiples)
    if why:
        pytest.skip(f"{grouped_fp8_linear_impl.name}: {why}")
