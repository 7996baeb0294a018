"""``numcheck versions``: the verdicts of reports made under different torch releases, side by side.

Reads ``report.json`` files (default: the baselines shipped with numcheck, :func:`reports.baselines.shipped_baselines`
— the committed ``reports/*/report.json``, read as package data; never a report a user wrote), groups them
by device (a CPU report is never compared with a GPU one) and, per device, lines the torch releases up oldest
first:

* **capabilities** — every probe whose answer differs between the releases (what a release can and cannot do);
* **impls** — per impl, per release: ``ran`` with passed/run counts, or why it did not run;
* **verdict differences** — every case run under two or more releases whose verdicts differ (a case that
  passes under one torch and fails under another is a version-dependent bug, in the impl or in the suite);
* **coverage** — how many cases each release ran that another did not (impls unavailable there, or grid
  cases outside a declaration that depends on a capability).

Cases are matched by impl name and the case's ``repr``. ``--check`` exits 1 when any verdict differs.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numcheck.reports.baselines import shipped_baselines
from numcheck.reports.report.schema import READS, REPO, SCHEMA, load

HELP = (
    "compare the verdicts of reports made under different torch releases (default: the baselines shipped with "
    "numcheck), per device: capabilities, impl status, cases whose verdicts differ"
)


def release_key(torch_version: str) -> tuple[int, ...]:
    """``"2.6.0+cu124"`` → ``(2, 6, 0)``, for ordering releases; unparsable parts sort first."""
    if not isinstance(torch_version, str) or not torch_version:
        raise ValueError(f"torch_version must be a non-empty string, got {torch_version!r}")
    parts = []
    for p in torch_version.split("+", 1)[0].split("."):
        m = re.match(r"\d+", p)
        parts.append(int(m.group()) if m else -1)
    return tuple(parts)


def committed_reports() -> list[Path]:
    """The baselines shipped with this numcheck (package data; in a checkout, ``reports/*/report.json``)."""
    return [Path(str(t)) for t in shipped_baselines()]


@dataclass
class Release:
    """One report: where it came from, its torch release and what it holds."""

    path: Path
    torch: str
    report: dict[str, Any]

    @property
    def label(self) -> str:
        return f"torch {self.torch.split('+', 1)[0]}"


@dataclass
class DeviceComparison:
    """The comparison of one device's reports, releases oldest first."""

    device: str
    releases: list[Release]
    capabilities: dict[str, list[bool | None]] = field(default_factory=dict)  # differing probes only
    impls: dict[str, list[str]] = field(default_factory=dict)  # impl -> one cell per release
    verdict_diffs: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (impl, case label, cells)
    only_in: list[int] = field(default_factory=list)  # cases each release ran that some other did not

    @property
    def differing(self) -> int:
        return len(self.verdict_diffs)


def _device(report: dict) -> str:
    env = report.get("environment", {})
    return f"{env.get('device', '?')} ({env.get('device_name', '?')})"


def _case_cell(case: dict | None) -> str:
    if case is None:
        return "—"
    if case.get("status") == "error":
        return "error: " + str(case.get("error", ""))[:80]
    verdicts = case.get("verdicts") or {}
    failed = [k for k, v in verdicts.items() if v is False]
    ratio = case.get("ratio_hard")
    ratio_s = f", error/bound {ratio:.3g}" if isinstance(ratio, (int, float)) else ""
    return (f"fail ({', '.join(failed)})" if failed else "pass") + ratio_s


def _outcome(case: dict) -> tuple:
    """What must agree across releases: the status and the verdict of every judgement made."""
    return (case.get("status"), tuple(sorted((k, bool(v)) for k, v in (case.get("verdicts") or {}).items())))


def compare(releases: list[Release]) -> DeviceComparison:
    """Compare the reports of one device (at least one), oldest release first."""
    if not releases:
        raise ValueError("releases must hold at least one report")
    rels = sorted(releases, key=lambda r: release_key(r.torch))
    cmp = DeviceComparison(device=_device(rels[0].report), releases=rels)
    caps = [r.report.get("environment", {}).get("capabilities", {}) or {} for r in rels]
    for probe in sorted(set().union(*caps)):
        vals = [c.get(probe) for c in caps]
        if len(set(vals)) > 1:
            cmp.capabilities[probe] = vals
    names: list[str] = []
    for r in rels:
        names += [i["name"] for i in r.report.get("impls", []) if i["name"] not in names]
    for name in names:
        cells = []
        for r in rels:
            info = next((i for i in r.report.get("impls", []) if i["name"] == name), None)
            if info is None:
                cells.append("not registered")
            elif info.get("status") != "ran":
                cells.append(f"{info.get('status')}: {info.get('reason', '')}")
            else:
                cases = [c for c in r.report.get("cases", []) if c.get("impl") == name]
                ok = sum(1 for c in cases if c.get("status") == "pass")
                cells.append(f"ran: {ok}/{len(cases)} pass")
        cmp.impls[name] = cells
    by_release = [
        {(c.get("impl"), c.get("case"), c.get("property", "accuracy")): c for c in r.report.get("cases", [])}
        for r in rels
    ]
    keys: list[tuple] = []
    seen: set[tuple] = set()
    for cases in by_release:
        for k in cases:
            if k not in seen:
                seen.add(k)
                keys.append(k)
    for k in keys:
        present = [cases.get(k) for cases in by_release]
        ran = [c for c in present if c is not None]
        if len(ran) >= 2 and len({_outcome(c) for c in ran}) > 1:
            label = next(c.get("label") or c.get("case") for c in ran)
            label = label if k[2] == "accuracy" else f"{k[2]}: {label}"
            cmp.verdict_diffs.append((str(k[0]), str(label), [_case_cell(c) for c in present]))
    cmp.only_in = [sum(1 for k in cases if any(k not in other for other in by_release)) for cases in by_release]
    return cmp


def compare_paths(paths: list[Path]) -> list[DeviceComparison]:
    """Load ``paths`` and compare them per device (devices in first-seen order)."""
    groups: dict[str, list[Release]] = {}
    for p in paths:
        report = load(p)
        if str(report.get("schema")).rsplit("/", 1)[-1] not in READS:
            raise ValueError(f"{p}: schema {report.get('schema')!r}, expected {SCHEMA!r} (or numcheck-report/1)")
        torch_v = report.get("environment", {}).get("torch")
        if not torch_v:
            raise ValueError(f"{p}: environment.torch is missing: the report does not say which torch made it")
        groups.setdefault(_device(report), []).append(Release(path=p, torch=torch_v, report=report))
    return [compare(rs) for rs in groups.values()]


def _shown(path: Path, root: Path) -> str:
    """A report's path as the Markdown shows it: relative to ``root`` (the checkout, or the installed package's
    folder, where baselines are ``reports/<dir>/report.json``), else as given."""
    for base in (root / "numcheck", root):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    resolved = path.resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _environment_rows(cmp: DeviceComparison, root: Path) -> list[str]:
    """The rows saying what made each release's report (file, torch, triton, liger-kernel, grid, commit), and a
    warning when the commits differ."""
    out: list[str] = []
    env_rows = [
        ("report", [_shown(r.path, root) for r in cmp.releases]),
        ("torch", [r.torch for r in cmp.releases]),
        ("triton", [str(r.report["environment"].get("triton")) for r in cmp.releases]),
        ("liger-kernel", [str(r.report["environment"].get("liger_kernel")) for r in cmp.releases]),
        ("grid", [str(r.report.get("grid", {}).get("name")) for r in cmp.releases]),
        ("git commit", [str(r.report["environment"].get("git_commit", ""))[:10] for r in cmp.releases]),
    ]
    for name, cells in env_rows:
        out.append(_row([name, *cells]))
    commits = {r.report["environment"].get("git_commit") for r in cmp.releases}
    if len(commits) > 1:
        out += [
            "",
            "The reports were made from different commits: a difference below may come from the code as "
            "well as from the torch release (regenerate them from one commit to separate the two).",
        ]
    return out


def _differences(cmp: DeviceComparison, heads: list[str]) -> list[str]:
    """What differs between the releases on one device: capabilities, impls available, verdicts, cases run."""
    out = ["", "### Capabilities that differ", ""]
    if cmp.capabilities:
        out += [_row(["probe", *heads]), _row(["---"] * (len(heads) + 1))]
        for probe, vals in cmp.capabilities.items():
            out.append(_row([f"`{probe}`", *["—" if v is None else ("yes" if v else "no") for v in vals]]))
    else:
        out.append("None: every probe answers the same under every release.")
    out += ["", "### Impls", "", _row(["impl", *heads]), _row(["---"] * (len(heads) + 1))]
    for name, cells in cmp.impls.items():
        out.append(_row([f"`{name}`", *cells]))
    out += ["", "### Cases whose verdicts differ", ""]
    if cmp.verdict_diffs:
        out += [_row(["impl", "case", *heads]), _row(["---"] * (len(heads) + 2))]
        for impl, label, cells in cmp.verdict_diffs:
            out.append(_row([f"`{impl}`", f"`{label}`", *cells]))
    else:
        ran_both = len(cmp.releases) > 1
        out.append(
            "None: every case run under more than one release got the same verdicts under each."
            if ran_both
            else "Only one release reported on this device: nothing to compare."
        )
    if len(cmp.releases) > 1:
        out += [
            "",
            "Cases run under one release but not all: "
            + ", ".join(f"{h}: {n}" for h, n in zip(heads, cmp.only_in))
            + " (impls unavailable under a release, or cases outside a capability-dependent declaration).",
        ]
    return out


def to_markdown(comparisons: list[DeviceComparison], *, root: Path = REPO) -> str:
    """The comparison as Markdown: one section per device."""
    out = [
        "# numcheck verdicts across torch releases",
        "",
        "Generated by `numcheck versions` from the committed (shipped) `report.json` files; each report records the "
        "torch that made it. Cases are matched by impl and case.",
        "",
    ]
    for cmp in comparisons:
        heads = [r.label for r in cmp.releases]
        out += [f"## {cmp.device}", ""]
        out += [_row(["", *heads]), _row(["---"] * (len(heads) + 1))]
        out += _environment_rows(cmp, root)
        out += _differences(cmp, heads)
        out.append("")
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "reports",
        nargs="*",
        type=Path,
        metavar="REPORT.json",
        help="reports to compare (default: the baselines shipped with numcheck)",
    )
    p.add_argument("--out", type=Path, metavar="FILE.md", help="also write the Markdown here")
    p.add_argument("--check", action="store_true", help="exit 1 when any case's verdicts differ between releases")


def run(args: argparse.Namespace) -> int:
    paths = list(args.reports) or committed_reports()
    if not paths:
        print("numcheck versions: no report.json given and no baseline shipped with this numcheck", file=sys.stderr)
        return 2
    try:
        for p in paths:
            if not Path(p).is_file():
                raise ValueError(f"report {p} does not exist")
        comparisons = compare_paths([Path(p).resolve() if args.reports else Path(p) for p in paths])
    except ValueError as exc:
        print(f"numcheck versions: {exc}", file=sys.stderr)
        return 2
    md = to_markdown(comparisons)
    print(md)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
    differing = sum(c.differing for c in comparisons)
    return 1 if args.check and differing else 0
