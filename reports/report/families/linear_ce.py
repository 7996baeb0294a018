"""The report's part of the linear + cross-entropy family (:class:`~reports.report.families.family.ReportFamily`):
the fixed grid, each impl's declared and many-chunk cases (:mod:`reports.report.grid`) in the reduction it
declares, judged by :func:`properties.core.accuracy.check_accuracy`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.grid import (
    GridCase,
    GridSpec,
    NotRun,
    declared_cases,
    in_declared_reduction,
    linear_ce_cases,
    many_chunk_cases,
)
from numcheck.reports.report.md_rows import all_judged_pass, fmt, median, plain_mode, summarize
from numcheck.reports.report.property_grid import linear_ce_refused, linear_ce_rows
from numcheck.reports.report.schema import dtype_names, linear_ce_record


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """A linear+CE impl's (impl, case) pairs: the fixed grid and its declared cases in the reduction it declares, less
    refused, repeated and known-divergent cases (counted and named in ``info``), then its many-chunk cases."""
    from numcheck.properties.core.known import known
    from numcheck.properties.core.strategies import refusal

    lin = linear_ce_cases(spec, device)  # the fixed grid (a few ms)
    mine: list[tuple[Any, GridCase]] = []  # (impl or its with_chunk_rows variant, case)
    not_run = NotRun()
    fixed = {gc.case for gc in lin}
    seen: set[Any] = set()
    for gc in lin + [d for d in declared_cases(spec, impl, device) if d.case not in fixed]:
        case = in_declared_reduction(gc.case, impl.support.reductions)
        divergence = known(impl.name, "accuracy", case)
        why = (
            refusal(impl.support, case)
            or ("the same case in the declared reduction" if case in seen else None)
            or (divergence and f"known divergence: {divergence.reason}")
        )
        seen.add(case)
        if why:
            not_run.add(gc.group, gc.mode, gc.case.short(), why)
        else:
            mine.append((impl, gc if case is gc.case else dataclasses.replace(gc, case=case)))
    many, left_out = many_chunk_cases(spec, impl, device)
    mine += many
    not_run.merge(left_out)
    info["not_declared"], info["not_run"] = dict(not_run), not_run.named
    return mine


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case judged by :func:`properties.core.accuracy.check_accuracy` (hard and expected bounds, relative)."""
    from numcheck.properties.core.accuracy import check_accuracy

    res = check_accuracy(impl, gc.case, levels=("hard", "expected"), relative=True)
    return linear_ce_record(impl, gc, res, time.perf_counter() - t0)


def properties() -> dict[str, Any]:
    """The linear+CE suite's properties by name."""
    from numcheck.properties.core.props import PROPERTIES

    return PROPERTIES


#: The outputs of a linear+CE case, in table and plot column order.
OUTPUTS: tuple[str, ...] = ("loss", "z_loss", "grad_x", "grad_weight", "grad_bias")


def declaration(impl: Any) -> dict[str, Any]:
    """A linear+CE declaration: its domain and the accumulation and precision paths the bounds follow."""
    s = impl.support
    return {
        "dtypes": dtype_names(s.dtypes),
        "autocast": dtype_names(s.autocast),
        "devices": sorted(s.devices),
        "options": sorted(s.options),
        "reductions": sorted(s.reductions),
        "all_ignored": s.all_ignored,
        "grad_accumulation": s.grad_accumulation,
        "chunk_rows": s.chunk_rows,
        "grad_x_accumulation": s.grad_x_accumulation,
        "chunk_cols": s.chunk_cols,
        "logits_dtype": s.logits_dtype,
        "ce_dtype": s.ce_dtype,
    }


def repro(impl: Any, prop: str, case: Any) -> str:
    """The ``numcheck repro`` command of one case (:func:`properties.core.failures.repro_command`)."""
    from numcheck.properties.core.failures import repro_command

    return repro_command(impl, prop, case)


def why(d: dict[str, Any]) -> str:
    """What in a linear+CE declaration (report.json's ``declaration``) sets its error (one line)."""
    acc = {
        "fp32": "grad_W accumulated in fp32",
        "per_chunk_rounding": "each chunk's grad_W product rounded to the compute dtype (bound + u_c)",
        "param_dtype": "grad_W running sum kept in the parameter dtype (bound + K·u_p)",
    }.get(d.get("grad_accumulation"), "")
    if d.get("grad_accumulation") == "param_dtype" and d.get("chunk_rows") is None:
        acc += ", chunk count undeclared (K = N assumed)"
    if d.get("grad_x_accumulation", "fp32") != "fp32":
        acc += f"; grad_x summed over vocabulary chunks ({d['grad_x_accumulation']}, " + (
            f"{d['chunk_cols']} classes each)" if d.get("chunk_cols") else "one per class assumed)"
        )
    logits = "logits in fp32" if d.get("logits_dtype") == "float32" else "logits in the compute dtype"
    ce = "; softmax/gradient arithmetic in the compute dtype" if d.get("ce_dtype") == "compute" else ""
    return f"{acc}; {logits}{ce}"


def _extras(row: dict[str, Any], items: list[tuple[dict, dict]]) -> None:
    row["rmse_vs_eager"] = median(
        o["relative"]["rmse_impl"] / o["relative"]["rmse_eager"]
        for _, o in items
        if "relative" in o and o["relative"]["rmse_eager"] > 0
    )


def summary(report: dict) -> list[dict[str, Any]]:
    """The linear+CE rows of report.md: per impl × dtype mode × output, with the RMSE against eager."""
    return summarize(report, LINEAR_CE_KIND, OUTPUTS, plain_mode, _extras)


def table(report: dict) -> list[str]:
    """The linear+CE summary: one row per impl, dtype mode and output (none without such cases)."""
    out: list[str] = []
    lin = summary(report)
    if lin:
        out += [
            "### Linear + cross-entropy: per impl × dtype × output",
            "",
            "Pass counts are *analytic* / *relative* (relative counts only judged outputs). Error/bound at the "
            "hard level; *expected* is the median at the √n level.",
            "",
            "| impl | dtype | output | cases | analytic pass | relative pass | worst error/bound | median | median (expected) | "
            "max ULP | RMSE vs eager (median) | worst case |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in lin:
            a = f"{r['passes'].get('analytic', 0)}/{r['judged'].get('analytic', 0)}"
            rel = (
                f"{r['passes'].get('relative', 0)}/{r['judged'].get('relative', 0)}"
                if r["judged"].get("relative")
                else "not judged"
            )
            flag = "" if all_judged_pass(r) else " ❌"
            out.append(
                f"| `{r['impl']}` | {r['mode']} | {r['output']} | {r['n']} | {a}{flag} | {rel} | {fmt(r['worst'])} | "
                f"{fmt(r['median'])} | {fmt(r['median_expected'])} | {fmt(r['max_ulp'])} | {fmt(r['rmse_vs_eager'])} | "
                f"`{r['worst_case']}` |"
            )
        out.append("")
    return out


def case_types() -> tuple[type, ...]:
    """A linear+CE case: a :class:`~properties.core.problems.Problem`."""
    from numcheck.properties.core.problems import Problem

    return (Problem,)


FAMILY = ReportFamily(
    kind=LINEAR_CE_KIND,
    plan=plan,
    measure=measure,
    properties=properties,
    case_types=case_types,
    declaration=declaration,
    judgements=("analytic", "relative"),
    repro=repro,
    property_rows=linear_ce_rows,
    refused=linear_ce_refused,
    why=why,
    summary=summary,
    table=table,
    outputs=OUTPUTS,
    label="",
)
