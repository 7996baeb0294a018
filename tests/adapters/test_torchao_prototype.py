"""torchao's prototype FP8 training paths (:mod:`numcheck.impls.adapters.torchao_prototype`): the emulated MXFP8
linear, declared from the release (its shapes too: block multiples, the ones the release accepts) and judged here
and by the suite, and MoE
training's FP8 rowwise grouped GEMM, unavailable on the CPU with the reasons read from the release and from numcheck's
grouped declaration.

Cost: without torchao, well under a second; with it, the import (~3 s) and four small MXFP8 cases.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import numcheck.impls.adapters.torchao as tao
import numcheck.impls.adapters.torchao_prototype as proto
from numcheck.errors import PropertyFailure
from numcheck.impls.protocols.fp8_linear import Fp8FunctionImpl
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.runner import judge
from numcheck.properties.fp8 import props as checks
from numcheck.properties.fp8.cases import Fp8Case
from numcheck.properties.fp8.grouped import props as grouped_checks
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.properties.fp8.grouped.known_torchao import GROUPED_TORCHAO_KNOWN, known_grouped_divergence
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.tests.adapters.uninstalled import impls_while_uninstalled

MX = proto.mx_module()
needs_mx = pytest.mark.skipif(isinstance(MX, str), reason=f"{MX}")
CACHES = (tao.load, proto.mx_module, proto.mx_shapes, proto.grouped_module, proto.grouped_refusal)


def _both() -> list[Any]:
    return proto.torchao_mx_impls() + proto.torchao_grouped_impls()


def test_absent_package_registers_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torchao every impl registers, unavailable with "torchao not installed", and its call says so."""
    impls = impls_while_uninstalled(monkeypatch, "torchao", _both, CACHES)
    assert [i.name for i in impls] == ["torchao_mxfp8[rceil]", "torchao_mxfp8[floor]", "torchao_grouped_fp8[rowwise]"]
    for impl in impls:
        assert impl.support.unavailable_reason() == "torchao not installed"
    with pytest.raises(RuntimeError, match="not installed"):
        impls[0](torch.zeros(1, 1), torch.zeros(1, 1), recipe=impls[0].support.recipes[0], save_original_input=True)


@needs_mx
def test_mx_declaration_is_read_from_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """One impl per ScaleCalculationMode numcheck has (RCEIL, FLOOR) with the matching mxfp8 recipe, x saved, the
    bias after the output's rounding, available, and its shapes read by running the release: it refuses M, K and N
    off the block (its assertion is quoted), so each is declared a multiple of 32; a release taking partial blocks
    would declare none, not because the adapter says so."""
    rceil, floor = proto.torchao_mx_impls()
    assert rceil.support.recipes == (Fp8Recipe("mxfp8", mx_scale_rounding="rceil"),)
    assert floor.support.recipes == (Fp8Recipe("mxfp8", mx_scale_rounding="floor"),)
    assert rceil.support.save_original_input == frozenset({True}) and rceil.support.bias_after_output_rounding
    assert rceil.support.unavailable_reason() is None
    assert rceil.support.dim_multiples == {"M": 32, "K": 32, "N": 32}
    assert "must be divisible by block_size 32" in rceil.description, rceil.description
    proto.mx_shapes.cache_clear()
    try:
        monkeypatch.setattr(proto, "_mx_run", lambda found, M, K, N: None)
        assert proto.torchao_mx_impls()[0].support.dim_multiples == {"M": 1, "K": 1, "N": 1}
        proto.mx_shapes.cache_clear()
        monkeypatch.setattr(proto, "_mx_run", lambda found, M, K, N: "RuntimeError: no kernel")
        broken = proto.torchao_mx_impls()[0].support.unavailable_reason() or ""
        assert "fails on x [64, 32], W [96, 32]: RuntimeError: no kernel" in broken, broken
    finally:
        monkeypatch.undo()
        proto.mx_shapes.cache_clear()


def _mx_case(impl: Fp8FunctionImpl, dtype: str, regime: str, seed: int) -> Fp8Case:
    kw = dict(dtype=dtype, bias=True, regime=regime, seed=seed, save_original_input=True)
    return Fp8Case(impl.support.recipes[0], 64, 96, 32, **kw)


@needs_mx
@pytest.mark.parametrize("dtype,regime", [("float32", "block_exponents"), ("bfloat16", "normal")])
def test_mx_accuracy_on_block_multiples(dtype: str, regime: str) -> None:
    """Both roundings pass the suite's accuracy property (both references, y, dgrad, wgrad, bgrad) on shapes the
    release accepts (M, K, N multiples of 32), on random data and on grids giving every row and K-block its own
    exponent."""
    for impl in proto.torchao_mx_impls():
        judge(checks.accuracy, impl, _mx_case(impl, dtype, regime, seed=1))


@needs_mx
def test_mx_rounding_is_a_needed_term() -> None:
    """torchao's RCEIL impl declared as FLOOR (the other E8M0 rounding) fails accuracy on the block-exponent grid:
    the declared rounding is checked, not passed by a wide bound."""
    rceil, floor = proto.torchao_mx_impls()
    fn = proto.mx_fn(MX, "RCEIL", floor.support.recipes[0])
    mislabelled = Fp8FunctionImpl(name="rceil_as_floor", fn=fn, support=dataclasses.replace(floor.support))
    with pytest.raises(PropertyFailure, match="beyond bound"):
        judge(checks.accuracy, mislabelled, _mx_case(floor, "float32", "block_exponents", seed=1))


