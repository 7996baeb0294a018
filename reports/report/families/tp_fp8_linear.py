"""Tensor-parallel FP8 linear (:class:`~properties.distributed.tp_fp8.cases.TPFp8Case`), per impl and recipe it declares (the
first recipe of each impl in the quick grid, every recipe in the full one): the cases of :data:`TP_CASES` (plain;
bias; sequence parallel with bias; and that with ``save_original_input=True``) in both parallel modes, at world sizes
1, 2 and 4 on the default backend, M = 64 (M/P a multiple of MXFP8's 32-row blocks at P = 2, blocks straddling
ranks at P = 4) and a sharded dimension of 4·edge, times 6 for per-tensor recipes (whole blocks in every shard at
P = 4); delayed recipes run two steps. What a declaration leaves out (dtype, parallel mode, SP,
``save_original_input``, bias, world size) or the backend cannot run here is counted with the reason; the distributed
FP8 suite records no known divergence to leave out. About 0.2 s a case.

The report's part of the tensor-parallel FP8 linear family (:class:`~reports.report.families.family.ReportFamily`).
"""

from __future__ import annotations

import time
from typing import Any

from numcheck.impls.protocols.tp_fp8_linear import TP_KIND
from numcheck.reports.common import find_impl
from numcheck.reports.report.coverage import tp_fp8_behaviours
from numcheck.reports.report.families import fp8_linear
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.grid import (
    DTYPE_NAMES,
    TP_CASES,
    TP_FREE,
    TP_M,
    TP_WORLD_SIZES,
    GridCase,
    GridSpec,
    NotRun,
)
from numcheck.reports.report.md_rows import fmt, fp8_extras, lead_cells, pass_cell, section, summarize
from numcheck.reports.report.property_grid import tp_rows
from numcheck.reports.report.schema import dtype_names, tp_record


def _tp_dtypes(spec: GridSpec, support: Any) -> list[str]:
    declared = [name for d, name in DTYPE_NAMES.items() if d in support.dtypes]
    if not declared:
        raise ValueError(f"support declares no dtype numcheck can build: {support.dtypes}")
    return declared if spec.fp8_all_dtypes else (["bfloat16"] if "bfloat16" in declared else declared[:1])


def tp_cases(spec: GridSpec, impl: Any) -> tuple[list[GridCase], NotRun]:
    """The tensor-parallel cases of ``spec`` an impl's declaration admits (module docstring), and the others
    counted and named per reason (:func:`properties.distributed.tp_fp8.cases.refusal`, a world size the backend
    cannot run here, a shape the recipe's blocks do not fit)."""
    from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
    from numcheck.properties.distributed.tp_fp8.cases import SHARD_EDGE, TPFp8Case
    from numcheck.properties.distributed.tp_fp8.cases import refusal as tp_case_refusal

    backend = default_backend()
    support = impl.support
    out: list[GridCase] = []
    not_run = NotRun()
    for recipe in support.recipes if spec.tp_all_recipes else support.recipes[:1]:
        split = 4 * SHARD_EDGE[recipe.kind] * (6 if SHARD_EDGE[recipe.kind] == 1 else 1)
        for dtype in _tp_dtypes(spec, support):
            for P in TP_WORLD_SIZES:
                for parallel in ("column", "row"):
                    K, N = (TP_FREE["column"], split) if parallel == "column" else (split, TP_FREE["row"])
                    for i, label in enumerate(spec.tp_cases):
                        try:
                            case = TPFp8Case(
                                recipe,
                                TP_M,
                                K,
                                N,
                                dtype=dtype,
                                regime="normal",
                                seed=5000 + i,
                                steps=2 if recipe.kind == "delayed" else 1,
                                world=P,
                                parallel=parallel,
                                **TP_CASES[label],
                            )
                        except ValueError as exc:
                            why: str | None = f"shape not buildable: {exc}"
                        else:
                            why = tp_case_refusal(support, case) or world_size_unavailable(P, backend)
                        sp = " SP" if TP_CASES[label]["sequence_parallel"] else ""
                        mode = f"P={P} {parallel}{sp} {dtype}"
                        if why:
                            not_run.add(f"tp:{label}", mode, f"{recipe.name} M{TP_M}K{K}N{N}", why)
                        else:
                            out.append(GridCase(f"tp:{label}", mode, case))
    return out, not_run


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """A tensor-parallel impl's cases (:func:`tp_cases`), the refused ones counted and named in ``info``."""
    cases, refused = tp_cases(spec, impl)
    info["not_declared"], info["not_run"] = dict(refused), refused.named
    return [(impl, gc) for gc in cases]


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case judged on its ranks by :func:`properties.distributed.tp_fp8.props.measure`."""
    from numcheck.properties.distributed.tp_fp8.props import measure as tp_measure

    return tp_record(impl, gc, tp_measure(impl, gc.case), time.perf_counter() - t0)


def properties() -> dict[str, Any]:
    """The tensor-parallel FP8 suite's properties by name."""
    from numcheck.properties.distributed.tp_fp8.props import DIST_FP8_PROPERTIES

    return DIST_FP8_PROPERTIES


def declaration(impl: Any) -> dict[str, Any]:
    """A tensor-parallel FP8 declaration: recipes, parallel layouts, world sizes and accumulation."""
    s = impl.support
    return {
        "dtypes": dtype_names(s.dtypes),
        "recipes": [r.name for r in s.recipes],
        "parallel": sorted(s.parallel),
        "sequence_parallel": sorted(s.sequence_parallel),
        "world_sizes": list(s.world_sizes),
        "partial_dtype": s.partial_dtype,
        "accum_unit_roundoff": s.accum_unit_roundoff,
    }


