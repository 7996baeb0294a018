"""The FP8 oracle itself: bit-exact formats, scale rules, block semantics, independent oracles."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numcheck.properties.fp8.strategies import amaxes, fp8_test_tensors
from numcheck.properties.fp8.tolerance import quantization_error_bound
from numcheck.reference.fp8_formats import (
    E4M3,
    E5M2,
    FP32_MAX,
    Fp8Format,
    all_codes,
    decode_e8m0,
    decode_fp8,
    encode_fp8,
    is_nan_code,
    round_to_fp32,
    same_codes,
)
from numcheck.reference.fp8_linear import quantized_linear
from numcheck.reference.fp8_recipes import Fp8Recipe, standard_recipes
from numcheck.reference.fp8_scaling import (
    Quantized,
    block_amax,
    delayed_scale_update,
    mx_scale_code,
    quantize,
    quantize_operand,
    scale_from_amax,
    scale_inverse,
)

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (the independent fp8 rounding oracle) is not installed")
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FMTS = [E4M3, E5M2]


def _at_least(n: int) -> int:
    """These oracle checks are cheap: at least ``n`` examples, more when the profile asks for more."""
    return max(n, settings.default.max_examples)


#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")
pytestmark = [
    pytestmark,
    pytest.mark.torch_versions(
        reason="an oracle: torch ops (and what it compares them with) a torch release can change"
    ),
]


def _ml_codes(v: torch.Tensor, fmt) -> torch.Tensor:
    return torch.from_numpy(v.to(torch.float64).numpy().astype(ML[fmt.name]).view(np.uint8).copy())


# -- formats ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_decode_all_256_codes_matches_torch_and_ml_dtypes(fmt):
    """Every one of the 256 codes decodes to the value torch's float8 dtype and ml_dtypes give (NaN as NaN)."""
    c = all_codes()
    mine = decode_fp8(c, fmt)
    via_torch = c.view(fmt.torch_dtype).to(torch.float64)
    via_ml = torch.from_numpy(np.arange(256, dtype=np.uint8).view(ML[fmt.name]).astype(np.float64))
    for other, who in ((via_torch, "torch"), (via_ml, "ml_dtypes")):
        same = (mine == other) | (torch.isnan(mine) & torch.isnan(other))
        assert bool(same.all()), f"{fmt.name}: code 0x{int((~same).nonzero()[0]):02x} decodes differently from {who}"
    assert torch.equal(torch.signbit(mine[0x80:0x81]), torch.tensor([True])), "0x80 must be −0"


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_encode_round_trips_all_256_codes(fmt):
    """encode(decode(c)) == c for every code (NaN codes as NaN); with saturation, ±inf become ±max."""
    c = all_codes()
    v = decode_fp8(c, fmt)
    assert bool(same_codes(encode_fp8(v, fmt, saturate=False), c, fmt).all())
    sat = encode_fp8(v, fmt, saturate=True)
    fin = torch.isfinite(v)
    assert torch.equal(sat[fin], c[fin])
    assert bool(torch.isnan(decode_fp8(sat[torch.isnan(v)], fmt)).all())
    if fmt.has_inf:
        assert decode_fp8(sat[torch.isinf(v)], fmt).abs().eq(fmt.max_finite).all()


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_rounding_ties_match_ml_dtypes(fmt):
    """Midpoints between every pair of adjacent finite FP8 values round to even, as ml_dtypes does."""
    v = decode_fp8(all_codes(), fmt)
    pos = torch.sort(v[torch.isfinite(v) & (v >= 0)]).values.unique()
    mids = (pos[:-1] + pos[1:]) / 2
    mids = torch.cat([mids, -mids, pos[-1:] + (pos[-1] - pos[-2]) / 2])
    assert bool(same_codes(encode_fp8(mids, fmt, saturate=False), _ml_codes(mids, fmt), fmt).all())


@settings(max_examples=_at_least(40))
@given(t=fp8_test_tensors())
def test_encode_matches_ml_dtypes_on_random_values(t):
    """Non-saturating RNE encoding of binary32 values equals ml_dtypes' cast bit for bit (NaN as NaN)."""
    for fmt in FMTS:
        ok = same_codes(encode_fp8(t, fmt, saturate=False), _ml_codes(t, fmt), fmt)
        assert bool(ok.all()), f"{fmt.name}: value {float(t.flatten()[int((~ok.flatten()).nonzero()[0])])!r}"


