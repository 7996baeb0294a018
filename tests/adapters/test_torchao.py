"""The ``torchao_float8[...]`` adapters (torchao's ``Float8Linear``): the declaration read from the installed
release's ``Float8LinearConfig``, the behaviour without torchao and with a release too old for
``from_recipe_name``, the suite's accuracy property on the recipe numcheck can judge, and mutants of the wrapper
that the property must catch.

Cost: without torchao, well under a second; with it on a CPU, the import (~3 s) and a few small cases.
"""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatch
from typing import Any

import pytest
import torch

import numcheck.impls.adapters.torchao as tao
from numcheck.errors import PropertyFailure
from numcheck.impls.protocols.fp8_linear import Fp8FunctionImpl
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.runner import judge
from numcheck.properties.fp8 import props as checks
from numcheck.properties.fp8.cases import Fp8Case
from numcheck.properties.fp8.known_torchao import (
    ROWWISE,
    ROWWISE_GW_HP,
    TENSORWISE,
    TORCHAO_KNOWN,
    known_fp8_divergence,
)
from numcheck.properties.fp8.shapes import fitted
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.tests.adapters.uninstalled import impls_while_uninstalled

INFO = tao.load()
SKIP_REASON = INFO if isinstance(INFO, str) else None
needs_torchao = pytest.mark.skipif(SKIP_REASON is not None, reason=f"{SKIP_REASON}")


def _case(recipe: Fp8Recipe, dtype: str = "bfloat16", seed: int = 3, **kw: Any) -> Fp8Case:
    fields = dict(M=8, K=40, N=16, dtype=dtype, bias=True, regime="normal", seed=seed, save_original_input=True)
    return Fp8Case(recipe, **{**fields, **kw})


def test_absent_package_registers_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torchao every recipe registers, unavailable with "torchao not installed", and its call says so."""
    impls = impls_while_uninstalled(monkeypatch, "torchao", tao.torchao_impls, (tao.load,))
    assert [i.name for i in impls] == [f"torchao_float8[{n}]" for n in tao.RECIPE_NAMES]
    for impl in impls:
        assert impl.support.unavailable_reason() == "torchao not installed"
        with pytest.raises(RuntimeError, match="not installed"):
            impl(torch.zeros(1, 1), torch.zeros(1, 1), recipe=impl.support.recipes[0], save_original_input=True)


@needs_torchao
def test_release_without_from_recipe_name_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release whose Float8LinearConfig has no from_recipe_name makes every recipe unavailable, naming why."""
    monkeypatch.delattr(INFO.config_cls, "from_recipe_name")
    tao.load.cache_clear()
    try:
        impls = tao.torchao_impls()
    finally:
        monkeypatch.undo()
        tao.load.cache_clear()
    for impl in impls:
        assert "has no Float8LinearConfig.from_recipe_name" in (impl.support.unavailable_reason() or "")


@needs_torchao
def test_declaration_is_read_from_the_release() -> None:
    """tensorwise is current scaling, E4M3 x and W, E5M2 dy, fp32 scales floored at the release's EPS, x saved and
    the bias added after the output rounding; rowwise is numcheck's rowwise kind and rowwise_with_gw_hp its
    rowwise_gw_hp kind (E4M3 everywhere, power-of-2 scales, the same EPS), both judged."""
    import torchao
    from torchao.float8.float8_utils import EPS

    assert INFO.version == torchao.__version__
    impls = {i.name: i for i in tao.torchao_impls()}
    tw = impls["torchao_float8[tensorwise]"].support
    assert tw.unavailable_reason() is None
    assert tw.recipes == (Fp8Recipe("current", fp8_format="HYBRID", power_of_2_scales=False, amax_epsilon=EPS),)
    assert tw.save_original_input == frozenset({True}) and tw.bias_after_output_rounding
    assert tw.dtypes == frozenset({torch.float32, torch.bfloat16}) and tw.devices == {tao.placement()[0]}
    rw = impls["torchao_float8[rowwise]"].support
    hp = impls["torchao_float8[rowwise_with_gw_hp]"].support
    assert rw.unavailable_reason() is None and hp.unavailable_reason() is None
    assert rw.recipes == (Fp8Recipe("rowwise", fp8_format="E4M3", power_of_2_scales=True, amax_epsilon=EPS),)
    assert hp.recipes == (Fp8Recipe("rowwise_gw_hp", fp8_format="E4M3", power_of_2_scales=True, amax_epsilon=EPS),)
    assert rw.save_original_input == hp.save_original_input == frozenset({True})


