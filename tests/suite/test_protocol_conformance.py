"""Every linear+CE impl follows the protocol's structure on a tiny case, for each reduction it declares.

Structure only — the values are judged by the property suite: the loss has the shape of its reduction, is a
floating tensor connected to autograd, ``(loss, z_loss)`` is returned exactly when declared, and
``loss.backward(upstream)`` fills finite gradients of the right shape and dtype on ``x``, ``weight`` and
``bias``. It is fast, so it is also what the outside-impl end-to-end test runs.
"""

from __future__ import annotations

import pytest

from numcheck.errors import PropertyFailure
from numcheck.impls.protocols.linear_ce import LINEAR_CE_OPTIONS
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.runner import judge
from numcheck.properties.linear_ce import props
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.known import known

pytestmark = pytest.mark.torch_versions_impls(
    "chunked[addmm_out_dtype]",
    "eager",
    "chunked_triton",
    "torch_native[reference]",
    "liger[accum=fp32]",
    reason="one impl per torch-switched path: the addmm_out_dtype probe, autocast (eager), the Triton torch pins, F.linear_cross_entropy, Liger's import",
)

#: Options this tiny case turns on when declared, with values that make each one matter.
_OPTION_VALUES = {"label_smoothing": 0.1, "softcap": 8.0, "z_loss_scale": 1e-3}


def _dtype_name(support) -> str:
    names = sorted(str(d).replace("torch.", "") for d in support.dtypes)
    return "float32" if "float32" in names else names[0]


def _problem(support, reduction: str) -> Problem:
    """A tiny problem using every option the impl declares (minus excluded combinations), on the suite's device."""
    opts = set(support.options)
    for combo in support.option_combinations_excluded:
        if combo <= opts:
            opts -= set(sorted(combo)[1:])
    return Problem(
        N=6,
        H=8,
        V=13,
        dtype=_dtype_name(support),
        bias="bias" in opts,
        ignored=0.34 if "ignore_index" in opts else 0.0,
        reduction=reduction,
        label_smoothing=_OPTION_VALUES["label_smoothing"] if "label_smoothing" in opts else 0.0,
        class_weights="class_weights" in opts,
        softcap=_OPTION_VALUES["softcap"] if "softcap" in opts else None,
        z_loss_scale=_OPTION_VALUES["z_loss_scale"] if "z_loss" in opts else 0.0,
        upstream="per_row" if reduction == "none" else "scalar",
        seed=7,
        device=DEVICE,
    )


def test_protocol_structure(linear_ce_impl):
    """For each reduction the impl declares, it returns a loss of that reduction's shape with an autograd graph, and
    gradients reach x, W, bias (:func:`numcheck.properties.linear_ce.props.protocol_structure`). One test per impl: its
    failure names each reduction that fails, or the exception an impl raised."""
    s = linear_ce_impl.support
    assert set(s.options) <= set(LINEAR_CE_OPTIONS)
    cases = [
        p
        for p in (_problem(s, red) for red in ("mean", "sum", "none"))
        if not s.refuses(dtype=p.param_dtype, device=p.device, options=p.features, reduction=p.reduction)
    ]
    if not cases:
        pytest.skip(
            f"{linear_ce_impl.name} declares none of this test's tiny cases (its dtypes, options or "
            f"reductions on {DEVICE})"
        )
    # A case a recorded known divergence covers is left out, as the drawn tests leave it out of their draws.
    covered = {p: k for p in cases if (k := known(linear_ce_impl.name, "protocol_structure", p)) is not None}
    cases = [p for p in cases if p not in covered]
    if not cases:
        pytest.skip(
            f"every case of this test is a known divergence of {linear_ce_impl.name} "
            f"(numcheck.properties.linear_ce.known): {next(iter(covered.values())).reason}"
        )
    failures = []
    for p in cases:
        try:
            judge(props.protocol_structure, linear_ce_impl, p)
        except PropertyFailure as exc:
            failures.append(exc)
            if exc.raised:  # the impl raises: one failure says it
                break
    if failures:
        first = failures[0]
        others = "".join(f"\n  also fails for reduction {f.case.reduction!r} ({f.case!r})" for f in failures[1:])
        raise PropertyFailure(f"{first}{others}", case=first.case, raised=first.raised)
