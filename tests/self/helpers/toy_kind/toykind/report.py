"""The toy family's part of ``numcheck report`` (:class:`~numcheck.reports.report.families.family.ReportFamily`):
two sums per declared dtype, judged by :func:`toykind.properties.props.measure`."""

from __future__ import annotations

import math
import time
from typing import Any

from numcheck.properties.core.failures import repro_command
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.grid import GridCase, GridSpec
from numcheck.reports.report.md_rows import all_judged_pass, fmt, plain_mode, summarize
from numcheck.reports.report.schema import case_text
from toykind.properties.cases import ToyCase
from toykind.properties.props import PROPERTIES
from toykind.properties.props import measure as measure_case
from toykind.protocol import TOY_KIND

OUTPUTS: tuple[str, ...] = ("total",)


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """Two sums (8 and 1000 elements) in each declared dtype."""
    return [
        (impl, GridCase(f"toy:{n}", dtype, ToyCase(n, dtype, seed=n, device=device)))
        for dtype in impl.support.dtypes
        for n in (8, 1000)
    ]


def _f(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case's record: its one output's error/bound and verdict."""
    c = measure_case(impl, gc.case)
    out = {
        "ratio_hard": _f(c.ratio),
        "ratio_expected": math.nan,
        "max_abs": _f(c.max_abs),
        "max_ulp": _f(c.max_ulp),
        "verdicts": {"analytic": bool(c.ok)},
    }
    rec = {
        "impl": impl.name,
        "kind": impl.kind,
        "case": case_text(gc.case),
        "label": gc.case.short(),
        "group": gc.group,
        "mode": gc.mode,
        "property": "accuracy",
        "status": "pass" if c.ok else "fail",
        "seconds": round(time.perf_counter() - t0, 3),
        "verdicts": {"analytic": bool(c.ok)},
        "outputs": {"total": out},
        "ratio_hard": out["ratio_hard"],
        "ratio_expected": math.nan,
    }
    if not c.ok:
        rec["failures"] = [c.describe()]
        rec["repro"] = repro_command(impl, "accuracy", gc.case)
    return rec


def summary(report: dict) -> list[dict[str, Any]]:
    """report.md's rows: per impl × dtype."""
    return summarize(report, TOY_KIND, OUTPUTS, plain_mode, lambda row, items: None)


def table(report: dict) -> list[str]:
    """report.md's toy section (none without toy cases)."""
    rows = summary(report)
    if not rows:
        return []
    out = [
        "### Toy sums: per impl × dtype",
        "",
        "| impl | dtype | cases | pass | worst error/bound |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        flag = "" if all_judged_pass(r) else " ❌"
        out.append(
            f"| `{r['impl']}` | {r['mode']} | {r['n']} | {r['passes'].get('analytic', 0)}/{r['n']}{flag} | {fmt(r['worst'])} |"
        )
    return [*out, ""]


FAMILY = ReportFamily(
    kind=TOY_KIND,
    plan=plan,
    measure=measure,
    properties=lambda: PROPERTIES,
    case_types=lambda: (ToyCase,),
    declaration=lambda impl: {"dtypes": list(impl.support.dtypes)},
    judgements=("analytic",),
    repro=repro_command,
    property_rows=lambda: (),
    refused=None,
    why=lambda d: "a sum of n values: γ_{n−1}·Σ|x| (Higham §4.2)",
    summary=summary,
    table=table,
    outputs=OUTPUTS,
    label="toy ",
    behaviours=lambda impl: [(f"dtype {d}", lambda case, d=d: case.dtype == d) for d in impl.support.dtypes],
)
