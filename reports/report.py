"""``numcheck report``: sweep every registered impl over the report grid and write the tolerance report.

Output directory (``--out``, default ``reports/<device>-torch<version>/`` of this checkout, e.g.
``reports/cpu-torch2.13.0/``) holds ``report.json`` (:mod:`reports.report_schema`), ``report.md``
(:mod:`reports.report_md`) and PNG plots (:mod:`reports.plots`). The directory is written atomically: built in
a temporary sibling and renamed into place, so a crash never leaves half a report.

A ``report.json`` tracked by git is a *committed baseline*: it is never overwritten unless
``--update-baseline`` (alias ``--force``) is given. When the default directory holds one, the new report goes to
``build/numcheck-report/<device>-torch<version>/`` instead (git-ignored), and the command says so.

``--compare BASE.json`` lists regressions against a baseline (:mod:`reports.report_compare`) and exits 1 if there
are any; with ``--current NEW.json`` it compares two existing reports without running anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from numcheck.reports import report_compare, report_schema
from numcheck.reports.report_grid import GRIDS, GridSpec
from numcheck.reports.report_schema import REPO, SCHEMA, device_label, torch_release

HELP = ("sweep every impl over a documented grid and write report.json, report.md and plots under "
        "reports/<device>-torch<version>/ (--quick: the small grid; --compare BASE.json: list regressions)")

#: Max chunks of the accumulation comparison per grid.
ACCUMULATION_CHUNKS = {"quick": 64, "full": 256, "smoke": 8}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_const", const="quick", dest="grid",
                   help="the quick grid (at most 3 minutes on a 2-core CPU)")
    g.add_argument("--grid", choices=sorted(GRIDS), help="grid preset: full (default), quick, or smoke (tiny, for tests)")
    p.add_argument("--out", type=Path, metavar="DIR", help="output directory (default reports/<device>-torch<version>/)")
    p.add_argument("--update-baseline", "--force", action="store_true", dest="force",
                   help="allow replacing a committed baseline report")
    p.add_argument("--compare", type=Path, metavar="BASE.json", help="list regressions against this report; exit 1 if any")
    p.add_argument("--current", type=Path, metavar="NEW.json",
                   help="with --compare: compare this existing report instead of running a new one")
    p.add_argument("--factor", type=float, default=report_compare.DEFAULT_FACTOR,
                   help=f"--compare: error/bound growth that counts as a regression (default {report_compare.DEFAULT_FACTOR:g})")
    p.add_argument("--floor", type=float, default=report_compare.DEFAULT_FLOOR,
                   help=f"--compare: growth counts only once error/bound exceeds this (default {report_compare.DEFAULT_FLOOR:g})")
    p.add_argument("--impl", action="append", default=[], metavar="SPEC",
                   help="only these impls: a built-in name or package.module:attr (repeatable; default: all)")
    p.add_argument("--device", default="cpu", help="device to run on (default cpu)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--render", type=Path, metavar="REPORT.json",
                   help="run nothing: write report.md and the plots of this report.json (made elsewhere, e.g. on a "
                        "GPU machine without matplotlib) into --out (default: the JSON's own directory)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def default_out_dir(device: str) -> Path:
    """``reports/<device label>-torch<release>/`` of this checkout."""
    return REPO / "reports" / f"{device_label(device)}-torch{torch_release()}"


def committed_baseline(path: Path) -> Path | None:
    """``path``'s committed baseline report (``path/report.json`` tracked by git), if it exists there."""
    rj = path / "report.json"
    if not rj.exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(path), "ls-files", "--error-unmatch", "report.json"],
                           capture_output=True, text=True, timeout=20)
        return rj if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        # No git: a report inside the package's reports/ folder is taken to be a committed one.
        return rj if (REPO / "reports") in path.resolve().parents else None


