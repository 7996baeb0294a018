"""Judgement (b), the relative judgement every family shares: RMSE(impl − oracle) ≤ k(n_eff)·RMSE(yardstick −
oracle) + λ(α)·RMS(E), with E an output's expected-level bound (√n·u per reduction) and the yardstick an honest
evaluation the family runs on the same case (eager for linear+CE, :mod:`numcheck.properties.linear_ce.accuracy`; the
declared path of a distributed family, :mod:`numcheck.properties.distributed.linear_ce.yardstick` and
:mod:`numcheck.properties.distributed.tp_fp8.yardstick`). A correct impl fails it with probability at most
α = :data:`RELATIVE_ALPHA` per output, under either of the two ways it can be correct:

* *it errs as the yardstick does* (the ratio half): with independent errors whose element scales are E's, the ratio
  RMSE²(impl)/RMSE²(yardstick) is F(n_eff, n_eff)-distributed, n_eff = (ΣE²)²/ΣE⁴ (Satterthwaite's degrees of
  freedom of ΣE_i²χ²₁: the number of elements that carry the error). k = √F⁻¹(1 − α; n_eff, n_eff), never
  below Inductor's 2 (fp32) / 3 (bf16, fp16). One number against one number says almost nothing: k is
  6.4e5 at n_eff = 1, 1000 at 2, 6.3 at 10, 2.0 at 50.
* *it evaluates in another order* (the order half): each element's error is then sub-Gaussian at scale
  E_i (Higham & Mary 2019), and for the RMS over elements, however they are coupled, Jensen over the
  weights E_i²/ΣE² and Chernoff's bound give P(RMS(e) > λ·RMS(E)) ≤ λ·exp(−(λ² − 1)/2); λ(1e-6) = 5.67
  (:func:`rms_lambda`). This half is what covers tiny tensors and an exact yardstick.

The allowance is the sum of the halves (each alone holds its rate under its own hypothesis). Which E, which
yardstick and which last rounding each output is judged at are the family's (its ``accuracy`` or ``yardstick``
module); the statistics here are the same for all (docs/error-analysis.md derives them, and
``tests/self/properties/test_relative_judgement.py`` measures the false-alarm rate by Monte Carlo).

>>> import torch
>>> j = relative_judgement("loss", torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64), (0.0, torch.float32),
...                        torch.tensor([1e-7]))
>>> j.ok, j.rmse_impl
(True, 0.0)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from scipy import optimize, stats

#: Inductor's multipliers (``torch._dynamo.utils.same``): the floor of the ratio half's k, per result dtype.
RELATIVE_K = {torch.float32: 2.0, torch.float64: 2.0, torch.bfloat16: 3.0, torch.float16: 3.0}
#: The false-alarm rate of judgement (b) per judged output: the probability, under the model of the module
#: docstring, that a correct impl fails it. A case judges at most five outputs, so at most 5·α per case.
RELATIVE_ALPHA = 1e-6


def effective_count(bound: torch.Tensor) -> float:
    """n_eff of an output: the participation ratio (Σb²)²/Σb⁴ of its element-wise bound ``bound``.

    It is the number of elements that carry the error: n for a flat bound, 1 when one element dominates.
    (Satterthwaite's degrees of freedom of Σ b_i²·χ²₁, the sum of squared errors whose scales are the bounds.)
    An all-zero bound gives 1; infinite elements, where there are any, are the ones counted."""
    b = bound.detach().to(torch.float64).nan_to_num(0.0, posinf=math.inf).abs().flatten()
    if bool(torch.isinf(b).any()):
        return float(torch.isinf(b).sum())
    top = float(b.max()) if b.numel() else 0.0
    if top == 0.0:
        return 1.0
    b2 = (b / top).square()
    return float(b2.sum().square() / b2.square().sum())


@functools.lru_cache(maxsize=4096)
def ratio_multiplier(n_eff: float, dtype: torch.dtype, alpha: float = RELATIVE_ALPHA) -> float:
    """k of the ratio half: √F⁻¹(1 − α; n_eff, n_eff), and never below Inductor's k for ``dtype``.

    If impl and eager err alike (independent errors of one distribution, element scales as the bound's),
    RMSE²(impl)/RMSE²(eager) is F(n_eff, n_eff)-distributed, so the ratio exceeds k² with probability α."""
    if not n_eff >= 1.0:
        raise ValueError(f"ratio_multiplier: n_eff must be ≥ 1, got {n_eff!r}")
    return max(RELATIVE_K.get(dtype, 3.0), math.sqrt(float(stats.f.isf(alpha, n_eff, n_eff))))


@functools.lru_cache(maxsize=16)
def rms_lambda(alpha: float = RELATIVE_ALPHA) -> float:
    """λ of the order half: the root above 1 of λ·exp(−(λ² − 1)/2) = α (5.67 at α = 1e-6).

    Each element's error is sub-Gaussian with scale its expected-level bound E_i (Higham & Mary 2019: a sum
    of independent mean-zero roundings; their λ = √(2 ln(2/α)) = 5.39 holds for one element). For the RMS over
    elements, however dependent, Jensen over the weights E_i²/ΣE² and Chernoff's bound give
    P(RMS(e) > λ·RMS(E)) ≤ λ·exp(−(λ² − 1)/2)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"rms_lambda: alpha must be in (0, 1), got {alpha!r}")
    return float(optimize.brentq(lambda lam: math.log(lam) - (lam * lam - 1) / 2 - math.log(alpha), 1.0 + 1e-12, 100.0))


