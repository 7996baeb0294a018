"""One property on one case, as an assertion any test can call: :func:`assert_linear_ce`, :func:`assert_fp8_linear`.

Like ``torch.testing.assert_close``, they return quietly when the property holds and raise
:class:`~numcheck.properties.core.failures.PropertyFailure` (an ``AssertionError``) with the suite's own failure
message — impl, property, case, output, error, bound, worst element, a reproduction line — when it does not.
Their arguments are checked first, and a bad one raises ``ValueError``/``TypeError`` saying what was wrong and
how to fix it, before anything runs. The case must be one the impl declares (the suite never judges an impl
outside its declaration). Known divergences of the built-in impls (numcheck's own test data) are not
consulted: the property is judged as stated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from numcheck.errors import InvalidAssertion
from numcheck.impls.protocols.declaration import did_you_mean
from numcheck.impls.protocols.fp8_linear import FP8_KIND
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND, LinearCESupport, validate_impl
from numcheck.properties.core import matmul_precision, poison
from numcheck.properties.fp8.cases import Fp8Case
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.chunks import declares_chunks
from numcheck.properties.linear_ce.props import Metrics
from numcheck.properties.linear_ce.strategies import refusal
from numcheck.properties.suites import SUITES
from numcheck.reference.fp8_recipes import Fp8Recipe


def _case(cls: type, call: str, case: Any, fields: Mapping[str, Any], example: str) -> Any:
    """``case`` itself, or ``cls(**fields)``; exactly one of them, every field name known."""
    names = [f.name for f in dataclasses.fields(cls)]
    if case is not None and fields:
        raise InvalidAssertion(
            f"{call}: got a {cls.__name__} and the fields {sorted(fields)} too\n"
            f"  Pass one: {cls.__name__}(...) or its fields as keywords, e.g. {example}."
        )
    if case is None:
        if not fields:
            raise InvalidAssertion(
                f"{call}: no case given\n  Pass a {cls.__name__} or its fields as keywords, e.g. {example}."
            )
        for k in fields:
            if k not in names:
                raise InvalidAssertion(
                    f"{call}: {k!r} is not a field of {cls.__name__}\n  Fields: "
                    f"{', '.join(names)}.{did_you_mean(k, names)}"
                )
        try:
            return cls(**fields)
        except TypeError as exc:  # a required field missing
            raise InvalidAssertion(f"{call}: {exc}\n  e.g. {example}.") from None
    if not isinstance(case, cls):
        raise InvalidAssertion(
            f"{call}: the case must be a {cls.__name__}, got {type(case).__name__} {case!r}\n  e.g. {example}."
        )
    return case


def _prop(call: str, prop: Any, table: Mapping[str, Callable[..., Any]]) -> Callable[..., Any]:
    if not isinstance(prop, str) or prop.split("[", 1)[0] not in table:
        raise InvalidAssertion(
            f"{call}: unknown property {prop!r}\n  Properties: {', '.join(sorted(table))}."
            f"{did_you_mean(prop, table) if isinstance(prop, str) else ''}"
        )
    return table[prop.split("[", 1)[0]]


def _impl(call: str, impl: Any, kind: str) -> None:
    """Refuse anything but a loadable, available impl of ``kind``."""
    try:
        validate_impl(impl, call)
    except TypeError as exc:
        raise InvalidAssertion(
            f"{exc}\n  Pass an impl object (e.g. one made with numcheck.linear_ce_impl or numcheck.fp8_linear_impl)."
        ) from None
    if impl.kind != kind:
        family = SUITES.get(impl.kind)
        other = family.assertion if family is not None and family.assertion else ""
        fix = (
            f"Use numcheck.{other} for it."
            if other
            else "numcheck has no assertion for its kind: run numcheck.check or the suite on it."
        )
        raise InvalidAssertion(f"{call}: impl {impl.name!r} is a {impl.kind} impl\n  {fix}")
    reason = impl.support.unavailable_reason()
    if reason:
        raise InvalidAssertion(
            f"{call}: impl {impl.name!r} cannot run here: {reason}\n"
            f"  Skip the test where the requirement is unmet (e.g. pytest.skip)."
        )


def inapplicable(prop: str, impl: Any, p: Problem) -> str | None:
    """Why linear+CE property ``prop`` says nothing about ``impl`` on ``p`` (it would return without judging),
    or ``None``. The conditions are the early returns of :mod:`numcheck.properties.linear_ce.props`."""
    s: LinearCESupport = impl.support
    if prop == "two_calls" and (p.reduction not in ("sum", "mean") or p.N < 2 or p.N % 2):
        return "it needs reduction 'sum' or 'mean' and an even N >= 2 (two halves)"
    if prop == "ignored_rows" and not p.n_ignored:
        return "it needs ignored rows (ignored > 0)"
    if prop == "shift_invariance" and (not p.bias or p.softcap is not None or p.z_loss_scale):
        return "it needs bias=True, no softcap and no z-loss (the shift goes through the bias)"
    if prop == "option_identities" and (
        p.label_smoothing or p.class_weights or p.z_loss_scale or p.softcap is not None
    ):
        return "it needs a plain case (no label smoothing, class weights, z-loss or softcap): it adds neutral ones"
    if prop == "chunk_invariance" and not declares_chunks(impl):
        return (
            f"impl {impl.name!r} declares no chunking (chunk_rows, chunk_rule, or a grad_accumulation other "
            f"than 'fp32')"
        )
    if prop == "chunk_invariance" and not hasattr(impl, "with_chunk_rows") and p.N < 2:
        return "it needs N >= 2 (rows to move across chunk boundaries)"
    if prop == "reduction_consistency" and (not {"mean", "sum", "none"} <= set(s.reductions) or p.all_ignored):
        return "it needs an impl declaring all three reductions and a case that is not all-ignored"
    return None


def assert_linear_ce(impl: Any, problem: Problem | None = None, *, prop: str = "accuracy", **fields: Any) -> Metrics:
    """Assert that linear+CE property ``prop`` holds for ``impl`` on one problem; return its metrics.

    ``problem`` is a :class:`~numcheck.properties.linear_ce.cases.Problem`, or its fields are given as keywords
    (``N=8, H=16, V=32, dtype="bfloat16"``). ``prop`` is a name of
    :data:`numcheck.properties.linear_ce.props.PROPERTIES` (``"accuracy"``: every output within the analytic bound of
    the float64 oracle and within k× eager's error). Raises
    :class:`~numcheck.properties.core.failures.PropertyFailure` (an ``AssertionError``) with the suite's message when
    the property fails, :class:`InvalidAssertion` before running when an argument is wrong: not a linear+CE
    impl, an impl unavailable here, an unknown property or field, a case the impl does not declare, or one the
    property says nothing about.

    >>> import torch.nn.functional as F
    >>> import numcheck
    >>> @numcheck.linear_ce_impl(name="doc_fp32", dtypes=("float32",), autocast=())
    ... def fp32(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    ...     return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)
    >>> metrics = numcheck.assert_linear_ce(fp32, N=8, H=16, V=32, bias=True)
    >>> metrics["error/bound"] <= 1.0
    True
    >>> @numcheck.linear_ce_impl(name="doc_sum_for_none", dtypes=("float32",), autocast=())
    ... def sum_for_none(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    ...     return fp32(x, weight, target, bias, reduction="sum", ignore_index=ignore_index)
    >>> numcheck.assert_linear_ce(sum_for_none, N=8, H=16, V=32, reduction="none", upstream="per_row")
    Traceback (most recent call last):
    ...
    numcheck.errors.ProtocolViolation: impl 'doc_sum_for_none' returned loss of shape () for reduction='none'; expected (8,)
    """
    call = "assert_linear_ce"
    _impl(call, impl, LINEAR_CE_KIND)
    family = SUITES[LINEAR_CE_KIND]
    fn = _prop(call, prop, family.properties)
    p = _case(family.case_type, call, problem, fields, "Problem(N=8, H=16, V=32, dtype='float32')")
    why = refusal(impl.support, p)
    if why:
        raise InvalidAssertion(
            f"{call}: impl {impl.name!r} does not declare this case: {why}\n  case: {p!r}\n"
            f"  Pass a case inside its declaration, or declare the case (numcheck list shows "
            f"what it declares)."
        )
    why = inapplicable(prop.split("[", 1)[0], impl, p)
    if why:
        raise InvalidAssertion(f"{call}: property {prop!r} says nothing about this case: {why}\n  case: {p!r}")
    # the GEMM precision the model assumes (properties.core.matmul_precision); memory poisoned as the suite poisons it
    with matmul_precision.pinned(), poison.judging(impl, prop.split("[", 1)[0]):
        return fn(impl, p)


def _recipe(call: str, value: Any) -> Any:
    """A recipe kind name given as ``recipe="current"`` becomes that kind's :class:`Fp8Recipe`."""
    if isinstance(value, str):
        try:
            return Fp8Recipe(value)
        except ValueError as exc:
            raise InvalidAssertion(f"{call}: {exc}\n  Give an Fp8Recipe(...) or a recipe kind name.") from None
    return value


def assert_fp8_linear(impl: Any, case: Fp8Case | None = None, *, prop: str = "accuracy", **fields: Any) -> Any:
    """Assert that quantized-linear property ``prop`` holds for ``impl`` on one case; return its result.

    ``case`` is a :class:`~numcheck.properties.fp8.cases.Fp8Case`, or its fields are given as keywords
    (``recipe="current", M=32, K=64, N=16``; ``recipe`` an :class:`Fp8Recipe` or a recipe kind name). ``prop``
    is a name of :data:`numcheck.properties.fp8.props.FP8_PROPERTIES` (``"accuracy"``: every output within the
    bounds against both references; it returns the measurement, an ``Fp8CaseResult``). Raises
    :class:`~numcheck.properties.core.failures.PropertyFailure` with the suite's message when the property fails,
    :class:`InvalidAssertion` before running when an argument is wrong (not a quantized-linear impl, unavailable
    here, an unknown property or field, a case the impl does not declare, ``quantizer`` without a ``quantize``).

    >>> import numcheck
    >>> from numcheck.impls.builtin.fp8_linear import Fp8Linear
    >>> from numcheck.reference.fp8_recipes import Fp8Recipe
    >>> impl = Fp8Linear("doc_fp8", (Fp8Recipe("current"),))
    >>> result = numcheck.assert_fp8_linear(impl, recipe=impl.support.recipes[0], M=16, K=32, N=8)
    >>> result.ok
    True
    """
    call = "assert_fp8_linear"
    _impl(call, impl, FP8_KIND)
    family = SUITES[FP8_KIND]
    fn = _prop(call, prop, family.properties)
    if "recipe" in fields:
        fields = {**fields, "recipe": _recipe(call, fields["recipe"])}
    c = _case(family.case_type, call, case, fields, "Fp8Case(Fp8Recipe('current'), M=32, K=64, N=16)")
    why = impl.support.refuses(
        recipe=c.recipe,
        dtype=c.torch_dtype,
        device=torch.device(c.device).type,
        save_original_input=c.save_original_input,
        bias=c.bias,
        shape=(c.M, c.K, c.N),
    )
    if why:
        declared = ", ".join(r.name for r in impl.support.recipes)
        raise InvalidAssertion(
            f"{call}: impl {impl.name!r} does not declare this case: {why}\n  case: {c!r}\n"
            f"  Pass a case inside its declaration (recipes: {declared}; numcheck list shows the "
            f"rest)."
        )
    if prop == "quantizer" and not impl.support.exposes_quantize:
        raise InvalidAssertion(
            f"{call}: property 'quantizer' needs an impl exposing quantize; {impl.name!r} "
            f"declares exposes_quantize=False"
        )
    if prop == "save_original_input" and True not in impl.support.save_original_input:
        raise InvalidAssertion(
            f"{call}: property 'save_original_input' says nothing about {impl.name!r}: it "
            f"declares save_original_input={sorted(impl.support.save_original_input)} only"
        )
    with matmul_precision.pinned(), poison.judging(impl, prop):
        return fn(impl, c)
