"""Quantized linear (:class:`~properties.fp8.cases.Fp8Case`), per impl and recipe it declares: an (M, K, N)
ladder with the same span (K: y, N: dgrad, M: wgrad and bgrad), the input regimes ``wide`` and
``outlier`` at the base shape, and in the full grid every declared dtype, the edge regimes (``zeros``,
``tiny``, ``nan``, ``inf``), ``save_original_input=True`` and three delayed-scaling steps; each shape rounded up into
the impl's declared ``dim_multiple``.

The report's part of the quantized-linear family (:class:`~reports.report.families.family.ReportFamily`).
"""

from __future__ import annotations

import math
import time
from shlex import quote
from typing import Any, Iterator

from numcheck.impls.protocols.fp8_linear import FP8_KIND
from numcheck.properties.fp8.cases import Fp8Case, declared_mode
from numcheck.properties.fp8.shapes import fitted
from numcheck.reports.report.coverage import fp8_behaviours
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.grid import DTYPE_NAMES, GridCase, GridSpec
from numcheck.reports.report.md_rows import (
    fmt,
    fp8_extras,
    lead_cells,
    median,
    pass_cell,
    plain_mode,
    section,
    summarize,
)
from numcheck.reports.report.property_grid import fp8_refused, fp8_rows
from numcheck.reports.report.schema import dtype_names, fp8_record


def _fp8_ladder(spec: GridSpec, recipe: Any, dtype: str, bias: bool, device: str) -> Iterator[tuple[str, Fp8Case]]:
    """The size ladder of one recipe and dtype: each of M, K, N walked over ``spec.fp8_ladder`` from the base."""
    m0, k0, n0 = spec.fp8_base
    for axis in ("M", "K", "N"):
        for size in spec.fp8_ladder:
            shape = {"M": m0, "K": k0, "N": n0, axis: size}
            base = (shape["M"], shape["K"], shape["N"]) == spec.fp8_base
            case = Fp8Case(
                recipe, shape["M"], shape["K"], shape["N"], dtype=dtype, bias=bias, seed=100 + size, device=device
            )
            yield ("ladder:base" if base else f"ladder:{axis}"), case


def _fp8_extras(
    support: Any, recipe: Any, base: tuple[int, int, int], dtype: str, bias: bool, device: str
) -> Iterator[tuple[str, Fp8Case]]:
    """The declared extras of one recipe and dtype: save_original_input, and three steps of delayed scaling."""
    m0, k0, n0 = base
    if recipe.allows_save_original_input and True in support.save_original_input:
        yield (
            "save_original_input",
            Fp8Case(recipe, m0, k0, n0, dtype=dtype, bias=bias, seed=300, save_original_input=True, device=device),
        )
    if recipe.kind == "delayed":
        yield "delayed_steps", Fp8Case(recipe, m0, k0, n0, dtype=dtype, bias=bias, seed=301, steps=3, device=device)