def repro(impl: Any, prop: str, case: Any) -> str:
    """The repro command of one case on its ranks (an accuracy case reruns ``dist_accuracy``)."""
    from numcheck.properties.core.failures import repro_command

    return repro_command(impl, "dist_accuracy" if prop == "accuracy" else prop, case)


def undeclared(impl: Any, case: Any) -> str | None:
    """Why ``impl``'s declaration excludes a tensor-parallel ``case`` (the suite never draws it), or ``None``:
    :func:`properties.distributed.tp_fp8.cases.refusal` (recipe, dtype, parallel mode, sequence parallel,
    ``save_original_input``, bias, world size)."""
    from numcheck.properties.distributed.tp_fp8.cases import refusal

    return refusal(impl.support, case)


def why(d: dict[str, Any]) -> str:
    """What in a tensor-parallel declaration (report.json's ``declaration``) sets its error (one line)."""
    sp = "with and without SP" if len(d.get("sequence_parallel", [])) > 1 else f"SP {d.get('sequence_parallel')}"
    return (
        f"{'/'.join(d.get('parallel', []))}-parallel {sp} over world sizes {d.get('world_sizes')}, "
        f"amaxes reduced over the group; partials of a sharded reduction in "
        f"{'the output dtype' if d.get('partial_dtype') == 'output' else 'fp32'}; {fp8_linear.why(d)}"
    )


def _mode(case: dict) -> str:
    # The layouts of one world size and dtype together (the worst case names its layout).
    return f"P={case.get('world_size')} {case['mode'].split()[-1]}"


def _extras(row: dict[str, Any], items: list[tuple[dict, dict]]) -> None:
    cases = {id(c): c for c, _ in items}.values()
    row["same_scale"] = (sum(bool(c.get("same_scale")) for c in cases), len(cases))
    fp8_extras(row, items)


def summary(report: dict) -> list[dict[str, Any]]:
    """The tensor-parallel rows of report.md: per impl × recipe × world size and dtype × output."""
    return summarize(report, TP_KIND, fp8_linear.OUTPUTS, _mode, _extras)


#: The columns of :func:`table`.
TABLE_COLUMNS: tuple[str, ...] = (
    "impl",
    "recipe",
    "world size, dtype",
    "output",
    "outputs judged",
    "accumulation pass",
    "total pass",
    "same scale",
    "worst error/bound",
    "median vs dequantized",
    "median vs original",
    "worst case",
)


def _cells(r: dict[str, Any]) -> list[str]:
    same, n_same = r["same_scale"]
    return [
        *lead_cells(r, recipe=True),
        pass_cell(r, "accumulation", flagged=True),
        pass_cell(r, "total"),
        f"{same}/{n_same}{'' if same == n_same else ' ❌'}",
        fmt(r["worst"]),
        fmt(r["median_dq"]),
        fmt(r["median_true"]),
        f"`{r['worst_case']}`",
    ]


def table(report: dict) -> list[str]:
    """The tensor-parallel FP8 summary: one row per impl, recipe, world size and dtype, and output."""
    return section(
        "### Tensor-parallel FP8 linear: per impl × recipe × world size, dtype × output",
        "Each case run on P ranks, the outputs assembled (and every other rank's copy of a replicated output, "
        "`NAME@rankR`) against the unsharded float64 oracle: *accumulation* within the sharded bound against "
        "the dequantized operands (the ranks' outputs must also assemble: replicated copies bitwise equal, "
        "delayed amaxes the group's), *total* against the original operands, *same scale*: cases whose ranks "
        "all quantized with the unsharded tensor's scales (`properties/distributed/tp_fp8/props.py`). One row holds every "
        "layout (column/row-parallel, with and without SP) of a world size; *outputs judged* counts the "
        "output over cases and ranks.",
        TABLE_COLUMNS,
        summary(report),
        _cells,
    )


def case_types() -> tuple[type, ...]:
    """A tensor-parallel case."""
    from numcheck.properties.distributed.tp_fp8.cases import TPFp8Case

    return (TPFp8Case,)


def find_tp_impl(name: str) -> Any:
    """``numcheck repro``'s impl of a tensor-parallel FP8 case (:mod:`impls.builtin.tp_fp8_linear`): a built-in by
    name, ``module:attr`` naming one impl, or the name of one loaded through ``NUMCHECK_IMPLS`` / entry points.
    ValueError naming the built-ins otherwise."""
    import importlib

    from numcheck.impls.builtin.tp_fp8_linear import tp_fp8_linear_impls

    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"impl spec {name!r} could not be loaded: {exc}") from None
        return obj
    for impl in tp_fp8_linear_impls():
        if impl.name == name:
            return impl
    try:  # one loaded through NUMCHECK_IMPLS or an entry point (the repro line of a spec naming several impls)
        impl = find_impl(name)
    except ValueError as exc:
        raise ValueError(
            f"no tensor-parallel impl named {name!r}; built-ins: {[i.name for i in tp_fp8_linear_impls()]}; {exc}"
        ) from None
    if impl.kind != TP_KIND:
        raise ValueError(f"impl {name!r} is a {impl.kind} impl but --problem is a TPFp8Case")
    return impl


FAMILY = ReportFamily(
    kind=TP_KIND,
    plan=plan,
    measure=measure,
    properties=properties,
    case_types=case_types,
    declaration=declaration,
    judgements=("accumulation", "total", "same_scale"),
    repro=repro,
    property_rows=tp_rows,
    refused=None,
    why=why,
    summary=summary,
    table=table,
    outputs=fp8_linear.OUTPUTS,
    label="TP FP8 ",
    behaviours=tp_fp8_behaviours,
    find_impl=find_tp_impl,
    repr_names=fp8_linear.repr_names,
    undeclared=undeclared,
)
