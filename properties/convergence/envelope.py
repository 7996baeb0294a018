"""The judgement of the convergence run: the envelope eager's own deviation from float64 draws.

Inductor's accuracy checker (``torch._dynamo.utils.same`` with ``fp64_ref``) passes a compiled result when its
RMSE from a float64 run is at most a fixed multiplier (2, or 3 in low precision) times eager's RMSE from that
run, plus ``tol/10``. Here the same shape of test is applied per training step, to two distances from the float64
trajectory — the loss of each step (absolute difference) and the master parameters after each update (RMSE over
all of them) — with the multiplier and the floor derived instead of fixed:

* **Rounding level** ℓ(t) of a metric at step t: one rounding of the float64 value at its unit roundoff,
  u_loss·|L64(t)| for the loss (u of the compute dtype, the dtype the loss comes back in) and
  u_master·RMS(θ64(t)) for the parameters (u of the master dtype they are kept in). Every low-precision run is
  at least this far from float64 in the worst case, whatever its arithmetic.
* **Distances in rounding units** a(t) = (d(t) + ℓ(t)) / ℓ(t) ≥ 1 (a run that only rounded once has a ≈ 1).
* **Multiplier** k = K·s, two factors:

  - K, how much more a correct *head* may err than eager's: the multiplier of the suite's per-call relative
    judgement (b) (:func:`numcheck.properties.core.relative.ratio_multiplier`) at the head gradients' element count
    (n_eff = min(N·H, V·H) for a flat error profile; thousands here, so K is Inductor's 2 for fp32, 3 for
    bf16/fp16). To first order a run's deviation is the body's rounding and the head's, independent, so
    d_impl² = d_body² + d_head² ≤ d_body² + K²·d_head,eager² ≤ K²·d_eager² for K ≥ 1.
  - s, how much one arithmetic's deviation varies by itself: eager in the same dtype is trained on the judged
    seed and on further data seeds (each a different problem and rounding realization), and s is the largest
    ratio, at any step, between the largest and the smallest a(t) eager draws across them.

  s alone, the first version of this envelope, was a false alarm for ``liger[accum=fp32]`` in bf16 (its
  parameters 1.19× eager's rounding units at step 1 of a 32-row run, s = 1.17): a different correct arithmetic is
  not a draw of eager's; the head factor K is the missing term.
* **Test** per step: r(t) = (d_impl(t) + ℓ(t)) / (d_eager(t) + ℓ(t)) ≤ k, that is
  d_impl(t) ≤ k·d_eager(t) + (k − 1)·ℓ(t): k times eager's distance plus a floor of (k − 1) rounding levels.
  r must be finite: a run whose loss or parameters turn NaN or inf is outside. When eager itself is not finite
  on some seed (s = ∞, k = ∞) the envelope is **undefined** and no run is inside: a diverging reference cannot
  vouch for anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from numcheck.properties.convergence.model import Trajectory
from numcheck.properties.core.relative import ratio_multiplier
from numcheck.properties.linear_ce.tolerance import unit_roundoff

#: The distances judged, in the order they are reported.
METRICS: tuple[str, ...] = ("params", "loss")


def distances(run: Trajectory, ref: Trajectory) -> dict[str, list[float]]:
    """Per step, ``run``'s distance from the float64 ``ref``: |ΔL| and the RMSE of the master parameters."""
    return {
        "params": [float((a - b).pow(2).mean().sqrt()) for a, b in zip(run.params, ref.params)],
        "loss": [abs(a - b) if math.isfinite(a) else math.inf for a, b in zip(run.loss, ref.loss)],
    }


def rounding_level(ref: Trajectory, dtype: torch.dtype) -> dict[str, list[float]]:
    """Per step, ℓ(t) of each metric: one rounding of the float64 run's value (module docstring)."""
    master = torch.float64 if dtype == torch.float64 else torch.float32
    u_p, u_l = unit_roundoff(master), unit_roundoff(dtype)
    return {
        "params": [u_p * float(p.pow(2).mean().sqrt()) for p in ref.params],
        "loss": [u_l * abs(v) for v in ref.loss],
    }