@needs_torchao
def test_other_granularities_are_unavailable_naming_them() -> None:
    """A config whose six casts match no numcheck kind (rowwise with a tensorwise grad_output) is unavailable, and
    the reason names each cast's granularity."""
    from torchao.float8.config import CastConfig

    cfg = dataclasses.replace(
        tao.recipe_config(INFO, "rowwise"),
        cast_config_grad_output=CastConfig(),
        cast_config_grad_output_for_grad_weight=None,
    )
    reason = tao.numcheck_recipe(cfg, INFO.eps)
    assert isinstance(reason, str) and "grad_output T" in reason and "input A" in reason, reason


@needs_torchao
def test_recipe_follows_the_config() -> None:
    """The mapping reads the config's fields: power-of-2 scales and an E4M3 grad_output change the recipe."""
    from torchao.float8.config import CastConfig, e4m3_dtype

    cfg = dataclasses.replace(
        tao.recipe_config(INFO, "tensorwise"),
        round_scales_to_power_of_2=True,
        cast_config_grad_output=CastConfig(target_dtype=e4m3_dtype),
        cast_config_grad_output_for_grad_weight=None,
    )
    want = Fp8Recipe("current", fp8_format="E4M3", power_of_2_scales=True, amax_epsilon=INFO.eps)
    assert tao.numcheck_recipe(cfg, INFO.eps) == want