def test_grouped_is_declared_rowwise_and_unavailable_on_the_cpu_with_its_reason() -> None:
    """torchao's FP8 rowwise grouped GEMM is registered and declared from the release: numcheck's rowwise kind (E4M3,
    power-of-2 scales, the kernels' EPS), bf16 (its output dtype), K, N and every group a multiple of 16, Hopper's
    fast accumulation, no bias; on the CPU it is unavailable with the release's own error (its Triton kernels)."""
    (impl,) = proto.torchao_grouped_impls()
    assert impl.name == "torchao_grouped_fp8[rowwise]"
    reason = impl.support.unavailable_reason() or ""
    found = proto.grouped_module()
    if isinstance(found, str):
        assert reason == found
        return
    s = impl.support
    assert s.recipes == (Fp8Recipe("rowwise", fp8_format="E4M3", power_of_2_scales=True, amax_epsilon=found[2]),)
    assert s.dtypes == frozenset({torch.bfloat16}) and not s.bias and s.save_original_input == frozenset({True})
    assert s.split_alignment == s.feature_alignment == 16
    assert "does not run on cpu" in reason and "triton" in reason, reason
    with pytest.raises(ValueError, match="multiples of 16"):
        impl(torch.zeros(8, 16), torch.zeros(1, 16, 16), m_splits=(8,), recipe=s.recipes[0], save_original_input=True)


def test_grouped_refuses_a_split_count_other_than_the_experts_naming_m_splits() -> None:
    """The release's grouped GEMM takes offsets, so the adapter's m_splits → offsets translation checks the count: a
    split per expert, else ValueError naming m_splits before the release is called (on CUDA the release raised
    RuntimeError 'matrix batch sizes have to match', which the grouped suite's split_rules property fails)."""
    (impl,) = proto.torchao_grouped_impls()
    s = impl.support
    if not s.recipes:
        pytest.skip(f"torchao's grouped GEMM not declared here: {s.unavailable_reason()}")
    x, w = torch.zeros(16, 16, dtype=torch.bfloat16), torch.zeros(1, 16, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"m_splits \(16, 0\) names 2 experts, the weights 1"):
        impl(x, w, m_splits=(16, 0), recipe=s.recipes[0], save_original_input=True)


@pytest.mark.parametrize("entry", GROUPED_TORCHAO_KNOWN, ids=lambda e: f"{e.example.regime}-{e.devices[0]}")
def test_grouped_known_divergence_examples_still_diverge(entry: Any) -> None:
    """Each known divergence of the grouped GEMM fails the accuracy property on its example, on the releases it holds
    for (strict: a fixed release turns this red until the entry goes), and the entry covers it; outside them the
    example passes. The release's grouped GEMM runs on CUDA only: elsewhere the check is skipped, naming where."""
    if torch.device(DEVICE).type not in entry.devices:
        pytest.skip(f"{entry.summary}: seen on {', '.join(entry.devices)}; this suite runs on {DEVICE}")
    (impl,) = proto.torchao_grouped_impls()
    if impl.support.unavailable_reason():
        pytest.skip(f"torchao's grouped GEMM does not run here: {impl.support.unavailable_reason()}")
    example = entry.example.replace(device=DEVICE)
    if not entry.releases.hold():
        judge(grouped_checks.accuracy, impl, example)
        return
    assert known_grouped_divergence(impl.name, "accuracy", example) is entry
    with pytest.raises(PropertyFailure, match="non-finite mismatch"):
        judge(grouped_checks.accuracy, impl, example)


def test_grouped_entry_covers_what_the_h100_run_failed_and_no_more() -> None:
    """On CUDA the grouped suite's nan_expert case the H100 run failed (torchao 0.18.0) is covered, under accuracy
    only, and so are the suite's other nan_expert draws; a finite regime, another impl, the CPU and the mode
    comparison (bitwise, not against the contract) are not. Deciding needs no CUDA device."""
    (entry,) = GROUPED_TORCHAO_KNOWN
    if not entry.releases.hold():
        pytest.skip(f"the entry holds for torchao {entry.releases.specifier}; installed: {entry.releases.installed()}")
    failed = GroupedCase(
        Fp8Recipe("rowwise", amax_epsilon=1e-12),
        (32, 0, 48, 48, 16),
        48,
        80,
        dtype="bfloat16",
        regime="nan_expert",
        seed=0,
        save_original_input=True,
        device="cuda",
    )
    name = "torchao_grouped_fp8[rowwise]"
    assert known_grouped_divergence(name, "accuracy", failed) is entry
    assert known_grouped_divergence(name, "accuracy", failed.replace(seed=5, m_splits=(16, 16))) is entry
    for other in (failed.replace(regime="wide"), failed.replace(device="cpu")):
        assert known_grouped_divergence(name, "accuracy", other) is None, other
    assert known_grouped_divergence("grouped_fp8_linear[loop]", "accuracy", failed) is None
    assert known_grouped_divergence(name, "save_original_input", failed) is None