def units(d: Sequence[float], level: Sequence[float]) -> list[float]:
    """a(t) = (d(t) + ℓ(t)) / ℓ(t): a distance in rounding levels, one rounding included."""
    return [(x + l) / l for x, l in zip(d, level)]


@dataclass(frozen=True)
class MetricEnvelope:
    """k of one metric and what it was derived from.

    Attributes:
        k: the multiplier, ``head·s``.
        head: K, judgement (b)'s multiplier at ``n_eff``.
        n_eff: the head gradients' element count K was taken at.
        spread: per step, max/min across seeds of eager's a(t); s is its maximum.
        seeds: the data seeds eager was run on (the judged seed first).
        worst_step: the step where the spread is largest.
    """

    k: float
    head: float
    n_eff: int
    spread: list[float]
    seeds: tuple[int, ...]
    worst_step: int

    @property
    def s(self) -> float:
        """s, the largest spread."""
        return self.spread[self.worst_step]

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "k": self.k,
            "K_head": self.head,
            "n_eff": self.n_eff,
            "s": self.s,
            "s_worst_step": self.worst_step,
            "seeds": list(self.seeds),
            "spread_per_step": self.spread,
        }


def envelope(
    eager_units: Sequence[dict[str, list[float]]], seeds: Sequence[int], *, dtype: torch.dtype, n_eff: int
) -> dict[str, MetricEnvelope]:
    """The envelope of every metric from eager's a(t) on each seed (``eager_units[i]`` belongs to ``seeds[i]``) and
    the head factor K of ``dtype`` at ``n_eff``."""
    head = ratio_multiplier(float(n_eff), dtype)
    if len(eager_units) < 2:
        raise ValueError("envelope: eager's spread needs at least two seeds")
    out: dict[str, MetricEnvelope] = {}
    for m in METRICS:
        per_step = list(zip(*(u[m] for u in eager_units)))
        spread = [max(s) / min(s) if all(map(math.isfinite, s)) else math.inf for s in per_step]
        worst = max(range(len(spread)), key=spread.__getitem__)
        out[m] = MetricEnvelope(
            k=head * spread[worst], head=head, n_eff=n_eff, spread=spread, seeds=tuple(seeds), worst_step=worst
        )
    return out


@dataclass(frozen=True)
class MetricVerdict:
    """One run's test on one metric: r(t) per step against k."""

    ratio: list[float]
    k: float
    worst_step: int

    @property
    def defined(self) -> bool:
        """Whether the envelope is defined: k finite (eager finite on every seed)."""
        return math.isfinite(self.k)

    @property
    def inside(self) -> bool:
        """Whether the envelope is defined and r(t) is finite and ≤ k at every step."""
        return self.defined and all(math.isfinite(r) and r <= self.k for r in self.ratio)

    @property
    def worst_ratio(self) -> float:
        """r at :attr:`worst_step`."""
        return self.ratio[self.worst_step]

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "inside": self.inside,
            "envelope_defined": self.defined,
            "k": self.k,
            "worst_step": self.worst_step,
            "worst_ratio": self.worst_ratio,
            "ratio_per_step": self.ratio,
        }


def judge(
    d_run: dict[str, list[float]],
    d_eager: dict[str, list[float]],
    level: dict[str, list[float]],
    env: dict[str, MetricEnvelope],
) -> dict[str, MetricVerdict]:
    """r(t) = (d_run + ℓ) / (d_eager + ℓ) per metric and step, each against its k."""
    out: dict[str, MetricVerdict] = {}
    for m in METRICS:
        r = [(a + l) / (b + l) for a, b, l in zip(d_run[m], d_eager[m], level[m])]
        r = [x if not math.isnan(x) else math.inf for x in r]
        out[m] = MetricVerdict(ratio=r, k=env[m].k, worst_step=max(range(len(r)), key=r.__getitem__))
    return out
