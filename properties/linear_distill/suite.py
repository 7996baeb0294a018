"""The drawn linear-distill tests, as data: :data:`DISTILL_SUITE` (name → :class:`SuiteProperty`), and the family's
descriptor :data:`FAMILY` for :data:`numcheck.properties.suites.SUITES`. ``numcheck.tests.suite.test_linear_distill``
runs one pytest test per entry.

Budgets: an example costs 0.05–0.3 s on CPU (tiny shapes, the float64 oracle and bounds) except under Triton's
interpreter (``slow`` impls: a quarter of the examples)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from numcheck.impls.protocols.linear_distill import LINEAR_DISTILL_KIND
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.family import SuiteFamily
from numcheck.properties.core.runner import Draw, SuiteProperty
from numcheck.properties.linear_distill import known_liger, props
from numcheck.properties.linear_distill.cases import DistillCase
from numcheck.properties.linear_distill.strategies import distill_cases


class DistillProperty(SuiteProperty):
    """A drawn linear-distill test: its known divergences are :mod:`~properties.linear_distill.known_liger`'s."""

    known_module = "numcheck.properties.linear_distill.known_liger"

    def known_for_every(self, impl: Any, fields: Any) -> Any:
        return self.known_case(impl, fields)

    def known_case(self, impl: Any, case: Any) -> Any:
        return known_liger.known(impl.name, self.property_name, case) if isinstance(case, DistillCase) else None


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
    DistillProperty("distill_accuracy", props.accuracy, _cases()),
    DistillProperty("distill_beta_endpoints", props.accuracy, _endpoint, skip=_endpoints),
    DistillProperty("distill_chunk_invariance", props.chunk_invariance, _cases(chunks=True), skip=_chunked),
    DistillProperty(
        "distill_ignored_rows_change_nothing",
        props.ignored_rows_change_nothing,
        _cases(ignored=True),
        skip=_needs("ignore_index"),
        every=lambda impl: DistillCase(N=2, H=2, V=2, ignored=1, device=DEVICE),
    ),
    DistillProperty("distill_beta_symmetry", props.beta_symmetry, _cases()),
    DistillProperty("distill_temperature_scaling", props.temperature_scaling, _cases(), skip=_needs("temperature")),
    DistillProperty(
        "distill_declared_options_take_effect", props.declared_options_take_effect, _cases(), skip=_any_option
    ),
    DistillProperty("distill_teacher_frozen", props.teacher_frozen, _cases()),
    DistillProperty("distill_determinism", props.determinism, _cases(), skip=_deterministic),
)
DISTILL_SUITE: dict[str, SuiteProperty] = {p.name: p for p in _ENTRIES}

FAMILY = SuiteFamily(
    kind=LINEAR_DISTILL_KIND,
    table=DISTILL_SUITE,
    properties=props.PROPERTIES,
    case_type=DistillCase,
    strategy=distill_cases,
)
