"""Running every loaded impl over the report grid, through the property library's judgements (each kind's
cases, judgement and record from its family, :data:`reports.report.families.FAMILIES`), with a plain-text progress
bar on stderr.

Nothing is dropped: an impl that failed to load is listed as ``broken`` with its error, one that cannot run
here as ``unavailable`` with its reason, cases its declaration excludes are counted per reason, and a case
on which the impl raises is a failing record carrying the error.

The sweep runs with one torch thread: summation order inside CPU matmuls can depend on the thread count,
and the report must not (it is compared with a committed baseline).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

import torch
from tqdm import tqdm

from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.impls.registry import BrokenImpl, ImplEntry
from numcheck.properties.core import poison
from numcheck.reports.report.coverage import unreached
from numcheck.reports.report.families import FAMILIES
from numcheck.reports.report.grid import GridCase, GridSpec
from numcheck.reports.report.property_grid import property_cases
from numcheck.reports.report.schema import case_text, error_record, property_record


class Progress:
    """A tqdm progress bar on a text stream, one step per (impl, case): redrawn in place on a terminal, a line at
    most every 15 s otherwise (CI logs)."""

    def __init__(self, total: int, stream: TextIO | None = None, label: str = "report", enabled: bool = True) -> None:
        stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(stream, "isatty", lambda: False)())
        self.bar = tqdm(
            total=max(total, 0),
            desc=label,
            file=stream,
            disable=not enabled or total <= 0,
            mininterval=0.2 if tty else 15.0,
            dynamic_ncols=tty,
            ascii=not tty,
        )

    def step(self, note: str = "") -> None:
        """Count one unit of work done (``note``: what it was)."""
        self.bar.set_postfix_str(note[:60], refresh=False)
        self.bar.update(1)
        if self.bar.n >= (self.bar.total or 0):
            self.bar.close()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch with one intra-op thread inside the block (restored after)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@dataclass
class SweepResult:
    """The impl entries and the case records of one sweep."""

    impls: list[dict[str, Any]] = field(default_factory=list)
    cases: list[dict[str, Any]] = field(default_factory=list)


def _impl_entry(entry: ImplEntry | BrokenImpl, device: str) -> tuple[dict[str, Any], bool]:
    if isinstance(entry, BrokenImpl):
        return (
            {
                "name": entry.name,
                "kind": None,
                "origin": entry.origin,
                "status": "broken",
                "reason": entry.error,
                "description": "",
                "declaration": {},
                "not_declared": {},
            },
            False,
        )
    impl = entry.impl
    reason = impl.support.unavailable_reason()
    dev = torch.device(device).type
    if reason is None and hasattr(impl.support, "devices") and dev not in impl.support.devices:
        reason = f"device {dev} not declared (declares {sorted(impl.support.devices)})"
    info = {
        "name": impl.name,
        "kind": impl.kind,
        "origin": entry.origin,
        "status": "unavailable" if reason else "ran",
        "reason": reason or "",
        "description": getattr(impl, "description", "") or "",
        "declaration": FAMILIES[impl.kind].declaration(impl),
        "not_declared": {},
    }
    return info, reason is None


def _with_properties(spec: GridSpec, impl: Any, device: str, mine: list, info: dict) -> list:
    """The impl's property cases (:func:`~reports.report.property_grid.property_cases`) not already among its accuracy
    cases ``mine``; the rows and cases its declaration leaves out are added to ``info``'s counts and names."""
    family = FAMILIES[impl.kind]
    extra, left_out = property_cases(spec, impl, family.property_rows(), family.refused, device)
    have = {(gc.prop, gc.case) for _, gc in mine}
    fresh = []
    for runner, gc in extra:
        if (gc.prop, gc.case) not in have:
            have.add((gc.prop, gc.case))
            fresh.append((runner, gc))
    counts = Counter(info.get("not_declared") or {})
    counts.update(dict(left_out))
    info["not_declared"] = dict(counts)
    info["not_run"] = list(info.get("not_run") or []) + left_out.named
    return fresh


