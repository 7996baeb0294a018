"""The drawn linear+CE tests of the suite, as data: :data:`SUITE` (name → :class:`LinearCEProperty`) and the
pinned cases :data:`PINNED`. ``numcheck.tests.suite.test_properties`` runs one pytest test per entry and
:func:`numcheck.check` runs the same entries without pytest, through :mod:`numcheck.properties.core.runner`.

Each entry draws only inside what the impl declares; one whose feature the impl does not declare is skipped
with the reason. Each test's docstring (in the suite module) states its property.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ContextManager, Sequence

import torch
from hypothesis import strategies as st

from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND, LINEAR_CE_OPTIONS
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.family import SuiteFamily
from numcheck.properties.core.rows import Row
from numcheck.properties.core.runner import Draw, SuiteProperty
from numcheck.properties.linear_ce import known, props
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.chunks import declares_chunks
from numcheck.properties.linear_ce.chunks import layout as chunk_layout
from numcheck.properties.linear_ce.coverage import EVERY_DIMENSION, covering_rows
from numcheck.properties.linear_ce.strategies import (
    chunk_invariance_problems,
    determinism_layout,
    determinism_problems,
    large_vocab_problems,
    long_batch_problems,
    loss_scale_available,
    loss_scale_problems,
    many_chunk_layout,
    many_chunk_problems,
    pinned_row,
    problems,
    refusal,
    wide_hidden_problems,
)
from numcheck.properties.linear_ce.undrawable import undrawable_reason


@dataclass(frozen=True)
class LinearCEProperty(SuiteProperty):
    """A drawn linear+CE test: a :class:`~numcheck.properties.core.runner.SuiteProperty` with the family's covering
    design (:mod:`numcheck.properties.linear_ce.coverage`), rows pinned through its strategies
    (:func:`~numcheck.properties.linear_ce.strategies.pinned_row`), the undrawable declarations
    (:mod:`numcheck.properties.linear_ce.undrawable`) and its known divergences, for linear+CE impls."""

    known_module = "numcheck.properties.linear_ce.known"
    design_module = "numcheck.properties.linear_ce.coverage"

    def design(self, impl: Any, dimensions: Sequence[str]) -> tuple[Row, ...]:
        if getattr(impl, "kind", None) != LINEAR_CE_KIND:
            return ()
        return covering_rows(dimensions, impl.support, DEVICE)

    def pinned(self, row: Row) -> ContextManager[None]:
        return pinned_row(row)

    def undrawable(self, impl: Any) -> str | None:
        return undrawable_reason(impl.support, DEVICE) if getattr(impl, "kind", None) == LINEAR_CE_KIND else None

    def known_for_every(self, impl: Any, fields: Any) -> Any:
        return known.covers_every(impl.name, self.property_name, fields)

    def known_case(self, impl: Any, case: Any) -> Any:
        return known.known(impl.name, self.property_name, case) if isinstance(case, Problem) else None


def _dtype_names(support: Any) -> set[str]:
    """The declared dtypes by name (``"float32"``, ...)."""
    return {str(d).replace("torch.", "") for d in support.dtypes}


def drawn(strategy: Any, **kw: Any) -> Draw:
    """A draw of ``strategy(impl.support, **kw)`` (default :func:`problems`), labelled ``problem``."""
    return lambda impl, data: data.draw(strategy(impl.support, **kw), label="problem")


def _fp32_sharp(impl: Any, data: Any) -> Problem:
    """A problem in plain fp32, where bounds are tightest."""
    return data.draw(problems(impl.support, force={"dtype": "float32", "autocast": None}), label="problem")


def _all_options(impl: Any, data: Any) -> Problem:
    """A problem with every declared option on, in fp32 where declared, not all rows ignored."""
    force = {"dtype": "float32", "autocast": None} if torch.float32 in impl.support.dtypes else {}
    return data.draw(
        problems(impl.support, force=force, require=frozenset(LINEAR_CE_OPTIONS), allow_all_ignored=False),
        label="problem",
    )


def _many_chunk_cases(impl: Any) -> Sequence[tuple[Any, Draw]]:
    """Many chunks of the impl (:func:`~numcheck.properties.linear_ce.chunks.many_chunks` of the drawn dtype) from its
    declaration alone (:func:`~numcheck.properties.linear_ce.strategies.many_chunk_layout`)."""
    lay = many_chunk_layout(impl)
    return [(lay.impl, drawn(many_chunk_problems, layout=lay))]


def _determinism_cases(impl: Any) -> Sequence[tuple[Any, Draw]]:
    """The impl (its variant of 7-row chunks where it exposes with_chunk_rows) on problems spanning several chunks."""
    variant, lay, min_v = determinism_layout(impl)
    return [(variant, drawn(determinism_problems, layout=lay, min_v=min_v))]


def _chunk_invariance_cases(impl: Any) -> Sequence[tuple[Any, Draw]]:
    """Where the impl exposes with_chunk_rows, any problem (its chunk sizes are set); else problems spanning
    several of its chunks as declared (:func:`~numcheck.properties.linear_ce.strategies.chunk_invariance_problems`)."""
    if hasattr(impl, "with_chunk_rows"):
        return [(impl, drawn(problems))]
    return [(impl, drawn(chunk_invariance_problems, layout=chunk_layout(impl)))]


def _describe_chunks(impl: Any, p: Any) -> str | None:
    """A ``describe`` of a property's cases: how many chunks of the impl a case's rows make, as it declares them
    (``None`` where the impl exposes with_chunk_rows and the property chose the variant's chunk size itself)."""
    if not isinstance(p, Problem):
        return None
    return "chunks: " + chunk_layout(impl).describe(p.N, p.H, p.V)


def _two_calls(impl: Any, data: Any) -> Problem:
    """An even-N problem in ``sum`` or ``mean`` (rows ignored under ``mean`` where declared), split in halves."""
    s = impl.support
    reds = [r for r in ("sum", "mean") if r in s.reductions]
    half = data.draw(st.integers(1, 48), label="rows per call")
    red = data.draw(st.sampled_from(reds), label="reduction")
    force: dict[str, Any] = {"N": 2 * half, "reduction": red}
    if red == "mean" and "ignore_index" in s.options:  # the halves' token counts differ
        force["ignored"] = data.draw(st.sampled_from([0.25, 0.5]), label="ignored")
    return data.draw(problems(s, force=force), label="problem")


def _earlier_calls(impl: Any, data: Any) -> Problem:
    """A problem, under a declared AMP dtype in most draws where fp32 and AMP are declared."""
    s = impl.support
    amp = sorted(str(d).replace("torch.", "") for d in s.autocast) if torch.float32 in s.dtypes else []
    # most draws under AMP where declared: where a compiled graph or a cast weight is keyed by the autocast dtype
    mode = data.draw(st.sampled_from([None, *amp]), label="autocast") if amp else None
    force = {"dtype": "float32", "autocast": mode} if mode else {}
    return data.draw(problems(s, force=force), label="problem")


def _ignored_rows(impl: Any, data: Any) -> Problem:
    """A problem with a quarter, half or 90% of its rows ignored."""
    ign = data.draw(st.sampled_from([0.25, 0.5, 0.9]), label="ignored")
    return data.draw(problems(impl.support, force={"ignored": ign}), label="problem")


def _unless(cond: Any, why: str) -> Any:
    """A skip rule: ``why`` (formatted with the impl's name) when ``cond(impl)`` is false."""
    return lambda impl: None if cond(impl) else why.format(name=impl.name)


_TINY = dict(N=1, H=1, V=1, device=DEVICE)

# Dimensions of the covering rows (numcheck.properties.linear_ce.coverage) of the tests whose draws vary them.
#: accuracy_fp32_sharp pins fp32: everything else.
_IN_FP32 = tuple(d for d in EVERY_DIMENSION if d != "precision")
#: strided_inputs: the upstream gradient meets the transposed weight (Liger 0.2.1–0.8.2's grad_weight was wrong
#: exactly there), in each reduction and precision, with a strided bias and a strided target with ignored rows.
_STRIDED = ("precision", "reduction", "upstream", "bias", "ignore_index")
#: ... for slow impls without the precision (a stride bug is one of indexing; precision × reduction alone takes 15
#: rows): 7 rows instead of 18. Slow impls run rows only here and in accuracy (every dimension), at ~1 s a row.
_STRIDED_SLOW = ("reduction", "upstream", "bias", "ignore_index")
#: many_chunks and long_batch: the regime their covering rows pin. A sum across chunks kept in the compute dtype
#: shows where the chunks' partial sums share a sign, so that its roundings add up: post-norm rows (per-feature
#: offsets) under a reduction whose scalar gradient reaches every chunk alike. A per-row upstream gradient (under
#: 'none') or another regime (zero-mean rows) leaves partial sums of either sign, and a narrow running sum there
#: can pass (the held-out review's bf16 running sum did: error/bound 1.5–3.3 on post_norm, within bound on the
#: one many-chunk draw it got, with reduction='none'). So every covering row, one per declared dtype and
#: reduction, is post_norm; the random draws take every regime.
_SUMS_ACROSS_CHUNKS = (("regime", "post_norm"),)
#: frozen_inputs: each gradient that is still formed, under each reduction and upstream, with and without bias.
_GRADIENT_SCALE = ("reduction", "upstream", "bias")

_ENTRIES: tuple[LinearCEProperty, ...] = (
    LinearCEProperty(
        "accuracy", props.accuracy, drawn(problems), dimensions=EVERY_DIMENSION, slow_dimensions=EVERY_DIMENSION
    ),
    LinearCEProperty(
        "accuracy_fp32_sharp",
        props.accuracy,
        _fp32_sharp,
        dimensions=_IN_FP32,
        skip=_unless(lambda i: "float32" in _dtype_names(i.support), "{name} declares no float32"),
    ),
    LinearCEProperty(
        "all_options_combined",
        props.accuracy,
        _all_options,
        every=lambda i: Problem(**_TINY, softcap=1.0) if "softcap" in i.support.options else None,
    ),
    LinearCEProperty(
        "many_chunks",
        props.accuracy,
        None,
        cases=_many_chunk_cases,
        dimensions=("dtype", "reduction"),
        row_pins=_SUMS_ACROSS_CHUNKS,
        describe=_describe_chunks,
    ),
    LinearCEProperty("large_vocab", props.accuracy, drawn(large_vocab_problems), dimensions=("head",)),
    LinearCEProperty(
        "long_batch",
        props.accuracy,
        drawn(long_batch_problems),
        dimensions=("low_precision", "reduction"),
        row_pins=_SUMS_ACROSS_CHUNKS,
    ),
    LinearCEProperty("wide_hidden", props.accuracy, drawn(wide_hidden_problems)),
    LinearCEProperty(
        "loss_scale",
        props.accuracy,
        drawn(loss_scale_problems),
        skip=_unless(lambda i: loss_scale_available(i.support), "{name} declares no AMP fp16 with 'mean' here"),
    ),
    LinearCEProperty(
        "strided_inputs", props.strided_inputs, drawn(problems), dimensions=_STRIDED, slow_dimensions=_STRIDED_SLOW
    ),
    LinearCEProperty(
        "frozen_inputs[weight]",
        props.frozen_weight,
        drawn(problems),
        every=lambda i: Problem(**_TINY),
        dimensions=_GRADIENT_SCALE,
    ),
    LinearCEProperty(
        "frozen_inputs[x]",
        props.frozen_x,
        drawn(problems),
        every=lambda i: Problem(**_TINY),
        dimensions=_GRADIENT_SCALE,
    ),
    LinearCEProperty(
        "two_calls",
        props.two_calls,
        _two_calls,
        skip=_unless(lambda i: {"sum", "mean"} & set(i.support.reductions), "{name} declares neither 'sum' nor 'mean'"),
    ),
    LinearCEProperty("earlier_calls", props.earlier_calls, _earlier_calls),
    LinearCEProperty(
        "confident_rows",
        props.accuracy,
        drawn(problems, regimes=("confident",)),
        every=lambda i: Problem(**_TINY, regime="confident"),
    ),
    LinearCEProperty(
        "ignored_rows",
        props.ignored_rows,
        _ignored_rows,
        skip=_unless(lambda i: "ignore_index" in i.support.options, "{name} declares no ignore_index"),
    ),
    LinearCEProperty("permutation", props.permutation, drawn(problems, allow_all_ignored=False)),
    LinearCEProperty(
        "shift_invariance",
        props.shift_invariance,
        drawn(problems, force={"bias": True, "softcap": None, "z_loss_scale": 0.0}),
        skip=_unless(lambda i: "bias" in i.support.options, "{name} declares no bias"),
    ),
    LinearCEProperty(
        "option_identities",
        props.option_identities,
        drawn(problems, force={"label_smoothing": 0.0, "class_weights": False, "z_loss_scale": 0.0, "softcap": None}),
    ),
    LinearCEProperty(
        "reduction_consistency",
        props.reduction_consistency,
        drawn(problems, allow_all_ignored=False),
        skip=_unless(
            lambda i: {"mean", "sum", "none"} <= set(i.support.reductions),
            "{name} does not declare all three reductions",
        ),
    ),
    LinearCEProperty(
        "determinism",
        props.determinism,
        None,
        cases=_determinism_cases,
        dimensions=("reduction",),
        skip=_unless(
            lambda i: i.support.deterministic,
            "{name} declares deterministic=False (reductions whose order changes between runs)",
        ),
    ),
    LinearCEProperty(
        "chunk_invariance",
        props.chunk_invariance,
        None,
        cases=_chunk_invariance_cases,
        describe=lambda i, p: None if hasattr(i, "with_chunk_rows") else _describe_chunks(i, p),
        skip=_unless(
            declares_chunks,
            "{name} declares no chunking (chunk_rows, chunk_rule, or a grad_accumulation other than 'fp32')",
        ),
    ),
    LinearCEProperty("grad_dtypes", props.grad_dtypes, drawn(problems)),
    LinearCEProperty("loss_dtype", props.loss_dtype, drawn(problems)),
)

#: Every drawn linear+CE test of the suite by verdict name.
SUITE: dict[str, LinearCEProperty] = {p.name: p for p in _ENTRIES}

#: Cases the suite once judged wrongly or that exposed a real bug: each stays pinned (hypothesis' @example role,
#: here across every impl that declares the case), with what it taught; run on the suite's device, all of an impl's
#: in one test (``test_pinned_cases[<impl>]``, whose failure names each failing case). Keyed by the text the case
#: was first pinned as, so keys stay stable when Problem's fields or repr change.
PINNED: dict[str, Problem] = {
    # eager bf16: F.cross_entropy forms p_y − 1 in bf16 (declared ce_dtype="compute" widens the bound).
    "Problem(N=16, H=24, V=40, dtype='bfloat16', regime='confident')": Problem(
        N=16, H=24, V=40, dtype="bfloat16", regime="confident"
    ),
    # V=1: eager exact, a correct fp16 impl not; the relative judgement needs its bound-based slack.
    "Problem(N=7, H=1, V=1, dtype='float16', upstream='scalar')": Problem(
        N=7, H=1, V=1, dtype="float16", upstream="scalar"
    ),
    # Liger forms p − y then divides by the token count in bf16: G is rounded twice.
    "Problem(N=7, H=80, V=2, dtype='bfloat16', seed=0)": Problem(N=7, H=80, V=2, dtype="bfloat16", seed=0),
    # fp16 subnormal G scaled by an upstream scalar after it underflowed.
    "Problem(N=1, H=1, V=2, dtype='float16', upstream='scalar', regime='confident', seed=43)": Problem(
        N=1, H=1, V=2, dtype="float16", upstream="scalar", regime="confident", seed=43
    ),
    "Problem(N=1, H=1, V=127, dtype='float16', upstream='scalar', regime='confident', seed=87)": Problem(
        N=1, H=1, V=127, dtype="float16", upstream="scalar", regime="confident", seed=87
    ),
    # bias added after the bf16 matmul output (one more rounding of the logits), AMP.
    "Problem(N=65, H=1, V=31, dtype='float32', autocast='bfloat16', bias=True, bias_dtype='bfloat16', regime='confident')": Problem(
        N=65, H=1, V=31, dtype="float32", autocast="bfloat16", bias=True, bias_dtype="bfloat16", regime="confident"
    ),
    # AMP: gradient matmuls return bf16 before the cast to the fp32 parameters.
    "Problem(N=1, H=1, V=3, dtype='float32', autocast='bfloat16')": Problem(
        N=1, H=1, V=3, dtype="float32", autocast="bfloat16"
    ),
    # Liger fp16: a subnormal grad_x formed in forward, then scaled by the upstream scalar in backward.
    "Problem(N=33, H=63, V=2, dtype='float16', bias=True, upstream='scalar', seed=0)": Problem(
        N=33, H=63, V=2, dtype="float16", bias=True, upstream="scalar", seed=0
    ),
    # Found by the five-seed runs: fp16 gradients summed from rounded partials below the normal range (2η).
    "Problem(N=17, H=16, V=2, dtype='float16', regime='tiny', seed=0)": Problem(
        N=17, H=16, V=2, dtype="float16", regime="tiny", seed=0
    ),
    "Problem(N=1, H=10, V=131, dtype='float16', bias=True, reduction='sum', class_weights=True, regime='confident')": Problem(
        N=1, H=10, V=131, dtype="float16", bias=True, reduction="sum", class_weights=True, regime="confident"
    ),
    # Other derandomized draws (a changed example-database key): the built-ins' fused CE formed the target's
    # gradient as (a + b)·(p_y − 1) + b, leaving u·b where a z-loss makes b ∝ λ·lse large: 28× the fp32 bound.
    "Problem(N=7, H=1, V=3, dtype='float32', z_loss_scale=0.5, regime='large', seed=0)": Problem(
        N=7, H=1, V=3, dtype="float32", z_loss_scale=0.5, regime="large", seed=0
    ),
    "Problem(N=3, H=1, V=1025, dtype='float32', z_loss_scale=0.5, regime='outlier_rows', seed=0)": Problem(
        N=3, H=1, V=1025, dtype="float32", z_loss_scale=0.5, regime="outlier_rows", seed=0
    ),
    "Problem(N=1, H=256, V=2, dtype='float32', label_smoothing=0.1, z_loss_scale=0.5, regime='large', seed=0)": Problem(
        N=1, H=256, V=2, dtype="float32", label_smoothing=0.1, z_loss_scale=0.5, regime="large", seed=0
    ),
    # Held-out review (round 3): a log-sum-exp shifted by the first 128-class block's max overflows exp where a
    # later block's logits exceed it by > 88 (outlier rows at V = 1025); the draws reach it in ~1 of 8.
    "Problem(N=12, H=16, V=1025, regime='outlier_rows', seed=3)": Problem(
        N=12, H=16, V=1025, regime="outlier_rows", seed=3
    ),
    # Held-out review: an all-ignored batch, which the draws reach in ~1 of 27 examples (ignored=1.0 and a given
    # reduction); a 1/0 normalizer in the gradient escaped the ci profile. Every reduction, and a non-default
    # ignore_index (a hard-coded -100 escaped before it was drawn).
    "Problem(N=8, H=16, V=24, ignored=1.0, reduction='mean')": Problem(N=8, H=16, V=24, ignored=1.0, reduction="mean"),
    "Problem(N=8, H=16, V=24, ignored=1.0, reduction='sum', bias=True)": Problem(
        N=8, H=16, V=24, ignored=1.0, reduction="sum", bias=True
    ),
    "Problem(N=8, H=16, V=24, ignored=1.0, reduction='none', upstream='per_row')": Problem(
        N=8, H=16, V=24, ignored=1.0, reduction="none", upstream="per_row"
    ),
    "Problem(N=8, H=16, V=24, ignored=0.5, ignore_index=-1, bias=True, seed=1)": Problem(
        N=8, H=16, V=24, ignored=0.5, ignore_index=-1, bias=True, seed=1
    ),
}


def _pinned_refusal(impl: Any, p: Problem) -> Any:
    """Why ``impl`` is not judged on pinned case ``p``: its declaration excludes it, or a known divergence covers it."""
    return refusal(impl.support, p) or known.known(impl.name, "accuracy", p)


#: The family's suite, registered in :data:`numcheck.properties.suites.SUITES`.
FAMILY = SuiteFamily(
    kind=LINEAR_CE_KIND,
    table=SUITE,
    properties=props.PROPERTIES,
    case_type=Problem,
    strategy=problems,
    pinned=PINNED,
    pinned_property=props.accuracy,
    pinned_refusal=_pinned_refusal,
    assertion="assert_linear_ce",
)
