"""``numcheck premerge``: the checklist a contributor pastes into a pull request.

Checks, each ✅ or ❌ with its key figure:

1. **impls load** — every selected impl (default all; ``--impl`` restricts, outside ``module:attr`` specs
   included) loads and follows its protocol.
2. **capability probes** — :func:`impls.capabilities.summary` on the device (informative: ❌ only if the
   probes themselves cannot run).
3. **property suite** — the ci hypothesis profile of the impl-parametrized tests (``tests/suite/test_properties.py``,
   ``tests/suite/test_fp8_impls.py``, ``tests/suite/test_protocol_conformance.py``) in a pytest subprocess with the same
   ``--impl`` flags; failures are listed with the repro command their message carries.
4. **quick report** — the report grid (``--grid``, default quick) for the selected impls: every case passes both
   verdicts.
5. **vs baseline** — that report compared with the committed baseline for this device
   (``reports/<device>-torch<version>/report.json``) when there is one (:mod:`reports.report_compare`).
6. **memory** — the memory table at the seed's shapes on ``meta`` (informative: ❌ only if the measurement
   itself breaks; an impl that cannot run on ``meta`` is listed with its reason).

It prints a Markdown checklist (environment first) and exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numcheck.reports import report_compare, report_schema
from numcheck.reports.report_grid import GRIDS
from numcheck.reports.report_schema import REPO

HELP = ("pre-merge checklist for a pull request: property suite (ci profile), quick report vs the committed "
        "baseline, memory table, capability probes; Markdown on stdout, exit 1 if any check fails")

#: The impl-parametrized test modules the property-suite check runs.
PROPERTY_TESTS = ("numcheck/tests/suite/test_properties.py", "numcheck/tests/suite/test_fp8_impls.py",
                  "numcheck/tests/suite/test_protocol_conformance.py")


@dataclass
class Check:
    """One checklist line: ``ok``, a title, its key figure, and details (failures with repro commands)."""

    title: str
    ok: bool
    figure: str
    details: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"- [{'x' if self.ok else ' '}] {'✅' if self.ok else '❌'} **{self.title}** — {self.figure}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", action="append", default=[], metavar="SPEC",
                   help="only these impls: a built-in name or package.module:attr (repeatable; default: all)")
    p.add_argument("--device", default="cpu", help="device (default cpu)")
    p.add_argument("--grid", choices=sorted(GRIDS), default="quick", help="report grid (default quick)")
    p.add_argument("--baseline", type=Path, metavar="BASE.json",
                   help="baseline report (default: the committed one for this device, if any)")
    p.add_argument("--factor", type=float, default=report_compare.DEFAULT_FACTOR, help="--compare factor (see numcheck report)")
    p.add_argument("--floor", type=float, default=report_compare.DEFAULT_FLOOR, help="--compare floor (see numcheck report)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="pytest-xdist workers for the property suite (default 1)")
    p.add_argument("--out", type=Path, metavar="DIR", help="also write the report (report.json, report.md) here")
    p.add_argument("--skip-tests", action="store_true", help="leave out the property suite (the checklist says so)")


# -- checks -----------------------------------------------------------------------------------------------
def check_impls(entries: list[Any]) -> Check:
    from numcheck.impls.registry import BrokenImpl

    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    good = [e for e in entries if not isinstance(e, BrokenImpl)]
    unavailable = [(e.name, e.impl.support.unavailable_reason()) for e in good if e.impl.support.unavailable_reason()]
    details = [f"`{e.name}` ({e.origin}): {e.error}" for e in broken]
    details += [f"`{n}` cannot run here: {r}" for n, r in unavailable]
    kinds = {}
    for e in good:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    figure = (f"{len(good)} loaded ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items())) or 'none'}), "
              f"{len(broken)} broken, {len(unavailable)} unavailable here")
    return Check("impls load", not broken and bool(good), figure if good else figure + " — nothing to check", details)


def check_probes(device: str) -> Check:
    from numcheck.impls import capabilities

    try:
        caps = capabilities.summary(device)
    except Exception as exc:  # noqa: BLE001 - the probe machinery itself broke
        return Check("capability probes", False, f"probes raised {type(exc).__name__}: {exc}")
    yes = [k for k, v in caps.items() if v]
    no = [k for k, v in caps.items() if not v]
    return Check("capability probes", True, f"{len(yes)}/{len(caps)} available on {device}",
                 [f"yes: {', '.join(yes) or '—'}", f"no: {', '.join(no) or '—'}"])


_REPRO = re.compile(r"reproduce: (.+)")


def _junit_failures(path: Path) -> tuple[dict[str, int], list[str]]:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    details: list[str] = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
            kind = "errors"
        else:
            kind = "failed"
        if bad is not None:
            counts[kind] += 1
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            repro = _REPRO.search(text)
            head = (bad.get("message") or "").strip().splitlines()
            summary = head[0][:300] if head else ""
            details.append(f"`{name}`: {summary}" + (f"\n  - reproduce: `{repro.group(1).strip()}`" if repro else ""))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, details


def check_property_suite(specs: list[str], jobs: int) -> Check:
    tests = [t for t in PROPERTY_TESTS if (REPO / t).exists()]
    if not tests:
        return Check("property suite (ci profile)", False, f"the test modules {PROPERTY_TESTS} are not in {REPO} "
                     "(run premerge from a checkout of numcheck)")
    with tempfile.TemporaryDirectory(prefix="numcheck-premerge-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
               "-o", "junit_logging=no"]
        for s in specs:
            cmd += ["--impl", s]
        if jobs > 1:
            cmd += ["-n", str(jobs)]
        env = dict(os.environ, NUMCHECK_HYPOTHESIS_PROFILE="ci")
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        secs = time.monotonic() - t0
        if not junit.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            return Check("property suite (ci profile)", False, f"pytest exited {proc.returncode} without results",
                         [f"`{' '.join(cmd)}`"] + [f"    {t}" for t in tail])
        counts, details = _junit_failures(junit)
    ok = proc.returncode in (0, 5) and counts["failed"] == counts["errors"] == 0 and counts["passed"] > 0
    figure = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
              f"{counts['skipped']} skipped in {secs:.0f} s")
    if counts["passed"] == 0 and not details:
        figure += " — no test ran for these impls"
    return Check("property suite (ci profile)", ok, figure, details)


def check_report(report: dict, grid: str) -> Check:
    from numcheck.reports.report_md import failures, impl_overview

    rows = [r for r in impl_overview(report) if r["status"] == "ran"]
    n = sum(r["n"] for r in rows)
    passed = sum(r["pass"] for r in rows)
    worst = max(rows, key=lambda r: r["worst_ratio"] if not math.isnan(r["worst_ratio"]) else -1, default=None)
    figure = f"{passed}/{n} cases pass both verdicts ({grid} grid, {report['grid']['seconds']:.0f} s)"
    if worst is not None and worst["n"]:
        figure += f"; worst error/bound {worst['worst_ratio']:.3g} ({worst['name']}, {worst['worst_output']})"
    details = []
    for c in failures(report):
        detail = c.get("error") or "; ".join(c.get("failures", [])[:1])
        details.append(f"`{c['impl']}` on `{c['label']}`: {detail[:300]}" + (f"\n  - reproduce: `{c['repro']}`" if c.get("repro") else ""))
    not_run = [f"`{i['name']}`: {i['status']} — {i['reason']}" for i in report["impls"] if i["status"] != "ran"]
    return Check("report", passed == n and n > 0, figure if n else figure + " — no case ran", details + not_run)


def check_baseline(report: dict, baseline: Path | None, factor: float, floor: float, *, restricted: bool = False) -> Check:
    """The report against the baseline; ``restricted`` (``--impl`` given) compares only the impls of this run."""
    if baseline is None:
        return Check("vs committed baseline", True, "no committed baseline for this device — nothing to compare")
    try:
        base = report_schema.load(baseline)
        if restricted:
            names = {i["name"] for i in report["impls"]}
            base = dict(base, impls=[i for i in base["impls"] if i["name"] in names],
                        cases=[c for c in base["cases"] if c["impl"] in names])
        diff = report_compare.compare_reports(base, report, factor=factor, floor=floor, base_label=str(baseline))
    except ValueError as exc:
        return Check("vs committed baseline", False, str(exc))
    regs = diff.regressions
    rel = os.path.relpath(baseline, REPO) if baseline.is_absolute() else str(baseline)
    figure = (f"{len(regs)} regression(s) against {rel} (factor {factor:g}, floor {floor:g}); "
              f"{len(diff.of('improvement'))} improvement(s), {len(diff.of('note'))} note(s)")
    details = [f"`{f.impl}` `{f.case}` {f.output}: {f.message}" for f in regs]
    details += [f"note: `{f.impl}`: {f.message}" for f in diff.of("note")][:10]
    return Check("vs committed baseline", not regs, figure, details)


def check_memory(report: dict) -> Check:
    mem = report.get("memory")
    if mem is None:
        return Check("memory", True, "no linear+CE impl ran, nothing to measure")
    if mem.get("error"):
        return Check("memory", False, f"the measurement failed: {mem['error']}")
    from numcheck.properties.memory import MiB

    N, H, V = mem["impl_shape"]
    measured = [r for r in mem["impls"] if not r.get("error")]
    figure = f"N={N}, H={H}, V={V} {mem['dtype']} on meta: " + "; ".join(
        f"{r['name']} held {r['held'] / MiB:.0f} MiB, peak {r['total_peak'] / MiB:.0f} MiB" for r in measured[:4])
    if len(measured) > 4:
        figure += f"; … ({len(measured)} impls)"
    details = [f"`{r['name']}` cannot run on meta: {r['error']}" for r in mem["impls"] if r.get("error")]
    return Check("memory", True, figure, details)


# -- output -----------------------------------------------------------------------------------------------
def render(env: dict, specs: list[str], checks: list[Check]) -> str:
    """The Markdown checklist."""
    ok = all(c.ok for c in checks)
    lines = ["## numcheck pre-merge checklist", "",
             f"**Result: {'✅ all checks pass' if ok else '❌ ' + str(sum(not c.ok for c in checks)) + ' check(s) fail'}**", "",
             f"- Hardware: {env['device_name']} ({env['device']})",
             f"- torch {env['torch']}, triton {env.get('triton') or '—'}, Python {env['python']}, numcheck "
             f"{env.get('numcheck') or '—'} @ {(env.get('git_commit') or '—')[:12]}"
             + (" (uncommitted changes)" if env.get("git_dirty") else ""),
             f"- Impls: {', '.join(f'`{s}`' for s in specs) if specs else 'all registered'}", ""]
    for c in checks:
        lines.append(c.line())
        for d in c.details:
            first, *rest = d.split("\n")
            lines.append(f"  - {first}")
            lines += [f"  {r}" for r in rest]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from numcheck.impls.registry import discover
    from numcheck.reports.report import build_report, default_out_dir, committed_baseline, write_report

    t0 = time.monotonic()
    specs = list(args.impl)
    entries = discover(specs)
    env = report_schema.environment(args.device)
    checks = [check_impls(entries), check_probes(args.device)]
    if args.skip_tests:
        checks.append(Check("property suite (ci profile)", False, "skipped (--skip-tests): run it before asking for review"))
    else:
        print("numcheck premerge: running the property suite (ci profile)…", file=sys.stderr)
        checks.append(check_property_suite(specs, args.jobs))
    print(f"numcheck premerge: running the {args.grid} report…", file=sys.stderr)
    report = build_report(GRIDS[args.grid], specs, args.device, progress=True)
    checks.append(check_report(report, args.grid))
    baseline = args.baseline if args.baseline is not None else committed_baseline(default_out_dir(args.device))
    checks.append(check_baseline(report, baseline, args.factor, args.floor, restricted=bool(specs)))
    checks.append(check_memory(report))
    if args.out is not None:
        if committed_baseline(args.out) is not None:
            print(f"numcheck premerge: --out {args.out} holds a committed baseline; not writing there", file=sys.stderr)
        else:
            try:
                write_report(report, args.out, plots=True)
            except OSError as exc:
                print(f"numcheck premerge: could not write the report to {args.out}: {exc}", file=sys.stderr)
    print(render(env, specs, checks))
    print(f"numcheck premerge: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0 if all(c.ok for c in checks) else 1
