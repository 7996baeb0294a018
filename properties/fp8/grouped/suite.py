"""The drawn grouped-linear tests of the suite, as data: :data:`GROUPED_SUITE` (name → :class:`SuiteProperty`).
``numcheck.tests.suite.test_grouped_fp8`` runs one pytest test per entry; :func:`numcheck.check`'s runner takes the
same entries (:mod:`numcheck.properties.core.runner`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import assume

from numcheck.impls.protocols.grouped_fp8_linear import GROUPED_KIND
from numcheck.properties.core.family import SuiteFamily
from numcheck.properties.core.runner import Draw, Metrics, SuiteProperty
from numcheck.properties.fp8.grouped import props as checks
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.properties.fp8.grouped.known_torchao import known_grouped_divergence
from numcheck.properties.fp8.grouped.strategies import grouped_cases
from numcheck.properties.fp8.suite import mode_comparison_refusal

#: Rows in all of the properties that run several calls and oracles per example (per-expert, permutation,
#: accumulation): they compare calls, so small splits still meet every block edge up to 32 and 128 rows.
SMALL_ROWS = 160
#: Regimes whose inputs are all finite (the empty-expert property asserts no NaN or inf anywhere).
FINITE = ("normal", "wide", "outlier", "zero_expert", "pruned")


def _cases(*regimes: str, prop: str = "accuracy", **fixed: Any) -> Draw:
    """A draw of a :class:`~properties.fp8.grouped.cases.GroupedCase` inside the impl's declaration, in one of
    ``regimes`` (``fixed``: :func:`~properties.fp8.grouped.strategies.grouped_cases`' keywords); a case a known
    divergence of the installed release covers under property ``prop``
    (:mod:`~numcheck.properties.fp8.grouped.known_torchao`, whose strict examples show it) is rejected."""

    def draw(impl: Any, data: Any) -> Any:
        case = data.draw(grouped_cases(impl.support, regimes=regimes, **fixed), label="case")
        assume(known_grouped_divergence(impl.name, prop, case) is None)
        return case

    return draw


def _no_delayed(*regimes: str, **fixed: Any) -> Draw:
    """As :func:`_cases`, with the impl's delayed recipes left out (the layer's state is per call)."""

    def draw(impl: Any, data: Any) -> Any:
        sup = replace(impl.support, recipes=tuple(r for r in impl.support.recipes if r.kind != "delayed"))
        return data.draw(grouped_cases(sup, regimes=regimes, **fixed), label="case")

    return draw


def accuracy(impl: Any, case: Any) -> Metrics:
    """:func:`props.accuracy`, its error/bound against the dequantized reference per output as metrics."""
    result = checks.accuracy(impl, case)
    return {f"{m.output} error/bound (dequantized reference)": min(m.dq.ratio, 1e6) for m in result.outputs.values()}


def _metricless(prop: Any) -> Any:
    def run(impl: Any, case: Any) -> Metrics:
        prop(impl, case)
        return {}

    run.__name__ = prop.__name__
    run.__doc__ = f":func:`props.{prop.__name__}` (bitwise or exact: no metrics)."
    return run


def _declares_soi(impl: Any) -> str | None:
    return (
        None if True in impl.support.save_original_input else f"{impl.name} does not declare save_original_input=True"
    )


def _declares_empty(impl: Any) -> str | None:
    return None if impl.support.empty_splits else f"{impl.name} does not declare empty splits (empty_splits=False)"


def _has_non_delayed(impl: Any) -> str | None:
    if any(r.kind != "delayed" for r in impl.support.recipes):
        return None
    return f"{impl.name} declares delayed recipes only (the accumulation property leaves their per-call state out)"


# Budgets by cost, measured per example on CPU (torch 2.13, one thread, a loaded 2-core machine): accuracy 0.3–2 s
# (the float64 oracle per expert and the bounds: the profile's examples); the per-expert comparison and the
# permutation 0.5–4 s (two calls and an oracle); the mode comparison and the held bytes 0.3–1.5 s; the refusals a
# few ms (no oracle: 3× the examples); the three-micro-batch accumulation 1–7 s (three oracles).
# The scale-block grids: accuracy on ``block_exponents`` cases only (every row, K-block and expert its own exponent,
# experts of one block of tokens), a test of its own so every example reaches them: 0.3–2 s each.
_ENTRIES: tuple[SuiteProperty, ...] = (
    SuiteProperty(
        "grouped_accuracy_against_both_references",
        accuracy,
        _cases("normal", "wide", "outlier", "zero_expert", "nan_expert", "scale_edge"),
    ),
    SuiteProperty("grouped_accuracy_on_scale_block_grids", accuracy, _cases("block_exponents")),
    SuiteProperty(
        "grouped_equals_the_linear_per_expert",
        _metricless(checks.per_expert_linear),
        _cases("normal", "wide", "outlier", "zero_expert", max_rows=SMALL_ROWS),
    ),
    SuiteProperty(
        "grouped_empty_experts_exact_zero",
        _metricless(checks.empty_experts),
        _cases(*FINITE, empty=True),
        skip=_declares_empty,
    ),
    SuiteProperty(
        "grouped_split_rules_refused_outside", _metricless(checks.split_rules), _cases("normal"), budget_scale=3
    ),
    SuiteProperty(
        "grouped_expert_permutation",
        _metricless(checks.expert_permutation),
        _cases("normal", "wide", "outlier", max_rows=SMALL_ROWS),
    ),
    SuiteProperty(
        "grouped_save_original_input_is_bitwise_identical",
        _metricless(checks.save_original_input),
        _cases("normal", "wide", "outlier", "nan_expert", prop="save_original_input"),
        skip=mode_comparison_refusal,
    ),
    SuiteProperty(
        "grouped_saved_bytes_measured", _metricless(checks.saved_bytes), _cases("normal"), skip=_declares_soi
    ),
    SuiteProperty(
        "grouped_wgrad_accumulation_over_micro_batches",
        _metricless(checks.wgrad_accumulation),
        _no_delayed("normal", "wide", "outlier", max_rows=SMALL_ROWS),
        skip=_has_non_delayed,
    ),
)

#: Every drawn grouped-linear test of the suite by verdict name.
GROUPED_SUITE: dict[str, SuiteProperty] = {p.name: p for p in _ENTRIES}

#: The family's suite, registered in :data:`numcheck.properties.suites.SUITES`.
FAMILY = SuiteFamily(
    kind=GROUPED_KIND,
    table=GROUPED_SUITE,
    properties=checks.GROUPED_PROPERTIES,
    case_type=GroupedCase,
    strategy=grouped_cases,
)
