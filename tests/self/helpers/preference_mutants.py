"""Linear+preference mutants: the chunked built-in (:class:`impls.builtin.linear_preference.ChunkedPreference`)
with one bug each, declared as the built-in is, and the property of the suite that must catch it (:data:`CAUGHT_BY`).

Load them as outside impls: ``--impl numcheck.tests.self.helpers.preference_mutants:MUTANTS``.
"""

from __future__ import annotations

import dataclasses

import torch

from numcheck.impls.builtin.linear_preference import ChunkedPreference, _support
from numcheck.impls.protocols.linear_preference import PreferenceFunctionImpl
from numcheck.reference.linear_preference import Conventions
from numcheck.reference.numerics.linear_preference import sequence_logps
from numcheck.tests.self.helpers.mutant_table import caught_by_table


class _Bf16RunningSum(ChunkedPreference):
    """grad_weight's and grad_bias's running sums over chunks rounded to bf16 after every chunk."""

    def accumulate(self, buf, part):
        buf.copy_((buf + part.float()).to(torch.bfloat16).float())


class _LossBf16Sum(ChunkedPreference):
    """The chunks' losses added in bf16."""

    def adding(self, total, part):
        total.copy_((total.to(torch.bfloat16) + part.to(torch.bfloat16)).float())


class _CountsIgnored(ChunkedPreference):
    """The per-sequence mean divides by every position, ignored ones included."""

    def sequence_logps(self, x, weight, target, bias, averaged, ignore):
        a, nll = sequence_logps(x, weight, target, bias, False, ignore)
        return (a / target.shape[1] if averaged else a), nll


class _NoLengthNormalisation(ChunkedPreference):
    """SimPO on summed, not length-normalised, log-probabilities."""

    def sequence_logps(self, x, weight, target, bias, averaged, ignore):
        return sequence_logps(x, weight, target, bias, False, ignore)


class _SwappedHalves(ChunkedPreference):
    """The first half of the batch taken as the rejected completions, the second as the chosen."""

    def __call__(self, x, weight, target, bias=None, *, ref_logps=None, params):
        P = x.shape[0] // 2
        swap = torch.cat([torch.arange(P, 2 * P), torch.arange(P)]).to(x.device)
        ref = ref_logps[swap] if ref_logps is not None else None
        loss = super().__call__(x[swap], weight, target[swap], bias, ref_logps=ref, params=params)
        return loss


class _Dropping(ChunkedPreference):
    """A wrapper that drops one of the call's numbers (:attr:`dropped`), using its default instead."""

    dropped: str = ""

    def __call__(self, x, weight, target, bias=None, *, ref_logps=None, params):
        default = {"beta": 0.1, "label_smoothing": 0.0, "nll_weight": 0.0, "kl": 0.0}[self.dropped]
        return super().__call__(
            x, weight, target, bias, ref_logps=ref_logps, params=dataclasses.replace(params, **{self.dropped: default})
        )


@dataclasses.dataclass(frozen=True)
class _DropsBeta(_Dropping):
    dropped: str = "beta"


@dataclasses.dataclass(frozen=True)
class _DropsSmoothing(_Dropping):
    dropped: str = "label_smoothing"


@dataclasses.dataclass(frozen=True)
class _DropsReferencePoint(_Dropping):
    dropped: str = "kl"


class _RefIgnored(ChunkedPreference):
    """DPO without the reference model: its log-probabilities taken as 0."""

    def __call__(self, x, weight, target, bias=None, *, ref_logps=None, params):
        zero = torch.zeros_like(ref_logps) if ref_logps is not None else None
        return super().__call__(x, weight, target, bias, ref_logps=zero, params=params)


def _mutant(name: str, cls: type, loss: str) -> PreferenceFunctionImpl:
    return PreferenceFunctionImpl(
        f"mutant_pref_{name}", cls(Conventions(loss)), _support(loss, chunking=True), (cls.__doc__ or "").strip()
    )


pref_gw_bf16_sum = _mutant("gw_bf16_sum", _Bf16RunningSum, "dpo")
pref_loss_bf16_sum = _mutant("loss_bf16_sum", _LossBf16Sum, "cpo")
pref_counts_ignored = _mutant("counts_ignored", _CountsIgnored, "orpo")
pref_no_length_norm = _mutant("no_length_norm", _NoLengthNormalisation, "simpo")
pref_swapped_halves = _mutant("swapped_halves", _SwappedHalves, "cpo")
pref_beta_dropped = _mutant("beta_dropped", _DropsBeta, "dpo")
pref_smoothing_dropped = _mutant("smoothing_dropped", _DropsSmoothing, "simpo")
pref_ref_ignored = _mutant("ref_ignored", _RefIgnored, "dpo_robust")
pref_kto_kl_dropped = _mutant("kto_kl_dropped", _DropsReferencePoint, "kto")

#: Every mutant and the property (of props.PROPERTIES) whose drawn test must catch it.
MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (pref_gw_bf16_sum, "chunk_invariance"),
        (pref_loss_bf16_sum, "chunk_invariance"),
        (pref_counts_ignored, "accuracy"),
        (pref_no_length_norm, "accuracy"),
        (pref_swapped_halves, "accuracy"),
        (pref_beta_dropped, "options_honoured"),
        (pref_smoothing_dropped, "options_honoured"),
        (pref_ref_ignored, "accuracy"),
        (pref_kto_kl_dropped, "options_honoured"),
    ]
)
