"""The drawn linear+preference tests of the suite, as data: :data:`PREFERENCE_SUITE` (name → :class:`SuiteProperty`).
``numcheck.tests.suite.test_linear_preference`` runs one pytest test per entry; :func:`numcheck.check`'s runner takes
the same entries (:mod:`numcheck.properties.core.runner`).

Budgets: every example is a few tiny calls and float64 oracles (``[2P, T, V]`` ≤ 8 × 6 × 40): 10–60 ms on a loaded
CPU core, so each test takes the profile's examples.
"""

from __future__ import annotations

from typing import Any

from numcheck.impls.protocols.linear_preference import PREFERENCE_KIND
from numcheck.properties.core.family import SuiteFamily
from numcheck.properties.core.runner import Draw, SuiteProperty
from numcheck.properties.linear_preference import known_liger
from numcheck.properties.linear_preference import props as checks
from numcheck.properties.linear_preference.cases import PreferenceCase
from numcheck.properties.linear_preference.strategies import preference_cases


def suite_examples(max_examples: int) -> int:
    """The examples each drawn test runs out of a profile's ``max_examples``: a quarter (at least 3). Every
    example runs several calls, oracles and bounds, and the family's twelve built-ins and six Liger adapters share
    the budget (about 25 test-seconds for the shipped module under the ci profile on CI's CPU)."""
    return max(3, max_examples // 4)


def _cases(**fixed: Any) -> Draw:
    """A draw of a :class:`~properties.linear_preference.cases.PreferenceCase` inside the impl's declaration
    (``fixed``: :func:`~properties.linear_preference.strategies.preference_cases`' keywords)."""
    return lambda impl, data: data.draw(preference_cases(impl.support, **fixed), label="case")


class PreferenceProperty(SuiteProperty):
    """A drawn linear-preference test: its known divergences are :mod:`~properties.linear_preference.known_liger`'s
    (a covered case is left out of the draws)."""

    known_module = "numcheck.properties.linear_preference.known_liger"

    def known_for_every(self, impl: Any, fields: Any) -> Any:
        return self.known_case(impl, fields)

    def known_case(self, impl: Any, case: Any) -> Any:
        return known_liger.known(impl.name, self.property_name, case) if isinstance(case, PreferenceCase) else None


def _declares_chunking(impl: Any) -> str | None:
    return None if impl.support.chunking else f"{impl.name} does not declare chunking (chunk_pairs)"


_ENTRIES: tuple[SuiteProperty, ...] = (
    PreferenceProperty("preference_accuracy", checks.accuracy, _cases()),
    PreferenceProperty("preference_ignored_positions", checks.ignored_positions, _cases(ignored=True)),
    PreferenceProperty(
        "preference_chunk_invariance", checks.chunk_invariance, _cases(min_pairs=2), skip=_declares_chunking
    ),
    PreferenceProperty("preference_pair_permutation", checks.pair_permutation, _cases(min_pairs=2)),
    PreferenceProperty("preference_options_honoured", checks.options_honoured, _cases(options_on=True)),
)

#: Every drawn linear+preference test of the suite by verdict name.
PREFERENCE_SUITE: dict[str, SuiteProperty] = {p.name: p for p in _ENTRIES}

#: The family's suite, registered in :data:`numcheck.properties.suites.SUITES`.
FAMILY = SuiteFamily(
    kind=PREFERENCE_KIND,
    table=PREFERENCE_SUITE,
    properties=checks.PROPERTIES,
    case_type=PreferenceCase,
    strategy=preference_cases,
)
