"""A linear+preference case as one printable value (:class:`PreferenceCase`, its ``repr`` valid Python: what
reproduction commands carry), and the tensors it stands for (:func:`build`).

Values: x ~ N(0, 1) ``[2P, T, H]``; W ~ N(0, 1)·``logit_scale``/√H ``[V, H]`` (logits of standard deviation
``logit_scale``: 1 ordinary, 4 confident rows); bias ~ N(0, ½²); targets uniform over the vocabulary, a fraction
``ignored`` of positions ignored (never a row's first: every completion keeps one); every tensor rounded to the
case's dtype, and the oracle takes the rounded values. The reference model's log-probabilities (losses with a
reference) are the policy's own, float64 from the rounded inputs, plus N(0, ``ref_spread``²), rounded to fp32: the
margins β·((c − ref_c) − (r − ref_r)) are then O(β·ref_spread), where log σ is neither flat nor linear.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from numcheck.reference.linear_preference import REFERENCE_LOSSES, Conventions, PreferenceParams, linear_preference

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class PreferenceCase:
    """One linear+preference case: ``P`` pairs of ``T`` positions, ``H`` features, ``V`` classes, the call's
    numbers (β, γ, ε, α, ``average_log_prob``, ``chunk_pairs``, κ) and how its values are drawn (module docstring)."""

    P: int
    T: int
    H: int
    V: int
    dtype: str = "float32"
    bias: bool = False
    beta: float = 0.1
    gamma: float = 0.0
    label_smoothing: float = 0.0
    nll_weight: float = 0.0
    average_log_prob: bool = False
    chunk_pairs: int | None = None
    kl: float = 0.0
    ignored: float = 0.0
    logit_scale: float = 1.0
    ref_spread: float = 2.0
    seed: int = 0
    device: str = "cpu"

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def params(self) -> PreferenceParams:
        """The call's :class:`~reference.linear_preference.PreferenceParams`."""
        return PreferenceParams(
            beta=self.beta,
            gamma=self.gamma,
            label_smoothing=self.label_smoothing,
            nll_weight=self.nll_weight,
            average_log_prob=self.average_log_prob,
            chunk_pairs=self.chunk_pairs,
            kl=self.kl,
        )

    def replace(self, **changes: Any) -> PreferenceCase:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    def short(self) -> str:
        """The case in a few words (report tables)."""
        return f"P={self.P} T={self.T} H={self.H} V={self.V}"


class PreferenceTensors(NamedTuple):
    """A case's tensors (in its dtype; ``ref_logps`` fp32 or ``None``)."""

    x: torch.Tensor
    weight: torch.Tensor
    target: torch.Tensor
    bias: torch.Tensor | None
    ref_logps: torch.Tensor | None


def _policy_logps(x, w, b, target, conv: Conventions, params: PreferenceParams) -> torch.Tensor:
    """The policy's per-sequence log-probabilities in float64 (what the reference's are drawn around)."""
    return linear_preference(x, w, target, b, None, Conventions("cpo", conv.layout), params).seq_logp


def build(case: PreferenceCase, conv: Conventions) -> PreferenceTensors:
    """The case's tensors for an impl of conventions ``conv`` (the reference log-probabilities where its loss
    takes them)."""
    g = torch.Generator().manual_seed(case.seed)
    B, dt = 2 * case.P, case.torch_dtype
    x = torch.randn(B, case.T, case.H, generator=g, dtype=torch.float64).to(dt)
    w = (torch.randn(case.V, case.H, generator=g, dtype=torch.float64) * case.logit_scale / case.H**0.5).to(dt)
    b = (torch.randn(case.V, generator=g, dtype=torch.float64) / 2).to(dt) if case.bias else None
    target = torch.randint(0, case.V, (B, case.T), generator=g)
    drop = torch.rand(B, case.T, generator=g) < case.ignored
    drop[:, 0] = False
    target[drop] = -100
    noise = torch.randn(B, generator=g, dtype=torch.float64) * case.ref_spread
    ref = None
    if conv.loss in REFERENCE_LOSSES:
        params = dataclasses.replace(case.params, average_log_prob=conv.averaged(case.params))
        ref = (_policy_logps(x, w, b, target, conv, params) + noise).to(torch.float32)
    dev = case.device
    move = lambda t: None if t is None else t.to(dev)  # noqa: E731
    return PreferenceTensors(move(x), move(w), move(target), move(b), move(ref))
