"""Known divergences of distributed impls (:data:`DIST_KNOWN`), each a
:class:`~numcheck.properties.core.known.KnownDivergence` whose ``applies`` takes the case (a
:class:`~numcheck.properties.distributed.linear_ce.cases.DistCase`) and whose example runs at its
``example_world_size`` (targets placed as ``example_placement`` says). An entry off in every output covers cases
the suite leaves out of its draws (:func:`whole_case_divergence`); one off in some outputs leaves the case in: the
suite still judges every other output of a covered case under the impl's own model, and judges the covered
outputs under the model of what the release is known to compute
(:attr:`~numcheck.properties.core.known.KnownDivergence.model`), so a second defect hiding behind the first is still
caught (:func:`output_divergences`).

Every entry's example runs strictly: tests/adapters/test_megatron_fused.py for Megatron's (an entry of some outputs
still exceeds the normal bound in exactly those outputs on a release inside the entry's range, so a fixed release
is noticed, and is within it outside; an entry of every output still fails in the loss),
tests/adapters/test_transformer_engine.py for TransformerEngine's (failing inside the range, passing outside).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from numcheck.properties.core.known import KnownDivergence, Releases, library_release
from numcheck.properties.distributed.linear_ce.placement import place_targets
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.known import ARTIFACTS, KNOWN
from numcheck.properties.linear_ce.known_te import (
    te_ignored_rows_counted,
    te_per_row_upstream_dropped,
    te_prerounded_gradient_fails,
    te_release,
)
from numcheck.properties.linear_ce.tolerance import ErrorModel, unit_roundoff


def megatron_release() -> str | None:
    """The installed megatron-core release (:func:`numcheck.impls.adapters.megatron.megatron_version`)."""
    from numcheck.impls.adapters.megatron import megatron_version

    return megatron_version()


def _grad_logits_in_bf16(m: ErrorModel) -> ErrorModel:
    """``m`` with the stored gradient of the logits rounded once more, to bf16 (u = 2⁻⁸; bf16 has fp32's exponent
    range, so the underflow term η_G is unchanged)."""
    return dataclasses.replace(m, u_G=m.u_G + unit_roundoff(torch.bfloat16))


def softmax_underflows(case: Any) -> bool:
    """Whether a non-ignored row of ``case``'s logits (in the compute dtype, upcast to fp32 as the adapter does) has
    a class whose fp32 softmax probability is exactly 0."""
    t = build(case.problem)
    z = torch.nn.functional.linear(t.x, t.weight, t.bias.to(t.weight.dtype) if t.bias is not None else None).float()
    valid = t.target != t.options.ignore_index
    return bool((torch.softmax(z[valid], dim=-1) == 0).any())


def _te_stores_fail(case: Any) -> bool:
    """:func:`te_prerounded_gradient_fails` on ``case``'s own tensors: its targets placed as the case places them
    (on shard boundaries, on one rank), not as ``build`` draws them; the stores' rounding depends on which class
    is the target."""
    return te_prerounded_gradient_fails(case.problem, place_targets(build(case.problem), case))


#: Every device type: a distributed entry is a defect of the release's code, seen wherever it runs.
_ANY_DEVICE = ("cpu", "cuda")


def _te(
    reduction: str,
    reason: str,
    applies: Callable[[Any], bool],
    example: Problem,
    specifier: str,
    summary: str,
    world_size: int = 2,
    by_data: bool = False,
) -> KnownDivergence:
    """A TransformerEngine entry for ``te_vocab_parallel[<reduction>]`` (its example in that reduction), off in
    every output."""
    if reduction == "none" and example.reduction != "none":
        example = example.replace(reduction="none")
    return KnownDivergence(
        impls=f"te_vocab_parallel[[]{reduction}[]]",
        properties=("*",),
        devices=_ANY_DEVICE,
        applies=applies,
        reason=reason,
        example=example,
        example_world_size=world_size,
        by_data=by_data,
        releases=Releases("transformer-engine", specifier, te_release),
        library="transformer-engine",
        summary=summary,
    )


#: Known divergences of distributed impls. Megatron's: its unfused CE's two smoothing defects (every output, the
#: examples of their evidence) and its fused CE's bf16 gradient of fp32 logits (some outputs). TransformerEngine's
#: fused CE with ``dist_process_group``: the release defects its linear+CE face shows
#: (:data:`numcheck.properties.linear_ce.known_te.KNOWN`, the ``te_parallel_ce`` entries), here on the vocabulary-parallel
#: path too, and the smoothing of the sharded path before 2.19.
DIST_KNOWN: tuple[KnownDivergence, ...] = (
    KnownDivergence(
        impls="megatron_vocab_parallel",
        properties=("*",),
        devices=_ANY_DEVICE,
        applies=lambda c: c.world_size > 1 and c.problem.label_smoothing > 0,
        reason=(
            "megatron-core 0.16.1's vocab_parallel_cross_entropy smooths with the local shard's size and mean "
            "(vocab_size = exp_logits.size(-1), log_probs.mean(-1), never all-reduced): at world size > 1 with "
            "label_smoothing each rank returns a different loss (docs/evidence/megatron_smoothing.txt)"
        ),
        example=Problem(N=7, H=5, V=16, bias=True, ignored=0.3, label_smoothing=0.1, seed=3),
        example_world_size=2,
        example_placement="boundary",
        library="megatron-core",
        summary="label smoothing uses the local shard's size and mean: at world size > 1 each rank returns a different loss",
    ),
    KnownDivergence(
        impls="megatron_vocab_parallel",
        properties=("*",),
        devices=_ANY_DEVICE,
        applies=lambda c: c.problem.label_smoothing > 0 and softmax_underflows(c),
        reason=(
            "megatron-core 0.16.1's vocab_parallel_cross_entropy smooths with torch.log of its fp32 softmax: a class "
            "whose probability underflows to 0 gives log 0 = -inf and an infinite loss, where Σ −log p_j = "
            "Σ (lse − z_j) is finite (docs/evidence/megatron_smoothing_underflow.txt)"
        ),
        example=Problem(N=1, H=1, V=2, dtype="bfloat16", label_smoothing=0.1, regime="large", seed=0),
        example_world_size=1,
        by_data=True,
        library="megatron-core",
        summary="label smoothing takes log of the fp32 softmax: an underflowing class gives an infinite loss",
    ),
    KnownDivergence(
        impls="megatron_fused_vocab_parallel",
        properties=("*",),
        devices=_ANY_DEVICE,
        applies=lambda c: c.problem.dtype == "float32",
        reason=(
            "megatron-core 0.16.1's fused_vocab_parallel_cross_entropy returns the gradient of the logits "
            "rounded to bf16 whatever the logits' dtype (fusions/fused_cross_entropy.py, calculate_gradients: "
            "grad_input = grad_input.to(torch.bfloat16)); autograd casts it back to fp32, so fp32 logits get "
            "an 8-bit gradient: grad_x, grad_W and grad_b off by up to 2^-8 relative where fp32 allows ~1e-6 "
            "(docs/evidence/megatron_fused_bf16_grad.txt). Judged under one extra bf16 rounding of G."
        ),
        example=Problem(N=7, H=5, V=16, bias=True, ignored=0.3, seed=3),
        example_world_size=2,
        example_placement="boundary",
        releases=Releases("megatron-core", ">=0.8.0", megatron_release),
        outputs=("grad_x", "grad_weight", "grad_bias"),
        model=_grad_logits_in_bf16,
        library="megatron-core",
        summary="the gradient of fp32 logits is rounded to bf16 (judged under that extra rounding)",
    ),
    *(
        _te(
            red,
            "TransformerEngine 2.2-2.18's fused CE with dist_process_group adds the label-smoothing term "
            "-eps/V * sum_j z_j over the rank's own vocabulary shard only (cross_entropy_kernel: scaled_x_sum runs "
            "over the local columns; the row max, the sum of exponentials and the target logit are all-gathered, "
            "that sum is not): at world size > 1 each rank returns a different, wrong loss (P = 2, V = 8, "
            "eps = 0.1: 0.034 and 0.046 off); the gradients are right. 2.19 all-gathers the sum too. Measured on "
            "2.18.0 (docs/evidence/te_releases.txt).",
            lambda c: c.world_size > 1 and c.problem.label_smoothing > 0,
            Problem(N=7, H=8, V=16, label_smoothing=0.1, seed=3),
            ">=2.2,<2.19",
            "label smoothing's sum of logits is taken over the rank's own shard only: each rank returns a wrong loss",
        )
        for red in ("mean", "none")
    ),
    *(
        _te(
            red,
            "TransformerEngine 2.4.0-2.6.0.post1's CrossEntropyFunction backward returns five gradients for "
            "six inputs: every backward of a call passing ignore_idx, as the adapter does, raises (the "
            "te_parallel_ce entry of properties/linear_ce/known_te.py).",
            lambda c: True,
            Problem(N=7, H=8, V=16, seed=3),
            ">=2.4,<2.7",
            "the backward of every call passing ignore_idx raises (5 gradients for 6 inputs)",
        )
        for red in ("mean", "none")
    ),
    _te(
        "none",
        "TransformerEngine before 2.5 divides reduce_loss=False's gradient by the number of rows (the "
        "te_parallel_ce[none] entry of properties/linear_ce/known_te.py).",
        lambda c: c.problem.N > 1,
        Problem(N=7, H=8, V=16, seed=3),
        ">=2.2,<2.5",
        "reduce_loss=False's gradient is divided by the row count (every gradient 1/N of the right one)",
    ),
    _te(
        "none",
        "TransformerEngine before 2.8 scales reduce_loss=False's gradient by the first row's upstream for "
        "every row (TE pull request #2139; the te_parallel_ce[none] entry of properties/linear_ce/known_te.py).",
        lambda c: te_per_row_upstream_dropped(c.problem),
        Problem(N=7, H=8, V=16, reduction="none", upstream="per_row", seed=3),
        ">=2.2,<2.8",
        "reduce_loss=False scales every row's gradient by the first row's upstream gradient",
        by_data=True,
    ),
    _te(
        "mean",
        "TransformerEngine 2.4-2.11's reduce_loss=True divides by all rows, ignored ones included (TE pull "
        "request #2476; the te_parallel_ce[mean] entry of properties/linear_ce/known_te.py).",
        lambda c: te_ignored_rows_counted(c.problem),
        Problem(N=7, H=8, V=16, ignored=0.4, seed=2),
        ">=2.4,<2.12",
        "reduce_loss=True divides the loss and its gradient by all rows, ignored ones included",
        by_data=True,
    ),
    *(
        _te(
            red,
            "TransformerEngine before 2.18 keeps the gradient in the bf16 logits buffer from forward on, losing "
            "the target's gradient on confident rows (the te_parallel_ce entry of properties/linear_ce/known_te.py). "
            "Covered where the emulated stores fail the single-device judgement, which the sharded model only "
            "widens.",
            _te_stores_fail,
            Problem(N=7, H=8, V=16, dtype="bfloat16", regime="confident", seed=4),
            ">=2.2,<2.18",
            "the gradient is kept in the bf16 logits buffer: confident rows lose the target's gradient",
            by_data=True,
        )
        for red in ("mean", "none")
    ),
)


def whole_case_divergence(impl: Any, case: Any) -> KnownDivergence | None:
    """The entry off in every output that covers ``case`` for ``impl`` on the installed release, if any."""
    return next((d for d in DIST_KNOWN if d.every_output and d.covers_case(impl.name, case)), None)


def output_divergences(impl: Any, case: Any) -> list[KnownDivergence]:
    """The entries off in some outputs that cover ``case`` for ``impl`` on the installed release."""
    return [d for d in DIST_KNOWN if not d.every_output and d.covers_case(impl.name, case)]


def applicable(impl_name: str, device: str, support: Any = None) -> list[KnownDivergence]:
    """Every recorded known divergence and environment artifact about impl ``impl_name`` (declared as ``support``)
    on ``device``'s type and the installed release (:meth:`KnownDivergence.applies_here`): single-device,
    distributed and :data:`ARTIFACTS` entries, in that order.

    In this module (not :mod:`properties.linear_ce.known`) because it reads both tables.

    >>> [k.summary for k in applicable("eager", "cuda")][:1]
    ['F.cross_entropy with label smoothing on fp16 logits sums the smoothing term in fp16: inf loss']
    """
    return [k for k in (*KNOWN, *DIST_KNOWN, *ARTIFACTS) if k.applies_here(impl_name, device, support)]


#: The library numcheck's Megatron adapters call (:data:`numcheck.properties.libraries.ADAPTER_LIBRARIES`).
LIBRARIES = (("megatron_*", "megatron-core", lambda: library_release("megatron-core")),)
