"""Known divergences of torchao's FP8 linears (``torchao_float8[...]``, :mod:`numcheck.impls.adapters.torchao`) from
numcheck's FP8 contract, as :class:`~numcheck.properties.core.known.KnownDivergence` entries whose ``applies`` and
``example`` take a :class:`~numcheck.properties.fp8.cases.QuantCase`.

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
from numcheck.properties.fp8.cases import QuantCase
from numcheck.reference.fp8_recipes import Fp8Recipe


def torchao_release() -> str | None:
    """The torchao release the adapter imported (:func:`numcheck.impls.adapters.torchao.release`)."""
    from numcheck.impls.adapters import torchao

    return torchao.release()


#: Measured on (docs/evidence/torchao_nonfinite.txt).
MEASURED = Releases("torchao", "==0.18.0", torchao_release)
#: torchao_float8[tensorwise]'s declared recipe on 0.18.0 (current scaling, HYBRID, amax floored at EPS = 1e-12).
TENSORWISE = Fp8Recipe("current", fp8_format="HYBRID", amax_epsilon=1e-12)


def _edge_case(regime: str) -> QuantCase:
    """The suite's edge case (``test_edge_inputs_every_recipe``) in ``regime``, with x saved as torchao does."""
    return QuantCase(
        TENSORWISE, 33, 40, 24, dtype="float32", bias=True, regime=regime, seed=11, save_original_input=True
    )


def _regime(name: str) -> Any:
    return lambda case: getattr(case, "regime", None) == name


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

TORCHAO_KNOWN: tuple[KnownDivergence, ...] = (
    KnownDivergence(
        impls="torchao_float8[[]*",
        properties=("accuracy",),
        devices=("cpu",),
        applies=_regime("nan"),
        reason=_NAN,
        library="torchao",
        summary="one NaN in x, W or dy makes its tensorwise scale NaN and every output it feeds NaN",
        example=_edge_case("nan"),
        releases=MEASURED,
    ),
    KnownDivergence(
        impls="torchao_float8[[]*",
        properties=("accuracy",),
        devices=("cpu",),
        applies=_regime("inf"),
        reason=_INF,
        library="torchao",
        summary="one ±inf in x, W or dy makes its tensorwise scale 0 and every output it feeds NaN (inf·0)",
        example=_edge_case("inf"),
        releases=MEASURED,
    ),
)


def known_fp8_divergence(impl_name: str, prop: str, case: QuantCase) -> KnownDivergence | None:
    """The FP8 known divergence covering ``case`` of impl ``impl_name`` under property ``prop``, or ``None``."""
    return next((e for e in TORCHAO_KNOWN if e.matches(impl_name, prop, case)), None)


#: The library numcheck's torchao adapter calls (:data:`numcheck.properties.libraries.ADAPTER_LIBRARIES`).
LIBRARIES = (("torchao_float8[[]*", "torchao", torchao_release),)
