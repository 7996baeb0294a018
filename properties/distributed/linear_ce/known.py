"""Known divergences of distributed impls that touch some outputs only: the suite still judges every other output
of a covered case under the impl's own model, and judges the covered outputs under the model of what the release
is known to compute (:attr:`OutputDivergence.model`), so a second defect hiding behind the first is still caught.
Whole-case divergences (every output off) are :data:`numcheck.properties.distributed.linear_ce.suite.DIST_KNOWN`.

tests/adapters/test_megatron_fused.py runs every entry's example strictly: the covered outputs must still exceed
the normal bound on a release inside the entry's range (so a fixed release is noticed) and be within it outside.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from numcheck.properties.core.known import Releases
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
        reason=("megatron-core 0.16.1's fused_vocab_parallel_cross_entropy returns the gradient of the logits "
                "rounded to bf16 whatever the logits' dtype (fusions/fused_cross_entropy.py, calculate_gradients: "
                "grad_input = grad_input.to(torch.bfloat16)); autograd casts it back to fp32, so fp32 logits get "
                "an 8-bit gradient: grad_x, grad_W and grad_b off by up to 2^-8 relative where fp32 allows ~1e-6 "
                "(docs/evidence/megatron_fused_bf16_grad.txt). Judged under one extra bf16 rounding of G."),
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
