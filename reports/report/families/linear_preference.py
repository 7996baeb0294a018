"""Linear+preference (:class:`~properties.linear_preference.cases.PreferenceCase`), per impl: :data:`CASES` in
each declared dtype — a small batch with every declared option set, and one with ignored positions, a bias where
declared and, where the impl declares chunking, one pair per chunk. Each case is judged as the suite's accuracy
judges it (judgement (a) under the derived bound, (b) against eager in the same dtype), without raising. About
0.1 s a case: the family's whole grid is a few seconds on a CPU.

The report's part of the linear+preference family (:class:`~reports.report.families.family.ReportFamily`).
"""

from __future__ import annotations

import time
from typing import Any

from numcheck.impls.protocols.linear_preference import PREFERENCE_KIND
from numcheck.properties.core.failures import repro_command
from numcheck.reports.report.families.family import ReportFamily
from numcheck.reports.report.grid import GridCase, GridSpec
from numcheck.reports.report.md_rows import fmt, lead_cells, pass_cell, plain_mode, section, summarize
from numcheck.reports.report.property_grid import PropertyRow
from numcheck.reports.report.schema import oracle_record

OUTPUTS: tuple[str, ...] = ("loss", "grad_x", "grad_weight", "grad_bias")
#: The grid's cases by label: the shape and the fields set where the declaration allows them.
CASES: dict[str, dict[str, Any]] = {
    "options": dict(P=3, T=5, H=16, V=24, beta=0.5, gamma=0.5, label_smoothing=0.1, nll_weight=0.5, kl=0.5),
    "ignored+chunks": dict(P=4, T=6, H=12, V=40, beta=2.0, ignored=0.4, bias=True, chunk_pairs=1, logit_scale=4.0),
}
_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def _fitted(support: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with what ``support`` does not declare set to its neutral value."""
    out = dict(fields)
    for name, declared in (
        ("gamma", support.margin),
        ("label_smoothing", support.label_smoothing),
        ("nll_weight", support.nll),
        ("kl", support.reference_point),
        ("bias", support.bias),
        ("chunk_pairs", support.chunking),
    ):
        if not declared:
            out.pop(name, None)
    out["average_log_prob"] = max(support.average_log_prob)
    return out


def plan(spec: GridSpec, impl: Any, device: str, info: dict) -> list[tuple[Any, GridCase]]:
    """Each case of :data:`CASES` in each declared dtype, its undeclared options left neutral."""
    from numcheck.properties.linear_preference.cases import PreferenceCase

    s = impl.support
    dtypes = sorted(_DTYPES[str(d)] for d in s.dtypes)
    return [
        (
            impl,
            GridCase(
                f"preference:{label}",
                dtype,
                PreferenceCase(**_fitted(s, fields), dtype=dtype, seed=7000 + i, device=device),
            ),
        )
        for i, (label, fields) in enumerate(CASES.items())
        for dtype in dtypes
    ]


def _row_case(name: str, label: str, **fields: Any):
    """A property row's builder: the grid case ``label`` in the impl's first declared dtype, with ``fields``."""

    def build(impl: Any, spec: GridSpec, device: str) -> list[tuple[str, Any]]:
        from numcheck.properties.linear_preference.cases import PreferenceCase

        s = impl.support
        dtype = sorted(_DTYPES[str(d)] for d in s.dtypes)[0]
        case = PreferenceCase(**{**_fitted(s, CASES[label]), **fields}, dtype=dtype, seed=7100, device=device)
        return [(f"{name}:{label}", case)]

    return build


def property_rows() -> tuple[PropertyRow, ...]:
    """One case per property of the suite besides accuracy, named by its suite test."""
    no_chunks = lambda impl: None if impl.support.chunking else "no chunking declared"  # noqa: E731
    return (
        PropertyRow("ignored_positions", "preference_ignored_positions", _row_case("ignored", "ignored+chunks")),
        PropertyRow(
            "chunk_invariance", "preference_chunk_invariance", _row_case("chunks", "ignored+chunks"), no_chunks
        ),
        PropertyRow("pair_permutation", "preference_pair_permutation", _row_case("permutation", "options")),
        PropertyRow("options_honoured", "preference_options_honoured", _row_case("options", "options")),
    )


def measure(impl: Any, gc: GridCase, t0: float) -> dict[str, Any]:
    """One case's record: every output's error/bound and the two judgements."""
    from numcheck.properties.linear_preference import props

    case = gc.case
    t = props.build(case, impl.support.conventions)
    got = props.run(impl, case, t)
    o, comps = props.judged(impl, case, t, got)
    rel = {j.output: j for j in props.relative_judgements(impl, case, t, got, o)}
    failures = [c.describe() for c in comps if not c.ok] + [j.describe() for j in rel.values() if not j.ok]

    def verdicts(c: Any) -> dict[str, bool]:
        j = rel.get(c.output)
        return {"analytic": bool(c.ok), "relative": bool(j.ok) if j is not None else True}

    return oracle_record(impl, gc, comps, verdicts, FAMILY.judgements, failures, time.perf_counter() - t0)


def summary(report: dict) -> list[dict[str, Any]]:
    """report.md's rows: per impl × dtype × output."""
    return summarize(report, PREFERENCE_KIND, OUTPUTS, plain_mode, lambda row, items: None)


def table(report: dict) -> list[str]:
    """report.md's linear+preference section (none without such cases)."""
    return section(
        "### Linear + preference loss (DPO, ORPO, CPO, SimPO, KTO): per impl × dtype × output",
        "Every output against the float64 oracle under the bound of `properties/linear_preference/tolerance.py` (a) "
        "and against eager in the same dtype (b).",
        ("impl", "dtype", "output", "cases", "pass (a)", "pass (b)", "worst error/bound"),
        summary(report),
        lambda r: [
            *lead_cells(r),
            pass_cell(r, "analytic", flagged=True),
            pass_cell(r, "relative"),
            fmt(r["worst"]),
        ],
    )


def properties() -> dict[str, Any]:
    """The family's properties by name."""
    from numcheck.properties.linear_preference.props import PROPERTIES

    return PROPERTIES


def case_types() -> tuple[type, ...]:
    """A linear+preference case."""
    from numcheck.properties.linear_preference.cases import PreferenceCase

    return (PreferenceCase,)


def declaration(impl: Any) -> dict[str, Any]:
    """The parts of a declaration that explain its numbers."""
    s = impl.support
    return {
        "loss": s.loss,
        "layout": s.layout,
        "reduction": s.reduction,
        "nll_reduction": s.nll_reduction,
        "dtypes": sorted(_DTYPES[str(d)] for d in s.dtypes),
        "average_log_prob": sorted(s.average_log_prob),
        "grad_weight_accumulation": s.grad_weight_accumulation,
        "chunking": s.chunking,
    }


def why(d: dict[str, Any]) -> str:
    """What in a declaration sets its error (one line)."""
    return (
        f"{d.get('loss')}: per-position log-softmax errors summed over each completion, through log σ of the margin; "
        f"grad_weight accumulated {d.get('grad_weight_accumulation')}"
    )


FAMILY = ReportFamily(
    kind=PREFERENCE_KIND,
    plan=plan,
    measure=measure,
    properties=properties,
    case_types=case_types,
    declaration=declaration,
    judgements=("analytic", "relative"),
    repro=repro_command,
    property_rows=property_rows,
    refused=None,
    why=why,
    summary=summary,
    table=table,
    outputs=OUTPUTS,
    label="preference ",
    behaviours=lambda impl: [(f"dtype {d}", lambda case, d=d: case.dtype == d) for d in declaration(impl)["dtypes"]],
)
