"""Known divergences that cover a whole test, and the TransformerEngine store emulation of releases before 2.5.

Judging TE 2.2-2.6 for the versions table (docs/evidence/te_releases.py) found three gaps: on 2.4-2.6, whose
backward raises on every call numcheck makes (a recorded entry of every case), the distributed tests failed with hypothesis'
``Unsatisfiable`` and ``test_protocol_structure`` judged the covered cases anyway; on 2.2, a V = 1 ``none`` case
failed because the emulation of TE's bf16 gradient stores left out the division by the rows those releases make.
"""

from __future__ import annotations

import types

import pytest
import torch

from numcheck.impls.registry import builtin, dist_impls
from numcheck.properties.core.tensors import kernel_store
from numcheck.properties.distributed.linear_ce import suite as dist_suite
from numcheck.properties.distributed.linear_ce.props import dist_accuracy
from numcheck.properties.linear_ce import known_te
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.tests.suite import test_protocol_conformance

_ENTRY = types.SimpleNamespace(reason="a release whose backward always raises (test entry)")


def test_dist_property_every_draw_known_raises_every_draw_known(monkeypatch):
    """Every draw covered by a whole-case entry: ``run_property`` raises :class:`EveryDrawKnown` naming the
    entry (the suite skips with it), not hypothesis' ``Unsatisfiable``; no rank is called."""
    impl = next(i for i in dist_impls() if i.name == "vocab_parallel[nan]")
    monkeypatch.setattr(dist_suite, "whole_case_divergence", lambda impl, case: _ENTRY)
    with pytest.raises(dist_suite.EveryDrawKnown, match="backward always raises") as info:
        dist_suite.run_property(dist_accuracy, impl, 1, "numcheck-ci", shrink=False)
    assert info.value.reasons == [_ENTRY.reason]
    assert "vocab_parallel[nan] at world size 1" in str(info.value)


def test_protocol_structure_skips_cases_a_known_divergence_covers(monkeypatch):
    """``test_protocol_structure`` leaves out the cases a recorded entry covers, as the drawn tests do, and skips
    with the entry's reason when none is left."""
    impl = builtin("eager")
    monkeypatch.setattr(test_protocol_conformance, "known", lambda name, prop, p: _ENTRY)
    with pytest.raises(pytest.skip.Exception, match="every case of this test is a known divergence of eager"):
        test_protocol_conformance.test_protocol_structure(impl)


@pytest.mark.parametrize(("release", "divided"), [("2.2.0", True), ("2.20.2", False)])
def test_te_store_emulation_divides_none_by_rows_before_2_5(monkeypatch, release, divided):
    """At V = 1 every exact gradient is 0; TE before 2.5 stores p/N = 1/N in the bf16 logits and subtracts 1/N
    from it, leaving bf16(bf16(1/N) - 1/N) on every row (the grad_W of 0.0135 measured on TE 2.2.0 for this case, past
    its bound). The emulation divides ``none`` by the rows only on those releases."""
    monkeypatch.setattr(known_te, "te_release", lambda: release)
    p = Problem(N=63, H=1, V=1, dtype="bfloat16", reduction="none", regime="post_norm", seed=2097150)
    t = build(p)
    out = known_te.te_gradient_stored_in_logits(p, t)
    if not divided:
        assert not out.grad_weight.any()
        return
    stored = kernel_store(torch.full((p.N, 1), 1.0 / p.N), torch.bfloat16).double()
    g = kernel_store((stored - 1.0 / p.N).float(), torch.bfloat16).double()  # the target's second store
    expected = (g.T @ t.x.double()).to(torch.bfloat16)
    assert out.grad_weight.any() and torch.equal(out.grad_weight, expected)


def test_te_dist_store_entry_reads_the_case_tensors():
    """The distributed bf16-store entry decides on the case's own tensors: a ``boundary`` placement moves the
    target of N = 1, V = 2 from class 1 (as ``build`` draws it, where the emulated stores pass) to class 0 (where
    they fail: TE 2.2.0's grad_W at 3.6 times its bound at world size 1 was this)."""
    pytest.importorskip("triton")
    from numcheck.impls.adapters import transformer_engine

    if isinstance(transformer_engine.load(), str):
        pytest.skip(f"TransformerEngine's fused CE is not loadable here: {transformer_engine.load()}")
    from numcheck.properties.distributed.linear_ce import known as dist_known
    from numcheck.properties.distributed.linear_ce.cases import DistCase

    p = Problem(N=1, H=7, V=2, dtype="bfloat16", reduction="none", seed=1)
    assert not known_te.te_prerounded_gradient_fails(p)
    assert dist_known._te_stores_fail(DistCase(problem=p, world_size=1, placement="boundary"))
