"""``numcheck production``: the production-shape tier (:mod:`properties.production.tier`) for every linear+CE impl.

The run is cut into items, one per (case, impl), cases outer so that the impls of a case share its inputs,
oracle, eager's errors and bounds. A worker process runs the items and appends each event to
``progress.jsonl`` as it happens (``case`` when a case's shared work is done, ``start`` before an impl,
``result`` after it), so a run cut short still reports every finished item. The parent process runs no impl:
it restarts the worker when it dies (a CUDA fault is sticky: it ends every later CUDA call of that
process) or when an item outlives its cap by :data:`GRACE_S` (a kernel that hangs cannot be interrupted from
Python), records that item as ``crashed`` or ``timeout``, and goes on with the rest. Inside the worker an item
past ``--time-cap-s`` is interrupted between kernel launches (``timeout``); an impl that raises, an OOM included,
is an ``error`` record. At the end ``production.json`` and ``production.md`` are written from the progress file
(``scale.json``/``scale.md`` before numcheck 0.2.0).

A run into an ``--out`` that holds an earlier run's progress resumes it: the items that passed, were unavailable,
unsupported or a known divergence are kept; those that failed, erred, timed out, crashed or were not run are run
again (:data:`RETRIED`). ``--force`` starts afresh, discarding the earlier progress. Every recorded result (and
case) carries the numcheck code and torch release it ran on (:func:`reports.common.code_identity`); on resume
those of other code, or recorded without it, are run again too, unless ``--keep-stale``.

Exit status: 0 when every record passes, is unavailable here, unsupported or a known divergence, 1 when one fails, errs, times
out or crashes, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from numcheck.reports import common
from numcheck.reports.common import add_impl_arguments
from numcheck.reports.production.md import FORMER_STEM, STEM

HELP = (
    "the production-shape tier: every linear+CE impl at BT=8192/H=4096/V=131072, a ragged vocabulary and "
    "N·V > 2^31, bf16 and AMP, judged against the float64 oracle; writes production.json and production.md"
)

PROGRESS = "progress.jsonl"
#: The statuses an earlier run's item is run again for on resume (every other status is a settled verdict).
RETRIED = ("fail", "error", "timeout", "crashed", "not_run")
#: Seconds an item may outlive its cap before the parent kills the worker.
GRACE_S = 60.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_impl_arguments(
        p,
        default="default: every registered linear+CE impl",
        device=None,
        device_help="cuda (default when available) or cpu",
    )
    p.add_argument(
        "--shapes",
        default=None,
        help="preset 'production' (default on CUDA) or 'smoke' (default elsewhere), or NAME=NxHxV,...",
    )
    p.add_argument("--precisions", default="bf16,amp", help="comma-separated of bf16, amp (default both)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("numcheck-production"),
        metavar="DIR",
        help="output folder (default ./numcheck-production); an existing progress.jsonl there is resumed: "
        "its failed, erred, timed-out, crashed and not-run items run again",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="start afresh: discard the progress.jsonl (and worker logs) an earlier run left in --out",
    )
    p.add_argument(
        "--keep-stale",
        action="store_true",
        help="on resume, keep the items an earlier run recorded on other numcheck code or torch (by default "
        "they run again)",
    )
    p.add_argument("--time-cap-s", type=float, default=150.0, help="seconds per (case, impl) item (default 150)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall seconds for the whole run; items not started by then are recorded as not_run",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--in-process",
        action="store_true",
        help="run the items in this process (no restart after a CUDA fault; the default on CPU)",
    )
    g.add_argument(
        "--isolate",
        action="store_true",
        help="run the items in a worker process restarted after a crash or hang (the default on CUDA)",
    )
    p.add_argument(
        "--assemble",
        action="store_true",
        help="run nothing: write production.json and production.md from the progress.jsonl in --out (a run cut short)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)


# -- the plan -------------------------------------------------------------------------------------------------


def _device(args: argparse.Namespace) -> str:
    """The device of the run: ``--device``, else cuda where available, else cpu."""
    import torch

    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _shapes_arg(args: argparse.Namespace, device: str) -> str:
    """``--shapes``, or its default for ``device`` (production on CUDA, smoke elsewhere)."""
    return args.shapes or ("production" if device.startswith("cuda") else "smoke")


def _plan(args: argparse.Namespace) -> tuple[list[Any], list[Any], list[Any]]:
    """``(cases, impls, broken)``: the cases in run order (every shape at bf16, then at AMP) and the impls."""
    from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
    from numcheck.impls.registry import BrokenImpl, by_kind, discover
    from numcheck.properties.production.tier import DTYPES, Case, parse_shapes

    device = _device(args)
    precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
    bad = [s for s in precisions if s not in DTYPES]
    if bad or not precisions:
        raise ValueError(f"--precisions: unknown {bad} (known: {sorted(DTYPES)})")
    shapes = parse_shapes(_shapes_arg(args, device))
    cases = [Case(s, prec, device) for prec in precisions for s in shapes]
    entries = discover(args.impl)
    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    impls = [e.impl for e in by_kind(entries, LINEAR_CE_KIND)]
    return cases, impls, broken


# -- progress file --------------------------------------------------------------------------------------------


def _events(out: Path) -> list[dict[str, Any]]:
    """The events of ``out``'s progress file in order (none without one), a line cut by a killed worker skipped."""
    path = out / PROGRESS
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a killed worker
    return events