def test_saturation_specials_and_signed_zero():
    """Saturating cast: overflow and ±inf → ±max, ties at the top go to even, NaN stays NaN, −0 keeps its sign."""
    v = torch.tensor(
        [1e9, -1e9, float("inf"), float("-inf"), 464.0, 465.0, 480.0, -0.0, 0.0, float("nan"), 2.0**-10, 2.0**-9 * 1.5]
    )
    e4 = encode_fp8(v, E4M3)
    # 464 is the midpoint of 448 (mantissa 110, even) and the would-be 480 (111): RNE picks 448, so never overflows.
    assert e4[:8].tolist() == [0x7E, 0xFE, 0x7E, 0xFE, 0x7E, 0x7E, 0x7E, 0x80]
    assert e4[8] == 0 and bool(is_nan_code(e4[9:10], E4M3).all())
    # 2^-10 is half the smallest subnormal 2^-9: a tie, rounds to even (0); 1.5·2^-9 is the tie 1→2 subnormal units.
    assert e4[10] == 0x00 and e4[11] == 0x02
    e5 = encode_fp8(torch.tensor([61440.0, 61439.0, float("inf"), -1e30]), E5M2)
    assert e5.tolist() == [0x7B, 0x7B, 0x7B, 0xFB]
    assert encode_fp8(torch.tensor([61440.0]), E5M2, saturate=False).tolist() == [0x7C]  # IEEE: tie to even 65536 → inf


@settings(max_examples=_at_least(60))
@given(v=st.floats(allow_nan=True, allow_infinity=True, width=64))
def test_round_to_fp32_matches_ieee_conversion(v):
    """The hand-written binary32 rounding equals the IEEE float64→float32 conversion, subnormals included."""
    t = torch.tensor([v, v * 2.0**-140, -v * 2.0**-120], dtype=torch.float64)
    mine = round_to_fp32(t)
    ieee = t.to(torch.float32).to(torch.float64)
    assert bool(
        ((mine == ieee) & (torch.signbit(mine) == torch.signbit(ieee)) | (torch.isnan(mine) & torch.isnan(ieee))).all()
    )


# -- scale rules --------------------------------------------------------------------------------------
def test_scale_rule_on_special_amax():
    """amax 0, inf, NaN → scale 1; a subnormal amax overflows fp8_max/amax → value_for_inf (2^127 with pow2)."""
    a = torch.tensor([0.0, float("inf"), float("nan"), 1e-45, 1e-40], dtype=torch.float64)
    s = scale_from_amax(a, 448.0)
    assert s.tolist()[:3] == [1.0, 1.0, 1.0]
    assert s.tolist()[3:] == [FP32_MAX, FP32_MAX]
    assert scale_from_amax(a, 448.0, power_of_2=True).tolist()[3:] == [2.0**127, 2.0**127]
    bf16_max = float(torch.finfo(torch.bfloat16).max)
    assert scale_from_amax(a[3:], 448.0, value_for_inf=bf16_max).tolist() == [bf16_max, bf16_max]
    # epsilon floors amax before the special-value test: amax 0 with epsilon 2^-4 gives 448·16.
    assert scale_from_amax(torch.tensor([0.0]), 448.0, epsilon=2.0**-4).tolist() == [448.0 * 16]
    # scale_inv of FLT_MAX is a binary32 subnormal, rounded to nearest.
    assert float(scale_inverse(torch.tensor(FP32_MAX))) == float(
        torch.tensor(1.0, dtype=torch.float32) / torch.tensor(FP32_MAX, dtype=torch.float32)
    )


@settings(max_examples=_at_least(80))
@given(amax=amaxes())
def test_scale_rule_matches_fp32_division(amax):
    """For normal amax the scale is the binary32 quotient fp8_max/amax, its pow2 variant the largest 2^k ≤ it."""
    a32 = torch.tensor(amax, dtype=torch.float32)
    for fmt in FMTS:
        s = float(scale_from_amax(torch.tensor(float(a32), dtype=torch.float64), fmt.max_finite))
        q = torch.tensor(fmt.max_finite, dtype=torch.float32) / a32
        if math.isnan(amax) or amax == 0 or math.isinf(amax):
            assert s == 1.0
        elif math.isinf(float(q)):
            assert s == FP32_MAX
        else:
            assert s == float(q)
            p2 = float(scale_from_amax(torch.tensor(float(a32), dtype=torch.float64), fmt.max_finite, power_of_2=True))
            assert p2 == 2.0 ** math.floor(math.log2(s)) and p2 <= s < 2 * p2