def resolve_out_dir(args: argparse.Namespace) -> tuple[Path, str]:
    """Where to write, and a message when the choice needs explaining. Raises ValueError when refused."""
    if args.out is not None:
        out = args.out
        base = committed_baseline(out)
        if base is not None and not args.force:
            raise ValueError(f"--out {out} holds the committed baseline {base}; pass --update-baseline to replace it, "
                             "or choose another --out")
        if out.exists() and any(out.iterdir()) and not (out / "report.json").exists():
            raise ValueError(f"--out {out} exists and is not a numcheck report directory (no report.json); "
                             "refusing to replace it")
        return out, ""
    out = default_out_dir(args.device)
    base = committed_baseline(out)
    if base is None or args.force:
        return out, ("replacing the committed baseline " + str(base)) if base else ""
    alt = REPO / "build" / "numcheck-report" / out.name
    return alt, (f"{base} is the committed baseline for this device; writing to {alt} instead "
                 f"(--update-baseline replaces the baseline; compare with: numcheck report --compare {base} "
                 f"--current {alt / 'report.json'})")


#: The files a report writes into its directory. Rewriting a report replaces or removes these (a stale plot
#: does not survive); anything else in the directory (a README, benchmark results, logs) is kept.
REPORT_FILES: frozenset[str] = frozenset({"report.json", "report.md", "compare.md"})


def write_atomically(out: Path, files: dict[str, str | bytes], extra: Any = None,
                     owned: frozenset[str] = frozenset()) -> None:
    """Write ``files`` (name → text or bytes) into the directory ``out``, atomically (temp dir + rename).

    ``extra``, when given, is called with the temporary directory to add files (plots) before the rename.
    Entries of an existing ``out`` that are neither written now nor named in ``owned`` are carried over into
    the new directory, so writing a report into a folder never deletes what else the folder holds.
    """
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data if isinstance(data, bytes) else data.encode())
        if extra is not None:
            extra(tmp)
        if out.exists():
            for entry in out.iterdir():
                if entry.name in owned or (tmp / entry.name).exists():
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, tmp / entry.name, symlinks=True)
                else:
                    shutil.copy2(entry, tmp / entry.name, follow_symlinks=False)
        os.chmod(tmp, 0o755)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        try:
            tmp.rename(out)
        except OSError:
            if old is not None:
                old.rename(out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def memory_section(impls: list[Any]) -> dict[str, Any]:
    """The memory table of :mod:`properties.memory` at the seed's shapes on ``meta`` (JSON-ready)."""
    import torch

    from numcheck.impls.measure import memory
    from numcheck.properties.memory import memory_table
    from numcheck.properties.problems import Problem

    try:
        N, H, V = memory.SEED_SHAPE
        C = memory.SEED_CHUNK
        chunk = memory.one_chunk_table(V, H, C, dtype=torch.bfloat16, device="meta")
        p = Problem(N=N, H=H, V=V, dtype="bfloat16", device="cpu")
        rows = memory_table(impls, p, "meta")
    except Exception as exc:  # noqa: BLE001 - the report still stands without it; the failure is shown
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"one_chunk_shape": [V, H, C], "impl_shape": [N, H, V], "dtype": "bfloat16", "device": "meta",
            "one_chunk": [{"path": r.path, "runs_as": r.runs_as, "extra_bytes": r.extra_bytes, "formula": r.formula}
                          for r in chunk],
            "impls": [{"name": m.name, "forward_peak": m.forward_peak, "held": m.held, "backward_peak": m.backward_peak,
                       "total_peak": m.total_peak, "opaque": sorted(m.opaque), "error": m.error} for m in rows]}


def build_report(spec: GridSpec, specs: list[str], device: str, *, progress: bool = True, memory: bool = True,
                 accumulation: bool = True) -> dict[str, Any]:
    """Run the sweep, the accumulation comparison and the memory table; the report dictionary.

    ``memory`` / ``accumulation`` False leave those sections out (``None``), for tests."""
    from numcheck.impls.registry import by_kind, discover
    from numcheck.impls.measure.accumulation import accumulation_table
    from numcheck.reports.report_sweep import one_thread, sweep

    t0 = time.monotonic()
    entries = discover(specs)
    env = report_schema.environment(device)
    result = sweep(entries, spec, device, progress=progress)
    acc = None
    if accumulation:
        with one_thread():
            acc = accumulation_table(max_chunks=ACCUMULATION_CHUNKS.get(spec.name, 64), device=device).to_json()
    ran = {i["name"] for i in result.impls if i["status"] == "ran"}
    lin = [e.impl for e in by_kind(entries, "linear_ce") if e.name in ran]
    mem = memory_section(lin) if (lin and memory) else None
    return {"schema": SCHEMA, "environment": env,
            "grid": {"name": spec.name, "description": spec.describe(), "seconds": round(time.monotonic() - t0, 1),
                     "impl_specs": list(specs)},
            "impls": result.impls, "cases": result.cases, "accumulation": acc, "memory": mem}


