"""Known divergences of torchao's FP8 linears (``torchao_float8[...]``, :mod:`numcheck.impls.adapters.torchao`) from
numcheck's FP8 contract, as :class:`~numcheck.properties.core.known.KnownDivergence` entries whose ``applies`` and
``example`` take a :class:`~numcheck.properties.fp8.cases.Fp8Case`.

The suite's fixed FP8 cases leave a case an entry covers unjudged (:func:`known_fp8_divergence`,
``tests/suite/test_fp8_impls.py``); ``tests/adapters/test_torchao.py`` runs every entry's example as a strict
expected failure, so a fixed release turns it red until the entry goes. Each entry holds for the releases it was
measured on.

**Non-finite inputs** (``docs/evidence/torchao_nonfinite.py``): torchao's tensorwise amax is
``torch.max(torch.abs(t))`` (``float8/float8_utils.py``, ``tensor_to_amax``), which propagates NaN, and the scale
is ``fp8_max / clamp(amax, min=EPS)`` (``amax_to_scale``), which is 0 for an infinite amax. So one NaN element of x,
W or dy makes that tensor's scale NaN and every output it feeds NaN, and one ±inf element makes the scale 0, its
cast inf·0 = NaN and again every output NaN. The contract (TransformerEngine's convention) ignores NaN in amax,
gives an infinite amax the scale 1 and saturates ±inf to ±max: only the outputs whose reduction meets the NaN are
NaN (79 of 792 elements of y in the suite's edge case, against torchao's 792; with inf, none against 792).

Each entry names the device it was seen on: the CPU's emulated path (``_CPU_KNOWN``) and CUDA's real
``torch._scaled_mm`` path (``_CUDA_KNOWN``: the same causes, seen in an H100 run, whose examples are the cases that
run failed, in the real path's shapes, K and N multiples of 16). An entry's strict example runs on its own device
only (on the CPU a CUDA entry's check is skipped, naming where it runs).
"""

from __future__ import annotations

from typing import Any

from numcheck.properties.core.known import KnownDivergence, Releases
from numcheck.properties.fp8.cases import Fp8Case
from numcheck.reference.fp8_recipes import Fp8Recipe


def torchao_release() -> str | None:
    """The torchao release the adapter imported (:func:`numcheck.impls.adapters.torchao.release`)."""
    from numcheck.impls.adapters import torchao

    return torchao.release()


#: Measured on 0.18.0 (docs/evidence/torchao_nonfinite.txt, docs/evidence/torchao_pow2_scale.txt); every example
#: diverges on every release from 0.9.0 (the first with Float8LinearConfig.from_recipe_name) to 0.18.0 that imports
#: beside torch 2.13 (0.12.0 does not), docs/evidence/torchao_releases.txt.
MEASURED = Releases("torchao", ">=0.9.0,<=0.18.0", torchao_release)
#: The declared recipes on 0.18.0: torchao_float8[tensorwise] (current scaling, HYBRID, amax floored at EPS = 1e-12),
#: [rowwise] and [rowwise_with_gw_hp] (E4M3, power-of-2 scales, the same floor).
TENSORWISE = Fp8Recipe("current", fp8_format="HYBRID", amax_epsilon=1e-12)
ROWWISE = Fp8Recipe("rowwise", amax_epsilon=1e-12)
ROWWISE_GW_HP = Fp8Recipe("rowwise_gw_hp", amax_epsilon=1e-12)


def _edge_case(regime: str, recipe: Fp8Recipe = TENSORWISE) -> Fp8Case:
    """The suite's edge case (``test_edge_inputs_every_recipe``) in ``regime``, with x saved as torchao does."""
    return Fp8Case(recipe, 33, 40, 24, dtype="float32", bias=True, regime=regime, seed=11, save_original_input=True)


def _regime(name: str) -> Any:
    return lambda case: getattr(case, "regime", None) == name


def _pow2_edge(case: Any) -> bool:
    """An fp32 case of the ``scale_edge`` regime (amaxes a few ulps beside fp8_max·2^k) with power-of-2 scales,
    where torchao's fp32 log2 rounds a scale up."""
    return (
        getattr(case, "regime", None) == "scale_edge"
        and getattr(case, "dtype", None) == "float32"
        and bool(getattr(getattr(case, "recipe", None), "power_of_2_scales", False))
    )


