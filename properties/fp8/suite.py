"""The drawn quantized-linear tests of the suite, as data: :data:`FP8_SUITE` (name → :class:`SuiteProperty`).
``numcheck.tests.suite.test_fp8_impls`` runs one pytest test per entry and :func:`numcheck.check` runs the same
entries without pytest, through :mod:`numcheck.properties.core.runner`. (The suite's fixed-case FP8 tests, edge
inputs, large shapes, all 256 codes and so on, run under pytest only.)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from numcheck.impls.protocols.fp8_linear import FP8_KIND
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.family import SuiteFamily
from numcheck.properties.core.runner import Draw, Metrics, SuiteProperty
from numcheck.properties.fp8 import props as checks
from numcheck.properties.fp8.cases import Fp8Case, QuantizerCase
from numcheck.properties.fp8.known_torchao import known_fp8_divergence
from numcheck.properties.fp8.shapes import multiples, round_up
from numcheck.properties.fp8.strategies import declares_chain, fp8_cases, fp8_tensor_specs


def _cases(*regimes: str, prop: str = "accuracy") -> Draw:
    """A draw of a :class:`Fp8Case` inside the impl's declaration, in one of ``regimes``; a case a known divergence
    of the installed release covers under property ``prop`` (:mod:`~numcheck.properties.fp8.known_torchao`, whose
    strict examples show it) is rejected, as the runner rejects linear+CE ones."""

    def draw(impl: Any, data: Any) -> Any:
        case = data.draw(fp8_cases(impl.support, regimes=regimes), label="case")
        assume(known_fp8_divergence(impl.name, prop, case) is None)
        return case

    return draw


def accuracy(impl: Any, case: Any) -> Metrics:
    """:func:`fp8_checks.accuracy`, its error/bound against the dequantized reference per output as metrics."""
    result = checks.accuracy(impl, case)
    return {f"{m.output} error/bound (dequantized reference)": min(m.dq.ratio, 1e6) for m in result.outputs.values()}


def save_original_input(impl: Any, case: Any) -> Metrics:
    """:func:`fp8_checks.save_original_input` (bitwise: no metrics)."""
    checks.save_original_input(impl, case)
    return {}


def saved_tensors(impl: Any, case: Any) -> Metrics:
    """:func:`fp8_checks.saved_tensors` (exact byte counts: no metrics)."""
    checks.saved_tensors(impl, case)
    return {}


def quantizer(impl: Any, case: QuantizerCase) -> Metrics:
    """:func:`fp8_checks.quantizer` on a drawn :class:`~numcheck.properties.fp8.cases.QuantizerCase` (bitwise: no
    metrics)."""
    checks.quantizer_case(impl, case)
    return {}


def _quantizer_case(impl: Any, data: Any) -> QuantizerCase:
    """A declared recipe, a random tensor in a declared dtype on the suite's device, and a delayed scale, as one
    printable case (the tensor by the values it was drawn from: a failure's repro line rebuilds it); its rows and
    columns rounded up to a multiple of every declared ``dim_multiple``."""
    recipe = data.draw(st.sampled_from(impl.support.recipes), label="recipe")
    dtype = str(data.draw(st.sampled_from(sorted(impl.support.dtypes, key=str)), label="dtype")).removeprefix("torch.")
    t = data.draw(fp8_tensor_specs(dtype=dtype), label="t")
    step = math.lcm(*multiples(impl.support).values())  # a tensor every role's declared shape admits
    if step > 1:
        t = dataclasses.replace(t, rows=round_up(t.rows, step), cols=round_up(t.cols, step))
    scale = data.draw(st.sampled_from([1.0, 0.375, 2.0**20, 3e-7]), label="delayed_scale")
    return QuantizerCase(recipe, t, dtype=dtype, delayed_scale=scale, device=DEVICE)


def chain_refusal(impl: Any) -> str | None:
    """Why the long same-sign chains say nothing about ``impl`` on the suite's device: it declares there neither
    truncating block steps (``accum_block``) nor promotion (``accum_chunk``), so its bound is the plain γ_n of one
    fp32 level, which the accuracy test's draws already judge."""
    if declares_chain(impl.support, DEVICE):
        return None
    return f"{impl.name} declares on {DEVICE} neither accum_block nor accum_chunk: one fp32 level, no chain to test"


def chain_description(impl: Any, case: Fp8Case) -> str | None:
    """What a long same-sign case means for ``impl``'s declared accumulation (put into its failure messages)."""
    u, chunk = impl.support.accumulation(case.device)
    block = impl.support.accumulation_block(case.device)
    chains = "one chain" if chunk is None else f"{-(-case.K // chunk)} chains of {chunk} added in fp32"
    u_text = f"2^{math.log2(u):g}"
    steps = f"truncating steps of {block} products at u = {u_text}" if block else f"unit roundoff {u_text}"
    return (
        f"y reduces K = {case.K} as declared: {chains}, {steps}; the operands have one sign, so each chain's "
        "truncation errors add up (a chain longer than declared exceeds the bound)"
    )


def mode_comparison_refusal(impl: Any) -> str | None:
    """Why the mode comparison says nothing about ``impl``: it does not declare save_original_input=True, or declares
    only True (nothing to compare with: torchao's Float8Linear always saves x itself)."""
    if True not in impl.support.save_original_input:
        return f"{impl.name} does not declare save_original_input=True"
    if False not in impl.support.save_original_input:
        return f"{impl.name} declares only save_original_input=True: no False run to compare with"
    return None


def _exposes_quantize(impl: Any) -> str | None:
    """Why the quantizer tests say nothing about ``impl`` (it exposes no quantize)."""
    if not impl.support.exposes_quantize:
        return f"{impl.name} does not expose quantize (support.exposes_quantize=False)"
    return None


# Example budgets by cost (SuiteProperty.budget_scale), measured per example on CPU, torch 2.13, one thread, a
# loaded 2-core machine: accuracy 310–670 ms (two references in float64: the profile's examples); the mode
# comparison 10–55 ms and the saved-tensor accounting 20–55 ms (one small forward and backward, no oracle):
# 10× and 5× (120 and 60 examples in ci, 1–7 s per impl); the quantizer on one tensor 100–130 ms (impl and
# oracle quantizers, both usages): 10× (120 examples, 12–16 s per impl), so its edges (planted in two draws of
# three, every block's amax at an edge in one of three) come in every ci run.
# The scale-block grids (``block_exponents``: every row and K-block its own exponent on grids of a few blocks each
# way, :data:`~properties.fp8.strategies.SCALE_K`) are a test of their own, so every example reaches them (a block
# scale misplaced, transposed or shared with the partial last K-block shows only there) and the accuracy test's
# draws stay as they were: the profile's examples, 0.1–0.7 s each.
_ENTRIES: tuple[SuiteProperty, ...] = (
    SuiteProperty(
        "accuracy_against_both_references", accuracy, _cases("normal", "wide", "outlier", "growing", "scale_edge")
    ),
    SuiteProperty("accuracy_on_scale_block_grids", accuracy, _cases("block_exponents")),
    SuiteProperty(
        "accuracy_on_long_same_sign_chains",
        accuracy,
        _cases("same_sign"),
        skip=chain_refusal,
        describe=chain_description,
    ),
    SuiteProperty(
        "save_original_input_is_bitwise_identical",
        save_original_input,
        _cases("normal", "wide", "outlier", "nan", prop="save_original_input"),
        skip=mode_comparison_refusal,
        budget_scale=10,
    ),
    SuiteProperty(
        "saved_tensor_aliasing_and_bytes", saved_tensors, _cases("normal", prop="saved_tensors"), budget_scale=5
    ),
    SuiteProperty(
        "quantizer_bitwise_on_random_tensors", quantizer, _quantizer_case, skip=_exposes_quantize, budget_scale=10
    ),
)

#: Every drawn quantized-linear test of the suite by verdict name.
FP8_SUITE: dict[str, SuiteProperty] = {p.name: p for p in _ENTRIES}

#: The family's suite, registered in :data:`numcheck.properties.suites.SUITES`.
FAMILY = SuiteFamily(
    kind=FP8_KIND,
    table=FP8_SUITE,
    properties=checks.FP8_PROPERTIES,
    case_type=Fp8Case,
    strategy=fp8_cases,
    assertion="assert_fp8_linear",
)
