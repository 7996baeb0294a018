"""``numcheck report``: sweep every registered impl over the report grid and write the tolerance report.

Where it writes. By default ``./numcheck-report/<device>-torch<version>/`` under the current directory (e.g.
``./numcheck-report/cpu-torch2.13.0/``), or ``--out DIR``; never into the installed package (refused, exit 2).
The folder holds ``report.json`` (:mod:`reports.report.schema`), ``report.md`` (:mod:`reports.report.md`) and PNG
plots (:mod:`reports.report.plots`); it is written atomically (built in a temporary sibling and renamed into place, so a
crash never leaves half a report). A folder that already holds a report is not replaced unless ``--force`` is
given: the command says so and exits 2.

Baselines. The committed baselines ``reports/<device>-torch<version>/report.json`` ship as package data
(:mod:`reports.baselines`); a user's baseline is a path (``--compare BASE.json``). Maintainers regenerate a
committed baseline with ``--update-baseline``, which writes into the checkout's ``reports/`` folder and is refused
by an installed numcheck.

``--compare BASE.json`` lists regressions against a baseline (:mod:`reports.report.compare`); with ``--current
NEW.json`` it compares two existing reports without running anything.

Known divergences. Every recorded known divergence of a library that applied to an impl judged here (its release,
this device) is a finding, not a pass: report.json's ``known_divergences`` (:mod:`reports.report.findings`), the
headline of report.md and the last line name each (library, release, what is wrong, the cases left out); an
environment artifact (Triton's interpreter) is named as "not judged here". They leave the exit status at 0 unless
``--strict`` is given (for gating a release upgrade), which makes any known divergence of a library exit 1.

Exit status: 0 when every declared case of every impl passes; 1 when a case fails or raises, an impl is broken
(fails to load or breaks the protocol), ``--compare`` finds a regression, or (``--strict``) a known divergence
applied; 2 on bad input (an unreadable,
corrupt or incomplete report or baseline — the message names the file and what is missing —, an output folder
that would be overwritten or lies inside the package). An impl merely unavailable here (its declared requirement
unmet, e.g. cut-cross-entropy without CUDA) is listed, not a failure. The last line says which.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from numcheck.errors import BadInput, both_names, warn_renamed
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.reports import baselines
from numcheck.reports.common import add_impl_arguments, write_atomically
from numcheck.reports.report import compare as report_compare
from numcheck.reports.report import findings
from numcheck.reports.report import schema as report_schema
from numcheck.reports.report import verdict as report_verdict
from numcheck.reports.report.grid import GRIDS, GridSpec
from numcheck.reports.report.schema import SCHEMA
from numcheck.reports.report.verdict import verdict

__all__ = ["add_arguments", "build_report", "run", "verdict", "write_report"]

HELP = (
    "sweep every impl over a documented grid and write report.json, report.md and plots under "
    "./numcheck-report/<device>-torch<version>/ (--out DIR elsewhere; --quick: the small grid; "
    "--compare BASE.json: list regressions); known divergences are named, not passed; exit 1 if a case fails or an "
    "impl is broken (--strict: or a known divergence applies), 2 on bad input"
)

#: Max chunks of the accumulation comparison per grid.
ACCUMULATION_CHUNKS = {"quick": 64, "full": 256, "smoke": 8}
#: The folder under the current directory that ``numcheck report`` writes into by default.
DEFAULT_ROOT = "numcheck-report"
#: ``--include-production`` before numcheck 0.2.0 (still read, with a warning, until 0.3.0).
FORMER_INCLUDE = "--include-scale"


def _grid_arguments(p: argparse.ArgumentParser) -> None:
    """Which grid runs, and where its report is written."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--quick",
        action="store_const",
        const="quick",
        dest="grid",
        help="the quick grid (at most 3 minutes on a 2-core CPU)",
    )
    g.add_argument(
        "--grid", choices=sorted(GRIDS), help="grid preset: full (default), quick, or smoke (tiny, for tests)"
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"output directory (default ./{DEFAULT_ROOT}/<device>-torch<version>/ under the current directory)",
    )
    p.add_argument("--force", action="store_true", help="replace a report already in the output directory")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when a recorded known divergence of a library applies here (for gating a release upgrade); "
        "without it such a divergence is named in the last line and the exit status stays 0",
    )
    p.add_argument(
        "--update-baseline",
        action="store_true",
        help="maintainers, in numcheck's checkout: write the committed baseline reports/<device>-torch<version>/ "
        "(refused by an installed numcheck)",
    )


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    """--compare against a baseline report, and what counts as a regression."""
    p.add_argument(
        "--compare", type=Path, metavar="BASE.json", help="list regressions against this report; exit 1 if any"
    )
    p.add_argument(
        "--current",
        type=Path,
        metavar="NEW.json",
        help="with --compare: compare this existing report instead of running a new one",
    )
    p.add_argument(
        "--factor",
        type=float,
        default=report_compare.DEFAULT_FACTOR,
        help=f"--compare: error/bound growth that counts as a regression (default {report_compare.DEFAULT_FACTOR:g})",
    )
    p.add_argument(
        "--floor",
        type=float,
        default=report_compare.DEFAULT_FLOOR,
        help=f"--compare: growth counts only once error/bound exceeds this (default {report_compare.DEFAULT_FLOOR:g})",
    )


