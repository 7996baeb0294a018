"""The rows of report.md's per-family tables, from report.json's cases: :func:`summarize` (one row per impl ×
dtype mode (× recipe) × output) and the cell formatting every table shares. Each family's table
(:mod:`reports.report.families`) says how its rows are grouped and what else they carry; :mod:`reports.report.md`
assembles the tables.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Callable, Iterable

#: ``extras(row, items)``: the family's own columns of a row (``items``: its (case, output record) pairs).
Extras = Callable[[dict[str, Any], list[tuple[dict, dict]]], None]


def fmt(v: Any, digits: int = 3) -> str:
    """A table cell: ``v`` to ``digits`` significant digits, ``—`` for none or NaN, ``∞`` for an infinity."""
    if v is None:
        return "—"
    if isinstance(v, float):
        if math.isnan(v):
            return "—"
        if math.isinf(v):
            return "∞"
    return f"{v:.{digits}g}"


def median(vals: Iterable[float]) -> float:
    """The median of the numbers among ``vals`` (NaN ignored; NaN when none)."""
    v = [x for x in vals if isinstance(x, (int, float)) and not math.isnan(x)]
    return statistics.median(v) if v else math.nan


def base_output(name: str) -> str:
    """An output's name without its ``@rankR`` suffix."""
    return name.split("@", 1)[0]


def all_judged_pass(row: dict[str, Any]) -> bool:
    """Whether every judged output of a :func:`summarize` row passes every judgement made on it."""
    return all(row["passes"].get(j, 0) == n for j, n in row["judged"].items())


def lead_cells(row: dict[str, Any], *, recipe: bool = False) -> list[str]:
    """The cells every family's table starts a :func:`summarize` row with: the impl, its recipe (an FP8 kind's,
    where ``recipe``), the dtype mode, the output and the count of cases."""
    return [f"`{row['impl']}`", *([row["recipe"]] if recipe else []), row["mode"], row["output"], str(row["n"])]


def pass_cell(row: dict[str, Any], judgement: str, flagged: bool = False) -> str:
    """A pass-count cell of a :func:`summarize` row: how many of its outputs judged on ``judgement`` pass it, of how
    many (``passed/judged``), marked `` ❌`` where ``flagged`` and the row fails any judgement (:func:`all_judged_pass`)."""
    flag = " ❌" if flagged and not all_judged_pass(row) else ""
    return f"{row['passes'].get(judgement, 0)}/{row['judged'].get(judgement, 0)}{flag}"


def section(
    title: str, note: str, columns: tuple[str, ...], rows: list[dict[str, Any]], cells: Callable[[dict], list[str]]
) -> list[str]:
    """A family's table in report.md: the heading ``title``, the paragraph ``note`` (none where empty), a header of
    ``columns``, one line per :func:`summarize` row of ``rows`` (``cells(row)``: its cells in column order) and a
    blank line; no lines without rows."""
    if not rows:
        return []
    head = [title, "", *([note, ""] if note else []), "| " + " | ".join(columns) + " |"]
    return [
        *head,
        "| " + " | ".join("---" for _ in columns) + " |",
        *("| " + " | ".join(cells(r)) + " |" for r in rows),
        "",
    ]


def _grouped(report: dict, kind: str, mode_of: Callable[[dict], str]) -> dict[tuple, list[tuple[dict, dict]]]:
    groups: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for c in report["cases"]:
        if c["kind"] != kind:
            continue
        mode = mode_of(c)
        for name, o in c.get("outputs", {}).items():
            key = (c["impl"], c.get("recipe", ""), mode, base_output(name))
            groups[key].append((c, o))
    return groups


def summarize(
    report: dict, kind: str, order: tuple[str, ...], mode_of: Callable[[dict], str], extras: Extras
) -> list[dict[str, Any]]:
    """Rows per impl × dtype mode (``mode_of(case)``) (× recipe for FP8) × output of ``kind``'s cases: counts,
    worst/median error/bound, more (``extras``); sorted by impl (report order), recipe, mode and output (``order``)."""
    rows = []
    for (impl, recipe, mode, out), items in _grouped(report, kind, mode_of).items():
        judgements = sorted({j for _, o in items for j in o["verdicts"]})
        worst_c, worst_o = max(items, key=lambda it: it[1]["ratio_hard"])
        row = {
            "impl": impl,
            "recipe": recipe,
            "mode": mode,
            "output": out,
            "n": len(items),
            # An output not judged on j (relative, where declared less accurate) is neither a pass nor a fail of j.
            "passes": {j: sum(1 for _, o in items if o["verdicts"].get(j) is True) for j in judgements},
            "judged": {j: sum(1 for _, o in items if j in o["verdicts"]) for j in judgements},
            "worst": worst_o["ratio_hard"],
            "worst_case": worst_c["label"],
            "median": median(o["ratio_hard"] for _, o in items),
            "median_expected": median(o["ratio_expected"] for _, o in items),
            "max_ulp": max(o["max_ulp"] for _, o in items),
        }
        extras(row, items)
        rows.append(row)
    impl_rank = {i["name"]: k for k, i in enumerate(report["impls"])}
    rows.sort(
        key=lambda r: (
            impl_rank.get(r["impl"], 0),
            r["recipe"],
            r["mode"],
            order.index(r["output"]) if r["output"] in order else 99,
        )
    )
    return rows


def plain_mode(case: dict) -> str:
    """A case's dtype mode as report.json records it."""
    return case["mode"]


def fp8_extras(row: dict[str, Any], items: list[tuple[dict, dict]]) -> None:
    """The FP8 columns every quantized kind's rows carry: the median ratios against the dequantized and the
    original operands."""
    row["median_dq"] = median(o["ratio_dq"] for _, o in items)
    row["median_true"] = median(o["ratio_true"] for _, o in items)
