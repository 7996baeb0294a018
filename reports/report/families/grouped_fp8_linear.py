"""Grouped FP8 linear (mixture-of-experts, :class:`~properties.fp8.grouped.cases.GroupedCase`), per impl: the cases of
:data:`GROUPED_CASES` (uneven splits; empty experts with a bias; ``save_original_input=True`` where the recipe allows
it; experts of different binades with fused wgrad accumulation where declared) for the first recipe of each kind in
the quick grid and every recipe in the full one, each moved into the impl's split rules; what the declaration still
leaves out is counted with the reason. About 0.3 s a case.

The report's part of the grouped FP8 linear family (:class:`~reports.report.families.family.ReportFamily`).
"""

from __future__ import annotations

import time
from shlex import quote
from typing import Any

from numcheck.impls.protocols.grouped_fp8_linear import GROUPED_KIND
from numcheck.reports.report.coverage import fp8_behaviours
from numcheck.reports.report.families import fp8_linear
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.grid import DTYPE_NAMES, GROUPED_CASES, GridCase, GridSpec, NotRun
from numcheck.reports.report.md_rows import plain_mode, summarize
from numcheck.reports.report.property_grid import grouped_refused, grouped_rows
from numcheck.reports.report.schema import fp8_record


def grouped_cases(spec: GridSpec, impl: Any, device: str = "cpu") -> tuple[list[GridCase], dict[str, int]]:
    """The grouped cases of ``spec`` (:data:`GROUPED_CASES`, module docstring) an impl's declaration admits, for each
    recipe (the first of each kind in the quick grid) and dtype, and the others counted per reason
    (:func:`properties.fp8.grouped.cases.refusal`)."""
    from numcheck.properties.fp8.grouped.cases import GroupedCase, fitted, refusal

    support = impl.support
    declared = [name for d, name in DTYPE_NAMES.items() if d in support.dtypes]
    if not declared:
        raise ValueError(f"support declares no dtype numcheck can build: {support.dtypes}")
    dtypes = declared if spec.fp8_all_dtypes else (["bfloat16"] if "bfloat16" in declared else declared[:1])
    recipes = (
        list(support.recipes)
        if spec.grouped_all_recipes
        else [next(r for r in support.recipes if r.kind == k) for k in dict.fromkeys(r.kind for r in support.recipes)]
    )
    out: list[GridCase] = []
    skipped: dict[str, int] = {}
    for recipe in recipes:
        for dtype in dtypes:
            for i, label in enumerate(spec.grouped_cases):
                splits, K, N, fields = GROUPED_CASES[label]
                if fields.get("save_original_input") and not recipe.allows_save_original_input:
                    fields = {**fields, "save_original_input": False}
                case = fitted(
                    support,
                    GroupedCase(
                        recipe,
                        splits,
                        K,
                        N,
                        dtype=dtype,
                        seed=6000 + i,
                        device=device,
                        steps=2 if recipe.kind == "delayed" else 1,
                        **fields,
                    ),
                )
                why = refusal(support, case)
                if why:
                    skipped[why] = skipped.get(why, 0) + 1
                else:
                    out.append(GridCase(f"grouped:{label}", dtype, case))
    return out, skipped


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """A grouped impl's cases (:func:`grouped_cases`), the refused ones counted per reason and named in ``info``
    (each reason once)."""
    cases, counts = grouped_cases(spec, impl, device)
    refused = NotRun()
    for why, n in counts.items():
        refused.add("grouped", "", f"{n} case(s)", why)
        refused[why] += n - 1
    info["not_declared"], info["not_run"] = dict(refused), refused.named
    return [(impl, gc) for gc in cases]


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case judged by :func:`properties.fp8.grouped.props.measure_case`."""
    from numcheck.properties.fp8.grouped.props import measure_case

    return fp8_record(impl, gc, measure_case(impl, gc.case), time.perf_counter() - t0)


def properties() -> dict[str, Any]:
    """The grouped FP8 suite's properties by name."""
    from numcheck.properties.fp8.grouped.props import GROUPED_PROPERTIES

    return GROUPED_PROPERTIES


def declaration(impl: Any) -> dict[str, Any]:
    """A grouped declaration: the single FP8 linear's, and how the experts are split and laid out."""
    s = impl.support
    out = fp8_linear.declaration(impl)
    out.update(
        split_alignment=s.split_alignment,
        empty_splits=s.empty_splits,
        feature_alignment=s.feature_alignment,
        weight_layouts=sorted(s.weight_layouts),
        fused_wgrad_accumulation=sorted(s.fused_wgrad_accumulation),
        bitwise_per_expert=s.bitwise_per_expert,
    )
    return out


def why(d: dict[str, Any]) -> str:
    """What in a grouped declaration (report.json's ``declaration``) sets its error (one line)."""
    return (
        f"experts' rows in multiples of {d.get('split_alignment')}"
        f"{', empty experts' if d.get('empty_splits') else ''}; every scale per expert; "
        f"{'wgrad fused into fp32 main_grad; ' if True in d.get('fused_wgrad_accumulation', []) else ''}"
        f"{fp8_linear.why(d)}"
    )


def summary(report: dict) -> list[dict[str, Any]]:
    """The grouped rows of report.md: per impl × recipe × dtype × output, the single FP8 linear's columns."""
    return summarize(report, GROUPED_KIND, fp8_linear.OUTPUTS, plain_mode, fp8_linear.single_extras)


def table(report: dict) -> list[str]:
    """The grouped FP8 linear summary (none without such cases)."""
    return fp8_linear.fp8_table(
        summary(report),
        "### Grouped FP8 linear (mixture-of-experts): per impl × recipe × dtype × output",
        "Each case split among its experts (uneven and unaligned sizes, "
        "empty experts), every element judged under its own expert's bounds "
        "(`properties/fp8/grouped/tolerance.py`); wgrad and bgrad stacked over the experts. ",
    )


def case_types() -> tuple[type, ...]:
    """A grouped case."""
    from numcheck.properties.fp8.grouped.cases import GroupedCase

    return (GroupedCase,)


def undeclared(impl: Any, case: Any) -> str | None:
    """Why ``impl``'s declaration excludes a grouped ``case`` (:func:`properties.fp8.grouped.cases.refusal`: the suite
    never draws it), with the case moved into the split rules where that declares it
    (:func:`properties.fp8.grouped.cases.fitted`, as the report's own cases are), or ``None``."""
    from numcheck.properties.fp8.grouped.cases import fitted, refusal

    why = refusal(impl.support, case)
    if why is None:
        return None
    moved = fitted(impl.support, case)
    if moved == case or refusal(impl.support, moved):
        return why
    return f"{why}; inside the declaration the case is --problem {quote(repr(moved))}"


FAMILY = ReportFamily(
    kind=GROUPED_KIND,
    plan=plan,
    measure=measure,
    properties=properties,
    case_types=case_types,
    declaration=declaration,
    judgements=("accumulation", "total"),
    repro=fp8_linear.repro,
    property_rows=grouped_rows,
    refused=grouped_refused,
    why=why,
    summary=summary,
    table=table,
    outputs=fp8_linear.OUTPUTS,
    label="grouped FP8 ",
    behaviours=fp8_behaviours,
    repr_names=fp8_linear.repr_names,
    undeclared=undeclared,
)
