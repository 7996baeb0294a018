"""Every FP8 quantized-linear property against every registered fp8-linear impl (built-in and plugged in).

Cases are drawn inside each impl's declaration (properties/fp8/strategies.py); the drawn tests are
:data:`numcheck.properties.fp8.suite.FP8_SUITE`, run by the runner :func:`numcheck.check` uses too
(one ``@given`` per test, at test level). Failures carry the impl,
the case, the output, error, bound, worst element and a repro command (properties/fp8/props.py).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.fp8_linear import FP8_KIND, Fp8LinearSupport, validate_fp8_linear_impl
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.runner import judge
from numcheck.properties.fp8 import props as checks
from numcheck.properties.fp8.cases import (
    EDGE_INPUT_REGIMES,
    LARGE_CASES,
    FormatCodes,
    Fp8Case,
    QuantizerCase,
    declared_mode,
)
from numcheck.properties.fp8.known_torchao import known_fp8_divergence
from numcheck.properties.fp8.shapes import SHAPE_REGIMES, fitted, regime_refusal
from numcheck.properties.fp8.strategies import drawn_shapes
from numcheck.properties.fp8.suite import FP8_SUITE
from numcheck.reference.fp8_formats import E4M3, E5M2
from numcheck.tests.suite.drawn import run_drawn

_FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
EDGE_REGIMES = EDGE_INPUT_REGIMES


#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")
pytestmark = [
    pytestmark,
    pytest.mark.torch_versions_impls(
        "fp8_linear[current]",
        "fp8_linear[blockwise]",
        "fp8_linear[mxfp8]",
        reason="one recipe per torch-switched path: scaled_mm per scaling mode, eager FP8 casts (saturating or not), float8_e8m0fnu",
    ),
]


def _declared_mode(impl) -> bool:
    """The save_original_input value the fixed cases run with (:func:`properties.fp8.cases.declared_mode`)."""
    return declared_mode(impl.support)


def _both_modes(impl) -> bool:
    """Whether the impl declares both save_original_input values (the mode comparison needs both)."""
    return {False, True} <= set(impl.support.save_original_input)


def _first_dtype(impl) -> str:
    for d, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        if d in impl.support.dtypes:
            return name
    raise AssertionError(f"{impl.name} declares no dtype")


@_FIXTURE_OK
@given(data=st.data())
def test_accuracy_against_both_references(fp8_linear_impl, data):
    """Every output is within the accumulation bound of the dequantized reference and the fp8 bound of the original."""
    run_drawn(FP8_SUITE["accuracy_against_both_references"], fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_accuracy_on_scale_block_grids(fp8_linear_impl, data):
    """Accuracy on grids of a few scale blocks each way whose every row and K-block has its own exponent, K = block ×
    odd or m·2^j below the block: a block scale read from another block, transposed, or the partial last K-block's
    taken from the block before, lands on another exponent (random data repeats exponents and hides it)."""
    run_drawn(FP8_SUITE["accuracy_on_scale_block_grids"], fp8_linear_impl, data)


@_FIXTURE_OK
@given(data=st.data())
def test_accuracy_on_long_same_sign_chains(fp8_linear_impl, data):
    """Accuracy where the impl declares a truncating or promoted accumulation: same-sign operands over K of four and
    five declared chains, where a truncating accumulator's one-signed errors add up linearly in K, so a chain that
    runs longer than declared (a slow-accumulation restart dropped) exceeds the bound."""
    run_drawn(FP8_SUITE["accuracy_on_long_same_sign_chains"], fp8_linear_impl, data)


def test_edge_inputs_every_recipe(fp8_linear_impl):
    """All-zero, outlier-per-block, NaN, inf, tiny and wide inputs follow the oracle's defined behaviour, K = 40
    (not a multiple of 16, 32 or 128; rounded up to the declared dim_multiple), for every declared recipe; a case a known divergence of the installed release
    covers (:mod:`numcheck.properties.fp8.known_torchao`) is left to that entry's strict example."""
    bias = fp8_linear_impl.support.bias
    for recipe in fp8_linear_impl.support.recipes:
        for regime in EDGE_REGIMES:
            steps = 2 if recipe.kind == "delayed" else 1
            case = fitted(
                fp8_linear_impl.support,
                Fp8Case(
                    recipe,
                    33,
                    40,
                    24,
                    dtype=_first_dtype(fp8_linear_impl),
                    bias=bias,
                    regime=regime,
                    seed=11,
                    steps=steps,
                    save_original_input=_declared_mode(fp8_linear_impl),
                    device=DEVICE,
                ),
            )
            if known_fp8_divergence(fp8_linear_impl.name, "accuracy", case) is None:  # else its strict example runs
                judge(checks.accuracy, fp8_linear_impl, case)


