"""The Liger-Kernel preference adapters (impls/adapters/liger_preference.py): their declarations follow the
installed release's signatures, their conventions (layout, denominators, NLL, averaging, robust DPO, the
reference values handed over chunk by chunk) match the float64 oracle in fp32, and without liger-kernel each impl
registers as unavailable with the reason."""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.adapters import liger_preference
from numcheck.impls.protocols.linear_preference import PreferenceParams
from numcheck.properties.linear_preference import props
from numcheck.properties.linear_preference.cases import PreferenceCase
from numcheck.tests.adapters.uninstalled import impls_while_uninstalled

pytestmark = pytest.mark.torch_versions(reason="Liger's chunked losses are torch code: every torch release runs them")

liger = pytest.importorskip("liger_kernel")


def _impls():
    return {i.name: i for i in liger_preference.liger_preference_impls()}


def test_declared_from_the_release():
    """DPO (sigmoid) without label smoothing, ORPO without the NLL weight, SimPO with its margin, KTO with its
    reference point and no NLL; every loss
    chunked with a parameter-dtype grad_weight sum."""
    impls = _impls()
    eager = {n: i for n, i in impls.items() if not n.endswith("_compiled]")}
    assert all(i.support.unavailable_reason() is None for i in eager.values()), eager
    assert not impls["liger_preference[dpo]"].support.label_smoothing
    assert impls["liger_preference[dpo_robust]"].support.label_smoothing
    assert not impls["liger_preference[orpo]"].support.nll and "alpha" in impls["liger_preference[orpo]"].description
    assert impls["liger_preference[simpo]"].support.margin
    assert impls["liger_preference[cpo]"].support.average_log_prob == {False, True}
    assert impls["liger_preference[kto]"].support.reference_point and not impls["liger_preference[kto]"].support.nll
    assert all(i.support.chunking and i.support.grad_weight_accumulation == "param_dtype" for i in impls.values())


@pytest.mark.parametrize("loss", list(liger_preference.MODULES))
def test_conventions_match_the_oracle(loss):
    """fp32, two chunks, ignored positions, a bias, every declared option set: every output within its bound."""
    impl = _impls()[f"liger_preference[{loss}]"]
    s = impl.support
    case = PreferenceCase(
        P=4,
        T=5,
        H=8,
        V=12,
        bias=True,
        beta=1.5,
        gamma=0.7 if s.margin else 0.0,
        label_smoothing=0.2 if s.label_smoothing else 0.0,
        nll_weight=0.5 if s.nll else 0.0,
        kl=0.7 if s.reference_point else 0.0,
        average_log_prob=max(s.average_log_prob),
        chunk_pairs=2,
        ignored=0.3,
        seed=11,
    )
    metrics = props.accuracy(impl, case)
    assert max(metrics.values()) <= 1


def test_unavailable_without_liger(monkeypatch):
    """Without liger-kernel every loss still registers, unavailable with the reason."""
    got = impls_while_uninstalled(
        monkeypatch, "liger_kernel", liger_preference.liger_preference_impls, [liger_preference.load]
    )
    assert [i.name for i in got] == [f"liger_preference[{k}]" for k in liger_preference.MODULES]
    assert all(i.support.unavailable_reason() == "liger-kernel not installed" for i in got)
    with pytest.raises(RuntimeError, match="unavailable"):
        got[0](torch.zeros(2, 1, 1), torch.zeros(1, 1), torch.zeros(2, 1, dtype=torch.long), params=None)


class _Recording:
    """A stand-in for one of Liger's Functions: its real ``forward`` signature, an ``apply`` that records what the
    adapter hands it."""

    def __init__(self, fn):
        self.forward, self.__name__, self.seen = fn.forward, fn.__name__, {}

    def apply(self, *args):
        params, _ = liger_preference.forward_parameters(self)
        self.seen = dict(zip(params, args))
        return torch.zeros(())


def test_compiled_variant_runs_liger_default_on_cuda_only():
    """Each loss's ``_compiled`` twin hands ``compiled=True`` (Liger's default) to the Function and the plain one
    ``False``; the twin declares CUDA only, and says why it cannot run on a machine without it."""
    impls = _impls()
    for loss in ("dpo", "simpo"):
        plain, compiled = impls[f"liger_preference[{loss}]"], impls[f"liger_preference[{loss}_compiled]"]
        assert compiled.support.devices == {"cuda"} and plain.support.devices >= {"cpu", "cuda"}
        if not torch.cuda.is_available():
            assert "judged on CUDA" in compiled.support.unavailable_reason()
        for impl, want in ((plain, False), (compiled, True)):
            rec = _Recording(impl.fn.fn)
            call = liger_preference.LigerPreference(loss, rec, impl.fn.compiled)
            x, w, t = torch.randn(4, 8), torch.randn(16, 8), torch.randint(0, 16, (4, 3))
            call(x, w, t, params=PreferenceParams(beta=0.5))
            assert rec.seen["compiled"] is want, (impl.name, rec.seen.get("compiled"))
