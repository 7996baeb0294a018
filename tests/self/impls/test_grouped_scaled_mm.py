"""The ``torch._scaled_grouped_mm`` built-in off CUDA: it follows its device probe (unavailable on the CPU with the
probe's reason), and its calls — layouts, per-row scales, ``offs``, empty experts left out — are right against an
emulation of the operator's documented contract (2-D × 3-D split along M, 2-D × 2-D split along the reduction, as
torch's own tests use it), with which the probe, the impl and the grouped suite's properties all agree on the CPU."""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.builtin.grouped_fp8_linear import GroupedScaledMMLinear, grouped_fp8_linear_impls
from numcheck.impls.measure import capabilities
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.properties.fp8.grouped.props import GROUPED_PROPERTIES
from numcheck.reference.fp8_recipes import Fp8Recipe

pytestmark = pytest.mark.torch_versions(
    reason="torch._scaled_grouped_mm, taken or not as the scaled_grouped_mm probe says"
)


def _emulated(
    mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False
):
    """The operator's contract in fp32 on the CPU, with its layout rules asserted: A row-major FP8, B column-major
    FP8, fp32 per-row scales, int32 ``offs`` (ends, multiples of 16), bf16 output."""
    assert mat_a.dtype == mat_b.dtype == torch.float8_e4m3fn and mat_a.is_contiguous() and mat_b.stride(-2) == 1
    assert (
        offs is not None and offs.dtype == torch.int32 and bool((offs % 16 == 0).all()) and out_dtype == torch.bfloat16
    )
    assert scale_a.dtype == scale_b.dtype == torch.float32 and bias is None
    a, b, ends = mat_a.float(), mat_b.float(), [0] + offs.tolist()
    if b.dim() == 3:  # 2-D × 3-D: rows of A split by offs, group g times B[g]
        assert scale_a.shape == (a.shape[0],) and scale_b.shape == (b.shape[0], b.shape[2])
        out = torch.zeros(a.shape[0], b.shape[2])
        for g in range(len(ends) - 1):
            r = slice(ends[g], ends[g + 1])
            out[r] = (a[r] * scale_a[r, None]) @ (b[g] * scale_b[g][None, :])
        return out.to(out_dtype)
    m, n, G = a.shape[0], b.shape[1], len(ends) - 1  # 2-D × 2-D: the reduction split by offs, one output per group
    assert scale_a.shape == (G * m,) and scale_b.shape == (G * n,)
    out = torch.zeros(G, m, n)
    for g in range(G):
        k = slice(ends[g], ends[g + 1])
        out[g] = (a[:, k] * scale_a[g * m : (g + 1) * m, None]) @ (b[k] * scale_b[g * n : (g + 1) * n][None, :])
    return out.to(out_dtype)


def test_unavailable_on_the_cpu_with_the_probes_reason():
    """On the CPU the probes answer no (no kernel), and the built-in is listed unavailable saying so; forced on, it
    is available; its call refuses a device whose probe fails."""
    impl = grouped_fp8_linear_impls()[2]
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the probe runs there")
    assert capabilities.scaled_grouped_mm("cpu", "2d_3d") is False
    assert "probe scaled_grouped_mm[2d_3d]" in impl.support.unavailable_reason()
    with capabilities.forced(scaled_grouped_mm=True):
        assert impl.support.unavailable_reason() is None
    with pytest.raises(RuntimeError, match="does not run exactly on cpu"):
        impl(
            torch.zeros(16, 16),
            torch.zeros(1, 16, 16),
            m_splits=(16,),
            recipe=Fp8Recipe("current", fp8_format="E4M3"),
            save_original_input=False,
        )


@pytest.fixture
def emulated(monkeypatch):
    """``torch._scaled_grouped_mm`` replaced by :func:`_emulated` and its probe cache cleared (restored after)."""
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _emulated, raising=False)  # torch 2.6 has none
    capabilities.scaled_grouped_mm.cache_clear()
    yield
    capabilities.scaled_grouped_mm.cache_clear()


def test_probe_and_impl_agree_with_the_emulated_contract(emulated):
    """With the operator emulated on the CPU, the probe passes (its exact check), and the built-in (declared for the
    CPU here) passes the grouped properties on 16-row-aligned splits with an empty expert, in both weight forms."""
    assert capabilities.scaled_grouped_mm("cpu", "2d_3d") and capabilities.scaled_grouped_mm("cpu", "2d_2d")
    base = grouped_fp8_linear_impls()[2]
    impl = GroupedScaledMMLinear(
        "sgmm_on_cpu",
        recipes=base.support.recipes,
        dtypes=base.support.dtypes,
        bias=False,
        split_alignment=16,
        feature_alignment=16,
        devices=frozenset({"cpu"}),
        accum_unit_roundoff=2.0**-24,
    )
    for recipe, weights in zip(impl.support.recipes, ("grouped", "list")):
        case = GroupedCase(recipe, (32, 0, 48, 16), 64, 48, dtype="bfloat16", seed=3, weights=weights, regime="outlier")
        for prop in (
            "accuracy",
            "per_expert_linear",
            "empty_experts",
            "expert_permutation",
            "save_original_input",
            "split_rules",
        ):
            GROUPED_PROPERTIES[prop](impl, case)