def _run_arguments(p: argparse.ArgumentParser) -> None:
    """Which impls run where (with --render: none), and what is written beside the report (plots, progress, the
    production tier)."""
    add_impl_arguments(p)
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--render",
        type=Path,
        metavar="REPORT.json",
        help="run nothing: write report.md and the plots of this report.json (made elsewhere, e.g. on a "
        "GPU machine without matplotlib) into --out (default: the JSON's own directory)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--include-production",
        type=Path,
        metavar="PRODUCTION.json",
        help="append the production-shape tier of this numcheck production run (its production.json) to report.md",
    )
    p.add_argument(
        FORMER_INCLUDE,
        type=Path,
        metavar="SCALE.json",
        help="old name of --include-production (renamed in 0.2.0; goes in 0.3.0)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``numcheck report``, in --help order."""
    _grid_arguments(p)
    _compare_arguments(p)
    _run_arguments(p)


def default_out_dir(device: str) -> Path:
    """``./numcheck-report/<device label>-torch<release>/`` under the current directory."""
    return Path.cwd() / DEFAULT_ROOT / baselines.report_dir_name(device)


def check_writable_here(out: Path, *, force: bool, baseline: bool = False) -> None:
    """Raise ValueError when ``out`` must not be written: inside the installed package (unless ``baseline``, the
    checkout's baseline folder), holding a report already (unless ``force``), or a folder that is no report."""
    pkg = baselines.inside_package(out)
    if pkg is not None and not baseline:
        raise ValueError(
            f"{out} lies inside numcheck's package folder {pkg}; a report is never written into the "
            f"package (choose another --out; maintainers regenerate a committed baseline with "
            f"--update-baseline from a checkout)"
        )
    if (out / "report.json").exists() and not (force or baseline):
        raise ValueError(
            f"{out} already holds a report ({out / 'report.json'}); pass --force to replace it, or choose another --out"
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not (out / "report.json").exists():
        raise ValueError(
            f"{out} exists and is not a numcheck report directory (no report.json); refusing to write into it"
        )


def resolve_out_dir(args: argparse.Namespace) -> tuple[Path, str]:
    """Where to write, and a message when the choice needs explaining. Raises ValueError when refused."""
    if getattr(args, "update_baseline", False):
        if args.out is not None:
            raise ValueError(
                "--update-baseline writes the checkout's reports/<device>-torch<version>/; it takes no --out"
            )
        out = baselines.baseline_dir_to_update(args.device)
        check_writable_here(out, force=True, baseline=True)
        return out, f"updating the committed baseline {out}" + (" (new)" if not out.exists() else "")
    out = args.out if args.out is not None else default_out_dir(args.device)
    check_writable_here(out, force=args.force)
    return out, ("replacing the report in " + str(out)) if (out / "report.json").exists() else ""


#: The files a report writes into its directory. Rewriting a report replaces or removes these (a stale plot
#: does not survive); anything else in the directory (a README, benchmark results, logs) is kept.
REPORT_FILES: frozenset[str] = frozenset({"report.json", "report.md", "compare.md"})


def memory_section(impls: list[Any]) -> dict[str, Any]:
    """The memory table of :mod:`properties.linear_ce.memory` at the seed's shapes on ``meta`` (JSON-ready)."""
    import torch

    from numcheck.impls.measure import memory
    from numcheck.properties.linear_ce.cases import Problem
    from numcheck.properties.linear_ce.memory import memory_table

    try:
        N, H, V = memory.SEED_SHAPE
        C = memory.SEED_CHUNK
        chunk = memory.one_chunk_table(V, H, C, dtype=torch.bfloat16, device="meta")
        p = Problem(N=N, H=H, V=V, dtype="bfloat16", device="cpu")
        rows = memory_table(impls, p, "meta")
    except Exception as exc:  # noqa: BLE001 - the report still stands without it; the failure is shown
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "one_chunk_shape": [V, H, C],
        "impl_shape": [N, H, V],
        "dtype": "bfloat16",
        "device": "meta",
        "one_chunk": [
            {"path": r.path, "runs_as": r.runs_as, "extra_bytes": r.extra_bytes, "formula": r.formula} for r in chunk
        ],
        "impls": [
            {
                "name": m.name,
                "forward_peak": m.forward_peak,
                "held": m.held,
                "backward_peak": m.backward_peak,
                "total_peak": m.total_peak,
                "opaque": sorted(m.opaque),
                "error": m.error,
            }
            for m in rows
        ],
    }


def build_report(
    spec: GridSpec,
    specs: list[str],
    device: str,
    *,
    progress: bool = True,
    memory: bool = True,
    accumulation: bool = True,
) -> dict[str, Any]:
    """Run the sweep, the accumulation comparison and the memory table; the report dictionary.

    ``memory`` / ``accumulation`` False leave those sections out (``None``), for tests."""
    from numcheck.impls.measure.accumulation import accumulation_table
    from numcheck.impls.registry import ImplEntry, by_kind, discover
    from numcheck.reports.report.run import one_thread, sweep

    t0 = time.monotonic()
    entries = discover(specs)
    env = report_schema.environment(device)
    notes = findings.release_notes()
    if notes:
        env["release_notes"] = notes
    result = sweep(entries, spec, device, progress=progress)
    acc = None
    if accumulation:
        with one_thread():
            acc = accumulation_table(max_chunks=ACCUMULATION_CHUNKS.get(spec.name, 64), device=device).to_json()
    findings.libraries(result.impls)
    ran = {i["name"] for i in result.impls if i["status"] == "ran"}
    lin = [e.impl for e in by_kind(entries, LINEAR_CE_KIND) if e.name in ran]
    mem = memory_section(lin) if (lin and memory) else None
    return {
        "schema": SCHEMA,
        "environment": env,
        "grid": {
            "name": spec.name,
            "description": spec.describe(),
            "seconds": round(time.monotonic() - t0, 1),
            "impl_specs": list(specs),
        },
        "impls": result.impls,
        "cases": result.cases,
        "known_divergences": findings.known_divergences(
            result.impls, {e.name: e.impl.support for e in entries if isinstance(e, ImplEntry)}, device
        ),
        "accumulation": acc,
        "memory": mem,
    }


def write_report(
    report: dict, out: Path, *, plots: bool = True, comparison_md: str = "", production_md: str = ""
) -> list[str]:
    """Write ``report.json``, ``report.md`` and the plots atomically into ``out``; the plot names. ``production_md``
    (the production-shape tier's section, :mod:`reports.production.md`) is appended to report.md."""
    from numcheck.reports.report import md as report_md

    drawn: list[str] = []
    note = "Plots skipped (--no-plots)."

    def add_plots(tmp: Path) -> None:
        nonlocal note
        if plots:
            from numcheck.reports.report.plots import write_plots

            names, note = write_plots(report, tmp)
            drawn.extend(names)
            if note:
                print(f"numcheck report: {note}", file=sys.stderr)
        try:
            text = report_md.render(report, plots=drawn, plot_note=note, comparison_md=comparison_md)
        except Exception as exc:  # noqa: BLE001 - report.json is written whatever the Markdown makes of it
            text = (
                f"# numcheck tolerance report\n\nreport.md could not be rendered from this report's data "
                f"({type(exc).__name__}: {exc}); the data is in report.json.\n"
            )
            print(f"numcheck report: {text.splitlines()[-1]}", file=sys.stderr)
        (tmp / "report.md").write_text(text + (f"\n{production_md}" if production_md else ""))

    files = {"report.json": report_schema.dumps(report)}
    if comparison_md:
        files["compare.md"] = comparison_md
    from numcheck.reports.report.plots import PLOT_FILES

    write_atomically(out, files, extra=add_plots, owned=REPORT_FILES | PLOT_FILES)
    return drawn


def print_summary(report: dict, out: Path | None) -> None:
    """A few lines on stdout: where the report is, whether any impl of the user's was judged, which impls failed."""
    from numcheck.reports.report.md import builtins_only_note, impl_overview

    rows = impl_overview(report)
    bad = [r for r in rows if r["status"] == "ran" and (r["fail"] or r["error"])]
    n = sum(r["n"] for r in rows)
    ok = sum(r["pass"] for r in rows)
    if out is not None:
        print(f"numcheck report ({report['grid']['name']} grid, {report['grid']['seconds']:.0f} s): {out}")
    print(f"  {ok}/{n} (impl, case) runs pass both verdicts over {sum(r['status'] == 'ran' for r in rows)} impls")
    note = builtins_only_note(report)
    if note:
        print(f"  {note}")
    for r in bad:
        worst = (
            f"worst error/bound {r['worst_ratio']:.3g} ({r['worst_output']}, {r['worst_case']})"
            if r["worst_output"]
            else "no case judged"
        )
        print(f"  FAIL {r['name']}: {r['fail']} failing, {r['error']} raising; {worst}")
    for r in rows:
        if r["status"] != "ran":
            print(f"  {r['status'].upper()} {r['name']}: {r['reason']}")
    defects, artifacts = report_verdict.divergences(report)
    for d in defects:
        print(f"  KNOWN DIVERGENCE {report_verdict.describe(d)}")
    for d in artifacts:
        print(f"  NOT JUDGED HERE {report_verdict.describe(d)}")


def _production_section(args: argparse.Namespace) -> str:
    """The Markdown of the ``numcheck production`` run's production.json ``--include-production`` names, or ``""``
    without one; :class:`BadInput` naming the file when it is not one. ``--include-scale`` (its name before 0.2.0)
    works with a warning; both given is one :class:`BadInput` naming both."""
    path, old = getattr(args, "include_production", None), getattr(args, "include_scale", None)
    if old is not None:
        if path is not None:
            raise BadInput(both_names("option", FORMER_INCLUDE, "--include-production"))
        warn_renamed("option", FORMER_INCLUDE, "--include-production")
        path = old
    if path is None:
        return ""
    from numcheck.reports.production import md as production_md

    try:
        return production_md.render(production_md.load(path), heading="##")
    except ValueError as exc:
        raise BadInput(f"--include-production: {exc}") from None


def render(path: Path, out: Path | None, *, plots: bool = True, production_section: str = "") -> int:
    """Write ``report.md`` and the plots of an existing ``report.json`` (validated on load) into ``out``.

    Exit 0 once written (rendering judges nothing; the summary says what the report holds), 2 when the JSON is
    not a complete report or the destination is inside an installed package."""
    try:
        report = report_schema.load(path)
        dest = out if out is not None else path.parent
        if baselines.inside_package(dest) is not None and baselines.checkout_root() is None:
            raise ValueError(f"{dest} lies inside the installed package; pass --out DIR to render elsewhere")
    except (OSError, ValueError) as exc:
        print(f"numcheck report --render: {exc}", file=sys.stderr)
        return 2
    write_report(report, dest, plots=plots, production_md=production_section)
    print_summary(report, dest)
    return 0


def _load_or_exit(path: Path) -> dict:
    """The report at ``path``, or :class:`BadInput` naming the file and what is wrong with it."""
    try:
        return report_schema.load(path)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def check_strict(args: argparse.Namespace) -> None:
    """:class:`BadInput` when ``--strict`` is given where nothing is judged: with ``--render`` (writes report.md,
    exit 0) or ``--current`` (compares two reports)."""
    if not getattr(args, "strict", False):
        return
    for flag, given, what in (
        ("--render", args.render, "writes report.md of an existing report and judges nothing"),
        ("--current", args.current, "compares two existing reports"),
    ):
        if given is not None:
            raise BadInput(
                f"--strict fails a run on the known divergences it finds, but {flag} {what}; drop --strict, or "
                f"run the report (without {flag}) with --strict"
            )


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except BadInput as exc:
        print(f"numcheck report: {exc}", file=sys.stderr)
        print("numcheck report: bad input (exit 2) — nothing was run", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    spec = GRIDS[args.grid or "full"]
    production_section = _production_section(args)
    check_strict(args)
    if args.render is not None:
        return render(args.render, args.out, plots=not args.no_plots, production_section=production_section)
    if not (args.factor >= 1.0 and args.floor >= 0.0):
        raise BadInput(f"--factor must be >= 1 and --floor >= 0 (got {args.factor!r}, {args.floor!r})")
    if args.current is not None:
        if args.compare is None:
            raise BadInput("--current needs --compare BASE.json")
        base, new = _load_or_exit(args.compare), _load_or_exit(args.current)
        diff = report_compare.compare_reports(
            base, new, factor=args.factor, floor=args.floor, base_label=str(args.compare)
        )
        print(report_compare.to_markdown(diff))
        return 1 if diff.regressions else 0
    base = _load_or_exit(args.compare) if args.compare is not None else None
    try:
        out, message = resolve_out_dir(args)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if message:
        print(f"numcheck report: {message}", file=sys.stderr)
    report = build_report(spec, list(args.impl), args.device, progress=not args.no_progress)
    comparison_md, regressions = "", 0
    if base is not None:
        diff = report_compare.compare_reports(
            base, report, factor=args.factor, floor=args.floor, base_label=str(args.compare)
        )
        comparison_md = report_compare.to_markdown(diff)
        regressions = len(diff.regressions)
    write_report(report, out, plots=not args.no_plots, comparison_md=comparison_md, production_md=production_section)
    print_summary(report, out)
    if comparison_md:
        print(comparison_md)
    status, line = verdict(report, regressions, strict=args.strict)
    print(line)
    return status