def test_delayed_scale_update_rules():
    """Delayed scaling: (fp8_max/2^margin)/max(window) or the most recent; non-finite or zero amax keeps the scale."""
    assert delayed_scale_update([1.0, 4.0, 2.0], 1.0, 448.0, margin=1, algo="max") == 448.0 / 2 / 4
    assert delayed_scale_update([1.0, 4.0, 2.0], 1.0, 448.0, margin=1, algo="most_recent") == 448.0 / 2 / 2
    assert delayed_scale_update([float("inf")], 3.0, 448.0, algo="max") == 3.0
    assert delayed_scale_update([0.0, 0.0], 3.0, 448.0) == 3.0
    assert delayed_scale_update([float("nan"), 2.0], 3.0, 448.0) == 224.0  # NaN ignored by max, as TE's fmaxf
    assert delayed_scale_update([1e-45], 3.0, 448.0) == FP32_MAX  # overflow → FLT_MAX (suite's choice, documented)
    assert delayed_scale_update([3.0], 1.0, 57344.0) == float(
        torch.tensor(57344.0, dtype=torch.float32) / torch.tensor(3.0)
    )


def test_mx_scale_codes_on_special_amax():
    """E8M0 codes: amax 0 → 0, inf → 254, NaN → 255, 448·2^k → 127+k (RCEIL and FLOOR), tiny → 0."""
    a = torch.tensor([0.0, float("inf"), float("nan"), 448.0, 448.0 * 4, 1e-45], dtype=torch.float64)
    for r in ("rceil", "floor"):
        assert mx_scale_code(a, E4M3, r).tolist() == [0, 254, 255, 127, 129, 0]
    assert decode_e8m0(torch.tensor([0, 127, 254, 255])).tolist()[:3] == [2.0**-127, 1.0, 2.0**127]


@settings(max_examples=_at_least(80))
@given(amax=st.floats(min_value=2.0**-100, max_value=2.0**100, width=32))
def test_rceil_and_floor_differ_exactly_when_amax_mantissa_exceeds_1_75(amax):
    """RCEIL = FLOOR + 1 iff the mantissa of amax exceeds 1.75 (fp8_max = 1.75·2^emax), else they agree."""
    for fmt in FMTS:
        a = torch.tensor([amax], dtype=torch.float64)
        r, f = int(mx_scale_code(a, fmt, "rceil")), int(mx_scale_code(a, fmt, "floor"))
        m = amax / 2.0 ** math.floor(math.log2(amax))
        assert r - f == (1 if m > 1.75 else 0), (fmt.name, amax, m, r, f)
        # RCEIL never saturates: amax / 2^(code−127) ≤ fp8_max; FLOOR keeps amax / X < 2^(emax+1).
        assert amax / 2.0 ** (r - 127) <= fmt.max_finite
        assert amax / 2.0 ** (f - 127) < 2.0 ** (fmt.mx_emax + 1)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_mx_scales_agree_with_torchao_to_mx(fmt, mode):
    """torchao's to_mx (an independent MX implementation) gives the same E8M0 scales and element codes."""
    try:
        import torchao.prototype.mx_formats.mx_tensor as mx
    except Exception as exc:  # absent, or a release that does not import with this torch
        pytest.skip(f"torchao's MX formats are not importable here ({type(exc).__name__}: {exc})")
    g = torch.Generator().manual_seed(7)
    # Rows over 60 binades; every 32-block has a normal amax (codes in 1..253, where the rules are defined alike).
    x = (torch.randn(64, 256, generator=g) * torch.exp2(torch.randint(-30, 31, (64, 1), generator=g).float())).float()
    x[3, :32] = torch.linspace(-448.0, 449.0, 32)  # amax mantissa just above 1.75: RCEIL and FLOOR differ here
    s, d = mx.to_mx(x, fmt.torch_dtype, 32, getattr(mx.ScaleCalculationMode, mode.upper()))
    q = quantize(x, fmt, (1, 32), scaling="mx", mx_rounding=mode)
    assert torch.equal(s.view(torch.uint8).to(torch.int64), q.scale_code)
    assert bool(same_codes(d.view(torch.uint8), q.codes, fmt).all())