def fp8_cases(spec: GridSpec, support: Any, device: str = "cpu") -> list[GridCase]:
    """Every quantized-linear case of ``spec`` for an impl declaring ``support``, in a fixed order."""
    declared = [name for d, name in DTYPE_NAMES.items() if d in support.dtypes]
    if not declared:
        raise ValueError(f"support declares no dtype numcheck can build: {support.dtypes}")
    dtypes = declared if spec.fp8_all_dtypes else (["bfloat16"] if "bfloat16" in declared else declared[:1])
    bias = bool(support.bias)
    out: list[GridCase] = []
    seen: set[Fp8Case] = set()

    only_original = declared_mode(support)  # an impl declaring only save_original_input=True runs in that mode

    def add(group: str, c: Fp8Case) -> None:
        c = fitted(support, c.replace(save_original_input=True) if only_original else c)  # in its dim_multiple
        if c not in seen:
            seen.add(c)
            out.append(GridCase(group, c.dtype, c))

    m0, k0, n0 = spec.fp8_base
    for r_i, recipe in enumerate(support.recipes):
        for dtype in dtypes:
            if spec.fp8_all_recipes_ladder or r_i == 0:
                for group, case in _fp8_ladder(spec, recipe, dtype, bias, device):
                    add(group, case)
            else:
                add("base", Fp8Case(recipe, m0, k0, n0, dtype=dtype, bias=bias, seed=100 + k0, device=device))
            for regime in spec.fp8_regimes:
                add(
                    f"regime:{regime}",
                    Fp8Case(recipe, m0 - 7, k0, n0 - 8, dtype=dtype, bias=bias, regime=regime, seed=200, device=device),
                )
            if spec.fp8_extras:
                for group, case in _fp8_extras(support, recipe, spec.fp8_base, dtype, bias, device):
                    add(group, case)
    return out


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """A quantized linear's cases (:func:`fp8_cases`); ``ValueError`` when it declares no buildable dtype."""
    return [(impl, gc) for gc in fp8_cases(spec, impl.support, device)]


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case judged by :func:`properties.fp8.props.measure_case`."""
    from numcheck.properties.fp8.props import measure_case

    res = measure_case(impl, gc.case)
    return fp8_record(impl, gc, res, time.perf_counter() - t0)


def properties() -> dict[str, Any]:
    """The FP8 suite's properties by name."""
    from numcheck.properties.fp8.props import FP8_PROPERTIES

    return FP8_PROPERTIES


#: The outputs of a quantized-linear case, in table and plot column order.
OUTPUTS: tuple[str, ...] = ("y", "dgrad", "wgrad", "bgrad")


def declaration(impl: Any) -> dict[str, Any]:
    """A single-device FP8 linear declaration (the grouped one adds its own): recipes, layouts, accumulation."""
    s = impl.support
    accum = s.accum_unit_roundoff
    return {
        "dtypes": dtype_names(s.dtypes),
        "devices": sorted(s.devices),
        "recipes": [r.name for r in s.recipes],
        "save_original_input": sorted(s.save_original_input),
        "bias": s.bias,
        "accum_unit_roundoff": dict(accum) if hasattr(accum, "items") else accum,
        **({"dim_multiple": s.dim_multiples} if any(m > 1 for m in s.dim_multiples.values()) else {}),
    }


def repro(impl: Any, prop: str, case: Any) -> str:
    """The ``numcheck repro`` command of one case (:func:`properties.core.failures.repro_command`)."""
    from numcheck.properties.core.failures import repro_command

    return repro_command(impl, prop, case)


def why(d: dict[str, Any]) -> str:
    """What in a quantized-linear declaration (report.json's ``declaration``) sets its error (one line); the grouped
    and tensor-parallel families say theirs before it."""
    u = d.get("accum_unit_roundoff")

    def p2(v: Any) -> str:
        return f"2^{math.log2(v):.0f}" if isinstance(v, float) and v > 0 else str(v)

    us = ", ".join(f"{k}: {p2(v)}" for k, v in sorted(u.items())) if isinstance(u, dict) else p2(u)
    return f"FP8 operands (E4M3 u = 2^-4, E5M2 u = 2^-3) per recipe; GEMM accumulation u = {us}"


def single_extras(row: dict[str, Any], items: list[tuple[dict, dict]]) -> None:
    """The columns of a single-device FP8 row (single and grouped): ratios, SQNR and relative Frobenius error."""
    fp8_extras(row, items)
    row["sqnr_db"] = median(o["sqnr_db"] for _, o in items if math.isfinite(o["sqnr_db"]))
    row["rel_fro_true"] = median(o["rel_fro_true"] for _, o in items)


def summary(report: dict) -> list[dict[str, Any]]:
    """The quantized-linear rows of report.md: per impl × recipe × dtype × output."""
    return summarize(report, FP8_KIND, OUTPUTS, plain_mode, single_extras)


#: The columns of :func:`fp8_table`.
TABLE_COLUMNS: tuple[str, ...] = (
    "impl",
    "recipe",
    "dtype",
    "output",
    "cases",
    "accumulation pass",
    "total pass",
    "worst error/bound",
    "median vs dequantized",
    "median vs original",
    "median (expected)",
    "SQNR dB (median)",
    "rel. Frobenius error (median)",
)