@needs_torchao
@pytest.mark.parametrize("name", tao.RECIPE_NAMES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_accuracy_on_a_small_case(dtype: str, name: str) -> None:
    """The suite's accuracy property (both references, y, dgrad, wgrad, bgrad) passes on a small case, for every
    recipe, and on the scale-block grids (every row its own exponent) for the rowwise ones."""
    impl = tao.torchao_impl(name)
    judge(checks.accuracy, impl, _case(impl.support.recipes[0], dtype))
    if name != "tensorwise":
        judge(checks.accuracy, impl, _case(impl.support.recipes[0], dtype, M=40, K=48, N=65, regime="block_exponents"))


def _mutant(name: str, fn: Any, support: Any) -> Fp8FunctionImpl:
    return Fp8FunctionImpl(name=name, fn=fn, support=support)


@needs_torchao
def test_mutants_are_caught() -> None:
    """A wrapper that drops the bias, or runs torchao's rowwise recipe while declaring tensorwise, fails accuracy."""
    impl = tao.torchao_impl("tensorwise")
    recipe = impl.support.recipes[0]

    def no_bias(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
        return impl(x, weight, None, recipe=recipe, save_original_input=save_original_input)

    def rowwise(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
        params = {"weight": weight, "bias": bias}
        return torch.func.functional_call(tao._module(INFO, "rowwise", weight, bias), params, (x,))

    for mutant in (_mutant("no_bias", no_bias, impl.support), _mutant("rowwise", rowwise, impl.support)):
        with pytest.raises(PropertyFailure, match="beyond bound"):
            judge(checks.accuracy, mutant, _case(recipe))


@needs_torchao
def test_bias_after_rounding_is_a_needed_term() -> None:
    """Where the bias cancels most of x·Wᵀ (seed 0, one output), torchao's y is many ulps off the single rounding:
    within the bound of the declared rounding order, beyond the bound without it
    (``docs/evidence/torchao_bias_rounding.py``)."""
    impl = tao.torchao_impl("tensorwise")
    case = _case(impl.support.recipes[0], seed=0, M=1, K=8, N=1)
    judge(checks.accuracy, impl, case)
    fused = dataclasses.replace(impl.support, bias_after_output_rounding=False)
    with pytest.raises(PropertyFailure, match="beyond bound"):
        judge(checks.accuracy, _mutant("fused_bias_declared", impl.fn, fused), case)


@needs_torchao
@pytest.mark.parametrize(
    "entry",
    TORCHAO_KNOWN,
    ids=lambda e: f"{e.impls.removeprefix('torchao_float8[[]')}-{e.example.regime}-{e.devices[0]}",
)
def test_known_divergence_examples_still_diverge(entry: Any) -> None:
    """Each known divergence's example fails the property on the releases it holds for (strict: a fixed release
    turns this red until the entry goes) and the entry covers it; outside them the example passes. The example runs
    on the impl of the entry's pattern that declares its recipe, on the suite's device, in its declared shapes; an
    entry of another device (a CUDA entry on the CPU) is skipped, naming where it runs."""
    if torch.device(DEVICE).type not in entry.devices:
        pytest.skip(f"{entry.summary}: seen on {', '.join(entry.devices)}; this suite runs on {DEVICE}")
    impl = next(
        i for i in tao.torchao_impls() if fnmatch(i.name, entry.impls) and entry.example.recipe in i.support.recipes
    )
    example = fitted(impl.support, entry.example.replace(device=DEVICE))  # the real path's shapes on CUDA
    if not entry.releases.hold():
        judge(checks.accuracy, impl, example)
        return
    assert known_fp8_divergence(impl.name, "accuracy", example) is entry
    with pytest.raises(PropertyFailure, match="non-finite mismatch|beyond bound"):
        judge(checks.accuracy, impl, example)


#: The edge cases the H100 run failed (results/gpu/h100-torch2.11-torchao-families/ao2/report/report.md, torchao
#: 0.18.0's real path): (impl, recipe, M, dtype, regime); K = 48, N = 32. Its rowwise nan case passed.
H100_FAILED = (
    ("tensorwise", TENSORWISE, 48, "float32", "nan"),
    ("tensorwise", TENSORWISE, 48, "float32", "inf"),
    ("rowwise", ROWWISE, 48, "bfloat16", "inf"),
    ("rowwise_with_gw_hp", ROWWISE_GW_HP, 33, "bfloat16", "nan"),
    ("rowwise_with_gw_hp", ROWWISE_GW_HP, 33, "bfloat16", "inf"),
)


@needs_torchao
def test_cuda_entries_cover_what_the_h100_run_failed_and_no_more() -> None:
    """On CUDA each case the H100 run failed is covered by an entry seen on CUDA, and the rowwise nan case it passed
    by none (deciding needs no CUDA device: an entry matches on the case's device type)."""

    def case(recipe: Fp8Recipe, M: int, dtype: str, regime: str) -> Fp8Case:
        return Fp8Case(
            recipe, M, 48, 32, dtype=dtype, bias=True, regime=regime, seed=11, save_original_input=True, device="cuda"
        )

    for name, recipe, M, dtype, regime in H100_FAILED:
        entry = known_fp8_divergence(f"torchao_float8[{name}]", "accuracy", case(recipe, M, dtype, regime))
        assert entry is not None and entry.devices == ("cuda",), (name, regime)
    assert known_fp8_divergence("torchao_float8[rowwise]", "accuracy", case(ROWWISE, 48, "bfloat16", "nan")) is None


@needs_torchao
def test_report_judges_it_in_its_declared_mode_and_names_its_divergences(tmp_path: Any, capsys: Any) -> None:
    """``numcheck report --quick`` runs every FP8 property case of torchao's tensorwise impl in the mode it declares
    (save_original_input=True only: a case built with False raised on every call), leaves out the cases its known
    divergences cover and names them on the last line, exit 0; ``--strict`` fails them."""
    import json

    from numcheck.reports import cli

    args = ["report", "--quick", "--no-progress", "--no-plots", "--impl", "torchao_float8[tensorwise]"]
    assert cli.main([*args, "--out", str(tmp_path / "r")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "PASS with known divergences" in last and last.count("torchao 0.18.0") == 2, last
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["cases"] and all(c["status"] == "pass" for c in report["cases"])
    tensorwise = {k.summary for k in TORCHAO_KNOWN if fnmatch("torchao_float8[tensorwise]", k.impls)}
    assert {k["summary"] for k in report["known_divergences"]} == tensorwise
    assert cli.main([*args, "--strict", "--out", str(tmp_path / "s")]) == 1


@needs_torchao
def test_cuda_declaration_is_read_from_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA device of capability 8.9+ each recipe declares that device alone with Hopper's FP8 accumulation,
    one chain (the output GEMM's fast accumulation), and leaves out an input dtype whose GEMMs the release runs in
    another output dtype: from 0.13.0 the rowwise recipes ask ``_scaled_mm`` for bfloat16 with fp32 input. Read from
    the release (its Float8Linear run with a recording ``_scaled_mm``), not written in the adapter: a release whose
    tensorwise GEMMs asked for bfloat16 too, or that used no fast accumulation, declares accordingly. On the CPU the
    emulated path keeps both dtypes, fp32 accumulation and every shape."""
    from torchao.float8.config import Float8GemmConfig

    cpu = tao.torchao_impl("rowwise", where=("cpu", True)).support
    assert cpu.devices == frozenset({"cpu"}) and cpu.dtypes == tao.DTYPES
    assert cpu.accum_unit_roundoff == {"cpu": 2.0**-24}
    tw = tao.torchao_impl("tensorwise", where=("cuda", False))
    rw = tao.torchao_impl("rowwise", where=("cuda", False))
    assert tw.support.devices == rw.support.devices == frozenset({"cuda"})
    assert tw.support.dtypes == tao.DTYPES and rw.support.dtypes == frozenset({torch.bfloat16})
    assert "float32 left out: its GEMMs output bfloat16" in rw.description
    assert rw.support.accum_unit_roundoff == {"cuda": 2.0**-13} and rw.support.accum_chunk == {"cuda": None}
    # judged in the shapes torch._scaled_mm takes: every dimension reaching an operand's trailing one a multiple of
    # 16 (rowwise_with_gw_hp's wgrad is a high-precision mm: M free); the CPU's emulated path takes every shape
    hp = tao.torchao_impl("rowwise_with_gw_hp", where=("cuda", False)).support
    assert tw.support.dim_multiples == rw.support.dim_multiples == {"M": 16, "K": 16, "N": 16}
    assert hp.dim_multiples == {"M": 1, "K": 16, "N": 16} and cpu.dim_multiples == {"M": 1, "K": 1, "N": 1}
    assert tw.support.unavailable_reason() is None and "M, K, N multiples of 16" in tw.description

    tao.real_path.cache_clear()
    try:
        with monkeypatch.context() as m:  # the release's GEMM wrapper asking for bf16 output
            import torchao.float8.float8_ops as ops

            m.setattr(ops, "addmm_float8_unwrapped", _forcing_bf16(ops.addmm_float8_unwrapped))
            assert tao.torchao_impl("tensorwise", where=("cuda", False)).support.dtypes == {torch.bfloat16}
        tao.real_path.cache_clear()
        slow = dataclasses.replace(
            INFO.config_cls.from_recipe_name("tensorwise"), gemm_config_output=Float8GemmConfig()
        )
        monkeypatch.setattr(INFO.config_cls, "from_recipe_name", lambda name: slow)
        assert tao.torchao_impl("tensorwise", where=("cuda", False)).support.accum_chunk == {
            "cuda": tao.HOPPER_PROMOTION
        }
    finally:
        monkeypatch.undo()
        tao.real_path.cache_clear()


def _forcing_bf16(fn: Any) -> Any:
    """``addmm_float8_unwrapped`` asking every GEMM for bfloat16 output."""

    def wrapped(*args: Any, **kw: Any) -> Any:
        if "output_dtype" in kw:
            kw["output_dtype"] = torch.bfloat16
        else:
            args = (*args[:4], torch.bfloat16, *args[5:])
        return fn(*args, **kw)

    return wrapped


@needs_torchao
def test_saved_fp8_wrapper_tensors_are_measured_by_their_parts() -> None:
    """torchao 0.9.0-0.11.0's tensorwise Float8Linear saves W's FP8 cast, a wrapper tensor subclass with no storage
    of its own (docs/evidence/torchao_releases.txt): what is held for backward counts its data and scale instead of
    raising on the wrapper's storage."""
    from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8

    from numcheck.impls.protocols.fp8_linear import HeldTensors

    fp8 = hp_tensor_and_scale_to_float8(torch.ones(4, 8), torch.tensor(2.0), torch.float8_e4m3fn)
    held = HeldTensors()
    held.add("w", fp8)
    assert sorted(held.storages.values()) == [4, 32] and len(held.tensors) == 2
