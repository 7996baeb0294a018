"""Running every loaded impl over the report grid, through the property library's judgements
(:func:`properties.linear_ce.accuracy.check_accuracy` for linear+CE, :func:`properties.fp8.props.measure_case` for
quantized linear, :func:`properties.fp8.grouped.props.measure_case` for grouped (mixture-of-experts) FP8 linears,
:func:`properties.distributed.linear_ce.props.measure` for distributed linear+CE and
:func:`properties.distributed.tp_fp8.props.measure` for tensor-parallel FP8 linears on their ranks), with a plain-text progress
bar on stderr.

Nothing is dropped: an impl that failed to load is listed as ``broken`` with its error, one that cannot run
here as ``unavailable`` with its reason, cases its declaration excludes are counted per reason, and a case
on which the impl raises is a failing record carrying the error.

The sweep runs with one torch thread: summation order inside CPU matmuls can depend on the thread count,
and the report must not (it is compared with a committed baseline).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

import torch
from tqdm import tqdm

from numcheck.impls.registry import BrokenImpl, ImplEntry
from numcheck.properties.core import poison
from numcheck.reports.report.coverage import unreached
from numcheck.reports.report.grid import (
    GridCase,
    GridSpec,
    NotRun,
    declared_cases,
    dist_cases,
    grouped_cases,
    in_declared_reduction,
    linear_ce_cases,
    many_chunk_cases,
    quant_cases,
    tp_cases,
)
from numcheck.reports.report.property_grid import PROPERTY_KINDS, property_cases
from numcheck.reports.report.schema import (
    case_text,
    declaration,
    dist_record,
    error_record,
    linear_ce_record,
    property_record,
    quant_record,
    tp_record,
)


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
        "declaration": declaration(impl),
        "not_declared": {},
    }
    return info, reason is None


def _named(found: tuple[list[GridCase], dict[str, int]]) -> tuple[list[GridCase], NotRun]:
    """Cases and refusals counted per reason (the grouped grid's) as :class:`NotRun`, each reason named once."""
    cases, counts = found
    not_run = NotRun()
    for why, n in counts.items():
        not_run.add("grouped", "", f"{n} case(s)", why)
        not_run[why] += n - 1
    return cases, not_run


def _linear_ce_plan(impl: Any, lin: list[GridCase], spec: GridSpec, device: str, info: dict) -> list:
    """A linear+CE impl's (impl, case) pairs: the fixed grid and its declared cases in the reduction it declares, less
    refused, repeated and known-divergent cases (counted and named in ``info``), then its many-chunk cases."""
    from numcheck.properties.linear_ce.known import known
    from numcheck.properties.linear_ce.strategies import refusal

    mine: list[tuple[Any, GridCase]] = []  # (impl or its with_chunk_rows variant, case)
    not_run = NotRun()
    fixed = {gc.case for gc in lin}
    seen: set[Any] = set()
    for gc in lin + [d for d in declared_cases(spec, impl, device) if d.case not in fixed]:
        case = in_declared_reduction(gc.case, impl.support.reductions)
        divergence = known(impl.name, "accuracy", case)
        why = (
            refusal(impl.support, case)
            or ("the same case in the declared reduction" if case in seen else None)
            or (divergence and f"known divergence: {divergence.reason}")
        )
        seen.add(case)
        if why:
            not_run.add(gc.group, gc.mode, gc.case.short(), why)
        else:
            mine.append((impl, gc if case is gc.case else dataclasses.replace(gc, case=case)))
    many, left_out = many_chunk_cases(spec, impl, device)
    mine += many
    not_run.merge(left_out)
    info["not_declared"], info["not_run"] = dict(not_run), not_run.named
    return mine


def _with_properties(spec: GridSpec, impl: Any, device: str, mine: list, info: dict) -> list:
    """The impl's property cases (:func:`~reports.report.property_grid.property_cases`) not already among its accuracy
    cases ``mine``; the rows and cases its declaration leaves out are added to ``info``'s counts and names."""
    extra, left_out = property_cases(spec, impl, device)
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
    (:func:`~reports.report.grid.many_chunk_cases`) run on its ``with_chunk_rows`` variant where it has one (the same
    name and declaration)."""
    infos, work = [], []
    lin = linear_ce_cases(spec, device)
    for entry in entries:
        info, runs = _impl_entry(entry, device)
        infos.append(info)
        if not runs:
            continue
        impl = entry.impl
        mine: list[tuple[Any, GridCase]] = []
        if impl.kind == "linear_ce":
            mine = _linear_ce_plan(impl, lin, spec, device, info)
        elif impl.kind in ("dist_linear_ce", "tp_quant_linear", "grouped_quant_linear"):
            by_kind = {
                "dist_linear_ce": lambda: dist_cases(spec, impl, device),
                "tp_quant_linear": lambda: tp_cases(spec, impl),
                "grouped_quant_linear": lambda: _named(grouped_cases(spec, impl, device)),
            }
            try:
                cases, refused = by_kind[impl.kind]()
            except ValueError as exc:
                info["status"], info["reason"] = "unavailable", str(exc)
                continue
            mine += [(impl, gc) for gc in cases]
            info["not_declared"], info["not_run"] = dict(refused), refused.named
        else:
            try:
                cases = quant_cases(spec, impl.support, device)
            except ValueError as exc:
                info["status"], info["reason"] = "unavailable", str(exc)
                continue
            mine += [(impl, gc) for gc in cases]
        if spec.properties and impl.kind in PROPERTY_KINDS:
            mine += _with_properties(spec, impl, device, mine, info)
        work += mine
        info["unreached"] = unreached(impl, [gc.case for _, gc in mine])
    return infos, work


def run_case(impl: Any, gc: GridCase) -> dict[str, Any]:
    """One (impl, case) record; an exception from the impl becomes an ``error`` record. The impl runs with
    uninitialised memory filled where :mod:`numcheck.properties.core.poison` says so for its kind."""
    t0 = time.perf_counter()
    if gc.prop != "accuracy":
        return _property_case(impl, gc, t0)
    try:
        with poison.judging(impl, gc.prop):  # the property cases get it through judge
            if impl.kind == "linear_ce":
                from numcheck.properties.linear_ce.accuracy import check_accuracy

                res = check_accuracy(impl, gc.case, levels=("hard", "expected"), relative=True)
                return linear_ce_record(impl, gc, res, time.perf_counter() - t0)
            if impl.kind == "dist_linear_ce":
                from numcheck.properties.distributed.linear_ce.props import measure

                comps, lines = measure(impl, gc.case)
                return dist_record(impl, gc, comps, lines, time.perf_counter() - t0)
            if impl.kind == "grouped_quant_linear":
                from numcheck.properties.fp8.grouped.props import measure_case as grouped_measure

                return quant_record(impl, gc, grouped_measure(impl, gc.case), time.perf_counter() - t0)
            if impl.kind == "tp_quant_linear":
                from numcheck.properties.distributed.tp_fp8.props import measure as tp_measure

                return tp_record(impl, gc, tp_measure(impl, gc.case), time.perf_counter() - t0)
            from numcheck.properties.fp8.props import measure_case

            res = measure_case(impl, gc.case)
            return quant_record(impl, gc, res, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - any exception is the impl's failure, recorded with its message
        return error_record(impl, gc, exc, time.perf_counter() - t0)


def property_table(kind: str) -> dict[str, Any]:
    """The property library's table of ``kind``'s properties by name (the functions the suite runs, and
    ``numcheck repro``)."""
    if kind == "linear_ce":
        from numcheck.properties.linear_ce.props import PROPERTIES
    elif kind == "quant_linear":
        from numcheck.properties.fp8.props import FP8_PROPERTIES as PROPERTIES
    elif kind == "grouped_quant_linear":
        from numcheck.properties.fp8.grouped.props import GROUPED_PROPERTIES as PROPERTIES
    elif kind == "tp_quant_linear":
        from numcheck.properties.distributed.tp_fp8.props import DIST_FP8_PROPERTIES as PROPERTIES
    else:
        from numcheck.properties.distributed.linear_ce.props import PROPERTIES
    return PROPERTIES


def _property_case(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One property case's record: the property's own function judges it, as the suite's ``judge`` runs it (an
    exception of the impl is the property's failure, ``error``); an exception of the harness is an ``error`` record."""
    from numcheck.properties.core.failures import PropertyFailure
    from numcheck.properties.core.runner import judge

    try:
        check = property_table(impl.kind)[gc.prop]
        metrics = judge(check, impl, gc.case, name=gc.prop)
    except PropertyFailure as exc:
        return property_record(impl, gc, None, exc, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - recorded with its message, never stops the sweep
        return error_record(impl, gc, exc, time.perf_counter() - t0)
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
    work = sorted(work, key=lambda w: (w[0].kind != "linear_ce", order[(w[1].prop, case_text(w[1].case))]))
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