def _clean(v: Any) -> Any:
    """JSON-safe: non-finite floats as the strings 'inf', '-inf', 'nan'."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


_CODE: list[str] = []


def _code() -> str:
    """This process's numcheck code hash and torch release, ``HASH@TORCH`` (computed once)."""
    if not _CODE:
        from numcheck.reports.common import code_identity

        ident = code_identity()
        _CODE.append(f"{ident['code']}@{ident['torch']}")
    return _CODE[0]


#: The events whose content depends on the code that made them (a result, a case's shared work).
_CODED = ("result", "case")


def _append(out: Path, event: dict[str, Any]) -> None:
    """Append ``event`` to the progress file (a result or case event tagged with :func:`_code`), synced."""
    if event.get("event") in _CODED:
        event = {**event, "code": _code()}
    with open(out / PROGRESS, "a") as f:
        f.write(json.dumps(_clean(event)) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _retry_unsettled(out: Path, keep_stale: bool = False) -> tuple[int, int]:
    """Drop from the progress file an earlier run's results whose status is in :data:`RETRIED`, and (unless
    ``keep_stale``) its results and cases recorded on other code than this run's (:func:`_code`), so that this
    run does those items again; and its ``start``/``case-start`` markers (they only tell a supervisor what is in
    flight now). ``(results retried for their status, results retried for their code)``."""
    events = _events(out)
    stale = (lambda e: e.get("event") in _CODED and e.get("code") != _code()) if not keep_stale else (lambda e: False)
    retried = [e for e in events if e.get("event") == "result" and e.get("status") in RETRIED]
    old = [e for e in events if e.get("event") == "result" and e.get("status") not in RETRIED and stale(e)]
    keep = [
        e
        for e in events
        if e.get("event") not in ("start", "case-start")
        and not (e.get("event") == "result" and e.get("status") in RETRIED)
        and not stale(e)
    ]
    if len(keep) != len(events):
        (out / PROGRESS).write_text("".join(json.dumps(e) + "\n" for e in keep))
    return len(retried), len(old)


def _start_afresh(out: Path) -> None:
    """``--force``: remove what an earlier run left in ``out`` (progress, worker logs, production.json/md, and the
    scale.json/md a run before 0.2.0 wrote)."""
    olds = [out / f"{FORMER_STEM}.json", out / f"{FORMER_STEM}.md"]
    for path in [out / PROGRESS, out / f"{STEM}.json", out / f"{STEM}.md", *olds, *out.glob("worker-*.log")]:
        path.unlink(missing_ok=True)


def _done(events: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (case, impl) items that have a result."""
    return {(e["case"], e["impl"]) for e in events if e.get("event") == "result"}


# -- the worker -----------------------------------------------------------------------------------------------


class ItemTimeout(BaseException):
    """An item ran past ``--time-cap-s`` (a BaseException, so that no impl's ``except Exception`` swallows it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise ItemTimeout()


def _work(args: argparse.Namespace) -> int:
    """Run every item not yet in the progress file, appending events; stop at the deadline."""
    import torch

    from numcheck.properties.production.tier import CaseContext, int32_first_row

    cases, impls, _ = _plan(args)
    out = args.out
    done = _done(_events(out))
    deadline = args.deadline if args.deadline is not None else math.inf
    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        signal.signal(signal.SIGALRM, _on_alarm)
    for case in cases:
        todo = [i for i in impls if (case.label, i.name) not in done]
        if not todo:
            continue
        if time.time() > deadline:
            _record_all(out, case, todo, "not_run", "the run's budget was spent")
            continue
        _append(out, {"event": "case-start", "case": case.label, "t": time.time()})
        try:
            ctx = CaseContext.build(case)
        except Exception as exc:  # the case's own work (inputs, oracle, eager) failed: no impl can be judged on it
            from numcheck.properties.core.failures import exception_lines

            why = "the case's inputs, oracle or eager run failed: " + " ".join(exception_lines(exc))
            _record_all(out, case, todo, "error", why)
            if torch.device(case.device).type == "cuda":
                torch.cuda.empty_cache()
            continue
        ctx.bounds.plan(todo)
        info = {"note": case.shape.note, "problem": repr(case.problem), **ctx.times}
        if ctx.eager_failure:
            info["eager_failure"] = ctx.eager_failure
        if case.shape.crosses_int32:
            info["int32_first_row"] = int32_first_row(case.shape.V)
        _append(out, {"event": "case", "case": case.label, **info})
        for impl in todo:
            if time.time() > deadline:
                _record_all(out, case, [impl], "not_run", "the run's budget was spent")
                continue
            _append(out, {"event": "result", **_judge_item(args, case, impl, ctx, use_alarm)})
            if torch.device(case.device).type == "cuda":
                torch.cuda.empty_cache()
        del ctx
    return 0


def _record_all(out: Path, case: Any, impls: list[Any], status: str, reason: str) -> None:
    """A result of ``status`` for each of ``impls`` on ``case``, none of them judged (``reason`` says why)."""
    for impl in impls:
        _append(
            out,
            {
                "event": "result",
                "case": case.label,
                "impl": impl.name,
                "shape": case.shape.name,
                "precision": case.precision,
                "status": status,
                "reason": reason,
            },
        )


def _judge_item(args: argparse.Namespace, case: Any, impl: Any, ctx: Any, use_alarm: bool) -> dict[str, Any]:
    """The record of ``impl`` judged on ``case`` (its context ``ctx``), under the ``--time-cap-s`` alarm where the
    platform has one: a ``timeout`` record when the item runs past it."""
    from numcheck.properties.production.tier import judge_impl

    _append(
        args.out, {"event": "start", "case": case.label, "impl": impl.name, "t": time.time(), "cap": args.time_cap_s}
    )
    if use_alarm:
        signal.setitimer(signal.ITIMER_REAL, args.time_cap_s)
    try:
        return judge_impl(impl, ctx)
    except ItemTimeout:
        return {
            "case": case.label,
            "impl": impl.name,
            "shape": case.shape.name,
            "precision": case.precision,
            "status": "timeout",
            "reason": f"interrupted after --time-cap-s {args.time_cap_s:g} s",
        }
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)


# -- the parent -----------------------------------------------------------------------------------------------


def _in_flight(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last ``start`` or ``case-start`` event with no result after it."""
    done = _done(events)
    for e in reversed(events):
        if e.get("event") == "start":
            return None if (e["case"], e["impl"]) in done else e
        if e.get("event") == "case-start":
            return e
        if e.get("event") in ("result", "case"):
            return None
    return None


def _tail(path: Path, n: int = 6) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _mark_lost(out: Path, e: dict[str, Any], status: str, why: str, impls: list[Any]) -> None:
    """Record the item (or, for a case that died while being set up, every item of it) the worker lost."""
    names = [e["impl"]] if e.get("event") == "start" else [i.name for i in impls]
    done = _done(_events(out))
    for name in names:
        if (e["case"], name) not in done:
            _append(
                out,
                {
                    "event": "result",
                    "case": e["case"],
                    "impl": name,
                    "status": status,
                    "reason": why,
                    "shape": e["case"].split("/")[0],
                    "precision": e["case"].split("/")[-1],
                },
            )


def _supervise(args: argparse.Namespace, argv: list[str]) -> None:
    """Run workers until every item has a result (see the module docstring)."""
    cases, impls, _ = _plan(args)
    total = {(c.label, i.name) for c in cases for i in impls}
    deadline = time.time() + args.budget_s if args.budget_s is not None else math.inf
    attempt = 0
    while not total <= _done(_events(args.out)):
        attempt += 1
        log = args.out / f"worker-{attempt}.log"
        cmd = [sys.executable, "-m", "numcheck.reports.production.command", *argv, "--worker"]
        if math.isfinite(deadline):
            cmd += ["--deadline", repr(deadline)]
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            killed = ""
            while proc.poll() is None:
                time.sleep(1.0)
                e = _in_flight(_events(args.out))
                if e is not None and e.get("event") == "start" and time.time() > e["t"] + e["cap"] + GRACE_S:
                    killed = f"killed: no result {e['cap'] + GRACE_S:g} s after it started (a hung kernel?)"
                elif e is not None and time.time() > deadline + GRACE_S:
                    killed = "killed: the run's budget was spent"
                if killed:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        e = _in_flight(_events(args.out))
        if e is not None:
            status = "timeout" if killed else "crashed"
            why = killed or f"the worker exited with status {proc.returncode}: {_tail(log)}"
            _mark_lost(args.out, e, status, why, impls)
        elif proc.returncode != 0 and not total <= _done(_events(args.out)):
            # It died between items (the case context, an import): nothing is in flight to blame.
            for c in cases:
                _mark_lost(
                    args.out,
                    {"event": "case-start", "case": c.label},
                    "crashed",
                    f"the worker exited with status {proc.returncode}: {_tail(log)}",
                    impls,
                )
            break
        if attempt > len(total) + 2:
            break


# -- results --------------------------------------------------------------------------------------------------


def _assemble(args: argparse.Namespace, broken: list[Any], wall: float) -> dict[str, Any]:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # no triton here: say so in the report
        triton_version = "absent"
    events = _events(args.out)
    device = _device(args)
    name = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    cases = {
        e["case"]: {k: v for k, v in e.items() if k not in ("event", "case")}
        for e in events
        if e.get("event") == "case"
    }
    records = {}
    for e in events:
        if e.get("event") == "result":
            records[(e["case"], e["impl"])] = {k: v for k, v in e.items() if k != "event"}
    recs = list(records.values())
    for b in broken:
        recs.append({"case": "-", "impl": b.name, "status": "error", "reason": f"failed to load: {b.error}"})
    meta = {
        "device": name,
        "torch": torch.__version__,
        "triton": triton_version,
        "shapes": _shapes_arg(args, device),
        "precisions": args.precisions.split(","),
        "wall_s": round(wall, 1),
        "time_cap_s": args.time_cap_s,
        "budget_s": args.budget_s,
    }
    return {"meta": meta, "cases": cases, "records": recs}


def _write(args: argparse.Namespace, data: dict[str, Any]) -> None:
    from numcheck.reports.production import md as production_md

    (args.out / f"{STEM}.json").write_text(json.dumps(_clean(data), indent=1) + "\n")
    (args.out / f"{STEM}.md").write_text(production_md.render(data))


def _worker_argv(args: argparse.Namespace) -> list[str]:
    """The options a worker is started with: this run's, without its budget (the worker gets a deadline)."""
    argv = [f"--impl={s}" for s in args.impl]
    if args.shapes:
        argv.append(f"--shapes={args.shapes}")
    argv += [
        f"--precisions={args.precisions}",
        f"--device={_device(args)}",
        f"--out={args.out}",
        f"--time-cap-s={args.time_cap_s!r}",
    ]
    return argv


def run(args: argparse.Namespace) -> int:
    """Run the tier (module docstring); the exit status."""
    try:
        cases, impls, broken = _plan(args)
    except ValueError as exc:
        print(f"numcheck production: {exc}", file=sys.stderr)
        return 2
    if args.force and args.assemble:
        print(
            "numcheck production: --force discards the progress --assemble would write from: pass one", file=sys.stderr
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        return _work(args)
    t0 = time.time()
    if args.force:
        _start_afresh(args.out)
    elif not args.assemble:
        n, old = _retry_unsettled(args.out, args.keep_stale)
        if n:
            print(
                f"numcheck production: resuming {args.out / PROGRESS}: {n} item(s) recorded {'/'.join(RETRIED)} run "
                f"again",
                file=sys.stderr,
            )
        if old:
            print(
                f"numcheck production: resuming {args.out / PROGRESS}: {old} item(s) recorded on other numcheck code or "
                f"torch run again (--keep-stale would keep them)",
                file=sys.stderr,
            )
    if args.assemble:
        if not (args.out / PROGRESS).exists():
            print(f"numcheck production: --assemble: no {PROGRESS} in {args.out}", file=sys.stderr)
            return 2
    elif args.in_process or not (args.isolate or _device(args).startswith("cuda")):
        args.deadline = t0 + args.budget_s if args.budget_s is not None else None
        _work(args)
    else:
        _supervise(args, _worker_argv(args))
    data = _assemble(args, broken, time.time() - t0)
    _write(args, data)
    from numcheck.reports.production.md import FAILING

    bad = [r for r in data["records"] if r["status"] in FAILING]
    counts: dict[str, int] = {}
    for r in data["records"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"numcheck production: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; {args.out / f'{STEM}.md'}")
    for r in bad:
        print(f"  {r['status']}: {r['impl']} on {r['case']}: {r.get('reason') or r.get('failure', '').splitlines()[0]}")
    for r in (r for r in data["records"] if r["status"] == "known"):
        print(f"  known divergence: {r['impl']} on {r['case']}: {r.get('known_divergence', '')[:160]}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m numcheck.reports.production.command ARGS``: the command as ``numcheck production ARGS`` runs it
    (how the supervisor starts its workers)."""
    common.prepare()
    parser = argparse.ArgumentParser(prog="numcheck production", description=HELP)
    add_arguments(parser)
    return common.execute(sys.modules[__name__], parser.parse_args(argv))


if __name__ == "__main__":
    # Run the importable module's main, not this __main__ copy (its dataclasses and pickles name the module).
    from numcheck.reports.production import command

    sys.exit(command.main())
