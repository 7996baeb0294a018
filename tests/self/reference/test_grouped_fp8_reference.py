"""The grouped FP8 linear's float64 oracle (reference/grouped_fp8_linear.py), as hard as the single linear's: each
expert bitwise the single linear's oracle on its rows, blocks and scales per expert, empty experts, isolation,
permutation, save_original_input, delayed scaling's per-GEMM scales, refusals, and an assembly computed another way."""

from __future__ import annotations

import pytest
import torch

from numcheck.reference.fp8_formats import F64
from numcheck.reference.fp8_linear import quantized_linear
from numcheck.reference.fp8_recipes import Fp8Recipe, standard_recipes
from numcheck.reference.fp8_scaling import quantize, quantize_operand
from numcheck.reference.grouped_fp8_linear import grouped_quantized_linear, split_offsets

pytestmark = pytest.mark.torch_versions(
    reason="an oracle: torch ops (and what it compares them with) a torch release can change"
)

RECIPES = standard_recipes()
SPLITS = ((5, 0, 37, 16), (33,), (0, 1, 130, 0, 32))


def _tensors(splits, K=40, N=24, dtype=torch.float32, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    M, G = sum(splits), len(splits)
    mag = torch.exp2(torch.randint(-4, 5, (G,), generator=g).to(torch.float64))
    x = torch.randn(M, K, generator=g, dtype=F64) * torch.repeat_interleave(mag, torch.tensor(splits))[:, None]
    w = torch.randn(G, N, K, generator=g, dtype=F64) / K**0.5 * mag.flip(0)[:, None, None]
    dy = torch.randn(M, N, generator=g, dtype=F64)
    b = torch.randn(G, N, generator=g, dtype=F64) if bias else None
    return x.to(dtype), w.to(dtype), dy.to(dtype), (b.to(dtype) if b is not None else None)


def _scales(recipe, G, values=None):
    if recipe.kind != "delayed":
        return None
    values = values or [1.0] * G
    return [{"x": v, "w": v / 2, "dy": v * 4} for v in values]


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
@pytest.mark.parametrize("splits", SPLITS, ids=lambda s: "-".join(map(str, s)))
def test_each_expert_is_the_single_linear_oracle_on_its_rows(recipe, splits):
    """Expert i's rows of y and dgrad, wgrad[i], bgrad[i], its operands and its amaxes are bitwise those of the single
    linear's oracle on x_i, W_i, dy_i, b_i (one expert: the single linear itself); an empty expert's are zeros."""
    x, w, dy, b = _tensors(splits, dtype=torch.bfloat16)
    scales = _scales(recipe, len(splits), [1.0, 0.25, 8.0, 2.0, 0.5][: len(splits)])
    ref = grouped_quantized_linear(x, w, dy, b, splits, recipe, delayed_scales=scales)
    for i, m in enumerate(splits):
        rows = ref.rows(i)
        if m == 0:
            assert (
                ref.experts[i] is None
                and bool((ref.dq["wgrad"][i] == 0).all())
                and bool((ref.true["bgrad"][i] == 0).all())
            )
            continue
        one = quantized_linear(x[rows], w[i], dy[rows], b[i], recipe, delayed_scales=scales[i] if scales else None)
        for name in ("y", "dgrad"):
            for part in ("dq", "true", "abs_products"):
                assert _bits_equal(getattr(ref, part)[name][rows], getattr(one, part)[name]), (name, part, i)
        for name in ("wgrad", "bgrad"):
            for part in ("dq", "true", "abs_products"):
                assert _bits_equal(getattr(ref, part)[name][i], getattr(one, part)[name]), (name, part, i)
        assert ref.amax[i] == one.amax
        for key, q in one.operands.items():
            assert torch.equal(ref.experts[i].operands[key].codes, q.codes)


def test_assembly_against_a_row_by_row_float64_computation():
    """The original reference assembled per expert equals a computation that never splits: each row of y times the
    weight of the expert owning it (an index per row), wgrad[i] summed row by row over that expert's rows."""
    splits = (5, 0, 37, 16, 1)
    x, w, dy, b = _tensors(splits)
    ref = grouped_quantized_linear(x, w, dy, b, splits, Fp8Recipe("current"))
    owner = torch.repeat_interleave(torch.arange(len(splits)), torch.tensor(splits))
    x64, w64, dy64, b64 = (t.to(F64) for t in (x, w, dy, b))
    y = torch.einsum("mk,mnk->mn", x64, w64[owner]) + b64[owner]
    assert torch.allclose(ref.true["y"], y, rtol=1e-13, atol=0)
    assert torch.allclose(ref.true["dgrad"], torch.einsum("mn,mnk->mk", dy64, w64[owner]), rtol=1e-13, atol=0)
    wg = torch.zeros_like(w64).index_add_(0, owner, torch.einsum("mn,mk->mnk", dy64, x64))
    bg = torch.zeros_like(b64).index_add_(0, owner, dy64)
    assert torch.allclose(ref.true["wgrad"], wg, rtol=1e-12, atol=1e-15) and torch.allclose(ref.true["bgrad"], bg)


def test_exactly_representable_operands_make_both_references_equal():
    """Small integers with a power-of-2 amax quantize exactly under current power-of-2 scaling (E4M3, scale 2^k), so
    the dequantized reference equals the plain float64 products bitwise in every expert."""
    g = torch.Generator().manual_seed(3)
    splits = (16, 0, 8)
    x = torch.randint(-4, 5, (24, 32), generator=g).to(torch.float32)
    w = torch.randint(-4, 5, (3, 16, 32), generator=g).to(torch.float32)
    dy = torch.randint(-4, 5, (24, 16), generator=g).to(torch.float32)
    x[0, 0] = w[:, 0, 0] = dy[0, 0] = 4.0
    x[16, 0] = dy[16, 0] = 4.0
    ref = grouped_quantized_linear(
        x, w, dy, None, splits, Fp8Recipe("current", fp8_format="E4M3", power_of_2_scales=True)
    )
    for name in ("y", "dgrad", "wgrad"):
        assert torch.equal(ref.dq[name], ref.true[name]), name


@pytest.mark.parametrize("kind", ["blockwise", "mxfp8"])
def test_columnwise_blocks_restart_at_every_expert(kind):
    """A columnwise block (along M) never spans two experts: expert 1 of splits (5, 59) has its x quantized as x[5:]
    alone, which differs from rows 5: of the whole tensor's columnwise quantization (blocks straddling the boundary)."""
    recipe = next(r for r in RECIPES if r.kind == kind)
    x, w, dy, b = _tensors((5, 59), K=64)
    x[0] *= 2.0**6  # the first expert's rows dominate a straddling block's amax
    ref = grouped_quantized_linear(x, w, dy, b, (5, 59), recipe)
    own = quantize_operand(x[5:], recipe, "x", "columnwise")
    whole = quantize_operand(x, recipe, "x", "columnwise")
    assert torch.equal(ref.experts[1].operand("x", "columnwise").codes, own.codes)
    assert not torch.equal(own.codes, whole.codes[5:])


def test_per_tensor_scales_come_from_each_experts_rows():
    """Current scaling: expert i's x is scaled by fp8_max / amax(x_i), its own, not the whole tensor's."""
    splits = (7, 9, 4)
    x, w, dy, _ = _tensors(splits, bias=False)
    recipe = Fp8Recipe("current")
    ref = grouped_quantized_linear(x, w, dy, None, splits, recipe)
    off = split_offsets(splits)
    for i in range(3):
        own = quantize(x[off[i] : off[i + 1]], recipe.format_of("x"), None)
        assert torch.equal(ref.experts[i].operand("x", "rowwise").scale, own.scale)
    assert len({float(ref.experts[i].operand("x", "rowwise").scale) for i in range(3)}) == 3


def test_empty_experts_zero_gradients_and_amaxes():
    """An empty expert: no rows, wgrad and bgrad exactly zero in both references, x and dy amax 0, W's its own."""
    splits = (0, 4, 0)
    x, w, dy, b = _tensors(splits)
    ref = grouped_quantized_linear(
        x, w, dy, b, splits, Fp8Recipe("delayed"), delayed_scales=_scales(Fp8Recipe("delayed"), 3)
    )
    for i in (0, 2):
        for part in (ref.dq, ref.true, ref.abs_products):
            assert bool((part["wgrad"][i] == 0).all()) and bool((part["bgrad"][i] == 0).all())
        assert ref.amax[i]["x"] == 0.0 and ref.amax[i]["dy"] == 0.0
        assert ref.amax[i]["w"] == float(w[i].abs().max())
    assert ref.dq["y"].shape == (4, 24) and ref.dq["wgrad"].shape == (3, 24, 40)


def test_experts_are_isolated():
    """Changing expert 0's inputs (values and a NaN) leaves every other expert's outputs bitwise as they were."""
    splits = (6, 10, 3)
    x, w, dy, b = _tensors(splits)
    recipe = Fp8Recipe("mxfp8")
    a = grouped_quantized_linear(x, w, dy, b, splits, recipe)
    x2, w2, dy2 = x.clone(), w.clone(), dy.clone()
    x2[:6] *= 1000.0
    x2[1, 3] = float("nan")
    w2[0] = -w2[0]
    dy2[:6] = float("nan")
    c = grouped_quantized_linear(x2, w2, dy2, b, splits, recipe)
    for name in ("y", "dgrad"):
        assert _bits_equal(a.dq[name][6:], c.dq[name][6:]) and _bits_equal(a.true[name][6:], c.true[name][6:])
    for name in ("wgrad", "bgrad"):
        assert _bits_equal(a.dq[name][1:], c.dq[name][1:])


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_permuting_experts_permutes_the_oracle(recipe):
    """The oracle of permuted experts (weights, biases, split sizes, row blocks, delayed scales) is the permuted
    oracle, bitwise."""
    splits = (5, 0, 37, 16)
    perm = [2, 0, 3, 1]
    x, w, dy, b = _tensors(splits)
    scales = _scales(recipe, 4, [1.0, 0.5, 4.0, 2.0])
    a = grouped_quantized_linear(x, w, dy, b, splits, recipe, delayed_scales=scales)
    off = split_offsets(splits)
    rows = torch.cat([torch.arange(off[p], off[p + 1]) for p in perm])
    c = grouped_quantized_linear(
        x[rows],
        w[perm],
        dy[rows],
        b[perm],
        [splits[p] for p in perm],
        recipe,
        delayed_scales=[scales[p] for p in perm] if scales else None,
    )
    for name in ("y", "dgrad"):
        assert _bits_equal(c.dq[name], a.dq[name][rows]) and _bits_equal(c.true[name], a.true[name][rows])
    for name in ("wgrad", "bgrad"):
        assert _bits_equal(c.dq[name], a.dq[name][perm])


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_save_original_input(recipe):
    """Every recipe but delayed scaling gives bitwise the same references with save_original_input on and off;
    delayed scaling refuses it naming the option."""
    splits = (5, 0, 37)
    x, w, dy, b = _tensors(splits)
    if not recipe.allows_save_original_input:
        with pytest.raises(ValueError, match="save_original_input"):
            grouped_quantized_linear(
                x, w, dy, b, splits, recipe, delayed_scales=_scales(recipe, 3), save_original_input=True
            )
        return
    on = grouped_quantized_linear(x, w, dy, b, splits, recipe, save_original_input=True)
    off = grouped_quantized_linear(x, w, dy, b, splits, recipe)
    for name in on.dq:
        assert _bits_equal(on.dq[name], off.dq[name]) and _bits_equal(on.true[name], off.true[name])


def test_delayed_scaling_uses_each_experts_stored_scales():
    """Delayed scaling: expert i's operands are quantized with its own stored scales (per-GEMM histories)."""
    splits = (8, 8)
    x, w, dy, b = _tensors(splits)
    recipe = Fp8Recipe("delayed")
    scales = [{"x": 1.0, "w": 2.0, "dy": 0.5}, {"x": 64.0, "w": 0.25, "dy": 8.0}]
    ref = grouped_quantized_linear(x, w, dy, b, splits, recipe, delayed_scales=scales)
    for i, s in enumerate(scales):
        for role, src in (("x", x[8 * i : 8 * (i + 1)]), ("w", w[i]), ("dy", dy[8 * i : 8 * (i + 1)])):
            q = ref.experts[i].operand(role, "rowwise")
            assert torch.equal(
                q.codes, quantize(src, recipe.format_of(role), None, scaling="stored", stored_scale=s[role]).codes
            )


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(m_splits=(5, 5)), "sums to 10"),
        (dict(m_splits=(-1, 12, 0)), r"m_splits\[0\]"),
        (dict(m_splits=(11,)), "weights holds 3 experts"),
        (dict(m_splits=()), "m_splits is empty"),
        (dict(recipe=Fp8Recipe("delayed")), "delayed_scales"),
    ],
)
def test_bad_arguments_are_refused_by_name(bad, match):
    """The oracle refuses malformed splits and a delayed recipe without per-expert scales, naming what is wrong."""
    x, w, dy, b = _tensors((3, 0, 8))
    args = dict(m_splits=(3, 0, 8), recipe=Fp8Recipe("current"))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        grouped_quantized_linear(x, w, dy, b, args["m_splits"], args["recipe"])
