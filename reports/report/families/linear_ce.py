"""The report's part of the linear + cross-entropy family (:class:`~reports.report.families.family.ReportFamily`):
the fixed grid of the preset (:func:`linear_ce_cases`: size ladders, option cases and seeded random draws, from the
tables of :mod:`reports.report.grid`), each impl's declared cases (:func:`declared_cases`) and many-chunk cases
(:func:`many_chunk_cases`), in the reduction it declares, judged by :func:`properties.linear_ce.accuracy.check_accuracy`.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND, LINEAR_CE_OPTIONS, REDUCTIONS
from numcheck.properties.linear_ce.cases import Problem, dtype_of
from numcheck.reports.report.coverage import linear_ce_behaviours
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.grid import (
    DECLARED_MODE_ORDER,
    MANY_CHUNK_DTYPES,
    MODES,
    OPTION_CASES,
    OPTION_VALUES,
    RANDOM_IGNORED,
    RANDOM_REGIMES,
    RANDOM_SIZES,
    REDUCTION_ORDER,
    REDUCTION_UPSTREAM,
    GridCase,
    GridSpec,
    NotRun,
    in_declared_reduction,
    label_seed,
)
from numcheck.reports.report.md_rows import fmt, lead_cells, median, pass_cell, plain_mode, section, summarize
from numcheck.reports.report.property_grid import linear_ce_refused, linear_ce_rows
from numcheck.reports.report.schema import dtype_names, linear_ce_record


def _problem(N: int, H: int, V: int, mode: str, seed: int, device: str, **fields: Any) -> Problem:
    dtype, autocast = MODES[mode]
    return Problem(N=N, H=H, V=V, dtype=dtype, autocast=autocast, seed=seed, device=device, **fields)


def linear_ce_cases(spec: GridSpec, device: str = "cpu") -> list[GridCase]:
    """Every linear+CE case of ``spec`` (before any impl's declaration filters them), in a fixed order."""
    out: list[GridCase] = []
    seen: set[Problem] = set()

    def add(group: str, mode: str, p: Problem) -> None:
        if p not in seen:
            seen.add(p)
            out.append(GridCase(group, mode, p))

    n0, h0, v0 = spec.base
    for mode in spec.ladder_modes:
        for axis in ("N", "H", "V"):
            for size in spec.ladder:
                shape = {"N": n0, "H": h0, "V": v0, axis: size}
                group = "ladder:base" if (shape["N"], shape["H"], shape["V"]) == spec.base else f"ladder:{axis}"
                add(group, mode, _problem(shape["N"], shape["H"], shape["V"], mode, 1000 + size, device))
    n, h, v = spec.option_shape
    for mode in spec.option_modes:
        for i, label in enumerate(spec.options):
            add(f"options:{label}", mode, _problem(n, h, v, mode, 2000 + i, device, **OPTION_CASES[label]))
    for mode, p in random_problems(spec.n_random, spec.seed, device):
        add("random", mode, p)
    return out


def random_problems(n: int, seed: int, device: str = "cpu") -> list[tuple[str, Problem]]:
    """The first ``n`` problems of the seeded random sequence (mode, problem)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        mode = rng.choice(tuple(MODES))
        N, H, V = (rng.choice(RANDOM_SIZES[a]) for a in ("N", "H", "V"))
        reduction = rng.choice(("mean", "sum", "none"))
        upstream = rng.choice(("one", "per_row")) if reduction == "none" else rng.choice(("one", "scalar"))
        fields = dict(
            bias=rng.random() < 0.5,
            ignored=rng.choice(RANDOM_IGNORED),
            reduction=reduction,
            label_smoothing=rng.choice((0.0, 0.0, 0.1, 0.5)),
            class_weights=rng.random() < 0.3,
            softcap=rng.choice((None, None, 5.0, 30.0)),
            z_loss_scale=rng.choice((0.0, 0.0, 1e-4, 1e-2)),
            upstream=upstream,
            regime=rng.choice(RANDOM_REGIMES),
        )
        out.append((mode, _problem(N, H, V, mode, 3000 + len(out), device, **fields)))
    return out


def option_groups(support: Any) -> list[tuple[str, ...]]:
    """The declared options in combined groups: as many together as ``option_combinations_excluded`` allows,
    every declared option in at least one group (one group unless the declaration excludes a combination)."""
    declared = [o for o in LINEAR_CE_OPTIONS if o in support.options]
    excluded = support.option_combinations_excluded
    groups: list[tuple[str, ...]] = []
    left = list(declared)
    while left:
        group: list[str] = []
        for o in [*left, *(d for d in declared if d not in left)]:
            if not any(combo <= {*group, o} for combo in excluded):
                group.append(o)
        if not set(group) & set(left):  # left[0] is excluded on its own: no case can hold it
            left = left[1:]
            continue
        groups.append(tuple(o for o in declared if o in group))
        left = [o for o in left if o not in group]
    return groups


def declared_option_cases(support: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, Problem fields) of the declared cases of a linear+CE declaration (module docstring): each declared
    option alone (at the first declared reduction), each other declared reduction alone, every combined group of
    :func:`option_groups` of two or more options at every declared reduction, and an all-ignored batch where
    declared."""
    reductions = [r for r in REDUCTIONS if r in support.reductions]
    base = reductions[0]

    def at(r: str) -> dict[str, Any]:
        return dict(reduction=r, upstream=REDUCTION_UPSTREAM[r])

    out = [(o, {**OPTION_VALUES[o], **at(base)}) for o in LINEAR_CE_OPTIONS if o in support.options]
    out += [(f"reduction={r}", at(r)) for r in reductions if r != base]
    for group in option_groups(support):
        if len(group) > 1:
            fields = {k: v for o in group for k, v in OPTION_VALUES[o].items()}
            out += [(f"{'+'.join(group)}+{r}", {**fields, **at(r)}) for r in reductions]
    if support.all_ignored is not None and "ignore_index" in support.options:
        out.append(("all_ignored", dict(ignored=1.0, **at(base))))
    return out


def _declared_modes(spec: GridSpec, impl: Any, p: Problem) -> tuple[str, ...]:
    """The dtype modes a declared case ``p`` runs in for ``impl``: the grid's option modes in which the declaration
    admits it and no recorded known divergence of the impl covers it (:mod:`properties.core.known`, left out of the
    suite's draws too), else the first such mode of :data:`DECLARED_MODE_ORDER`, else the first mode it declares,
    else the option modes (in those two the plan names it as not run, with the reason)."""
    from numcheck.properties.linear_ce.known import known
    from numcheck.properties.linear_ce.strategies import refusal

    def declared(mode: str) -> bool:
        return refusal(impl.support, p.replace(dtype=MODES[mode][0], autocast=MODES[mode][1])) is None

    def runs(mode: str) -> bool:
        q = p.replace(dtype=MODES[mode][0], autocast=MODES[mode][1])
        return declared(mode) and known(impl.name, "accuracy", q) is None

    modes = tuple(m for m in spec.option_modes if runs(m))
    order = (*spec.option_modes, *DECLARED_MODE_ORDER)
    return modes or next(((m,) for f in (runs, declared) for m in order if f(m)), spec.option_modes)


def declared_cases(spec: GridSpec, impl: Any, device: str = "cpu") -> list[GridCase]:
    """An impl's declared linear+CE cases (module docstring), at the grid's declared shape, each in
    :func:`_declared_modes`."""
    if not spec.declared:
        return []
    n, h, v = spec.declared_shape
    out = []
    for label, fields in declared_option_cases(impl.support):
        p = _problem(n, h, v, "float32", label_seed(6000, label), device, **fields)
        out += [
            GridCase(f"declared:{label}", mode, p.replace(dtype=MODES[mode][0], autocast=MODES[mode][1]))
            for mode in _declared_modes(spec, impl, p)
        ]
    return out


#: The upstream gradient of a many-chunk case at each reduction: one that reaches every chunk alike, so the chunks'
#: partial sums of grad_weight share a sign on post-norm rows and a narrow running sum's roundings add up (a per-row
#: upstream gives partials of either sign, where one can pass: properties.linear_ce.suite's covering rows).
MANY_CHUNK_UPSTREAM: dict[str, str] = {"mean": "one", "sum": "scalar", "none": "one"}


def many_chunk_shape(layout: Any, chunks_wanted: int) -> tuple[int, int, int]:
    """(N, H, V) of a many-chunk case of ``chunks_wanted`` chunks of ``layout``
    (:class:`properties.linear_ce.chunks.Layout`): a declared rule's cheapest shape (:func:`~properties.linear_ce.chunks.
    rule_shapes`), else the fewest rows of :meth:`~properties.linear_ce.chunks.Layout.n_range` with the largest V and H the
    suite's draws take at that N (:func:`~properties.linear_ce.chunks.v_cap`, at least
    :data:`~properties.linear_ce.chunks.MANY_CHUNK_MIN_V` and :data:`~properties.linear_ce.chunks.MANY_CHUNK_MIN_H`): few
    classes and hidden features, so grad_weight's error comes from the sum across chunks."""
    from numcheck.properties.linear_ce import chunks

    if layout.rule is not None:
        return chunks.rule_shapes(layout.rule, chunks_wanted, chunks.MANY_CHUNK_MIN_H, chunks.MANY_CHUNK_MIN_V)[0]
    N = layout.n_range(chunks_wanted)[0]
    V = max(chunks.MANY_CHUNK_MIN_V, chunks.v_cap(N))
    return N, max(chunks.MANY_CHUNK_MIN_H, min(chunks.MAX_H, V // 3)), V


def many_chunk_cases(spec: GridSpec, impl: Any, device: str = "cpu") -> tuple[list[tuple[Any, GridCase]], NotRun]:
    """A linear+CE impl's many-chunk cases (module docstring) as ``(impl to run, case)``: the impl's
    ``with_chunk_rows`` variant where the layout takes it (:func:`properties.linear_ce.strategies.many_chunk_layout`, as
    the suite's ``test_many_chunks``), else the impl; and the cases it does not run, named with the reason (a dtype or
    reduction it does not declare, a recorded known divergence of its ``many_chunks`` draws, or, for a slow impl, a
    dtype past its coarsest or a reduction past its first)."""
    from numcheck.properties.linear_ce import chunks
    from numcheck.properties.linear_ce.known import known
    from numcheck.properties.linear_ce.strategies import many_chunk_layout, refusal

    not_run = NotRun()
    if not spec.many_chunks:
        return [], not_run
    s = impl.support
    lay = many_chunk_layout(impl)
    slow = bool(s.slow)
    coarsest = next((d for d in MANY_CHUNK_DTYPES if dtype_of(d) in s.dtypes), None)
    first = next((r for r in REDUCTION_ORDER if r in s.reductions), None)
    out: list[tuple[Any, GridCase]] = []
    for dtype in MANY_CHUNK_DTYPES:
        k = chunks.many_chunks(dtype, lay.rows, slow)
        N, H, V = many_chunk_shape(lay, k)
        for red in [r for r in REDUCTION_ORDER if r in s.reductions]:
            p = Problem(
                N=N,
                H=H,
                V=V,
                dtype=dtype,
                reduction=red,
                upstream=MANY_CHUNK_UPSTREAM[red],
                regime="post_norm",
                seed=label_seed(7000, f"{dtype}+{red}"),
                device=device,
            )
            divergence = known(lay.impl.name, "many_chunks", p)
            why = (
                refusal(s, p)
                or (divergence and f"known divergence: {divergence.reason}")
                or (
                    f"declared slow: its many-chunk cases run in {coarsest} and {first!r} only, {k} chunks "
                    "(numcheck.properties.linear_ce.chunks.many_chunks), as the suite's draws"
                    if slow and (dtype, red) != (coarsest, first)
                    else None
                )
            )
            gc = GridCase("many_chunks", dtype, p, chunks=lay.describe(N, H, V))
            if why:
                not_run.add(gc.group, gc.mode, p.short(), why)
            else:
                out.append((lay.impl, gc))
    return out, not_run


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """A linear+CE impl's (impl, case) pairs: the fixed grid and its declared cases in the reduction it declares, less
    refused, repeated and known-divergent cases (counted and named in ``info``), then its many-chunk cases."""
    from numcheck.properties.linear_ce.known import known
    from numcheck.properties.linear_ce.strategies import refusal

    lin = linear_ce_cases(spec, device)  # the fixed grid (a few ms)
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


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case judged by :func:`properties.linear_ce.accuracy.check_accuracy` (hard and expected bounds, relative)."""
    from numcheck.properties.linear_ce.accuracy import check_accuracy

    res = check_accuracy(impl, gc.case, levels=("hard", "expected"), relative=True)
    return linear_ce_record(impl, gc, res, time.perf_counter() - t0)


def properties() -> dict[str, Any]:
    """The linear+CE suite's properties by name."""
    from numcheck.properties.linear_ce.props import PROPERTIES

    return PROPERTIES


#: The outputs of a linear+CE case, in table and plot column order.
OUTPUTS: tuple[str, ...] = ("loss", "z_loss", "grad_x", "grad_weight", "grad_bias")


def declaration(impl: Any) -> dict[str, Any]:
    """A linear+CE declaration: its domain and the accumulation and precision paths the bounds follow."""
    s = impl.support
    return {
        "dtypes": dtype_names(s.dtypes),
        "autocast": dtype_names(s.autocast),
        "devices": sorted(s.devices),
        "options": sorted(s.options),
        "reductions": sorted(s.reductions),
        "all_ignored": s.all_ignored,
        "grad_accumulation": s.grad_accumulation,
        "chunk_rows": s.chunk_rows,
        "grad_x_accumulation": s.grad_x_accumulation,
        "chunk_cols": s.chunk_cols,
        "logits_dtype": s.logits_dtype,
        "ce_dtype": s.ce_dtype,
    }


def repro(impl: Any, prop: str, case: Any) -> str:
    """The ``numcheck repro`` command of one case (:func:`properties.core.failures.repro_command`)."""
    from numcheck.properties.core.failures import repro_command

    return repro_command(impl, prop, case)


def why(d: dict[str, Any]) -> str:
    """What in a linear+CE declaration (report.json's ``declaration``) sets its error (one line)."""
    acc = {
        "fp32": "grad_W accumulated in fp32",
        "per_chunk_rounding": "each chunk's grad_W product rounded to the compute dtype (bound + u_c)",
        "param_dtype": "grad_W running sum kept in the parameter dtype (bound + K·u_p)",
    }.get(d.get("grad_accumulation"), "")
    if d.get("grad_accumulation") == "param_dtype" and d.get("chunk_rows") is None:
        acc += ", chunk count undeclared (K = N assumed)"
    if d.get("grad_x_accumulation", "fp32") != "fp32":
        acc += f"; grad_x summed over vocabulary chunks ({d['grad_x_accumulation']}, " + (
            f"{d['chunk_cols']} classes each)" if d.get("chunk_cols") else "one per class assumed)"
        )
    logits = "logits in fp32" if d.get("logits_dtype") == "float32" else "logits in the compute dtype"
    ce = "; softmax/gradient arithmetic in the compute dtype" if d.get("ce_dtype") == "compute" else ""
    return f"{acc}; {logits}{ce}"


def _extras(row: dict[str, Any], items: list[tuple[dict, dict]]) -> None:
    row["rmse_vs_eager"] = median(
        o["relative"]["rmse_impl"] / o["relative"]["rmse_eager"]
        for _, o in items
        if "relative" in o and o["relative"]["rmse_eager"] > 0
    )


def summary(report: dict) -> list[dict[str, Any]]:
    """The linear+CE rows of report.md: per impl × dtype mode × output, with the RMSE against eager."""
    return summarize(report, LINEAR_CE_KIND, OUTPUTS, plain_mode, _extras)


#: The columns of :func:`table`.
TABLE_COLUMNS: tuple[str, ...] = (
    "impl",
    "dtype",
    "output",
    "cases",
    "analytic pass",
    "relative pass",
    "worst error/bound",
    "median",
    "median (expected)",
    "max ULP",
    "RMSE vs eager (median)",
    "worst case",
)


def table(report: dict) -> list[str]:
    """The linear+CE summary: one row per impl, dtype mode and output (none without such cases)."""
    return section(
        "### Linear + cross-entropy: per impl × dtype × output",
        "Pass counts are *analytic* / *relative* (relative counts only judged outputs). Error/bound at the "
        "hard level; *expected* is the median at the √n level.",
        TABLE_COLUMNS,
        summary(report),
        lambda r: [
            *lead_cells(r),
            pass_cell(r, "analytic", flagged=True),
            pass_cell(r, "relative") if r["judged"].get("relative") else "not judged",
            fmt(r["worst"]),
            fmt(r["median"]),
            fmt(r["median_expected"]),
            fmt(r["max_ulp"]),
            fmt(r["rmse_vs_eager"]),
            f"`{r['worst_case']}`",
        ],
    )


def case_types() -> tuple[type, ...]:
    """A linear+CE case: a :class:`~properties.linear_ce.cases.Problem`."""
    from numcheck.properties.linear_ce.cases import Problem

    return (Problem,)


def undeclared(impl: Any, case: Problem) -> str | None:
    """Why ``impl``'s declaration excludes ``case`` (:func:`properties.linear_ce.strategies.refusal`: the suite never
    draws it), or ``None``."""
    from numcheck.properties.linear_ce.strategies import refusal

    return refusal(impl.support, case)


FAMILY = ReportFamily(
    kind=LINEAR_CE_KIND,
    plan=plan,
    measure=measure,
    properties=properties,
    case_types=case_types,
    declaration=declaration,
    judgements=("analytic", "relative"),
    repro=repro,
    property_rows=linear_ce_rows,
    refused=linear_ce_refused,
    why=why,
    summary=summary,
    table=table,
    outputs=OUTPUTS,
    label="",
    behaviours=linear_ce_behaviours,
    undeclared=undeclared,
)