# -- blocks ---------------------------------------------------------------------------------------------
@settings(max_examples=_at_least(30))
@given(t=fp8_test_tensors(), recipe=st.sampled_from(standard_recipes()), role=st.sampled_from(["x", "w", "dy"]))
def test_columnwise_equals_transposed_rowwise(t, recipe, role):
    """Columnwise quantization of t equals the rowwise quantization of tᵀ, transposed back (codes and scales)."""
    col = quantize_operand(t, recipe, role, "columnwise", stored_scale=2.0)
    row = quantize_operand(t.t().contiguous(), recipe, role, "rowwise", stored_scale=2.0)
    assert torch.equal(col.codes, row.codes.t())
    assert torch.equal(col.scale_inv, row.scale_inv.t())


@settings(max_examples=_at_least(30))
@given(
    t=fp8_test_tensors(),
    block=st.sampled_from([(1, 32), (32, 1), (1, 128), (128, 1), (128, 128)]),
    mode=st.sampled_from(["amax", "mx"]),
)
def test_partial_blocks_mean_zero_padding(t, block, mode):
    """A shape not divisible by the block quantizes as if zero-padded to a multiple, then cropped."""
    R, C = t.shape
    pr, pc = -(-R // block[0]) * block[0], -(-C // block[1]) * block[1]
    padded = torch.zeros(pr, pc, dtype=t.dtype)
    padded[:R, :C] = t
    a = quantize(t, E4M3, block, scaling=mode)
    b = quantize(padded, E4M3, block, scaling=mode)
    assert torch.equal(a.codes, b.codes[:R, :C])
    assert torch.equal(a.scale_inv.nan_to_num(), b.scale_inv.nan_to_num())
    assert torch.equal(a.amax, block_amax(padded, block))


@settings(max_examples=_at_least(30))
@given(t=fp8_test_tensors(), recipe=st.sampled_from(standard_recipes()))
def test_quantization_error_within_derived_bound(t, recipe):
    """|deq(Q(t)) − t| ≤ ρ(t), the per-element bound the total-error tolerance is built from; the bound is
    attained within a factor 4 on ordinary data (so it is not vacuous)."""
    q = quantize_operand(t, recipe, "x", "rowwise", stored_scale=1.0)
    t64 = t.to(torch.float64)
    fin = torch.isfinite(t64)
    err = (q.dequantized - t64).abs()[fin]
    rho = quantization_error_bound(q, t)[fin]
    assert bool((err <= rho).all()), float((err / rho).max())


def test_quantization_error_bound_is_sharp_on_normal_data():
    """On N(0,1) data the worst |deq(Q(t)) − t| / ρ(t) exceeds 1/4 for every recipe (ρ is not loose)."""
    t = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    for recipe in standard_recipes():
        q = quantize_operand(t, recipe, "x", "rowwise", stored_scale=1.0)
        ratio = float(((q.dequantized - t.double()).abs() / quantization_error_bound(q, t)).max())
        assert 0.25 < ratio <= 1.0, (recipe.name, ratio)


# -- the linear oracle -----------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", standard_recipes(), ids=lambda r: r.name)
def test_oracle_original_reference_matches_float64_autograd(recipe):
    """The original-operand reference equals float64 autograd of F.linear; the dequantized one is the exact
    product of the oracle's own quantized operands."""
    g = torch.Generator().manual_seed(5)
    x, w, dy, b = (
        torch.randn(33, 40, generator=g),
        torch.randn(17, 40, generator=g),
        torch.randn(33, 17, generator=g),
        torch.randn(17, generator=g),
    )
    ref = quantized_linear(x, w, dy, b, recipe, delayed_scales={"x": 2.0, "w": 8.0, "dy": 0.5})
    xx, ww, bb = (t.double().requires_grad_(True) for t in (x, w, b))
    y = torch.nn.functional.linear(xx, ww, bb)
    y.backward(dy.double())
    assert torch.allclose(ref.true["y"], y.detach(), rtol=1e-13, atol=1e-13)
    assert torch.allclose(ref.true["dgrad"], xx.grad, rtol=1e-13, atol=1e-13)
    assert torch.allclose(ref.true["wgrad"], ww.grad, rtol=1e-13, atol=1e-13)
    assert torch.allclose(ref.true["bgrad"], bb.grad, rtol=1e-13, atol=1e-13)
    xq, wq = ref.operand("x", "rowwise").dequantized, ref.operand("w", "rowwise").dequantized
    assert torch.equal(ref.dq["y"], xq @ wq.t() + b.double())
    assert ref.operand("dy", "rowwise").fmt is recipe.format_of("dy")


def test_block_amax_ignores_nan_and_counts_inf():
    """Block amax drops NaN elements (an all-NaN block has amax 0) and an inf element makes it inf."""
    t = torch.tensor([[float("nan"), -3.0, 2.0, float("nan")], [float("nan")] * 4, [1.0, float("-inf"), 0.0, 5.0]])
    assert block_amax(t, (1, 4)).flatten().tolist() == [3.0, 0.0, float("inf")]
    assert block_amax(t, (1, 2)).tolist() == [[3.0, 2.0], [0.0, 0.0], [float("inf"), 5.0]]
    assert block_amax(t, None).tolist() == [[float("inf")]]


def test_recipe_table():
    """Formats and block shapes per recipe, role and usage are the documented ones (TE's recipes)."""
    B, X = 128, 32
    expect = {
        "delayed": {("x", "rowwise"): None, ("w", "columnwise"): None, ("dy", "columnwise"): None},
        "current": {("x", "columnwise"): None, ("w", "rowwise"): None},
        "blockwise": {
            ("x", "rowwise"): (1, B),
            ("x", "columnwise"): (B, 1),
            ("dy", "rowwise"): (1, B),
            ("dy", "columnwise"): (B, 1),
            ("w", "rowwise"): (B, B),
            ("w", "columnwise"): (B, B),
        },
        "mxfp8": {
            ("x", "rowwise"): (1, X),
            ("x", "columnwise"): (X, 1),
            ("w", "rowwise"): (1, X),
            ("w", "columnwise"): (X, 1),
            ("dy", "rowwise"): (1, X),
            ("dy", "columnwise"): (X, 1),
        },
    }
    for kind, table in expect.items():
        r = Fp8Recipe(kind)
        for (role, usage), block in table.items():
            assert r.block_of(role, usage) == block, (kind, role, usage)
        hybrid = kind in ("delayed", "current")
        assert r.format_of("dy") is (E5M2 if hybrid else E4M3) and r.format_of("x") is E4M3 and r.format_of("w") is E4M3
        assert r.allows_save_original_input is (kind != "delayed")
    assert Fp8Recipe("blockwise").power_of_2_scales and not Fp8Recipe("current").power_of_2_scales
    with pytest.raises(ValueError, match="mx_scale_rounding"):
        Fp8Recipe("current", mx_scale_rounding="floor")
    with pytest.raises(ValueError, match="kind"):
        Fp8Recipe("nvfp4")


def test_cast_rounds_through_binary32_first():
    """q = fp8(fp32(x·s)): x·s just below the E4M3 tie 1.1875 becomes the tie in binary32, which rounds to even
    1.25 — direct rounding of the exact product would give 1.125. The oracle follows the kernels (and torch)."""
    target_ = torch.tensor(1.1875 / 3, dtype=torch.float64)
    x = torch.nextafter(target_.to(torch.float32), torch.tensor(0.0)).reshape(1, 1)
    assert float(x.double() * 3) < 1.1875 and float((x * 3).double()) == 1.1875  # the binary32 product is the tie
    q = quantize(x, E4M3, None, scaling="stored", stored_scale=3.0)
    assert float(q.values) == 1.25
    assert float(decode_fp8(encode_fp8(x.double() * 3, E4M3), E4M3)) == 1.125  # direct rounding differs
    assert float((x * 3).to(torch.float8_e4m3fn).float()) == 1.25


def test_accumulation_bound_model():
    """The chunked (promoted) accumulation factor equals γ_{n+4} without promotion, stays finite for long
    reductions at 14-bit precision, and grows with n only through the fp32 level."""
    from numcheck.properties.fp8.tolerance import U32, accumulation_gamma, gamma

    assert accumulation_gamma(100, 2.0**-24, None) == gamma(104, 2.0**-24)
    assert accumulation_gamma(100, 2.0**-13, 128) == gamma(104, 2.0**-13)
    big = accumulation_gamma(1 << 20, 2.0**-13, 128)
    assert math.isfinite(big) and big < 0.02 and gamma((1 << 20) + 4, 2.0**-13) == math.inf
    g = gamma(132, 2.0**-13)
    assert accumulation_gamma(4096, 2.0**-13, 128) == g + (1 + g) * gamma(32, U32)


def test_rowwise_recipe_table():
    """The rowwise kinds (torchao's AXISWISE recipes): one scale per row (rowwise usage) or column (columnwise) over
    the whole other dimension; rowwise_gw_hp scales W for dgrad per tensor and quantizes x and dy rowwise only (its
    wgrad runs in high precision); both E4M3 with power-of-2 scales by default."""
    rw, hp = Fp8Recipe("rowwise"), Fp8Recipe("rowwise_gw_hp")
    for role in ("x", "w", "dy"):
        assert rw.block_of(role, "rowwise") == hp.block_of(role, "rowwise") == (1, None)
        assert rw.block_of(role, "columnwise") == (None, 1) and rw.usages_of(role) == ("rowwise", "columnwise")
        assert rw.format_of(role) is E4M3 and hp.format_of(role) is E4M3
    assert hp.block_of("w", "columnwise") is None and hp.usages_of("x") == hp.usages_of("dy") == ("rowwise",)
    for role in ("x", "dy"):
        with pytest.raises(ValueError, match="not quantized columnwise.*wgrad GEMM runs in high precision"):
            hp.block_of(role, "columnwise")
    assert rw.power_of_2_scales and hp.power_of_2_scales and rw.high_precision_gemms == ()
    assert hp.high_precision_gemms == ("wgrad",) and not hp.quantizes("wgrad") and hp.quantizes("dgrad")
    assert rw.name == "rowwise-e4m3-pow2" and Fp8Recipe("rowwise", power_of_2_scales=False).name == "rowwise-e4m3-fp32"


def test_rowwise_quantization_scales_each_row_over_the_whole_row():
    """A rowwise quantization of [R, C] has R scales, each fp8_max / amax of its own row rounded down to a power of
    2 (torchao: ``amax_to_scale`` of ``amax(abs(t), dim=-1)``), and columnwise C scales of the columns; rows of
    different magnitude keep their own FP8 precision."""
    t = torch.tensor([[1.0, -3.0, 0.5], [1e-3, 2e-3, -4e-3], [100.0, 0.0, 7.0]])
    recipe = Fp8Recipe("rowwise", amax_epsilon=1e-12)
    q = quantize_operand(t, recipe, "x", "rowwise")
    assert q.block == (1, 3) and q.scale.shape == (3, 1)
    want = [2.0 ** math.floor(math.log2(448.0 / a)) for a in (3.0, float(torch.tensor(4e-3)), 100.0)]
    assert q.scale.flatten().tolist() == want
    c = quantize_operand(t, recipe, "x", "columnwise")
    assert c.block == (3, 1) and c.scale.shape == (1, 3)
    assert c.scale.flatten().tolist() == [2.0 ** math.floor(math.log2(448.0 / a)) for a in (100.0, 3.0, 7.0)]
    assert torch.allclose(q.dequantized[1], t[1].double(), rtol=2.0**-4)  # the small row keeps 3 mantissa bits


def test_high_precision_wgrad_reads_the_original_operands():
    """rowwise_gw_hp's wgrad reference is dyᵀ·x of the original operands (dequantized and original references
    agree); fprop and dgrad are quantized, dgrad's W with one scale for the tensor."""
    g = torch.Generator().manual_seed(3)
    x, w, dy = (torch.randn(*s, generator=g) for s in ((9, 20), (7, 20), (9, 7)))
    ref = quantized_linear(x, w, dy, None, Fp8Recipe("rowwise_gw_hp"))
    assert torch.equal(ref.dq["wgrad"], ref.true["wgrad"])
    assert torch.equal(ref.dq["wgrad"], dy.double().t() @ x.double())
    assert set(ref.operands) == {("x", "rowwise"), ("w", "rowwise"), ("dy", "rowwise"), ("w", "columnwise")}
    assert ref.operand("w", "columnwise").scale.shape == (1, 1) and ref.operand("w", "rowwise").scale.shape == (7, 1)
    assert not torch.equal(ref.dq["dgrad"], ref.true["dgrad"])


def _hopper_case(codes_a: torch.Tensor, codes_b: torch.Tensor, fmt_b: Fp8Format = E4M3):
    """(GemmOperands, exact float64 product, QTensors) of E4M3 codes ``a`` and ``fmt_b`` codes ``b``, unit scales."""
    from numcheck.properties.fp8.tolerance import GemmOperands, step_exponents
    from numcheck.reference.numerics.fp8_linear import QTensor

    qa = Quantized(codes_a, E4M3, (1, 1), *(torch.ones(1, 1, dtype=torch.float64),) * 3)
    qb = Quantized(codes_b, fmt_b, (1, 1), *(torch.ones(1, 1, dtype=torch.float64),) * 3)
    ops = [qa.dequantized, qb.dequantized, None, None, None, None, None, None]
    (ta, la), (tb, lb) = step_exponents(qa), step_exponents(qb)
    ops += [ta, tb, la, lb, qa.values.abs(), qb.values.abs()]
    one = torch.ones((), dtype=torch.float32)
    q = [QTensor(c.view(f.torch_dtype), one, None, (1, 1), f) for c, f in ((codes_a, E4M3), (codes_b, fmt_b))]
    return GemmOperands(*ops), qa.dequantized @ qb.dequantized.t(), q


@pytest.mark.skipif(importlib.util.find_spec("mmaemu") is None, reason="mmaemu (the extra 'hopper') not installed")
def test_block_step_bound_holds_on_hoppers_chain_and_a_longer_chain_breaks_it():
    """mmaemu's Hopper chain stays within the truncating-block-step bound (module docstring of
    properties.fp8.tolerance) on same-sign, mixed-sign and subnormal-heavy E4M3 operands (E5M2 for one), with chains
    of 128 and one chain; on same-sign operands at K = 1024 the one chain exceeds the bound declared for chains of 128
    (the bound is tight enough to tell the two apart)."""
    from numcheck.impls.builtin.fp8_hopper import hopper_gemm
    from numcheck.properties.fp8.tolerance import block_step_error

    g = torch.Generator().manual_seed(5)
    codes = {  # [2·8, K] uint8 code rows: a's 8 rows then b's 8 rows
        "same_sign": torch.randint(0x08, 0x7F, (16, 1024), generator=g),
        "mixed_sign": torch.randint(0, 256, (16, 1024), generator=g),
        "subnormal_heavy": torch.randint(0x00, 0x10, (16, 1024), generator=g)
        | (torch.rand(16, 1024, generator=g) < 0.05) * 0x60,
    }
    for name, c in codes.items():
        c = torch.where((c & 0x7F) == 0x7F, c - 1, c).to(torch.uint8)  # no NaN codes
        for fmt_b in (E4M3, E5M2) if name == "mixed_sign" else (E4M3,):
            cb = c[8:] if fmt_b is E4M3 else torch.where((c[8:] & 0x7C) == 0x7C, c[8:] & 0x83, c[8:]).to(torch.uint8)
            ops, exact, (qa, qb) = _hopper_case(c[:8], cb, fmt_b)
            for fast, chain in ((False, 128), (True, 1024)):
                err = (hopper_gemm(qa, qb, fast=fast).double() - exact).abs()
                E = block_step_error(ops, 2.0**-13, 32, chain) * (1 + 2.0**-20) + 2.0**-140
                assert bool((err <= E).all()), (name, fmt_b.name, fast, float((err / E).max()))
    ops, exact, (qa, qb) = _hopper_case(codes["same_sign"][:8].to(torch.uint8), codes["same_sign"][8:].to(torch.uint8))
    err = (hopper_gemm(qa, qb, fast=True).double() - exact).abs()
    assert float((err / block_step_error(ops, 2.0**-13, 32, 128)).max()) > 1.5
