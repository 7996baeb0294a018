"""``numcheck premerge``: the checklist a contributor pastes into a pull request.

Checks, each ✅ or ❌ with its key figure:

1. **impls load** — every selected impl (default all; ``--impl`` restricts, outside ``module:attr`` specs
   included) loads and follows its protocol. If one does not, premerge prints one line naming each broken spec
   and its cause and stops (exit 1): the suite would only repeat the load error in every test.
2. **capability probes** — :func:`impls.measure.capabilities.summary` on the device (informative: ❌ only if the
   probes themselves cannot run).
3. **property suite** — the installed suite, exactly as a user runs it: ``python -m pytest --pyargs
   numcheck.tests.suite --impl ...`` (:data:`SUITE_MODULES`; the plugin ``numcheck.tests.plugin`` gives it
   ``--impl`` and its ``numcheck-ci`` hypothesis profile) in a subprocess in the current directory, so no checkout
   is needed; pytest's progress is streamed to stderr line by line while it runs; failures are listed with the
   repro command their message carries.
4. **quick report** — the report grid (``--grid``, default quick) for the selected impls: every case passes both
   verdicts.
5. **vs baseline** — that report compared (:mod:`reports.report.compare`) with ``--baseline BASE.json``, or
   else with the baseline shipped in the package for this device and torch release
   (:func:`reports.baselines.baseline_for`); without one it says "no baseline for this device" — information,
   not a failure.
6. **memory** — the memory table at the seed's shapes on ``meta`` (informative: ❌ only if the measurement
   itself breaks). An impl that cannot run on ``meta`` is "not measured", with the reason and what to do, and the
   line is ⚠️, not ✅.
7. **known divergences** — every recorded known divergence of a library that applied to a selected impl (the
   report's ``known_divergences``: library, release, what is wrong, the cases left out), a finding, not a pass:
   ⚠️ and named in the result line; ❌ with ``--strict`` (for gating a release upgrade). Environment artifacts are
   listed as "not judged here" and never fail it.

It prints a Markdown checklist (environment first) and exits 1 if any check fails, 2 on bad input (an unreadable
or incomplete ``--baseline``, an ``--out`` that would overwrite a report or lies inside the package, ``--strict``
with ``--base``).

With ``--base SPEC`` (one per ``--impl``, in the same order) it runs the A/B mode instead: each change judged
against the impl it replaces on the same problems, its memory, time and code paths side by side, and the claims
of ``--claims FILE`` checked (:mod:`reports.premerge.ab_run`, ``docs/premerge-ab.md``).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import shlex
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numcheck.reports import baselines, common
from numcheck.reports.common import SUITE_MODULES, add_impl_arguments, stream
from numcheck.reports.report import compare as report_compare
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report.grid import GRIDS
from numcheck.reports.report.schema import Traversable

HELP = (
    "pre-merge checklist for a pull request: the installed property suite (ci profile), quick report vs the "
    "baseline shipped for this device, memory table, capability probes; with --base OLD, the change --impl NEW "
    "judged against OLD and its --claims checked; known divergences named as findings (--strict: failures); Markdown "
    "on stdout, exit 1 if any check fails, 2 on bad input"
)


@dataclass
class ChecklistItem:
    """One checklist line: ``ok``, a title, its key figure, and details (failures with repro commands).
    ``unmeasured``: the check could not measure everything it reports on (the figure says what and why); it is
    neither ✅ nor a failure: ⚠️, unticked, and named in the result line."""

    title: str
    ok: bool
    figure: str
    details: list[str] = field(default_factory=list)
    unmeasured: bool = False
    #: Findings that are not passes but do not fail the check (known divergences without ``--strict``): ⚠️,
    #: unticked, named in the result line.
    findings: bool = False

    def line(self) -> str:
        warn = self.ok and (self.unmeasured or self.findings)
        mark = "⚠️" if warn else "✅" if self.ok else "❌"
        return f"- [{'x' if self.ok and not warn else ' '}] {mark} **{self.title}** — {self.figure}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_impl_arguments(p, device_help="device (default cpu)")
    p.add_argument("--grid", choices=sorted(GRIDS), default="quick", help="report grid (default quick)")
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="BASE.json",
        help="baseline report (default: the one shipped with numcheck for this device and torch, if any)",
    )
    p.add_argument(
        "--factor", type=float, default=report_compare.DEFAULT_FACTOR, help="--compare factor (see numcheck report)"
    )
    p.add_argument(
        "--floor", type=float, default=report_compare.DEFAULT_FLOOR, help="--compare floor (see numcheck report)"
    )
    p.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="pytest-xdist workers for the property suite (default 1)"
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="also write the report (report.json, report.md) here (a new folder, or one without a report)",
    )
    p.add_argument("--skip-tests", action="store_true", help="leave out the property suite (the checklist says so)")
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail the checklist (exit 1) when a recorded known divergence of a library applies to a selected impl "
        "(for gating a release upgrade); without it such a divergence is ⚠️, named, and passes",
    )
    from numcheck.reports.premerge import ab_run as premerge_ab_run

    premerge_ab_run.add_arguments(p)


# -- checks -----------------------------------------------------------------------------------------------
def check_impls(entries: list[Any]) -> ChecklistItem:
    from numcheck.impls.registry import BrokenImpl

    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    good = [e for e in entries if not isinstance(e, BrokenImpl)]
    unavailable = [(e.name, e.impl.support.unavailable_reason()) for e in good if e.impl.support.unavailable_reason()]
    details = [f"`{e.name}` ({e.origin}): {e.error}" for e in broken]
    details += [f"`{n}` cannot run here: {r}" for n, r in unavailable]
    kinds = {}
    for e in good:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    figure = (
        f"{len(good)} loaded ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items())) or 'none'}), "
        f"{len(broken)} broken, {len(unavailable)} unavailable here"
    )
    return ChecklistItem(
        "impls load", not broken and bool(good), figure if good else figure + " — nothing to check", details
    )


def stopped_line(loaded: ChecklistItem) -> str:
    """The one line premerge prints when its impls do not load: each broken spec with its cause (or that nothing
    was selected), and that nothing else ran."""
    why = "; ".join(d.split("\n")[0] for d in loaded.details if "cannot run here" not in d) or loaded.figure
    return (
        f"❌ **impls load** — {why} — premerge stopped here (exit 1): no suite, report or memory table ran; fix "
        f"the load and rerun"
    )


def check_probes(device: str) -> ChecklistItem:
    from numcheck.impls.measure import capabilities

    try:
        caps = capabilities.summary(device)
    except Exception as exc:  # noqa: BLE001 - the probe machinery itself broke
        return ChecklistItem("capability probes", False, f"probes raised {type(exc).__name__}: {exc}")
    yes = [k for k, v in caps.items() if v]
    no = [k for k, v in caps.items() if not v]
    return ChecklistItem(
        "capability probes",
        True,
        f"{len(yes)}/{len(caps)} available on {device}",
        [f"yes: {', '.join(yes) or '—'}", f"no: {', '.join(no) or '—'}"],
    )


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


def suite_command(specs: list[str], jobs: int, junit: Path) -> list[str]:
    """The pytest command line of the property-suite check: the installed suite, the impls, JUnit XML out."""
    return common.suite_command(junit, specs, jobs)


def check_property_suite(specs: list[str], jobs: int, device: str = "cpu") -> ChecklistItem:
    """The shipped suite on ``specs`` in a pytest subprocess drawing its problems on ``device`` (NUMCHECK_DEVICE, as
    ``numcheck sweep`` sets it): ``--device cuda`` judges the impls on the GPU in the suite as in the report."""
    title = "property suite (ci profile)"
    missing = [m for m in SUITE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        return ChecklistItem(
            title,
            False,
            f"the installed numcheck has no suite module {', '.join(missing)} (a broken install: reinstall numcheck)",
        )
    with tempfile.TemporaryDirectory(prefix="numcheck-premerge-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = suite_command(specs, jobs, junit)
        print(f"numcheck premerge: running the property suite: {shlex.join(cmd)}", file=sys.stderr)
        env = dict(os.environ, PYTHONUNBUFFERED="1", NUMCHECK_DEVICE=device)
        print(
            f"numcheck premerge: the suite draws its problems on {device} (NUMCHECK_DEVICE={device})", file=sys.stderr
        )
        t0 = time.monotonic()
        rc, lines = stream(cmd, env=env)
        secs = time.monotonic() - t0
        if not junit.exists():
            tail = [t for t in lines if t.strip()][-5:]
            return ChecklistItem(
                title,
                False,
                f"pytest exited {rc} without results",
                [f"`{shlex.join(cmd)}`"] + [f"    {t}" for t in tail],
            )
        counts, details = _junit_failures(junit)
    ok = rc in (0, 5) and counts["failed"] == counts["errors"] == 0 and counts["passed"] > 0
    figure = (
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
        f"{counts['skipped']} skipped in {secs:.0f} s, problems drawn on {device}"
    )
    if counts["passed"] == 0 and not details:
        figure += " — no test ran for these impls"
    return ChecklistItem(title, ok, figure, details)


def unreached_note(report: dict, grid: str) -> str:
    """Why the report can pass where the suite fails: the declared behaviours its grid did not reach per impl
    (:mod:`reports.report.coverage`), or that it reached them all."""
    missed = [
        f"{i['name']}: {', '.join(i['unreached'])}"
        for i in report["impls"]
        if i["status"] == "ran" and i.get("unreached")
    ]
    if missed:
        return (
            f"the property suite failed where this report passed: the {grid} grid did not reach these declared "
            f"behaviours, which the suite draws — {'; '.join(missed)}"
        )
    return (
        f"the property suite failed where this report passed, though the {grid} grid reached every behaviour "
        f"the impls declare: the suite's failing cases (listed under it) lie beyond the grid's shapes and values"
    )


def check_report(report: dict, grid: str, *, suite_failed: bool = False) -> ChecklistItem:
    """The report's line; ``suite_failed`` (the property suite ran and failed): a passing report says which
    declared behaviours its grid did not reach, so the two lines never disagree unexplained."""
    from numcheck.reports.report.md import failures, impl_overview

    rows = [r for r in impl_overview(report) if r["status"] == "ran"]
    n = sum(r["n"] for r in rows)
    passed = sum(r["pass"] for r in rows)
    worst = max(rows, key=lambda r: r["worst_ratio"] if not math.isnan(r["worst_ratio"]) else -1, default=None)
    figure = f"{passed}/{n} cases pass both verdicts ({grid} grid, {report['grid']['seconds']:.0f} s)"
    if worst is not None and worst["worst_output"]:  # an impl that raised on every case has no judged worst
        figure += f"; worst error/bound {worst['worst_ratio']:.3g} ({worst['name']}, {worst['worst_output']})"
    ok = passed == n and n > 0
    if ok and suite_failed:
        figure += f" — {unreached_note(report, grid)}"
    details = []
    for c in failures(report):
        detail = c.get("error") or "; ".join(c.get("failures", [])[:1])
        details.append(
            f"`{c['impl']}` on `{c['label']}`: {detail[:300]}"
            + (f"\n  - chunks: {c['chunks']}" if c.get("chunks") else "")
            + (f"\n  - reproduce: `{c['repro']}`" if c.get("repro") else "")
        )
    not_run = [f"`{i['name']}`: {i['status']} — {i['reason']}" for i in report["impls"] if i["status"] != "ran"]
    not_run += [
        f"`{i['name']}`: declared, reached by no case of the {grid} grid: {', '.join(i['unreached'])}"
        for i in report["impls"]
        if i["status"] == "ran" and i.get("unreached")
    ]
    return ChecklistItem("report", ok, figure if n else figure + " — no case ran", details + not_run)


def check_known(report: dict, *, strict: bool = False) -> ChecklistItem:
    """The known divergences that applied (:func:`reports.report.verdict.divergences`): none ✅; some ⚠️ (named, a
    finding, not a pass), ❌ with ``strict``; environment artifacts listed as not judged here."""
    from numcheck.reports.report.verdict import describe, divergences

    defects, artifacts = divergences(report)
    figure = (
        f"{len(defects)} known divergence(s) of a library apply — findings, not passes"
        + (" (--strict: a failure)" if strict else " (--strict makes them a failure)")
        if defects
        else "none applies to the selected impls here"
    )
    if artifacts:
        figure += f"; {len(artifacts)} environment artifact(s): not judged here"
    details = [describe(d) for d in defects] + [
        f"not judged here (environment artifact): {describe(d)}" for d in artifacts
    ]
    return ChecklistItem("known divergences", not (strict and defects), figure, details, findings=bool(defects))


def check_baseline(
    report: dict,
    baseline: Path | Traversable | None,
    factor: float,
    floor: float,
    *,
    restricted: bool = False,
    label: str | None = None,
) -> ChecklistItem:
    """The report against the baseline; ``restricted`` (``--impl`` given) compares only the impls of this run.
    ``baseline`` None: there is none for this device, which is information, not a failure."""
    title = "vs committed baseline"
    if baseline is None:
        env = report.get("environment", {})
        return ChecklistItem(
            title,
            True,
            f"no baseline for this device ({env.get('device', '?')}, torch "
            f"{env.get('torch', '?')}) — nothing to compare (information, not a failure)",
        )
    label = label or str(baseline)
    try:
        base = report_schema.load(baseline)
        if restricted:
            names = {i["name"] for i in report["impls"]}
            base = dict(
                base,
                impls=[i for i in base["impls"] if i["name"] in names],
                cases=[c for c in base["cases"] if c["impl"] in names],
            )
        diff = report_compare.compare_reports(base, report, factor=factor, floor=floor, base_label=label)
    except ValueError as exc:
        return ChecklistItem(title, False, str(exc))
    regs = diff.regressions
    figure = (
        f"{len(regs)} regression(s) against {label} (factor {factor:g}, floor {floor:g}); "
        f"{len(diff.of('improvement'))} improvement(s), {len(diff.of('note'))} note(s)"
    )
    details = [f"`{f.impl}` `{f.case}` {f.output}: {f.message}" for f in regs]
    details += [f"note: `{f.impl}`: {f.message}" for f in diff.of("note")][:10]
    return ChecklistItem(title, not regs, figure, details)


def shipped_label(resource: Traversable) -> str:
    """How the checklist names a shipped baseline: ``the shipped baseline cpu-torch2.13.0/report.json``."""
    p = Path(str(resource))
    return f"the shipped baseline {p.parent.name}/{p.name}"


#: What to do about an impl whose memory cannot be traced on ``meta``.
MEMORY_ADVICE = (
    "measure it where it runs: `numcheck premerge --device cuda` or `numcheck bench` on a GPU; or expose "
    "`accumulation_step(gw, G, x)` so its grad_weight step is measured on its own "
    "(`numcheck premerge --base`, docs/premerge-ab.md)"
)


def check_memory(report: dict) -> ChecklistItem:
    """The memory line: each impl's held bytes and peak at the seed's shapes on ``meta``. An impl that cannot run
    on ``meta`` (a backward that reads values: ``torch.equal(grad_output, 1)``, ``.item()``) is not measured:
    the line says so, with the reason and what to do, and is not ✅."""
    mem = report.get("memory")
    if mem is None:
        return ChecklistItem("memory", True, "no linear+CE impl ran, nothing to measure")
    if mem.get("error"):
        return ChecklistItem("memory", False, f"the measurement failed: {mem['error']}")
    from numcheck.impls.measure.memory import MiB

    N, H, V = mem["impl_shape"]
    measured = [r for r in mem["impls"] if not r.get("error")]
    unmeasured = [r for r in mem["impls"] if r.get("error")]
    parts = [f"{r['name']} held {r['held'] / MiB:.0f} MiB, peak {r['total_peak'] / MiB:.0f} MiB" for r in measured[:4]]
    if len(measured) > 4:
        parts.append(f"… ({len(measured)} impls)")
    figure = f"N={N}, H={H}, V={V} {mem['dtype']} on meta: " + ("; ".join(parts) or "no impl measured")
    if unmeasured:
        names = ", ".join(f"`{r['name']}`" for r in unmeasured)
        figure = f"not measured for {names} (cannot run on meta); " + figure
    details = [f"`{r['name']}` not measured: it cannot run on meta ({r['error']}); {MEMORY_ADVICE}" for r in unmeasured]
    return ChecklistItem("memory", True, figure, details, unmeasured=bool(unmeasured))


# -- output -----------------------------------------------------------------------------------------------
def render(env: dict, specs: list[str], checks: list[ChecklistItem]) -> str:
    """The Markdown checklist."""
    ok = all(c.ok for c in checks)
    result = "✅ all checks pass" if ok else f"❌ {sum(not c.ok for c in checks)} check(s) fail"
    unmeasured = [c.title for c in checks if c.ok and c.unmeasured]
    if unmeasured:
        result += f" (⚠️ not measured in full: {', '.join(unmeasured)})"
    found = [d for c in checks if c.ok and c.findings for d in c.details if not d.startswith("not judged here")]
    if found:
        result += f" (⚠️ {len(found)} known divergence(s) apply, not passes: {'; '.join(found)})"
    lines = [
        "## numcheck pre-merge checklist",
        "",
        f"**Result: {result}**",
        "",
        f"- Hardware: {env['device_name']} ({env['device']})",
        f"- torch {env['torch']}, triton {env.get('triton') or '—'}, Python {env['python']}, numcheck "
        f"{env.get('numcheck') or '—'} @ {(env.get('git_commit') or '—')[:12]}"
        + (" (uncommitted changes)" if env.get("git_dirty") else ""),
        f"- Impls: {', '.join(f'`{s}`' for s in specs) if specs else 'all registered'}",
        "",
    ]
    for c in checks:
        lines.append(c.line())
        for d in c.details:
            first, *rest = d.split("\n")
            lines.append(f"  - {first}")
            lines += [f"  {r}" for r in rest]
    return "\n".join(lines) + "\n"


def _bad_input(args: argparse.Namespace) -> bool:
    """Whether ``--baseline`` does not load or ``--out`` cannot be written (said on stderr): checked first, so bad
    input costs no run."""
    from numcheck.reports.report.command import check_writable_here

    try:
        if args.baseline is not None:
            report_schema.load(args.baseline)
        if args.out is not None:
            check_writable_here(args.out, force=False)
    except ValueError as exc:
        print(f"numcheck premerge: {exc}", file=sys.stderr)
        print("numcheck premerge: bad input (exit 2) — nothing was run", file=sys.stderr)
        return True
    return False


def _add_baseline_check(args: argparse.Namespace, report: dict, specs: list[str], checks: list[ChecklistItem]) -> None:
    """Appends the check against ``--baseline``, or else the shipped baseline of the device (a shipped one that
    does not load fails the check: a broken install)."""
    if args.baseline is not None:
        baseline, label = args.baseline, str(args.baseline)
    else:
        try:
            baseline = baselines.baseline_for(args.device)
        except ValueError as exc:  # a shipped baseline that does not load: a broken install, said as such
            baseline = None
            checks.append(ChecklistItem("vs committed baseline", False, f"a shipped baseline does not load: {exc}"))
        label = shipped_label(baseline) if baseline is not None else None
    if not any(c.title == "vs committed baseline" for c in checks):
        checks.append(check_baseline(report, baseline, args.factor, args.floor, restricted=bool(specs), label=label))


def _strict_with_base(args: argparse.Namespace) -> bool:
    """Whether ``--strict`` was given with ``--base`` (said on stderr with the fix): the A/B mode has no
    known-divergence check to make strict."""
    if not args.strict:
        return False
    print(
        "numcheck premerge: --strict fails the checklist on known divergences, but --base runs the A/B "
        "comparison, which has no such check; drop --strict, or drop --base to run the checklist",
        file=sys.stderr,
    )
    print("numcheck premerge: bad input (exit 2) — nothing was run", file=sys.stderr)
    return True


def run(args: argparse.Namespace) -> int:
    from numcheck.impls.registry import discover
    from numcheck.reports.report.command import build_report, write_report

    if args.base:
        from numcheck.reports.premerge.ab_run import run_ab

        if _strict_with_base(args):
            return 2

        return run_ab(args)
    t0 = time.monotonic()
    if _bad_input(args):  # before minutes of work
        return 2
    specs = list(args.impl)
    entries = discover(specs)
    loaded = check_impls(entries)
    if not loaded.ok:
        print(stopped_line(loaded))
        return 1
    env = report_schema.environment(args.device)
    checks = [loaded, check_probes(args.device)]
    if args.skip_tests:
        checks.append(
            ChecklistItem(
                "property suite (ci profile)", False, "skipped (--skip-tests): run it before asking for review"
            )
        )
    else:
        checks.append(check_property_suite(specs, args.jobs, args.device))
    suite_failed = not args.skip_tests and not checks[-1].ok
    print(f"numcheck premerge: running the {args.grid} report…", file=sys.stderr)
    report = build_report(GRIDS[args.grid], specs, args.device, progress=True)
    checks.append(check_report(report, args.grid, suite_failed=suite_failed))
    _add_baseline_check(args, report, specs, checks)
    checks.append(check_memory(report))
    checks.append(check_known(report, strict=args.strict))
    if args.out is not None:
        try:
            write_report(report, args.out, plots=True)
            print(f"numcheck premerge: report written to {args.out}", file=sys.stderr)
        except OSError as exc:
            print(f"numcheck premerge: could not write the report to {args.out}: {exc}", file=sys.stderr)
    print(render(env, specs, checks))
    failed = [c.title for c in checks if not c.ok]
    print(
        f"numcheck premerge: {time.monotonic() - t0:.0f} s; "
        + (
            f"FAIL (exit 1): {', '.join(failed)}"
            if failed
            else "PASS (exit 0): every check passes"
            + ("; known divergences apply (named above; --strict fails them)" if checks[-1].findings else "")
        ),
        file=sys.stderr,
    )
    return 1 if failed else 0
