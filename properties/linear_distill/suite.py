"""The drawn linear-distill tests, as data: :data:`DISTILL_SUITE` (name → :class:`SuiteProperty`), and the family's
descriptor :data:`FAMILY` for :data:`numcheck.properties.suites.SUITES`. ``numcheck.tests.suite.test_linear_distill``
runs one pytest test per entry.

Budgets: an example costs 0.05–0.3 s on CPU (tiny shapes, the float64 oracle and bounds) except under Triton's
interpreter (``slow`` impls: a quarter of the examples)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from numcheck.impls.protocols.linear_distill import LINEAR_DISTILL_KIND
from numcheck.properties.core.family import SuiteFamily
from numcheck.properties.core.runner import Draw, SuiteProperty
from numcheck.properties.linear_distill import props
from numcheck.properties.linear_distill.cases import DistillCase
from numcheck.properties.linear_distill.strategies import distill_cases


def _cases(**fixed: Any) -> Draw:
    return lambda impl, data: data.draw(distill_cases(impl.support, **fixed), label="case")


def _endpoint(impl: Any, data: Any) -> DistillCase:
    beta = data.draw(st.sampled_from((0.0, 1.0)), label="endpoint")
    return data.draw(distill_cases(impl.support, beta=beta), label="case")


def _chunked(impl: Any) -> str | None:
    sup = impl.support
    if sup.chunk_rows is None and sup.chunk_rule is None:
        return f"{impl.name} declares no chunks (chunk_rows, chunk_rule)"
    return None


def _endpoints(impl: Any) -> str | None:
    return None if impl.support.beta_endpoints else f"{impl.name} excludes beta 0 and 1 (beta_endpoints=False)"


def _needs(option: str):
    def skip(impl: Any) -> str | None:
        return None if option in impl.support.options else f"{impl.name} does not declare the option {option!r}"

    return skip


def _any_option(impl: Any) -> str | None:
    return None if impl.support.options else f"{impl.name} declares no option"


def _deterministic(impl: Any) -> str | None:
    return None if impl.support.deterministic else f"{impl.name} declares deterministic=False"


_ENTRIES: tuple[SuiteProperty, ...] = (
    SuiteProperty("distill_accuracy", props.accuracy, _cases()),
    SuiteProperty("distill_beta_endpoints", props.accuracy, _endpoint, skip=_endpoints),
    SuiteProperty("distill_chunk_invariance", props.chunk_invariance, _cases(chunks=True), skip=_chunked),
    SuiteProperty(
        "distill_ignored_rows_change_nothing",
        props.ignored_rows_change_nothing,
        _cases(ignored=True),
        skip=_needs("ignore_index"),
    ),
    SuiteProperty("distill_beta_symmetry", props.beta_symmetry, _cases()),
    SuiteProperty("distill_temperature_scaling", props.temperature_scaling, _cases(), skip=_needs("temperature")),
    SuiteProperty(
        "distill_declared_options_take_effect", props.declared_options_take_effect, _cases(), skip=_any_option
    ),
    SuiteProperty("distill_teacher_frozen", props.teacher_frozen, _cases()),
    SuiteProperty("distill_determinism", props.determinism, _cases(), skip=_deterministic),
)
DISTILL_SUITE: dict[str, SuiteProperty] = {p.name: p for p in _ENTRIES}

FAMILY = SuiteFamily(
    kind=LINEAR_DISTILL_KIND,
    table=DISTILL_SUITE,
    properties=props.PROPERTIES,
    case_type=DistillCase,
    strategy=distill_cases,
)