_NAN = (
    "torchao's tensorwise amax propagates NaN (torch.max(abs(t)), float8_utils.tensor_to_amax): one NaN element makes "
    "its tensor's scale NaN and every output it feeds NaN; the contract ignores NaN in amax and makes NaN only the "
    "outputs whose reduction meets it"
)
_INF = (
    "torchao's scale of an infinite amax is fp8_max/inf = 0 (float8_utils.amax_to_scale): every element of the tensor "
    "quantizes to 0 and the inf to inf·0 = NaN, so every output it feeds is NaN; the contract gives scale 1 and "
    "saturates ±inf to ±max"
)
_ROW_INF = (
    "torchao's rowwise scale of a row (column) holding ±inf is fp8_max/inf = 0 (float8_utils.amax_to_scale over "
    "torch.amax(abs(t), dim)): the row quantizes to 0 and the inf to inf·0 = NaN, so every output the row or column "
    "feeds is NaN (56 of y's 792 in the edge case; rowwise_with_gw_hp's one scale of W for dgrad: all 1320 of "
    "dgrad); the contract gives scale 1 and saturates ±inf to ±max"
)
_GW_HP_W_NAN = (
    "rowwise_with_gw_hp scales W for grad_input with one scale per tensor (cast_config_weight_for_grad_input "
    "TENSORWISE), whose amax torch.max(abs(W)) propagates NaN: one NaN in W makes every dgrad element NaN (1320 of "
    "1320 in the edge case); the contract ignores NaN in amax and makes NaN only dgrad's column the NaN meets (72)"
)
_POW2 = (
    "torchao rounds a power-of-2 scale as exp2(floor(log2 s)) in fp32 (float8_utils._round_scale_down_to_power_of_2): "
    "for an fp32 scale a few ulps below 2^k log2 rounds to k, so the scale is 2^k where the recipe's floor and the "
    "contract give 2^(k-1); the row's amax saturates and its FP8-subnormal elements take a grid twice as fine, beyond "
    "the dequantized reference's accumulation bound in dgrad and wgrad (docs/evidence/torchao_pow2_scale.py: every "
    "case passes with an exact floor)"
)


def _entry(
    impls: str, applies: Any, reason: str, summary: str, example: Fp8Case, device: str = "cpu"
) -> KnownDivergence:
    """An accuracy divergence of ``impls`` on ``device`` (its example's), measured on :data:`MEASURED`."""
    return KnownDivergence(
        impls=impls,
        properties=("accuracy",),
        devices=(device,),
        applies=applies,
        reason=reason,
        library="torchao",
        summary=summary,
        example=example,
        releases=MEASURED,
    )


#: Seen on the CPU (the emulated path), docs/evidence/torchao_nonfinite.txt and torchao_pow2_scale.txt.
_CPU_KNOWN: tuple[KnownDivergence, ...] = (
    _entry(
        "torchao_float8[[]tensorwise]",
        _regime("nan"),
        _NAN,
        "one NaN in x, W or dy makes its tensorwise scale NaN and every output it feeds NaN",
        _edge_case("nan"),
    ),
    _entry(
        "torchao_float8[[]tensorwise]",
        _regime("inf"),
        _INF,
        "one ±inf in x, W or dy makes its tensorwise scale 0 and every output it feeds NaN (inf·0)",
        _edge_case("inf"),
    ),
    _entry(
        "torchao_float8[[]rowwise*",
        _regime("inf"),
        _ROW_INF,
        "one ±inf makes its row's rowwise scale 0 and every output that row or column feeds NaN (inf·0)",
        _edge_case("inf", ROWWISE),
    ),
    _entry(
        "torchao_float8[[]rowwise_with_gw_hp]",
        _regime("nan"),
        _GW_HP_W_NAN,
        "rowwise_with_gw_hp: one NaN in W makes W's tensorwise dgrad scale NaN and all of dgrad NaN",
        _edge_case("nan", ROWWISE_GW_HP),
    ),
    _entry(
        "torchao_float8[[]rowwise*",
        _pow2_edge,
        _POW2,
        "power-of-2 scales via fp32 log2 round a scale just below 2^k up to 2^k (an fp32 amax beside fp8_max·2^k)",
        _edge_case("scale_edge", ROWWISE),
    ),
)


