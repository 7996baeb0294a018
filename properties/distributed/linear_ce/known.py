"""Known divergences of distributed impls that touch some outputs only: the suite still judges every other output
of a covered case under the impl's own model, and judges the covered outputs under the model of what the release
is known to compute (:attr:`OutputDivergence.model`), so a second defect hiding behind the first is still caught.
Whole-case divergences (every output off) are :data:`numcheck.properties.distributed.linear_ce.suite.DIST_KNOWN`;
those of a third-party release range are :data:`CASE_KNOWN` here (DIST_KNOWN takes them), each with an example that
tests/adapters/test_transformer_engine.py runs strictly (failing inside the range, passing outside).

tests/adapters/test_megatron_fused.py runs every entry's example strictly: the covered outputs must still exceed
the normal bound on a release inside the entry's range (so a fixed release is noticed) and be within it outside.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from numcheck.properties.core.known import (
    Releases,
    te_ignored_rows_counted,
    te_per_row_upstream_dropped,
    te_prerounded_gradient_fails,
    te_release,
)
from numcheck.properties.core.problems import Problem
from numcheck.properties.core.tolerance import ErrorModel, unit_roundoff


def megatron_release() -> str | None:
    """The installed megatron-core release (:func:`numcheck.impls.adapters.megatron.megatron_version`)."""
    from numcheck.impls.adapters.megatron import megatron_version

    return megatron_version()


@dataclass(frozen=True)
class OutputDivergence:
    """A divergence of impl ``impl`` (its name) in ``outputs`` on the cases ``covers(case)`` accepts (a
    :class:`~numcheck.properties.distributed.linear_ce.props.DistCase`), for ``releases``. ``model`` maps the impl's
    :class:`ErrorModel` to the model of what the release computes, under which the covered outputs are judged.
    ``example``: a covered problem and world size whose covered outputs exceed the normal bound."""

    impl: str
    outputs: tuple[str, ...]
    reason: str
    covers: Callable[[Any], bool]
    model: Callable[[ErrorModel], ErrorModel]
    example: Problem
    example_world_size: int
    releases: Releases

    def holds(self, impl: Any, case: Any) -> bool:
        """Whether this entry covers ``case`` for ``impl`` on the installed release."""
        return impl.name == self.impl and self.releases.hold() and self.covers(case)


def _grad_logits_in_bf16(m: ErrorModel) -> ErrorModel:
    """``m`` with the stored gradient of the logits rounded once more, to bf16 (u = 2⁻⁸; bf16 has fp32's exponent
    range, so the underflow term η_G is unchanged)."""
    import torch

    return dataclasses.replace(m, u_G=m.u_G + unit_roundoff(torch.bfloat16))


OUTPUT_KNOWN: tuple[OutputDivergence, ...] = (
    OutputDivergence(
        impl="megatron_fused_vocab_parallel",
        outputs=("grad_x", "grad_weight", "grad_bias"),
        reason=(
            "megatron-core 0.16.1's fused_vocab_parallel_cross_entropy returns the gradient of the logits "
            "rounded to bf16 whatever the logits' dtype (fusions/fused_cross_entropy.py, calculate_gradients: "
            "grad_input = grad_input.to(torch.bfloat16)); autograd casts it back to fp32, so fp32 logits get "
            "an 8-bit gradient: grad_x, grad_W and grad_b off by up to 2^-8 relative where fp32 allows ~1e-6 "
            "(docs/evidence/megatron_fused_bf16_grad.txt). Judged under one extra bf16 rounding of G."
        ),
        covers=lambda c: c.problem.dtype == "float32",
        model=_grad_logits_in_bf16,
        example=Problem(N=7, H=5, V=16, bias=True, ignored=0.3, seed=3),
        example_world_size=2,
        releases=Releases("megatron-core", ">=0.8.0", megatron_release),
    ),
)


def output_divergences(impl: Any, case: Any) -> list[OutputDivergence]:
    """The entries covering ``case`` for ``impl`` on the installed release."""
    return [d for d in OUTPUT_KNOWN if d.holds(impl, case)]


@dataclass(frozen=True)
class CaseDivergence:
    """A whole-case divergence of the distributed impl named ``impl`` on ``releases``: the cases ``covers(case)``
    accepts are left out of the draws (:data:`numcheck.properties.distributed.linear_ce.suite.DIST_KNOWN`).
    ``example`` at ``example_world_size`` (``placement``) is a covered case whose ``dist_accuracy`` fails inside the
    range and passes outside it."""

    impl: str
    reason: str
    covers: Callable[[Any], bool]
    example: Problem
    example_world_size: int
    releases: Releases
    placement: str = "as_built"

    def holds(self, case: Any) -> bool:
        """Whether this entry covers ``case`` on the installed release."""
        return self.releases.hold() and self.covers(case)


def _te(
    reduction: str, reason: str, covers: Callable[[Any], bool], example: Problem, specifier: str, world_size: int = 2
) -> CaseDivergence:
    """A TransformerEngine entry for ``te_vocab_parallel[<reduction>]`` (its example in that reduction)."""
    if reduction == "none" and example.reduction != "none":
        example = example.replace(reduction="none")
    return CaseDivergence(
        impl=f"te_vocab_parallel[{reduction}]",
        reason=reason,
        covers=covers,
        example=example,
        example_world_size=world_size,
        releases=Releases("transformer-engine", specifier, te_release),
    )


#: TransformerEngine's fused CE with ``dist_process_group``: the release defects its linear+CE face shows
#: (:data:`numcheck.properties.core.known.KNOWN`, the ``te_parallel_ce`` entries), here on the vocabulary-parallel
#: path too, and the smoothing of the sharded path before 2.19.
CASE_KNOWN: tuple[CaseDivergence, ...] = (
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
        )
        for red in ("mean", "none")
    ),
    *(
        _te(
            red,
            "TransformerEngine 2.4.0-2.6.0.post1's CrossEntropyFunction backward returns five gradients for "
            "six inputs: every backward raises (the te_parallel_ce entry of properties/core/known.py).",
            lambda c: True,
            Problem(N=7, H=8, V=16, seed=3),
            ">=2.4,<2.7",
        )
        for red in ("mean", "none")
    ),
    _te(
        "none",
        "TransformerEngine before 2.5 divides reduce_loss=False's gradient by the number of rows (the "
        "te_parallel_ce[none] entry of properties/core/known.py).",
        lambda c: c.problem.N > 1,
        Problem(N=7, H=8, V=16, seed=3),
        ">=2.2,<2.5",
    ),
    _te(
        "none",
        "TransformerEngine before 2.8 scales reduce_loss=False's gradient by the first row's upstream for "
        "every row (TE pull request #2139; the te_parallel_ce[none] entry of properties/core/known.py).",
        lambda c: te_per_row_upstream_dropped(c.problem),
        Problem(N=7, H=8, V=16, reduction="none", upstream="per_row", seed=3),
        ">=2.2,<2.8",
    ),
    _te(
        "mean",
        "TransformerEngine 2.4-2.11's reduce_loss=True divides by all rows, ignored ones included (TE pull "
        "request #2476; the te_parallel_ce[mean] entry of properties/core/known.py).",
        lambda c: te_ignored_rows_counted(c.problem),
        Problem(N=7, H=8, V=16, ignored=0.4, seed=2),
        ">=2.4,<2.12",
    ),
    *(
        _te(
            red,
            "TransformerEngine before 2.18 keeps the gradient in the bf16 logits buffer from forward on, losing "
            "the target's gradient on confident rows (the te_parallel_ce entry of properties/core/known.py). "
            "Covered where the emulated stores fail the single-device judgement, which the sharded model only "
            "widens.",
            lambda c: te_prerounded_gradient_fails(c.problem),
            Problem(N=7, H=8, V=16, dtype="bfloat16", regime="confident", seed=4),
            ">=2.2,<2.18",
        )
        for red in ("mean", "none")
    ),
)


def case_divergence(impl: Any, case: Any) -> CaseDivergence | None:
    """The :data:`CASE_KNOWN` entry covering ``case`` for ``impl`` on the installed release, if any."""
    return next((d for d in CASE_KNOWN if d.impl == impl.name and d.holds(case)), None)