def write_report(report: dict, out: Path, *, plots: bool = True, comparison_md: str = "") -> list[str]:
    """Write ``report.json``, ``report.md`` and the plots atomically into ``out``; the plot names."""
    from numcheck.reports import report_md

    drawn: list[str] = []
    note = "Plots skipped (--no-plots)."

    def add_plots(tmp: Path) -> None:
        nonlocal note
        if plots:
            from numcheck.reports.plots import write_plots

            names, note = write_plots(report, tmp)
            drawn.extend(names)
            if note:
                print(f"numcheck report: {note}", file=sys.stderr)
        (tmp / "report.md").write_text(report_md.render(report, plots=drawn, plot_note=note, comparison_md=comparison_md))

    files = {"report.json": report_schema.dumps(report)}
    if comparison_md:
        files["compare.md"] = comparison_md
    from numcheck.reports.plots import PLOT_FILES

    write_atomically(out, files, extra=add_plots, owned=REPORT_FILES | PLOT_FILES)
    return drawn


def print_summary(report: dict, out: Path | None) -> None:
    """A few lines on stdout: where the report is and which impls failed."""
    from numcheck.reports.report_md import impl_overview

    rows = impl_overview(report)
    bad = [r for r in rows if r["status"] == "ran" and (r["fail"] or r["error"])]
    n = sum(r["n"] for r in rows)
    ok = sum(r["pass"] for r in rows)
    if out is not None:
        print(f"numcheck report ({report['grid']['name']} grid, {report['grid']['seconds']:.0f} s): {out}")
    print(f"  {ok}/{n} (impl, case) runs pass both verdicts over {sum(r['status'] == 'ran' for r in rows)} impls")
    for r in bad:
        print(f"  FAIL {r['name']}: {r['fail']} failing, {r['error']} raising; worst error/bound {r['worst_ratio']:.3g} "
              f"({r['worst_output']}, {r['worst_case']})")
    for r in rows:
        if r["status"] != "ran":
            print(f"  {r['status'].upper()} {r['name']}: {r['reason']}")


def render(path: Path, out: Path | None, *, plots: bool = True) -> int:
    """Write ``report.md`` and the plots of an existing ``report.json`` (validated on load) into ``out``."""
    try:
        report = report_schema.load(path)
    except (OSError, ValueError) as exc:
        print(f"numcheck report --render: {path}: {exc}", file=sys.stderr)
        return 2
    dest = out if out is not None else path.parent
    write_report(report, dest, plots=plots)
    print_summary(report, dest)
    return 0


def run(args: argparse.Namespace) -> int:
    spec = GRIDS[args.grid or "full"]
    if args.render is not None:
        return render(args.render, args.out, plots=not args.no_plots)
    if args.current is not None:
        if args.compare is None:
            print("numcheck report: --current needs --compare BASE.json", file=sys.stderr)
            return 2
        try:
            base, new = report_schema.load(args.compare), report_schema.load(args.current)
            diff = report_compare.compare_reports(base, new, factor=args.factor, floor=args.floor,
                                                  base_label=str(args.compare))
        except ValueError as exc:
            print(f"numcheck report: {exc}", file=sys.stderr)
            return 2
        print(report_compare.to_markdown(diff))
        return 1 if diff.regressions else 0
    try:
        out, message = resolve_out_dir(args)
        base = report_schema.load(args.compare) if args.compare is not None else None
    except ValueError as exc:
        print(f"numcheck report: {exc}", file=sys.stderr)
        return 2
    if message:
        print(f"numcheck report: {message}", file=sys.stderr)
    report = build_report(spec, list(args.impl), args.device, progress=not args.no_progress)
    comparison_md, regressions = "", 0
    if base is not None:
        diff = report_compare.compare_reports(base, report, factor=args.factor, floor=args.floor,
                                              base_label=str(args.compare))
        comparison_md = report_compare.to_markdown(diff)
        regressions = len(diff.regressions)
    write_report(report, out, plots=not args.no_plots, comparison_md=comparison_md)
    print_summary(report, out)
    if comparison_md:
        print(comparison_md)
    return 1 if regressions else 0
