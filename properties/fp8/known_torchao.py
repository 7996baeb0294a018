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


def _entry(impls: str, applies: Any, reason: str, summary: str, example: Fp8Case) -> KnownDivergence:
    """An accuracy divergence of ``impls`` on the CPU, measured on :data:`MEASURED`."""
    return KnownDivergence(
        impls=impls,
        properties=("accuracy",),
        devices=("cpu",),
        applies=applies,
        reason=reason,
        library="torchao",
        summary=summary,
        example=example,
        releases=MEASURED,
    )


TORCHAO_KNOWN: tuple[KnownDivergence, ...] = (
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
