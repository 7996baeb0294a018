"""report.json's ``known_divergences``: every recorded known divergence (and environment artifact) that applied to
an impl the report judged — :func:`numcheck.properties.distributed.linear_ce.known.applicable` on the report's device and the
installed releases — with the grid cases it left out. The verdict (:mod:`reports.report.verdict`), report.md,
premerge's checklist and the pytest plugin's summary all read these records; a divergence is a finding, never a pass.

Each record (JSON-ready)::

    {"impl", "library", "release", "summary" (one line), "artifact" (bool: "not judged here", never the library's
     divergence), "outputs" (["*"]: every output), "reason" (the evidence), "cases_left_out" (int),
     "cases": ["group (mode, case label)", ...]}
"""

from __future__ import annotations

from typing import Any

#: How the report run names a case a known divergence left out (reports/report/run.py and grid.py prefix the
#: entry's reason with it).
LEFT_OUT = "known divergence: "


def _left_out(info: dict[str, Any], entry: Any) -> list[dict[str, str]]:
    """The not-run cases of impl entry ``info`` that ``entry`` left out: named with its reason, or, for an
    environment artifact, the cases of the dtype the adapter left out of the declaration here because of it."""
    named = info.get("not_run") or []
    if entry.artifact:
        return [c for c in named if c["reason"].startswith(f"dtype torch.{entry.example.dtype} not declared")]
    return [c for c in named if c["reason"] == LEFT_OUT + entry.reason]


def known_divergences(impls: list[dict[str, Any]], supports: dict[str, Any], device: str) -> list[dict[str, Any]]:
    """The ``known_divergences`` records of the impls that ran (module docstring); ``supports``: each impl's
    declaration by name (an entry reaching nothing the impl declares here does not apply)."""
    from numcheck.properties.distributed.linear_ce.known import applicable
    from numcheck.properties.fp8.grouped.known_torchao import GROUPED_TORCHAO_KNOWN
    from numcheck.properties.fp8.known_torchao import TORCHAO_KNOWN

    out = []
    for info in impls:
        if info.get("status") != "ran":
            continue
        name, support = info["name"], supports.get(info["name"])
        fp8 = [k for k in (*TORCHAO_KNOWN, *GROUPED_TORCHAO_KNOWN) if k.applies_here(name, device, support)]
        for entry in (*applicable(name, device, support), *fp8):
            cases = _left_out(info, entry)
            out.append(
                {
                    **entry.finding(info["name"]),
                    "cases_left_out": len(cases),
                    "cases": [f"{c['group']} ({c['mode']}, {c['case']})" for c in cases],
                }
            )
    return out


def libraries(impls: list[dict[str, Any]]) -> None:
    """Give each impl entry that is numcheck's adapter of a third-party library ``library`` = ``{"name",
    "release"}`` (the release judged; ``"unknown"`` when it cannot be read)."""
    from numcheck.properties.libraries import adapter_library

    for info in impls:
        found = adapter_library(info["name"]) if info.get("status") != "broken" else None
        if found is not None:
            info["library"] = {"name": found[0], "release": found[1] or "unknown"}


def release_notes() -> dict[str, str]:
    """Library → note for a release that could not be told (ambiguous or unknown), shown in the report header: the
    adapters' own reading (:func:`numcheck.impls.adapters.release_notes.release_notes`); empty in the usual case."""
    from numcheck.impls.adapters.release_notes import release_notes as adapter_notes

    return adapter_notes()
