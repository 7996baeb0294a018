"""The verdict of a report: its exit status and the last line that says why, computed from the judgements alone
(``report["cases"]``, ``report["impls"]``, ``report["known_divergences"]``), never from how report.md shows them.

Exit 1 when a case fails or raises (any record with status ``fail`` or ``error``, whatever property it judged), an
impl is broken, or a baseline comparison found regressions; with ``strict``, also when a known divergence of a
library applied (:mod:`reports.report.findings`; an environment artifact never counts). Else 0. The line names
every known divergence that applied (library, release, what is wrong, the cases left out) apart from the passes,
and the environment artifacts as "not judged here".

>>> verdict({"impls": [], "cases": []})
(0, 'numcheck report: PASS (exit 0) — no case ran: nothing was checked here')
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

#: The statuses of a record that fail the report.
FAILING = ("fail", "error")


def impl_counts(report: dict) -> list[dict[str, Any]]:
    """One row per impl entry: ``name``, ``status``, ``reason`` and its records ``n``, ``pass``, ``fail``,
    ``error``."""
    by_impl: dict[str, Counter] = defaultdict(Counter)
    for c in report["cases"]:
        by_impl[c["impl"]][c["status"]] += 1
    rows = []
    for info in report["impls"]:
        k = by_impl.get(info["name"], Counter())
        rows.append(
            {
                "name": info["name"],
                "status": info["status"],
                "reason": info.get("reason", ""),
                "n": sum(k.values()),
                "pass": k["pass"],
                "fail": k["fail"],
                "error": k["error"],
            }
        )
    return rows


def divergences(report: dict) -> tuple[list[dict], list[dict]]:
    """The known divergences that applied (``known_divergences``, absent from a report made before it: none), split
    into the libraries' divergences and the environment artifacts (not judged here)."""
    found = report.get("known_divergences") or []
    return [d for d in found if not d.get("artifact")], [d for d in found if d.get("artifact")]


def describe(d: dict) -> str:
    """One known divergence in a line: impl, library and release, what is wrong, the cases left out."""
    n = d.get("cases_left_out", 0)
    left = f"{n} case(s) of this grid left out" if n else "in this release; no case of this grid reached it"
    return f"{d['impl']}: {d['library']} {d['release']} — {d['summary']} ({left})"


def grouped(found: list[dict]) -> list[dict]:
    """``found`` with the records of one divergence (library, release, summary) merged: their impls joined with
    ", ", their cases left out summed (one divergence of several variants of an impl is named once)."""
    merged: dict[tuple, dict] = {}
    for d in found:
        key = (d["library"], d["release"], d["summary"])
        if key in merged:
            m = merged[key]
            m["impl"] += f", {d['impl']}"
            m["cases_left_out"] = m.get("cases_left_out", 0) + d.get("cases_left_out", 0)
        else:
            merged[key] = dict(d)
    return list(merged.values())


def known_clause(report: dict) -> str:
    """The known divergences and artifacts of the last line, each divergence once (:func:`grouped`; ``""`` when
    none applied)."""
    defects, artifacts = divergences(report)
    parts = []
    if defects:
        parts.append(
            f"{len(defects)} known divergence(s) apply, not passes: " + "; ".join(map(describe, grouped(defects)))
        )
    if artifacts:
        parts.append(
            "not judged here (environment artifact, not the library's divergence): "
            + "; ".join(map(describe, grouped(artifacts)))
        )
    return "; ".join(parts)


def verdict(report: dict, regressions: int = 0, *, strict: bool = False) -> tuple[int, str]:
    """The exit status of a report (module docstring) and the last line that says why. Impls unavailable here are
    named in the line as not a failure."""
    rows = impl_counts(report)
    ran = [r for r in rows if r["status"] == "ran"]
    failing = [r for r in ran if r["fail"] or r["error"]]
    broken = [r["name"] for r in rows if r["status"] == "broken"]
    unavailable = [r["name"] for r in rows if r["status"] == "unavailable"]
    n, ok = sum(r["n"] for r in ran), sum(r["pass"] for r in ran)
    defects, _ = divergences(report)
    problems = []
    if failing:
        problems.append(
            f"{n - ok} of {n} case(s) fail or raise in {len(failing)} impl(s) ({', '.join(r['name'] for r in failing)})"
        )
    if broken:
        problems.append(f"{len(broken)} impl(s) broken — fail to load or break the protocol ({', '.join(broken)})")
    if regressions:
        problems.append(f"{regressions} regression(s) against the baseline")
    tail = (
        f"; {len(unavailable)} impl(s) unavailable here, listed above, not a failure ({', '.join(unavailable)})"
        if unavailable
        else ""
    )
    known = known_clause(report)
    known = f"; {known}" if known else ""
    if problems:
        return 1, "numcheck report: FAIL (exit 1) — " + "; ".join(problems) + known + tail
    if strict and defects:
        return 1, f"numcheck report: FAIL (exit 1, --strict) — all {n} case(s) run pass{known}{tail}"
    if not n:
        return 0, f"numcheck report: PASS (exit 0) — no case ran: nothing was checked here{known}{tail}"
    head = "PASS with known divergences (exit 0; --strict fails them)" if defects else "PASS (exit 0)"
    return 0, f"numcheck report: {head} — all {n} case(s) of {len(ran)} impl(s) pass both verdicts{known}{tail}"
