"""``--compare``: what changed between a baseline report and a new one, and which changes are regressions.

A change is a **regression** when, for an impl present and run in both reports, on the same case and property (a
``numcheck-report/1`` report's records all judge accuracy):

* a verdict flipped from pass to fail (either judgement, or the case now raises), or
* an output's error/bound (hard) grew by more than ``factor`` *and* now exceeds ``floor``;

or when an impl that ran in the baseline now fails to load. The floor (default 0.25: a quarter of the error
budget) is there because far below the bound the ratio of a correct impl can move with summation order
(another BLAS, another CPU: a bf16 output's worst element rounding the other way) by 2× or more, so such
growth is noise; above it, growth is a kernel eating its budget. For scale: switching a chunked impl's
grad_weight accumulator from fp32 to bf16 over 50 chunks took grad_weight from 0.09 to 0.40 of its bound
(``tests/test_report.py``). Improvements (fail → pass) and coverage differences (impls or cases in one report only, impls
unavailable now) are listed as notes, never silently dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_FACTOR = 2.0
DEFAULT_FLOOR = 0.25


@dataclass(frozen=True)
class Finding:
    """One listed difference. ``kind``: ``regression``, ``improvement`` or ``note``."""

    kind: str
    impl: str
    case: str
    output: str
    message: str
    base_ratio: float = math.nan
    new_ratio: float = math.nan


@dataclass
class ReportDiff:
    """Every finding of one comparison, with the thresholds used."""

    factor: float
    floor: float
    base_label: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "regression"]

    def of(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]


def _fmt(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def compare_reports(
    base: dict, new: dict, *, factor: float = DEFAULT_FACTOR, floor: float = DEFAULT_FLOOR, base_label: str = "baseline"
) -> ReportDiff:
    """Compare two loaded reports (:func:`reports.report.schema.load`); see the module docstring."""
    if not (factor >= 1.0):
        raise ValueError(f"factor must be >= 1, got {factor!r}")
    if not (floor >= 0.0):
        raise ValueError(f"floor must be >= 0, got {floor!r}")
    diff = ReportDiff(factor, floor, base_label)
    add = diff.findings.append
    b_impls = {i["name"]: i for i in base["impls"]}
    n_impls = {i["name"]: i for i in new["impls"]}
    both = []
    for name, bi in b_impls.items():
        ni = n_impls.get(name)
        if ni is None:
            add(Finding("note", name, "", "", "impl in the baseline only (not loaded in this run)"))
        elif bi["status"] == "ran" and ni["status"] == "broken":
            add(Finding("regression", name, "", "", f"impl ran in the baseline but now fails to load: {ni['reason']}"))
        elif bi["status"] == "ran" and ni["status"] != "ran":
            add(Finding("note", name, "", "", f"impl ran in the baseline but is {ni['status']} here: {ni['reason']}"))
        elif bi["status"] != "ran" and ni["status"] == "ran":
            add(
                Finding(
                    "note",
                    name,
                    "",
                    "",
                    f"impl was {bi['status']} in the baseline ({bi['reason']}); no cases to compare",
                )
            )
        elif ni["status"] == "ran":
            both.append(name)
    for name in n_impls:
        if name not in b_impls:
            add(Finding("note", name, "", "", "impl has no baseline (new)"))
    b_cases = {_key(c): c for c in base["cases"] if c["impl"] in both}
    n_cases = {_key(c): c for c in new["cases"] if c["impl"] in both}
    missing = [k for k in b_cases if k not in n_cases]
    extra = [k for k in n_cases if k not in b_cases]
    for impl in both:
        m = sum(1 for k in missing if k[0] == impl)
        e = sum(1 for k in extra if k[0] == impl)
        if m:
            add(Finding("note", impl, "", "", f"{m} baseline case(s) not in this run (different grid or declaration)"))
        if e:
            add(Finding("note", impl, "", "", f"{e} case(s) of this run have no baseline"))
    for key, bc in b_cases.items():
        nc = n_cases.get(key)
        if nc is None:
            continue
        _compare_case(bc, nc, diff)
    return diff


def _key(rec: dict) -> tuple[str, str, str]:
    """What a record is matched on: impl, property (``accuracy`` for a ``/1`` report's records) and case."""
    return rec["impl"], rec.get("property", "accuracy"), rec["case"]


def _label(rec: dict) -> str:
    """A record's case label in a finding, prefixed by its property where that is not accuracy."""
    prop = rec.get("property", "accuracy")
    return rec["label"] if prop == "accuracy" else f"{prop}: {rec['label']}"


def _newly_failing(bc: dict, nc: dict, diff: ReportDiff) -> bool:
    """Records a case that passed or ran in the baseline and now raises or fails a judgement (a regression);
    whether it did, so nothing more is said of that case."""
    impl, label = nc["impl"], _label(nc)
    flipped = [j for j, ok in bc.get("verdicts", {}).items() if ok and not nc.get("verdicts", {}).get(j, False)]
    if nc["status"] == "error" and bc["status"] != "error":
        diff.findings.append(
            Finding(
                "regression",
                impl,
                label,
                "",
                f"now raises: {nc.get('error', '')}" + (f" — reproduce: {nc['repro']}" if nc.get("repro") else ""),
            )
        )
        return True
    if flipped:
        worst = max(nc.get("outputs", {}).items(), key=lambda kv: kv[1].get("ratio_hard", 0.0), default=(None, {}))
        diff.findings.append(
            Finding(
                "regression",
                impl,
                label,
                worst[0] or "",
                f"verdict flipped pass → fail ({', '.join(flipped)})"
                + (f" — reproduce: {nc['repro']}" if nc.get("repro") else ""),
                bc.get("ratio_hard", math.nan),
                nc.get("ratio_hard", math.nan),
            )
        )
        return True
    return False


def _ratio_growth(bc: dict, nc: dict, diff: ReportDiff) -> None:
    """Records each output whose error/bound grew past the floor by more than the factor (a regression), and each
    output the new report lacks (a note)."""
    impl, label = nc["impl"], _label(nc)
    for out, bo in bc.get("outputs", {}).items():
        no = nc.get("outputs", {}).get(out)
        if no is None:
            diff.findings.append(Finding("note", impl, label, out, "output present in the baseline only"))
            continue
        b, n = bo.get("ratio_hard", 0.0), no.get("ratio_hard", 0.0)
        if n > diff.floor and n > diff.factor * b:
            growth = n / b if b > 0 else math.inf
            diff.findings.append(
                Finding(
                    "regression",
                    impl,
                    label,
                    out,
                    f"error/bound grew ×{growth:.3g} (> ×{diff.factor:g}) to {n:.3g} (> floor {diff.floor:g})"
                    + (f" — reproduce: {nc['repro']}" if nc.get("repro") else ""),
                    b,
                    n,
                )
            )


def _compare_case(bc: dict, nc: dict, diff: ReportDiff) -> None:
    """The findings of one case present in both reports (baseline ``bc``, new ``nc``) into ``diff``."""
    if _newly_failing(bc, nc, diff):
        return
    impl, label = nc["impl"], _label(nc)
    if bc["status"] != "pass" and nc["status"] == "pass":
        diff.findings.append(
            Finding(
                "improvement",
                impl,
                label,
                "",
                "verdict flipped fail → pass",
                bc.get("ratio_hard", math.nan),
                nc.get("ratio_hard", math.nan),
            )
        )
    _ratio_growth(bc, nc, diff)


def to_markdown(diff: ReportDiff) -> str:
    """The comparison as a Markdown section."""
    regs, imps, notes = diff.of("regression"), diff.of("improvement"), diff.of("note")
    lines = [
        f"## Comparison with {diff.base_label}",
        "",
        f"Regression: a verdict flipped pass → fail, or an output's error/bound grew more than ×{diff.factor:g} "
        f"and now exceeds {diff.floor:g}. **{len(regs)} regression(s)**, {len(imps)} improvement(s), "
        f"{len(notes)} note(s).",
        "",
    ]
    if regs or imps:
        lines += [
            "| | impl | case | output | baseline error/bound | now | what |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for f in regs + imps:
            mark = "❌" if f.kind == "regression" else "✅"
            lines.append(
                f"| {mark} | `{f.impl}` | `{f.case}` | {f.output or '—'} | {_fmt(f.base_ratio)} | "
                f"{_fmt(f.new_ratio)} | {f.message.replace('|', '/')} |"
            )
        lines.append("")
    if notes:
        lines += (
            ["Notes:", ""]
            + [
                f"- `{f.impl}`{(' ' + f.case) if f.case else ''}{(' ' + f.output) if f.output else ''}: {f.message}"
                for f in notes
            ]
            + [""]
        )
    return "\n".join(lines)