def test_multi_tile_and_long_reduction_every_recipe(fp8_linear_impl):
    """Shapes the draws seldom reach, for every recipe (:data:`LARGE_CASES`): a 3×3 grid of 128×128 W tiles with
    a binade spread (a transposed scale grid shows) or with zero tiles (amax 0), K = 1040 and K = 4096 and a
    2304-token wgrad in bf16 where declared (partial sums of a long or split reduction must stay fp32 with each
    split's own scales), and a 76800-element x whose amax is its last element (an amax reduction must cover a
    partial tail)."""
    low = "bfloat16" if torch.bfloat16 in fp8_linear_impl.support.dtypes else _first_dtype(fp8_linear_impl)
    for recipe in fp8_linear_impl.support.recipes:
        steps = 2 if recipe.kind == "delayed" else 1
        for M, K, N, which, regime in LARGE_CASES:
            dtype = low if which == "low" else _first_dtype(fp8_linear_impl)
            case = fitted(
                fp8_linear_impl.support,
                Fp8Case(
                    recipe,
                    M,
                    K,
                    N,
                    dtype=dtype,
                    bias=fp8_linear_impl.support.bias,
                    regime=regime,
                    seed=12,
                    steps=steps,
                    save_original_input=_declared_mode(fp8_linear_impl),
                    device=DEVICE,
                ),
            )
            judge(checks.accuracy, fp8_linear_impl, case)


@pytest.mark.parametrize("prop", checks.LAYER_PROPERTIES)
@pytest.mark.parametrize("soi", [False, True], ids=["copy", "original"])
def test_usage_as_a_layer_every_recipe(fp8_linear_impl, soi, prop):
    """Used as training uses a layer, for every current-scaling recipe, property ``prop``: two micro-batches
    accumulate into weight.grad, a weight changed in place is seen, two layers of one shape keep their own
    gradients, or sliced x / dy with a transposed weight leaf give the single-call outputs (or a loud refusal)."""
    if soi not in fp8_linear_impl.support.save_original_input:
        pytest.skip(f"{fp8_linear_impl.name} does not declare save_original_input={soi}")
    recipes = [
        r for r in fp8_linear_impl.support.recipes if r.kind != "delayed" and (r.allows_save_original_input or not soi)
    ]
    if not recipes:
        pytest.skip(f"{fp8_linear_impl.name} declares no recipe this applies to (delayed scaling keeps per-call state)")
    for recipe in recipes:
        case = fitted(
            fp8_linear_impl.support,
            Fp8Case(
                recipe,
                33,
                40,
                24,
                dtype=_first_dtype(fp8_linear_impl),
                bias=fp8_linear_impl.support.bias,
                seed=13,
                save_original_input=soi,
                device=DEVICE,
            ),
        )
        judge(checks.FP8_PROPERTIES[prop], fp8_linear_impl, case)


@_FIXTURE_OK
@given(data=st.data())
def test_save_original_input_is_bitwise_identical(fp8_linear_impl, data):
    """save_original_input True and False give bitwise identical y, dgrad, wgrad and bgrad (delayed: True raises)."""
    run_drawn(FP8_SUITE["save_original_input_is_bitwise_identical"], fp8_linear_impl, data)


def test_save_original_input_on_edge_regimes(fp8_linear_impl):
    """Bitwise identical modes also where FP8 subnormals and outliers make double quantization visible
    (wide and outlier inputs), for every recipe that allows save_original_input."""
    if not _both_modes(fp8_linear_impl):
        pytest.skip(f"{fp8_linear_impl.name} does not declare both save_original_input values")
    for recipe in fp8_linear_impl.support.recipes:
        for regime in ("wide", "outlier", "zeros", "inf"):
            case = fitted(
                fp8_linear_impl.support,
                Fp8Case(
                    recipe,
                    64,
                    72,
                    40,
                    dtype=_first_dtype(fp8_linear_impl),
                    bias=fp8_linear_impl.support.bias,
                    regime=regime,
                    seed=5,
                    device=DEVICE,
                ),
            )
            judge(checks.save_original_input, fp8_linear_impl, case)


@_FIXTURE_OK
@given(data=st.data())
def test_saved_tensor_aliasing_and_bytes(fp8_linear_impl, data):
    """True holds x itself, False holds the FP8 copy instead, and held(False) − held(True) is the predicted copy."""
    run_drawn(FP8_SUITE["saved_tensor_aliasing_and_bytes"], fp8_linear_impl, data)


def test_delayed_scaling_over_steps(fp8_linear_impl):
    """Delayed scaling quantizes with the stored scales while x grows 8× and dy shrinks 4× per step (so the
    window's max, its most recent entry and a window longer than 4 all differ), and records exact amaxes."""
    delayed = [r for r in fp8_linear_impl.support.recipes if r.kind == "delayed"]
    if not delayed:
        pytest.skip(f"{fp8_linear_impl.name} declares no delayed recipe")
    for recipe in delayed:
        case = fitted(
            fp8_linear_impl.support,
            Fp8Case(recipe, 48, 64, 40, dtype=_first_dtype(fp8_linear_impl), steps=6, seed=2, device=DEVICE),
        )
        judge(checks.accuracy, fp8_linear_impl, case)


