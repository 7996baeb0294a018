"""The linear-distill family's part of ``numcheck report`` (:class:`~reports.report.families.family.ReportFamily`):
a small grid per declared dtype (β inside (0, 1) and at the declared endpoints, T = 1 and 2 where declared, some
ignored rows where declared; the smoke grid one case per dtype), each judged by
:func:`numcheck.properties.linear_distill.props.judge` (the analytic bound) — about 0.1 s a case on CPU, a second
under Triton's interpreter."""

from __future__ import annotations

import time
from typing import Any

from numcheck.impls.protocols.linear_distill import LINEAR_DISTILL_KIND
from numcheck.properties.core.failures import repro_command
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.grid import GridCase, GridSpec
from numcheck.reports.report.md_rows import fmt, lead_cells, pass_cell, plain_mode, section, summarize
from numcheck.reports.report.property_grid import PropertyRow
from numcheck.reports.report.schema import oracle_record

OUTPUTS: tuple[str, ...] = ("loss", "grad_x", "grad_weight")


def _cases(support: Any, dtype: str, device: str, smoke: bool) -> list[Any]:
    from numcheck.properties.linear_distill.cases import DistillCase

    N = 24 if support.chunk_rows is None and support.chunk_rule is None else 40
    base = DistillCase(N=N, H=16, V=48, dtype=dtype, seed=11, device=device)
    if smoke:
        return [base]
    cases = [base, base.replace(beta=0.1, scale=6.0, teacher_scale=8.0, seed=12)]
    if support.beta_endpoints:
        cases += [base.replace(beta=0.0, seed=13), base.replace(beta=1.0, seed=14)]
    if "temperature" in support.options:
        cases.append(base.replace(temperature=2.0, seed=15))
    if "ignore_index" in support.options:
        cases.append(base.replace(ignored=N // 3, seed=16))
    return cases


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """A few cases per declared dtype (module docstring)."""
    smoke = spec.name == "smoke"
    dtypes = sorted(str(d).removeprefix("torch.") for d in impl.support.dtypes)
    return [
        (impl, GridCase(f"distill:{c.short()}", dtype, c))
        for dtype in dtypes
        for c in _cases(impl.support, dtype, device, smoke)
    ]


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case's record: each output's error/bound and the analytic verdict."""
    from numcheck.properties.linear_distill.props import judge

    comps, *_ = judge(impl, gc.case)
    failures = [c.describe() for c in comps.values() if not c.ok]
    verdicts = lambda c: {"analytic": bool(c.ok)}  # noqa: E731
    return oracle_record(impl, gc, comps.values(), verdicts, FAMILY.judgements, failures, time.perf_counter() - t0)


def summary(report: dict) -> list[dict[str, Any]]:
    """report.md's rows: per impl × dtype × output."""
    return summarize(report, LINEAR_DISTILL_KIND, OUTPUTS, plain_mode, lambda row, items: None)


def table(report: dict) -> list[str]:
    """report.md's linear-distill section (none without its cases)."""
    return section(
        "### Linear + generalised JSD (distillation): per impl × dtype × output",
        "",
        ("impl", "dtype", "output", "cases", "pass", "worst error/bound", "worst case"),
        summary(report),
        lambda r: [
            *lead_cells(r),
            pass_cell(r, "analytic", flagged=True),
            fmt(r["worst"]),
            r["worst_case"],
        ],
    )


def _properties() -> dict[str, Any]:
    from numcheck.properties.linear_distill.props import PROPERTIES

    return PROPERTIES


def _case_types() -> tuple[type, ...]:
    from numcheck.properties.linear_distill.cases import DistillCase

    return (DistillCase,)


def declaration(impl: Any) -> dict[str, Any]:
    """The fields that set the family's numbers."""
    s = impl.support
    return {
        "dtypes": sorted(str(d).removeprefix("torch.") for d in s.dtypes),
        "options": sorted(s.options),
        "beta_zero": s.beta_zero,
        "temperature_on": s.temperature_on,
        "temperature_squared": s.temperature_squared,
        "denominator": s.denominator,
        "logits_dtype": s.logits_dtype,
        "divergence_dtype": s.divergence_dtype,
        "grad_accumulation": s.grad_accumulation,
        "chunk_rows": s.chunk_rows,
    }


def why(d: dict[str, Any]) -> str:
    """What in a declaration sets the error."""
    return (
        f"logits in {d.get('logits_dtype')}, divergence in {d.get('divergence_dtype')}, grad_weight over chunks "
        f"{d.get('grad_accumulation')}: the softmax bound of each head carried through the JSD (docs/linear-distill.md)"
    )


def behaviours(impl: Any) -> list[tuple[str, Any]]:
    """The declared behaviours a report's cases should reach."""
    s = impl.support
    out = [(f"dtype {d}", lambda c, d=str(d).removeprefix("torch."): c.dtype == d) for d in s.dtypes]
    if s.beta_endpoints:
        out.append(("beta endpoints", lambda c: c.beta in (0.0, 1.0)))
    if "temperature" in s.options:
        out.append(("temperature != 1", lambda c: c.temperature != 1.0))
    if "ignore_index" in s.options:
        out.append(("ignored rows", lambda c: c.ignored > 0))
    return out


def _property_case(**fields: Any):
    """A row's builder: one case of the impl's first declared dtype with ``fields``, fitted to its options."""

    def build(impl: Any, spec: GridSpec, device: str) -> list[tuple[str, Any]]:
        from numcheck.properties.linear_distill.cases import DistillCase

        sup = impl.support
        dtype = sorted(str(d).removeprefix("torch.") for d in sup.dtypes)[-1]  # float32 where declared
        kw = dict(fields)
        if "ignore_index" not in sup.options:
            kw["ignored"] = 0
        if "temperature" not in sup.options:
            kw["temperature"] = 1.0
        N = kw.pop("N", 24)
        case = DistillCase(N=N, H=16, V=48, dtype=dtype, seed=21, device=device, **kw)
        return [(case.short(), case)]

    return build


def _needs(option: str):
    return lambda impl: None if option in impl.support.options else f"does not declare {option!r}"


def property_rows() -> tuple[PropertyRow, ...]:
    """One row per property of the suite beyond accuracy (tests/suite/test_linear_distill.py)."""
    chunked = lambda impl: (  # noqa: E731
        None if impl.support.chunk_rows or impl.support.chunk_rule else "declares no chunks"
    )
    return (
        PropertyRow("chunk_invariance", "distill_chunk_invariance", _property_case(N=61), chunked),
        PropertyRow(
            "ignored_rows_change_nothing",
            "distill_ignored_rows_change_nothing",
            _property_case(ignored=9),
            _needs("ignore_index"),
        ),
        PropertyRow("beta_symmetry", "distill_beta_symmetry", _property_case(beta=0.25)),
        PropertyRow("temperature_scaling", "distill_temperature_scaling", _property_case(), _needs("temperature")),
        PropertyRow(
            "declared_options_take_effect",
            "distill_declared_options_take_effect",
            _property_case(temperature=2.0, ignored=6),
        ),
        PropertyRow("teacher_frozen", "distill_teacher_frozen", _property_case()),
        PropertyRow(
            "determinism",
            "distill_determinism",
            _property_case(),
            lambda impl: None if impl.support.deterministic else "declares deterministic=False",
        ),
    )


FAMILY = ReportFamily(
    kind=LINEAR_DISTILL_KIND,
    plan=plan,
    measure=measure,
    properties=_properties,
    case_types=_case_types,
    declaration=declaration,
    judgements=("analytic",),
    repro=repro_command,
    property_rows=property_rows,
    refused=None,
    why=why,
    summary=summary,
    table=table,
    outputs=OUTPUTS,
    label="linear+JSD ",
    behaviours=behaviours,
)
