"""Every linear+CE impl follows the protocol's structure on a tiny case, for each reduction it declares.

Structure only — the values are judged by the property suite: the loss has the shape of its reduction, is a
floating tensor connected to autograd, ``(loss, z_loss)`` is returned exactly when declared, and
``loss.backward(upstream)`` fills finite gradients of the right shape and dtype on ``x``, ``weight`` and
``bias``. It is fast, so it is also what the outside-impl end-to-end test runs.
"""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.protocols.linear_ce import LINEAR_CE_OPTIONS
from numcheck.properties.core.harness import ProtocolViolation, run_impl
from numcheck.properties.core.problems import Problem
from numcheck.properties.core.strategies import DEVICE

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
        N=6, H=8, V=13, dtype=_dtype_name(support), bias="bias" in opts,
        ignored=0.34 if "ignore_index" in opts else 0.0, reduction=reduction,
        label_smoothing=_OPTION_VALUES["label_smoothing"] if "label_smoothing" in opts else 0.0,
        class_weights="class_weights" in opts, softcap=_OPTION_VALUES["softcap"] if "softcap" in opts else None,
        z_loss_scale=_OPTION_VALUES["z_loss_scale"] if "z_loss" in opts else 0.0,
        upstream="per_row" if reduction == "none" else "scalar", seed=7, device=DEVICE)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_protocol_structure(linear_ce_impl, reduction):
    """The impl returns a loss of its reduction's shape with an autograd graph, and gradients reach x, W, bias."""
    s = linear_ce_impl.support
    assert set(s.options) <= set(LINEAR_CE_OPTIONS)
    p = _problem(s, reduction)
    why = s.refuses(dtype=p.param_dtype, device=p.device, options=p.features, reduction=reduction)
    if why:
        pytest.skip(f"{linear_ce_impl.name}: {why}")
    repro = f"pytest 'tests/suite/test_protocol_conformance.py::test_protocol_structure[{linear_ce_impl.name}-{reduction}]'"
    try:
        out = run_impl(linear_ce_impl, p)
    except ProtocolViolation as exc:
        raise AssertionError(f"{exc} on {p!r}; repro: {repro}") from None
    want = (p.N,) if reduction == "none" else ()
    assert tuple(out.loss.shape) == want, f"impl {linear_ce_impl.name!r}: loss shape {tuple(out.loss.shape)}, want {want}; {repro}"
    assert bool(torch.isfinite(out.loss).all()), f"impl {linear_ce_impl.name!r}: non-finite loss {out.loss} on {p!r}; {repro}"
    if s.returns_z_loss:
        assert out.z_loss is not None and tuple(out.z_loss.shape) == want, (
            f"impl {linear_ce_impl.name!r} declares returns_z_loss but z_loss is {out.z_loss!r}; {repro}")
    shapes = {"grad_x": (p.N, p.H), "grad_weight": (p.V, p.H)}
    if p.bias:
        shapes["grad_bias"] = (p.V,)
    for name, shape in shapes.items():
        g = out.get(name)
        assert g is not None, f"impl {linear_ce_impl.name!r}: no {name} after loss.backward() — gradient does not reach it; {repro}"
        assert tuple(g.shape) == shape, f"impl {linear_ce_impl.name!r}: {name} shape {tuple(g.shape)}, want {shape}; {repro}"
        assert bool(torch.isfinite(g).all()), f"impl {linear_ce_impl.name!r}: non-finite {name} on {p!r}; {repro}"
    assert bool((out.grad_x != 0).any()), f"impl {linear_ce_impl.name!r}: grad_x is all zero on {p!r}; {repro}"
