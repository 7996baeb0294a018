"""What the report needs of one kind of implementation: :class:`ReportFamily`, one per kind, registered in
:data:`reports.report.families.FAMILIES`.

A family module (``reports/report/families/<family>.py``) builds its kind's grid cases from the preset
(:class:`~reports.report.grid.GridSpec`, whose case tables and shared machinery stay in :mod:`reports.report.grid`),
measures one case into a record (:mod:`reports.report.schema`) and names the property library's table of its
kind's properties; :mod:`reports.report.run` iterates the registry instead of switching on the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from numcheck.reports.report.grid import GridCase, GridSpec
from numcheck.reports.report.property_grid import PropertyRow, Refused

#: ``plan(spec, impl, device, info)``: the (impl, case) pairs one impl runs; what its declaration leaves out is
#: counted and named in ``info`` (``not_declared``, ``not_run``); ``ValueError`` when it cannot run any here.
Plan = Callable[[GridSpec, Any, str, dict], list[tuple[Any, GridCase]]]
#: ``measure(impl, case, t0)``: one accuracy case's record (``t0``: :func:`time.perf_counter` at its start).
Measure = Callable[[Any, GridCase, float], dict[str, Any]]


@dataclass(frozen=True)
class ReportFamily:
    """One kind's part of ``numcheck report``.

    Attributes:
        kind: the kind's name (imported from its protocol module, :mod:`impls.protocols.kinds`).
        plan: its accuracy cases for one impl (:data:`Plan`).
        measure: one accuracy case judged by the property library, as a record (:data:`Measure`).
        properties: the property library's table of the kind's properties by name (imported when called: the
            suite's modules import hypothesis).
        case_types: the case classes of the kind (``numcheck repro --problem`` finds the kind of a case by them;
            imported when called).
        declaration: the parts of an impl's declaration that explain its numbers (report.json's ``declaration``).
        judgements: the judgements of an accuracy case of the kind (all failed in the record of a case that raised).
        repro: ``repro(impl, property, case)``, the command that reruns one case of the kind
            (``property``: ``accuracy`` or another property of its suite).
        property_rows: the rows of the kind's other properties (:mod:`reports.report.property_grid`).
        refused: ``refused(impl, property, case)``, why an impl of the kind does not run a built property case (its
            declaration, a recorded known divergence), or ``None`` where the builders fit the declaration.
        why: what in a declaration (report.json's ``declaration``) sets the kind's error, one line of report.md.
        summary: report.md's rows of the kind (:func:`reports.report.md_rows.summarize`).
        table: report.md's section of the kind (its summary table; no lines without cases of the kind).
        outputs: the kind's outputs in column order (the facets of ``ratio_distribution.png``).
        label: how a row of ``ratio_distribution.png`` names the kind (before the dtype mode).
        behaviours: ``behaviours(impl)``, the behaviours an impl of the kind declares, each a (description,
            predicate on a case) pair: report.json's ``unreached`` names those no case run for it has
            (:mod:`reports.report.coverage`).
        find_impl: ``find_impl(name)``, the impl ``numcheck repro --impl NAME`` runs a case of the kind on (a
            family whose impls load otherwise than the registry's: a built-in list of its own, a spec naming a
            function that builds one on its ranks); ``None``: :func:`reports.common.find_impl`.
        repr_names: ``repr_names()``, the names besides its case types that a case's ``repr`` uses (a recipe, a drawn
            tensor), which ``numcheck repro --problem`` evaluates with; ``None``: none (imported when called).
        undeclared: ``undeclared(impl, case)``, why the impl's declaration excludes a case of the kind (``numcheck
            repro`` runs it only with ``--undeclared``), or ``None`` where every case it is given is declared.
    """

    kind: str
    plan: Plan
    measure: Measure
    properties: Callable[[], dict[str, Any]]
    case_types: Callable[[], tuple[type, ...]]
    declaration: Callable[[Any], dict[str, Any]]
    judgements: tuple[str, ...]
    repro: Callable[[Any, str, Any], str]
    property_rows: Callable[[], tuple[PropertyRow, ...]]
    refused: Refused | None
    why: Callable[[dict[str, Any]], str]
    summary: Callable[[dict], list[dict[str, Any]]]
    table: Callable[[dict], list[str]]
    outputs: tuple[str, ...]
    label: str
    behaviours: Callable[[Any], list[tuple[str, Callable[[Any], bool]]]]
    find_impl: Callable[[str], Any] | None = None
    repr_names: Callable[[], dict[str, Any]] | None = None
    undeclared: Callable[[Any, Any], str | None] | None = None