@dataclass(frozen=True)
class RelativeJudgement:
    """Judgement (b) for one output: ``allowed`` = ``multiplier``·``rmse_eager`` + ``slack``.

    ``n_eff`` is the effective element count (:func:`effective_count`) that sets ``multiplier`` at
    false-alarm rate ``alpha``; ``slack`` = ``lam``·``rms_expected``, the expected-level bound's RMS (at the
    finer of the impl's and eager's output precision) scaled for the same rate."""

    output: str
    ok: bool
    judged: bool
    rmse_impl: float
    rmse_eager: float
    allowed: float
    note: str = ""
    n_eff: float = math.nan
    multiplier: float = math.nan
    alpha: float = RELATIVE_ALPHA
    rms_expected: float = math.nan
    lam: float = math.nan
    #: What ``rmse_eager`` was measured on: ``"eager"``, or numcheck's evaluation of the path the impl declares
    #: (:mod:`numcheck.properties.linear_ce.declared_path`) for an output declared coarser than eager keeps it.
    yardstick: str = "eager"

    @property
    def slack(self) -> float:
        """The order half of the allowance, λ·RMS(expected-level bound)."""
        return self.lam * self.rms_expected

    def describe(self) -> str:
        """One line: both RMSEs, the allowance and its two halves with n_eff, k, α and λ."""
        who = "eager" if self.yardstick == "eager" else "yardstick"
        return (
            f"{self.output}: RMSE {self.rmse_impl:.3g} vs {self.yardstick} RMSE {self.rmse_eager:.3g}; allowed "
            f"{self.allowed:.3g} = k·{who} {self.multiplier * self.rmse_eager:.3g} (k {self.multiplier:.3g} "
            f"at n_eff {self.n_eff:.3g}, α {self.alpha:.0e}) + slack {self.slack:.3g} (λ {self.lam:.3g} × "
            f"RMS of the expected-level bound {self.rms_expected:.3g}){' — ' + self.note if self.note else ''}"
        )


def rms(v: torch.Tensor) -> float:
    """The root mean square of ``v``'s elements in float64, NaN elements counted as 0."""
    return float(v.to(torch.float64).nan_to_num(0.0).square().mean().sqrt())


def yardstick_error(yard: torch.Tensor, oracle: torch.Tensor) -> tuple[float, torch.dtype]:
    """Judgement (b)'s ``yard`` for one output: the yardstick's RMSE against the float64 ``oracle`` and its dtype.

    Measured on the oracle's device, as :func:`relative_judgement` measures the impl and
    :func:`~numcheck.properties.core.compare.compare` judges (a): a family's oracle and its bounds run where the
    family computes them (:mod:`numcheck.properties.core.device`), and every output judged against them is moved
    there."""
    return rms(yard.to(device=oracle.device, dtype=torch.float64) - oracle), yard.dtype


def relative_judgement(
    output: str,
    value: torch.Tensor,
    oracle: torch.Tensor,
    yard: tuple[float, torch.dtype],
    expected: torch.Tensor,
    *,
    note: str = "",
    yardstick: str = "eager",
) -> RelativeJudgement:
    """Judgement (b) of one output (module docstring): ``value`` against ``oracle``, the yardstick's RMSE and dtype
    ``yard``, ``expected`` the expected-level bound (the slack's E and n_eff's weights). ``note``: recorded, not
    judged (with why)."""
    diff = value.to(device=oracle.device, dtype=torch.float64) - oracle
    # An element the impl returns non-finite where the exact value is finite is (a)'s to judge: a correct overflow
    # (the value reaches its format's overflow threshold, or an intermediate legitimately overflows: e.g. fp16
    # gradients under a large loss scale, which GradScaler then skips) passes it, anything else fails it there.
    # (b) measures the finite rest: an accepted ±inf would otherwise make the RMSE infinite.
    unjudged = torch.isfinite(oracle) & ~torch.isfinite(diff)
    kept = diff[~unjudged]
    rmse = rms(kept) if kept.numel() else 0.0
    n_eff = effective_count(expected)
    k = ratio_multiplier(n_eff, value.dtype, RELATIVE_ALPHA)
    rms_e = rms(expected)
    lam = rms_lambda(RELATIVE_ALPHA)
    allowed = k * yard[0] + lam * rms_e
    ok = (rmse <= allowed) or bool(note) or math.isnan(rmse) and math.isnan(yard[0])
    return RelativeJudgement(
        output,
        ok,
        not note,
        rmse,
        yard[0],
        allowed,
        note,
        n_eff=n_eff,
        multiplier=k,
        alpha=RELATIVE_ALPHA,
        rms_expected=rms_e,
        lam=lam,
        yardstick=yardstick,
    )
