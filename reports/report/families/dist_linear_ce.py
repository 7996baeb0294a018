"""Distributed linear+CE (:class:`~properties.distributed.linear_ce.cases.DistCase`), per impl: the cases of :data:`DIST_CASES` (a
plain fp32 one, bf16 with bias, ignored rows and ``sum``, and label smoothing with targets on shard boundaries) at
world sizes 1, 2 and 4 on the default backend (gloo on CPU), each inside the impl's declaration; then the declared
cases (:func:`dist_declared`): each declared option and reduction on its own and all declared options together at
every declared reduction, at the largest of those world sizes the impl declares, and where it declares
``uneven_vocab`` all its declared options with targets on shard boundaries at V = :data:`DIST_UNEVEN_V` (uneven
shards at every world size above 1) at every declared world size above 1. The world sizes it does not declare or
the backend cannot run here are counted and named with the reason. About 0.1 s a case.

The report's part of the vocabulary-parallel linear+CE family (:class:`~reports.report.families.family.ReportFamily`).
"""

from __future__ import annotations

import time
from typing import Any

from numcheck.impls.protocols.dist_linear_ce import DIST_KIND
from numcheck.impls.protocols.linear_ce import REDUCTIONS
from numcheck.properties.linear_ce.cases import Problem, dtype_of
from numcheck.reports.common import find_impl
from numcheck.reports.report.coverage import dist_behaviours
from numcheck.reports.report.families import linear_ce
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.families.linear_ce import declared_option_cases, option_groups
from numcheck.reports.report.grid import (
    DIST_CASES,
    DIST_SHAPE,
    DIST_UNEVEN_V,
    DIST_WORLD_SIZES,
    OPTION_VALUES,
    REDUCTION_UPSTREAM,
    GridCase,
    GridSpec,
    NotRun,
    in_declared_reduction,
    label_seed,
)
from numcheck.reports.report.md_rows import fmt, lead_cells, pass_cell, plain_mode, section, summarize
from numcheck.reports.report.property_grid import dist_refused, dist_rows
from numcheck.reports.report.schema import dist_record, dtype_names


def dist_declared(spec: GridSpec, impl: Any) -> list[tuple[str, dict[str, Any], str, int, int]]:
    """(group, Problem fields, placement, V, world size) of a distributed impl's declared cases (module docstring):
    its declared options and reductions alone and combined at the largest world size of :data:`DIST_WORLD_SIZES` it
    declares, and each combined group with targets on shard boundaries at V = :data:`DIST_UNEVEN_V` at every world
    size above 1 (refused, with the reason, where ``uneven_vocab`` or the world size is not declared)."""
    s = impl.support
    dtype = next((d for d in ("float32", "bfloat16", "float16") if dtype_of(d) in s.dtypes), None)
    if not spec.declared or dtype is None:
        return []
    top = max((P for P in DIST_WORLD_SIZES if P in impl.dist.world_sizes), default=max(DIST_WORLD_SIZES))
    V = DIST_SHAPE[2]
    out = [
        (f"dist:declared:{label}", dict(dtype=dtype, **fields), "as_built", V, top)
        for label, fields in declared_option_cases(s)
    ]
    base = [r for r in REDUCTIONS if r in s.reductions][0]
    for group in option_groups(s) or [()]:
        fields = {k: v for o in group for k, v in OPTION_VALUES[o].items()}
        label = f"dist:uneven:{'+'.join(group) or 'plain'}+{base}"
        out += [
            (
                label,
                dict(dtype=dtype, reduction=base, upstream=REDUCTION_UPSTREAM[base], **fields),
                "boundary",
                DIST_UNEVEN_V,
                P,
            )
            for P in DIST_WORLD_SIZES
            if P > 1
        ]
    return out


def dist_cases(spec: GridSpec, impl: Any, device: str = "cpu") -> tuple[list[GridCase], NotRun]:
    """The distributed cases of ``spec`` an impl's declaration admits at each of :data:`DIST_WORLD_SIZES` and its
    declared cases (:func:`dist_declared`), and the others counted and named per reason (an undeclared option or
    dtype, world size, backend or uneven shards, ranks the backend cannot run here, or a recorded known divergence
    of the impl, :data:`properties.distributed.linear_ce.known.DIST_KNOWN`)."""
    from numcheck.properties.distributed.linear_ce.cases import DistCase
    from numcheck.properties.distributed.linear_ce.suite import known_divergence
    from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
    from numcheck.properties.linear_ce.strategies import refusal

    backend = default_backend()
    out: list[GridCase] = []
    not_run = NotRun()
    N, H, V0 = DIST_SHAPE
    planned = [
        (f"dist:{label}", DIST_CASES[label][0], DIST_CASES[label][1], V0, P, 4000 + i)
        for P in DIST_WORLD_SIZES
        for i, label in enumerate(spec.dist_cases)
    ]
    planned += [(g, f, pl, V, P, label_seed(4100, g)) for g, f, pl, V, P in dist_declared(spec, impl)]
    for group, fields, placement, V, P, seed in planned:
        p = in_declared_reduction(Problem(N=N, H=H, V=V, seed=seed, device=device, **fields), impl.support.reductions)
        why = (
            refusal(impl.support, p)
            or (f"world size {P} not declared" if P not in impl.dist.world_sizes else None)
            or (f"backend {backend} not declared" if backend not in impl.dist.backends else None)
            or (
                f"uneven shards (V={V} over {P} ranks) not declared (uneven_vocab=False)"
                if V % P and not impl.dist.uneven_vocab
                else None
            )
            or world_size_unavailable(P, backend)
        )
        case = None if why else DistCase(p, P, backend, placement)
        known = known_divergence(impl, case) if case is not None else None
        mode = f"P={P} {p.dtype}"
        if why:
            not_run.add(group, mode, p.short(), why)
        elif known:  # a recorded defect of the impl, as the suite leaves it out of its draws: counted, not run
            not_run.add(group, mode, p.short(), f"known divergence: {known}")
        else:
            out.append(GridCase(group, mode, case))
    return out, not_run


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """A distributed impl's cases (:func:`dist_cases`), the refused ones counted and named in ``info``."""
    cases, refused = dist_cases(spec, impl, device)
    info["not_declared"], info["not_run"] = dict(refused), refused.named
    return [(impl, gc) for gc in cases]


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case judged on its ranks by :func:`properties.distributed.linear_ce.props.measure`."""
    from numcheck.properties.distributed.linear_ce.props import measure as dist_measure

    comps, lines = dist_measure(impl, gc.case)
    return dist_record(impl, gc, comps, lines, time.perf_counter() - t0)


def properties() -> dict[str, Any]:
    """The distributed linear+CE suite's properties by name."""
    from numcheck.properties.distributed.linear_ce.props import PROPERTIES

    return PROPERTIES


