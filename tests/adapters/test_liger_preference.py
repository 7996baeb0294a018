"""The Liger-Kernel preference adapters (impls/adapters/liger_preference.py): their declarations follow the
installed release's signatures, their conventions (layout, denominators, NLL, averaging, robust DPO, the
reference values handed over chunk by chunk) match the float64 oracle in fp32, and without liger-kernel each impl
registers as unavailable with the reason."""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.adapters import liger_preference
from numcheck.impls.protocols.linear_preference import PreferenceParams
from numcheck.properties.core.device import DEVICE
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
    """fp32, two chunks of unequal size (Liger splits 5 pairs at chunk_size 2 into 3 and 2; KTO's 10 completions at
    4 into 5 and 5), ignored positions, a bias, every declared option set: every output within its bound (the
    reference values reach each chunk's rows)."""
    impl = _impls()[f"liger_preference[{loss}]"]
    s = impl.support
    case = PreferenceCase(
        P=5,
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
        device=DEVICE,  # the suite's device: on a GPU run the adapter is judged on CUDA
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
    adapter hands it, and the class and the loss function a compiled twin's call looks up."""

    def __init__(self, fn):
        self.forward, self.__name__, self.seen = fn.forward, fn.__name__, {}
        self.__mro__, self.preference_loss_fn = fn.__mro__, fn.__dict__["preference_loss_fn"]

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


def test_known_divergence_examples_pass_outside_their_releases():
    """Each recorded divergence's example passes its first property on the installed release where that is outside
    the entry's range (0.8.5 in CI: DPO's sign was fixed in 0.5.3, KTO's chunks in 0.8.3), so an entry cannot outlive a
    fix unnoticed; inside the range the examples fail (docs/evidence/liger_preference_releases.txt)."""
    from numcheck.properties.linear_preference.known_liger import KNOWN

    impls = _impls()
    ran = 0
    for entry in KNOWN:
        impl = impls[entry.impls.replace("[[]", "[")]
        if impl.support.unavailable_reason() or entry.releases.hold():
            continue
        props.PROPERTIES[entry.properties[0]](impl, entry.example.replace(device=DEVICE))
        ran += 1
    assert ran or all(k.releases.hold() for k in KNOWN)


def test_kto_chunk_predicate_is_the_broadcast_that_raises():
    """``kto_chunks_raise`` says exactly when Liger 0.5.5-0.8.2's unpaired base raises: a chunk of ``n``
    completions (``torch.chunk`` of the 2P rows) whose ``[n, T, V]`` logits times ``labels.unsqueeze(1)`` do not
    broadcast."""
    from numcheck.properties.linear_preference.known_liger import kto_chunks_raise

    for P in range(1, 5):
        for T in range(1, 7):
            for chunk_pairs in range(1, P + 1):
                B = 2 * P
                raised = False
                for rows in torch.arange(B).chunk(max(1, B // (2 * chunk_pairs))):
                    n = len(rows)
                    try:
                        torch.zeros(n, T, 3) * torch.ones(n, dtype=torch.bool).unsqueeze(1)
                    except RuntimeError:
                        raised = True
                assert kto_chunks_raise(P, T, chunk_pairs) == raised, (P, T, chunk_pairs)
    assert not kto_chunks_raise(3, 5, None)


class _Base(torch.autograd.Function):
    @staticmethod
    def forward(ctx, _input, chunk_size=1, average_log_prob=True):
        return _input


class _Summing(_Base):
    """Like CPO 0.5.3-0.5.4: no average_log_prob parameter, hands the base False."""

    @staticmethod
    def forward(ctx, _input, chunk_size=1):
        return _Base.forward(ctx, _input, chunk_size, average_log_prob=False)


class _BaseDefault(_Base):
    """Like DPO up to 0.5.8: no average_log_prob parameter, the base's default applies."""

    @staticmethod
    def forward(ctx, _input):
        return _Base.forward(ctx, _input)


class _OldBase(torch.autograd.Function):
    """Like the bases of 0.5.0-0.5.2: no average_log_prob at all (they always average)."""

    @staticmethod
    def forward(ctx, _input, chunk_size=1):
        return _input


class _OnOldBase(_OldBase):
    @staticmethod
    def forward(ctx, _input):
        return _OldBase.forward(ctx, _input)


def test_fixed_reduction_of_a_release_without_average_log_prob():
    """A release whose forward has no average_log_prob is declared with the reduction it applies: the value its
    forward hands the base, else the base's default, else (no such parameter anywhere) the mean."""
    assert liger_preference.fixed_average(_Summing) is False
    assert liger_preference.fixed_average(_BaseDefault) is True
    assert liger_preference.fixed_average(_OnOldBase) is True
    support, notes = liger_preference.declare("cpo", ("_input", "chunk_size"), _Summing)
    assert support.average_log_prob == {False} and any("summed" in n for n in notes)
    assert liger_preference.declare("dpo", ("_input",), _BaseDefault)[0].average_log_prob == {True}


class _Paired:
    """A stand-in for a paired loss Function of 0.5.0-0.5.4, whose forward hands the base the loss function by the
    class's name: two chunks, of 2 pairs and 1."""

    @staticmethod
    def preference_loss_fn(chosen, rejected, full_target, ref_chosen_logps=None, ref_rejected_logps=None, beta=0.1):
        return torch.stack([ref_chosen_logps, ref_rejected_logps])


def test_reference_values_reach_each_chunks_rows_and_the_class_is_restored():
    """The reference log-probabilities are handed to Liger's own loss function row by row in Liger's chunk order,
    however it chunks (also a release whose forward names the class's loss function: the attribute is replaced for
    the call), and the attribute is restored afterwards, even when the call raises."""
    original = _Paired.__dict__["preference_loss_fn"]
    ref = torch.tensor([1.0, 2.0, 3.0, -1.0, -2.0, -3.0])
    with liger_preference._handing_reference(_Paired, ref, unpaired=False):
        first = _Paired.preference_loss_fn(torch.zeros(2), torch.zeros(2), None)
        second = _Paired.preference_loss_fn(torch.zeros(1), torch.zeros(1), None)
    assert first.tolist() == [[1.0, 2.0], [-1.0, -2.0]] and second.tolist() == [[3.0], [-3.0]]
    assert _Paired.__dict__["preference_loss_fn"] is original
    with pytest.raises(RuntimeError, match="raised inside"):
        with liger_preference._handing_reference(_Paired, ref, unpaired=False):
            raise RuntimeError("raised inside the call")
    assert _Paired.__dict__["preference_loss_fn"] is original