def _needs_quantize(impl) -> None:
    if not impl.support.exposes_quantize:
        pytest.skip(f"{impl.name} does not expose quantize (support.exposes_quantize=False)")
    odd = {d: m for d, m in impl.support.dim_multiples.items() if 8 % m}
    if odd:
        pytest.skip(f"{impl.name} declares dim_multiple {odd}: the 8×32 tensor of every code is not such a shape")


@pytest.mark.parametrize("regime", sorted(SHAPE_REGIMES))
def test_shape_regimes_in_the_declared_shapes(fp8_linear_impl, regime):
    """Every shape the suite draws for the impl lies in its declared shapes (``dim_multiple``), and a regime that is
    a property of the shape (:data:`numcheck.properties.fp8.shapes.SHAPE_REGIMES`: a partial scale block along K or
    the rows; the scale-block grids' K = block × odd and K = m·2^j below the block) is among them wherever the
    declaration allows it; where it does not, this test is skipped naming the declaration field, so a regime the
    drawn tests cannot reach is said, not dropped unseen."""
    support = fp8_linear_impl.support
    outside = {(r.name, s) for r in support.recipes for s in drawn_shapes(support, r) if support.shape_refusal(*s)}
    assert not outside, (
        f"{fp8_linear_impl.name}: the suite draws shapes outside its dim_multiple: {sorted(outside)[:5]}"
    )
    why = regime_refusal(support, regime, drawn_shapes)
    if why:
        pytest.skip(f"{fp8_linear_impl.name}: {why}")


@_FIXTURE_OK
@given(data=st.data())
def test_quantizer_bitwise_on_random_tensors(fp8_linear_impl, data):
    """The impl's quantizer equals the oracle bitwise on random tensors (codes, scales, E8M0), columnwise = rowwise(ᵀ)ᵀ."""
    run_drawn(FP8_SUITE["quantizer_bitwise_on_random_tensors"], fp8_linear_impl, data)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_quantizer_bitwise_on_all_256_codes(fp8_linear_impl, fmt):
    """Quantizing a tensor of all 256 values of a format (saturation, NaN, subnormals, signed zero) matches the oracle."""
    _needs_quantize(fp8_linear_impl)
    for recipe in fp8_linear_impl.support.recipes:
        for transposed in (False, True):
            case = QuantizerCase(recipe, FormatCodes(fmt.name, transposed), device=DEVICE)
            judge(checks.quantizer_case, fp8_linear_impl, case, name="quantizer")


def test_fp8_values_round_trip_under_unit_scale(fp8_linear_impl):
    """With current scaling, a tensor holding every finite value of its format (amax = fp8_max, scale 1) quantizes
    to exactly those codes; ±inf saturate to ±max and NaN stays NaN."""
    _needs_quantize(fp8_linear_impl)
    cur = [r for r in fp8_linear_impl.support.recipes if r.kind == "current" and not r.power_of_2_scales]
    if not cur:
        pytest.skip(f"{fp8_linear_impl.name} declares no current-scaling recipe with fp32 scales")
    for recipe in cur:
        case = QuantizerCase(recipe, FormatCodes(recipe.format_of("x").name), device=DEVICE)
        judge(checks.unit_scale_round_trip, fp8_linear_impl, case)


def test_emulated_gemms_match_native(fp8_linear_impl):
    """With torch._scaled_mm forced off (exact emulation), outputs stay within bounds and the modes stay bitwise equal."""
    with capabilities.forced(scaled_mm=False):
        for recipe in fp8_linear_impl.support.recipes:
            case = fitted(
                fp8_linear_impl.support,
                Fp8Case(
                    recipe,
                    32,
                    128,
                    48,
                    dtype=_first_dtype(fp8_linear_impl),
                    bias=fp8_linear_impl.support.bias,
                    seed=4,
                    save_original_input=_declared_mode(fp8_linear_impl),
                    device=DEVICE,
                ),
            )
            judge(checks.accuracy, fp8_linear_impl, case)
            if recipe.allows_save_original_input and _both_modes(fp8_linear_impl):
                judge(checks.save_original_input, fp8_linear_impl, case)


# -- protocol ------------------------------------------------------------------------------------------
def test_protocol_rejects_malformed_impls():
    """validate_fp8_linear_impl names the origin and the problem for objects that break the protocol."""

    class NoSupport:
        name, kind = "bad", FP8_KIND

        def __call__(self, *a, **k):
            return None

    with pytest.raises(TypeError, match="origin-x.*support"):
        validate_fp8_linear_impl(NoSupport(), "origin-x")

    class NoQuantize(NoSupport):
        support = Fp8LinearSupport(exposes_quantize=True)

    with pytest.raises(TypeError, match="exposes_quantize"):
        validate_fp8_linear_impl(NoQuantize(), "origin-y")
    with pytest.raises(ValueError, match="recipes"):
        Fp8LinearSupport(recipes=())
