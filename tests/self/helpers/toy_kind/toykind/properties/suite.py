"""The toy family's drawn tests (:data:`TOY_SUITE`) and its descriptor for the property registry (:data:`FAMILY`)."""

from __future__ import annotations

from typing import Any

from numcheck.properties.core.family import SuiteFamily
from numcheck.properties.core.runner import SuiteProperty
from toykind.properties import props
from toykind.properties.cases import ToyCase
from toykind.properties.strategies import toy_cases
from toykind.protocol import TOY_KIND


def _draw(impl: Any, data: Any) -> ToyCase:
    return data.draw(toy_cases(impl.support))


TOY_SUITE: dict[str, SuiteProperty] = {
    p.name: p
    for p in (SuiteProperty("accuracy", props.accuracy, _draw), SuiteProperty("determinism", props.determinism, _draw))
}

FAMILY = SuiteFamily(kind=TOY_KIND, table=TOY_SUITE, properties=props.PROPERTIES, case_type=ToyCase, strategy=toy_cases)