#: The outputs of a distributed linear+CE case, in plot column order.
OUTPUTS: tuple[str, ...] = ("loss", "grad_x", "grad_weight", "grad_bias")


def declaration(impl: Any) -> dict[str, Any]:
    """A distributed linear+CE declaration: the linear+CE domain and how it is distributed (world sizes, backends,
    uneven vocabularies, smoothing, the dtype grad_x is reduced in)."""
    s = impl.support
    d = impl.dist
    return {
        "dtypes": dtype_names(s.dtypes),
        "devices": sorted(s.devices),
        "options": sorted(s.options),
        "reductions": sorted(s.reductions),
        "all_ignored": s.all_ignored,
        "logits_dtype": s.logits_dtype,
        "ce_dtype": s.ce_dtype,
        "world_sizes": list(d.world_sizes),
        "backends": list(d.backends),
        "uneven_vocab": d.uneven_vocab,
        "smoothing": d.smoothing,
        "grad_x_reduce_dtype": d.grad_x_reduce_dtype,
    }


def repro(impl: Any, prop: str, case: Any) -> str:
    """The repro command of one case on its ranks (an accuracy case reruns ``dist_accuracy``)."""
    from numcheck.properties.distributed.linear_ce.props import repro_command

    return repro_command(impl, "dist_accuracy" if prop == "accuracy" else prop, case)


def why(d: dict[str, Any]) -> str:
    """What in a distributed declaration (report.json's ``declaration``) sets its error (one line)."""
    return (
        f"vocabulary sharded over world sizes {d.get('world_sizes')} on {', '.join(d.get('backends', []))}; "
        f"grad_x all-reduced in {d.get('grad_x_reduce_dtype')}; smoothing convention {d.get('smoothing')}; "
        f"logits in {'fp32' if d.get('logits_dtype') == 'float32' else 'the compute dtype'}"
    )


def summary(report: dict) -> list[dict[str, Any]]:
    """The distributed rows of report.md: per impl × world size and dtype × output (linear+CE's output order)."""
    return summarize(report, DIST_KIND, linear_ce.OUTPUTS, plain_mode, lambda row, items: None)


def table(report: dict) -> list[str]:
    """The distributed linear+CE summary: one row per impl, world size and dtype, and output."""
    return section(
        "### Distributed linear + cross-entropy: per impl × world size × dtype × output",
        "Each case run on P gloo ranks, the assembled outputs (and every other rank's grad_x, `grad_x@rankR`) "
        "against the unsharded float64 oracle under the sharded model's bound "
        "(`properties/distributed/linear_ce/tolerance.py`); every rank's loss must also be bitwise rank 0's.",
        (
            "impl",
            "world size, dtype",
            "output",
            "cases",
            "analytic pass",
            "worst error/bound",
            "median",
            "max ULP",
            "worst case",
        ),
        summary(report),
        lambda r: [
            *lead_cells(r),
            pass_cell(r, "analytic", flagged=True),
            fmt(r["worst"]),
            fmt(r["median"]),
            fmt(r["max_ulp"]),
            f"`{r['worst_case']}`",
        ],
    )


def case_types() -> tuple[type, ...]:
    """A distributed linear+CE case."""
    from numcheck.properties.distributed.linear_ce.cases import DistCase

    return (DistCase,)


def find_dist_impl(name: str) -> Any:
    """``numcheck repro``'s impl of a distributed linear+CE case: ``module:NAME`` as its failure's own repro line
    names it (one of the module's ``dist_impls()``, or the attribute), or the name of a built-in or of one loaded
    through ``NUMCHECK_IMPLS`` / entry points. ValueError saying what was found otherwise."""
    if ":" in name:
        from numcheck.properties.distributed.linear_ce.props import load_impl

        try:
            return load_impl(name)
        except (ImportError, ValueError) as exc:
            raise ValueError(f"impl spec {name!r} could not be loaded: {exc}") from None
    impl = find_impl(name)
    if impl.kind != DIST_KIND:
        raise ValueError(f"impl {name!r} is a {impl.kind} impl but --problem is a DistCase")
    return impl


FAMILY = ReportFamily(
    kind=DIST_KIND,
    plan=plan,
    measure=measure,
    properties=properties,
    case_types=case_types,
    declaration=declaration,
    judgements=("analytic",),
    repro=repro,
    property_rows=dist_rows,
    refused=dist_refused,
    why=why,
    summary=summary,
    table=table,
    outputs=OUTPUTS,
    label="distributed ",
    behaviours=dist_behaviours,
    find_impl=find_dist_impl,
)
