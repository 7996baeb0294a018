"""What the property library knows of one kind of implementation: :class:`SuiteFamily`, one per family, registered
with one line in :data:`numcheck.properties.suites.SUITES`.

A family's ``suite`` module builds its descriptor from its own modules (the suite's table, the property functions,
the case type, the strategy, the pinned cases); :func:`numcheck.check`, the assertions
(:mod:`numcheck.properties.assertions`) and the pytest plugin (the suite property a drawn test runs, the
``numcheck_problems`` fixture) iterate the registry instead of switching on the kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from numcheck.properties.core.runner import SuiteProperty


def _declares_every_case(impl: Any, case: Any) -> str | None:
    """No pinned case refused."""
    return None


@dataclass(frozen=True)
class SuiteFamily:
    """One family's suite, as :func:`numcheck.check`, the assertions and the plugin run it.

    Attributes:
        kind: the kind's name (imported from its protocol module).
        table: the suite's drawn tests by verdict name (:class:`~numcheck.properties.core.runner.SuiteProperty`; a
            test of the shipped suite named ``test_<name>`` is run through its entry).
        properties: the property functions by name (``fn(impl, case)``, raising ``PropertyFailure``): what
            ``numcheck repro`` and the family's assertion look a property up in.
        case_type: the family's case class (what its properties take; its ``repr`` is the repro line's ``--problem``).
        strategy: ``strategy(support)``, the hypothesis strategy of the family's cases inside a declaration (the
            ``numcheck_problems`` fixture draws it).
        pinned: cases every impl declaring them is judged on (``pinned_cases``), by the text they were pinned as.
        pinned_property: the property the pinned cases are judged by (``None`` without pinned cases).
        pinned_refusal: ``pinned_refusal(impl, case)``, why ``impl`` is not judged on a pinned case (its declaration
            excludes it, a recorded known divergence), or ``None``.
        assertion: the name of numcheck's assertion for one case of the kind (``numcheck.<assertion>``), or ``""``.
    """

    kind: str
    table: Mapping[str, SuiteProperty]
    properties: Mapping[str, Callable[..., Any]]
    case_type: type
    strategy: Callable[[Any], Any]
    pinned: Mapping[str, Any] = field(default_factory=dict)
    pinned_property: Callable[..., Any] | None = None
    pinned_refusal: Callable[[Any, Any], str | None] = _declares_every_case
    assertion: str = ""


@dataclass(frozen=True)
class RankedSuite:
    """A family whose drawn tests run on ranks, their draws inside the tests (no :class:`SuiteFamily`): each drawn
    test by name, as a tool runs one outside pytest (``tools/detection.py``), registered with one line in
    :data:`numcheck.properties.suites.RANKED`.

    Attributes:
        kind: the kind's name (imported from its protocol module).
        names: ``names(impl)``, the names of the family's drawn tests for ``impl`` (with the world size where a
            test runs at one: ``dist_accuracy[world_size=4]``).
        run: ``run(impl, name, profile, shrink)``, the drawn test ``name`` on ``impl`` under the hypothesis profile
            ``profile`` (without the shrink phase unless ``shrink``): ``("passed" | "failed" | "skipped", message)``.
    """

    kind: str
    names: Callable[[Any], list[str]]
    run: Callable[[Any, str, str, bool], tuple[str, str]]
