"""The ``torch_native`` adapters (PyTorch's ``F.linear_cross_entropy``): reference and chunked paths against the
float64 oracle on hand-picked cases, the chunked path's fallback made loud, and its declared limits checked
against what it really does.

Cost: ~60 small CPU calls, about 3 s.
"""

from __future__ import annotations

import pytest
import torch

import numcheck.impls.adapters.torch_native as tn
from numcheck.impls.registry import builtin as _impl
from numcheck.properties.core.failures import fail
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.harness import run_impl
from numcheck.properties.linear_ce.strategies import why_not_run

pytestmark = pytest.mark.torch_versions(
    reason="F.linear_cross_entropy: absent before torch 2.13, its impls then unavailable with the reason"
)

NAMES = ["torch_native[reference]"] + [f"torch_native[chunked,acc={p}]" for p in tn.ACC_POLICIES]

#: Hand-picked cases: each reduction, bias, ignore_index, label smoothing and class weights (alone and
#: together), ``none`` with a non-uniform per-row upstream gradient, the all-ignored batch, bf16/fp16 and AMP.
#: N=37 is not a multiple of the chunked path's chunk (aspect_ratio: next_pow2(⌈37/⌈V/H⌉⌉) rows).
CASES: list[Problem] = [
    Problem(N=37, H=16, V=53, seed=1),
    Problem(N=37, H=16, V=53, bias=True, ignored=0.25, reduction="sum", upstream="scalar", seed=2),
    Problem(N=37, H=16, V=53, reduction="none", upstream="per_row", ignored=0.25, bias=True, seed=3),
    Problem(N=37, H=16, V=53, class_weights=True, ignored=0.2, seed=4),
    Problem(N=37, H=16, V=53, class_weights=True, reduction="none", upstream="per_row", seed=5),
    Problem(N=37, H=16, V=53, label_smoothing=0.1, class_weights=True, ignored=0.2, seed=6),
    Problem(N=37, H=16, V=53, ignored=1.0, seed=7),
    Problem(N=37, H=16, V=53, ignored=1.0, reduction="sum", seed=7),
    Problem(N=37, H=16, V=53, regime="confident", seed=8),
    Problem(N=37, H=16, V=53, dtype="bfloat16", bias=True, seed=9),
    Problem(N=37, H=16, V=53, dtype="float16", class_weights=True, seed=10),
    Problem(N=37, H=16, V=53, autocast="bfloat16", bias=True, ignored=0.1, seed=11),
]


def _param(name: str, p: Problem):
    marks = []
    if "chunked" in name and p.all_ignored and p.reduction == "mean":
        marks.append(
            pytest.mark.xfail(
                strict=True,
                reason=(
                    "PyTorch's chunked linear_cross_entropy divides its row weights by a NaN normaliser when every row is "
                    "ignored: NaN gradients where the reference path (and F.cross_entropy) give zeros. Undocumented, so "
                    "declared all_ignored='nan' and reported; strict: passes again only if PyTorch changes"
                ),
            )
        )
    return pytest.param(name, p, id=f"{name}-{p.short()}", marks=marks)


@pytest.mark.parametrize("name,p", [_param(n, p) for n in NAMES for p in CASES])
def test_matches_oracle(name: str, p: Problem) -> None:
    """Each torch_native impl matches the float64 oracle within the tolerance model on every declared case."""
    impl = _impl(name)
    why = why_not_run(impl, p)
    if why:
        pytest.skip(why)
    res = check_accuracy(impl, p)
    if not res.ok:
        fail(impl, "accuracy", p, *res.failure_lines())


@pytest.mark.parametrize("policy", tn.ACC_POLICIES)
def test_chunked_fallback_is_an_error(policy: str) -> None:
    """When PyTorch would silently run its reference path instead of the chunked one (label smoothing), the
    adapter raises ChunkedFallback quoting PyTorch's warning, and label smoothing is not declared."""
    impl = _impl(f"torch_native[chunked,acc={policy}]")
    if impl.support.unavailable_reason():
        pytest.skip(impl.support.unavailable_reason())
    assert "label_smoothing" not in impl.support.options
    assert "label_smoothing" in impl.description
    x, w = torch.randn(6, 4, requires_grad=True), torch.randn(9, 4, requires_grad=True)
    y = torch.randint(0, 9, (6,))
    with pytest.raises(tn.ChunkedFallback, match="options.*ignored"):
        impl(x, w, y, None, reduction="mean", ignore_index=-100, label_smoothing=0.1)
    impl(x, w, y, None, reduction="mean", ignore_index=-100)  # the declared path raises nothing


@pytest.mark.parametrize("policy", tn.ACC_POLICIES)
def test_chunked_ignores_autocast_as_declared(policy: str) -> None:
    """The chunked op computes in the parameters' dtype under autocast (why AMP is not declared): its
    outputs under bf16 autocast equal the fp32 call's bitwise. Passing means the declaration is still true."""
    impl = _impl(f"torch_native[chunked,acc={policy}]")
    if impl.support.unavailable_reason():
        pytest.skip(impl.support.unavailable_reason())
    assert torch.bfloat16 not in impl.support.autocast
    p = Problem(N=16, H=8, V=24, bias=True, seed=3)
    plain = run_impl(impl, p)
    amp = run_impl(impl, p.replace(autocast="bfloat16"))
    for out in ("loss", "grad_x", "grad_weight", "grad_bias"):
        a, b = plain.get(out), amp.get(out)
        assert torch.equal(a, b), (
            f"{impl.name}: {out} differs under bf16 autocast (max |Δ| "
            f"{(a.double() - b.double()).abs().max():.3g}): it now honours autocast; "
            "declare AMP for it instead"
        )


def test_no_softcap_no_zloss() -> None:
    """PyTorch has neither softcap nor z-loss: no torch_native impl declares them, and passing one is a
    ValueError naming it, never silently dropped."""
    x, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2])
    for name in NAMES:
        impl = _impl(name)
        assert not {"softcap", "z_loss"} & set(impl.support.options), name
        with pytest.raises(ValueError, match="softcap"):
            impl(x, w, y, None, softcap=3.0)
        with pytest.raises(ValueError, match="z-loss"):
            impl(x, w, y, None, z_loss_scale=0.1)
