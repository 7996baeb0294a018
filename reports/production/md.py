"""The Markdown of a production-shape tier run (``production.json`` of ``numcheck production``), also included by
``numcheck report --include-production``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The name of a run's JSON and Markdown outputs (``production.json``, ``production.md``), and before numcheck 0.2.0
#: (``scale.json``: still read, with a warning, until 0.3.0).
STEM, FORMER_STEM = "production", "scale"
#: Statuses that are a verdict against the impl (``known``: a recorded known divergence; ``unavailable`` (the
#: impl's ``support.requires`` unmet here), ``unsupported`` and ``not_run`` judge nothing).
FAILING = ("fail", "error", "timeout", "crashed")


def _g(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:.{digits}g}"


def _mib(n: Any) -> str:
    return "-" if not isinstance(n, (int, float)) else f"{n / 2**20:.0f}"


def _worst(rec: dict[str, Any]) -> tuple[str, str, str]:
    """(worst error/bound with its output, worst RMSE/allowed of (b), first wrong row) of a judged record."""
    outs = rec.get("outputs") or {}
    if not outs:
        return "-", "-", "-"
    ratios = {n: o["ratio"] for n, o in outs.items()}
    name = max(ratios, key=lambda n: float(ratios[n]) if ratios[n] is not None else float("inf"))
    rel = [
        (o["relative"]["rmse"] / o["relative"]["allowed"] if o["relative"]["allowed"] else float("inf"), n)
        for n, o in outs.items()
        if o.get("relative", {}).get("judged")
        and o["relative"].get("allowed") is not None
        and isinstance(o["relative"].get("rmse"), (int, float))
    ]
    rel_s = f"{max(rel)[0]:.3g} ({max(rel)[1]})" if rel else "-"
    rows = [f"{n} {o['first_row_beyond']}" for n, o in outs.items() if "first_row_beyond" in o]
    return f"{_g(ratios[name])} ({name})", rel_s, ", ".join(rows) or "-"


def _verdict(rec: dict[str, Any]) -> str:
    """A record's verdict in words: its status, with its reason (a known divergence's recorded reason)."""
    if rec["status"] == "known":
        return f"known divergence: {rec.get('known_divergence', '?')}"
    return rec["status"] + (f": {rec['reason']}" if rec.get("reason") and rec["status"] != "fail" else "")


def render(data: dict[str, Any], heading: str = "#") -> str:
    """The tier's Markdown: one table per case (verdict, worst ratios, first wrong row, times, extra peak), the
    failure texts, and the run's totals."""
    meta = data.get("meta", {})
    lines = [
        f"{heading} Production-shape tier (`numcheck production`)",
        "",
        f"Device {meta.get('device', '?')}, torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}; "
        f"shapes `{meta.get('shapes', '?')}`, precisions {', '.join(meta.get('precisions', []))}; "
        f"wall {_g(meta.get('wall_s'))} s. Each impl is judged by the property suite's accuracy property "
        "(judgements (a) and (b), the bounds of properties/linear_ce/tolerance.py) against the chunked float64 oracle; "
        "times in seconds (bound: time spent on bounds while judging this impl; the impl whose bounds were "
        "missing carries the shared sweep of every planned declaration that fit beside them, the others "
        "only their finishing), extra peak = torch.cuda.max_memory_allocated over forward + backward "
        "less what was allocated before.",
        "",
    ]
    records = data.get("records", [])
    cases = data.get("cases", {})
    for label in dict.fromkeys(r["case"] for r in records):
        c = cases.get(label, {})
        lines += [
            f"{heading}# {label}: {c.get('note', '')}",
            "",
            f"{c.get('problem', '')}; inputs {_g(c.get('inputs_s'))} s, oracle {_g(c.get('oracle_s'))} s, "
            f"eager {_g(c.get('eager_s'))} s"
            + (
                f"; first row with (row+1)·V > 2^31: {c['int32_first_row']}"
                if c.get("int32_first_row") is not None
                else ""
            ),
            "",
            "| impl | verdict | worst error/bound (a) | worst RMSE/allowed (b) | first wrong row | impl s | "
            "bound s | extra peak MiB |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in (r for r in records if r["case"] == label):
            a, b, row = _worst(r)
            verdict = _verdict(r)
            lines.append(
                f"| `{r['impl']}` | {verdict.replace('|', '/')} | {a} | {b} | {row} | {_g(r.get('impl_s'))} | "
                f"{_g(r.get('bound_s'))} | {_mib(r.get('extra_peak_bytes'))} |"
            )
        lines.append("")
    failing = [r for r in records if r.get("failure")]
    if failing:
        lines += [f"{heading}# Failures", ""]
        for r in failing:
            lines += [f"`{r['impl']}` on {r['case']}: {_verdict(r)}", "", "```", r["failure"], "```", ""]
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("Totals: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no record") + ".")
    return "\n".join(lines) + "\n"


def load(path: Path) -> dict[str, Any]:
    """A ``production.json``, or ValueError naming the file and what is wrong with it. A run's ``scale.json`` (its
    name before 0.2.0) is read the same, with a :class:`~numcheck.errors.RenamedWarning` once per process."""
    if Path(path).name == f"{FORMER_STEM}.json":
        from numcheck.errors import warn_renamed

        warn_renamed("numcheck production output", f"{FORMER_STEM}.json", f"{STEM}.json")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable production.json ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list) or "meta" not in data:
        raise ValueError(f"{path}: not a production.json of numcheck production (needs 'meta' and a 'records' list)")
    for i, r in enumerate(data["records"]):
        if not isinstance(r, dict) or not {"case", "impl", "status"} <= set(r):
            raise ValueError(f"{path}: record {i} lacks case, impl or status")
    return data