def fp8_table(rows: list[dict[str, Any]], title: str, intro: str) -> list[str]:
    """The per impl × recipe × dtype × output table of the single or the grouped FP8 linear (none without rows)."""
    return section(
        title,
        intro + "*accumulation*: within the bound against the dequantized operands; *total*: within the bound against "
        "the original operands. The expected column is the error against the dequantized operands over the expected "
        "level (√n accumulation error plus the output's own rounding; informative only).",
        TABLE_COLUMNS,
        rows,
        lambda r: [
            *lead_cells(r, recipe=True),
            pass_cell(r, "accumulation", flagged=True),
            pass_cell(r, "total"),
            fmt(r["worst"]),
            fmt(r["median_dq"]),
            fmt(r["median_true"]),
            fmt(r["median_expected"]),
            fmt(r["sqnr_db"]),
            fmt(r["rel_fro_true"]),
        ],
    )


def table(report: dict) -> list[str]:
    """The FP8 quantized linear summary (none without such cases)."""
    return fp8_table(summary(report), "### FP8 quantized linear: per impl × recipe × dtype × output", "")


def case_types() -> tuple[type, ...]:
    """A quantized-linear case, or a quantizer's."""
    from numcheck.properties.fp8.cases import Fp8Case, QuantizerCase

    return (Fp8Case, QuantizerCase)


def repr_names() -> dict[str, Any]:
    """What an FP8 case's ``repr`` names besides its case type: its recipe, a quantizer case's drawn tensor."""
    from numcheck.properties.fp8.cases import DrawnTensor, FormatCodes
    from numcheck.reference.fp8_recipes import Fp8Recipe

    return {"Fp8Recipe": Fp8Recipe, "DrawnTensor": DrawnTensor, "FormatCodes": FormatCodes}


def _names(values: Any) -> str:
    return ", ".join(sorted(str(v).removeprefix("torch.") for v in values))


def undeclared(impl: Any, case: Any) -> str | None:
    """Why ``impl``'s declaration excludes ``case`` (the suite never draws it), naming the field and what it declares,
    or ``None``. A quantized-linear case: its recipe, dtype, device, ``save_original_input``, bias, and its shape
    against ``dim_multiple`` (with the case moved into the declared shapes, as the suite's own fixed cases are:
    :func:`properties.fp8.shapes.fitted`); a quantizer case: its recipe and device."""
    s = impl.support
    checks = [
        (
            case.recipe in s.recipes,
            f"recipe {case.recipe.name} is not declared (recipes: {_names(r.name for r in s.recipes)})",
        ),
        (
            str(case.device).split(":", 1)[0] in s.devices,
            f"device={case.device!r} is not declared (devices: {_names(s.devices)})",
        ),
    ]
    if isinstance(case, Fp8Case):
        checks += [
            (case.torch_dtype in s.dtypes, f"dtype={case.dtype!r} is not declared (dtypes: {_names(s.dtypes)})"),
            (
                bool(case.save_original_input) in s.save_original_input,
                f"save_original_input={case.save_original_input} is not declared "
                f"(save_original_input: {_names(sorted(s.save_original_input))})",
            ),
            (not case.bias or s.bias, "bias=True is not declared (the impl declares no bias): pass bias=False"),
        ]
        shape = s.shape_refusal(case.M, case.K, case.N)
        checks.append(
            (shape is None, f"{shape}; in the declared shapes the case is --problem {quote(repr(fitted(s, case)))}")
        )
    return next((why for ok, why in checks if not ok), None)


FAMILY = ReportFamily(
    kind=FP8_KIND,
    plan=plan,
    measure=measure,
    properties=properties,
    case_types=case_types,
    declaration=declaration,
    judgements=("accumulation", "total"),
    repro=repro,
    property_rows=fp8_rows,
    refused=fp8_refused,
    why=why,
    summary=summary,
    table=table,
    outputs=OUTPUTS,
    label="FP8 ",
    behaviours=fp8_behaviours,
    repr_names=repr_names,
    undeclared=undeclared,
)