#: Where the H100 run saw them (results/gpu/h100-torch2.11-torchao-families/: ao1/suite.txt, ao2/report/report.md).
_H100 = (
    "; seen on CUDA with the same cause (H100, torch 2.11, torchao 0.18.0, the real torch._scaled_mm path, "
    "results/gpu/h100-torch2.11-torchao-families/ao1/suite.txt and ao2/report/report.md): {seen}; the CPU's "
    "emulated path on the same case fails at the same first index with the same counts"
)


def _cuda_case(regime: str, recipe: Fp8Recipe, M: int, dtype: str) -> Fp8Case:
    """The suite's edge case as the H100 run drew it on CUDA: 33×40×24 fitted to the real path's declared shapes
    (K and N multiples of 16; M too where its GEMMs take M as a trailing dimension) in the first declared dtype
    (the rowwise recipes declare no float32 there: their GEMMs output bfloat16)."""
    return Fp8Case(
        recipe, M, 48, 32, dtype=dtype, bias=True, regime=regime, seed=11, save_original_input=True, device="cuda"
    )


#: The same causes on CUDA's real path, each with the case the H100 run failed (its element counts: every element
#: of an output the NaN or zero scale feeds, only the rows and columns holding the inf for a rowwise scale).
_CUDA_KNOWN: tuple[KnownDivergence, ...] = tuple(
    _entry(e.impls, e.applies, e.reason + _H100.format(seen=seen), e.summary, example, device="cuda")
    for e, seen, example in (
        (
            _CPU_KNOWN[0],
            "48×48×32 float32: y all NaN (1426 elements where the contract is finite), dgrad all (2209), "
            "wgrad all (1426)",
            _cuda_case("nan", TENSORWISE, 48, "float32"),
        ),
        (
            _CPU_KNOWN[1],
            "48×48×32 float32: every element of y NaN (1536 of 1536 where the contract is finite)",
            _cuda_case("inf", TENSORWISE, 48, "float32"),
        ),
        (
            _CPU_KNOWN[2],
            "rowwise 48×48×32 bfloat16: y 79 of 1536 NaN, dgrad 95 of 2304, wgrad 79 of 1536 (the rows and "
            "columns holding the inf); rowwise_with_gw_hp 33×48×32: y 64 of 1056, dgrad all 1584 (W's one scale)",
            _cuda_case("inf", ROWWISE, 48, "bfloat16"),
        ),
        (
            _CPU_KNOWN[3],
            "33×48×32 bfloat16: dgrad all NaN (1504 elements where the contract is finite, of 1584), y and wgrad "
            "as the contract",
            _cuda_case("nan", ROWWISE_GW_HP, 33, "bfloat16"),
        ),
    )
)

#: Every entry: the CPU's, then CUDA's (the power-of-2 rounding of fp32 scales has no CUDA entry: the real path
#: declares no float32 for the rowwise recipes, so the suite draws no case of it there).
TORCHAO_KNOWN: tuple[KnownDivergence, ...] = _CPU_KNOWN + _CUDA_KNOWN


def known_fp8_divergence(impl_name: str, prop: str, case: Fp8Case) -> KnownDivergence | None:
    """The FP8 known divergence covering ``case`` of impl ``impl_name`` under property ``prop``, or ``None``."""
    return next((e for e in TORCHAO_KNOWN if e.matches(impl_name, prop, case)), None)


#: The library numcheck's torchao adapters call (:data:`numcheck.properties.libraries.ADAPTER_LIBRARIES`): its
#: Float8Linear, MXFP8 linear and MoE FP8 grouped GEMM (``impls/adapters/torchao_prototype.py``).
LIBRARIES = (
    ("torchao_float8[[]*", "torchao", torchao_release),
    ("torchao_mxfp8[[]*", "torchao", torchao_release),
    ("torchao_grouped_fp8[[]*", "torchao", torchao_release),
)