def plan(
    entries: list[ImplEntry | BrokenImpl], spec: GridSpec, device: str
) -> tuple[list[dict], list[tuple[Any, GridCase]]]:
    """The impl entries and the (impl, case) pairs to run, in order; refused cases, and cases a recorded known
    divergence of the impl covers (:mod:`properties.linear_ce.known`, left out of the suite's draws too), are counted per
    reason (``not_declared``) and named (``not_run``). A linear+CE impl's many-chunk cases
    (:func:`~reports.report.families.linear_ce.many_chunk_cases`) run on its ``with_chunk_rows`` variant where it has one (the same
    name and declaration)."""
    infos, work = [], []
    for entry in entries:
        info, runs = _impl_entry(entry, device)
        infos.append(info)
        if not runs:
            continue
        impl = entry.impl
        try:
            mine = FAMILIES[impl.kind].plan(spec, impl, device, info)
        except ValueError as exc:  # no case of its kind can be built from its declaration here
            info["status"], info["reason"] = "unavailable", str(exc)
            continue
        if spec.properties:
            mine += _with_properties(spec, impl, device, mine, info)
        work += mine
        info["unreached"] = unreached(FAMILIES[impl.kind].behaviours(impl), [gc.case for _, gc in mine])
    return infos, work


def run_case(impl: Any, gc: GridCase) -> dict[str, Any]:
    """One (impl, case) record; an exception from the impl becomes an ``error`` record. The impl runs with
    uninitialised memory filled where :mod:`numcheck.properties.core.poison` says so for its kind."""
    t0 = time.perf_counter()
    if gc.prop != "accuracy":
        return _property_case(impl, gc, t0)
    try:
        with poison.judging(impl, gc.prop):  # the property cases get it through judge
            return FAMILIES[impl.kind].measure(impl, gc, t0)
    except Exception as exc:  # noqa: BLE001 - any exception is the impl's failure, recorded with its message
        return _error_record(impl, gc, exc, t0)


def _error_record(impl: Any, gc: GridCase, exc: BaseException, t0: float) -> dict[str, Any]:
    """The record of a case the impl raised on, with its family's judgements and repro command."""
    family = FAMILIES[impl.kind]
    return error_record(impl, gc, exc, time.perf_counter() - t0, family.judgements, family.repro)


def property_table(kind: str) -> dict[str, Any]:
    """The property library's table of ``kind``'s properties by name (the functions the suite runs, and
    ``numcheck repro``), from its family (:data:`reports.report.families.FAMILIES`)."""
    return FAMILIES[kind].properties()


def _property_case(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One property case's record: the property's own function judges it, as the suite's ``judge`` runs it (an
    exception of the impl is the property's failure, ``error``); an exception of the harness is an ``error`` record."""
    from numcheck.errors import PropertyFailure
    from numcheck.properties.core.runner import judge

    try:
        check = property_table(impl.kind)[gc.prop]
        metrics = judge(check, impl, gc.case, name=gc.prop)
    except PropertyFailure as exc:
        return property_record(impl, gc, None, exc, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - recorded with its message, never stops the sweep
        return _error_record(impl, gc, exc, t0)
    return property_record(impl, gc, metrics, None, time.perf_counter() - t0)


def sweep(
    entries: list[ImplEntry | BrokenImpl],
    spec: GridSpec,
    device: str = "cpu",
    *,
    progress: bool = True,
    stream: TextIO | None = None,
) -> SweepResult:
    """Run every runnable impl on every case of ``spec`` it declares (module docstring)."""
    infos, work = plan(entries, spec, device)
    # Cases in the outer loop (eager's error on each problem is computed once, shared by every impl).
    order: dict[tuple[str, str], int] = {}
    for i, (_, gc) in enumerate(work):
        order.setdefault((gc.prop, case_text(gc.case)), i)
    work = sorted(work, key=lambda w: (w[0].kind != LINEAR_CE_KIND, order[(w[1].prop, case_text(w[1].case))]))
    bar = Progress(len(work), stream, label=f"numcheck report ({spec.name})", enabled=progress)
    records = []
    with one_thread():
        for impl, gc in work:
            rec = run_case(impl, gc)
            records.append(rec)
            bar.step(f"{impl.name} {gc.case.short()}")
    rank = {info["name"]: i for i, info in enumerate(infos)}
    records.sort(key=lambda r: (rank.get(r["impl"], 0), order.get((r["property"], r["case"]), 0)))
    return SweepResult(infos, records)
