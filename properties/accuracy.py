"""Accuracy of every output against the float64 oracle, under two judgements.

(a) *Analytic*: every element within the bound of :mod:`properties.tolerance` (the hard ceiling gates; the
    expected level is recorded for reports).
(b) *Relative to eager* (PyTorch Inductor's rule): RMSE(impl − oracle) ≤ k·RMSE(eager − oracle) + slack,
    eager being the ``eager`` built-in run on the same problem in the same dtype. k = 2 for fp32 and 3 for
    bf16/fp16 results (Inductor's multipliers); slack = 2·u_out·RMS(oracle) + RMS(hard bound)/2: two
    roundings of the result in its own dtype are always allowed, and half the analytic bound's RMS absorbs a
    different but equally valid evaluation order when eager happens to be (nearly) exact — measured: on
    N=1, V=2 fp32 a correct chunked impl had 4× eager's RMSE, and with V=1 eager is exact (error 0) while
    a correct fp16 impl is not. So (b) fails only an impl whose errors are, in RMS, both well above eager's
    and above half of what the analysis allows everywhere. Outputs an impl declares less accurate (grad_weight and grad_bias under
    ``per_chunk_rounding`` or ``param_dtype`` accumulation, grad_x under such a ``grad_x_accumulation``, every
    gradient under a loss-scale upstream; the loss under ``target_logit="rounded_products"``)
    are recorded but not judged by (b), and (b) is
    skipped for an all-ignored ``mean`` (a convention, not a rounding).

(b) is what catches an impl that returns an output rounded to a lower precision than eager keeps (a loss
rounded to bf16 under AMP, say) where (a), which trusts the dtype the impl returns, cannot.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from numcheck.properties.compare import Comparison, compare
from numcheck.properties.harness import FROZEN_GRADS, OUTPUTS, ImplOutputs, run_impl, run_oracle
from numcheck.properties.problems import Problem, Tensors, build
from numcheck.properties.tolerance import Level, error_model, linear_ce_bounds, range_dtypes, unit_roundoff

RELATIVE_K = {torch.float32: 2.0, torch.float64: 2.0, torch.bfloat16: 3.0, torch.float16: 3.0}
RELATIVE_SLACK_ROUNDINGS = 2.0
RELATIVE_SLACK_BOUND = 0.5


@dataclass(frozen=True)
class RelativeJudgement:
    """Judgement (b) for one output."""

    output: str
    ok: bool
    judged: bool
    rmse_impl: float
    rmse_eager: float
    allowed: float
    note: str = ""

    def describe(self) -> str:
        return (f"{self.output}: RMSE {self.rmse_impl:.3g} vs eager RMSE {self.rmse_eager:.3g}; allowed "
                f"{self.allowed:.3g} (k·eager + slack){' — ' + self.note if self.note else ''}")


@dataclass
class AccuracyResult:
    """Both judgements for every output of one impl on one problem."""

    problem: Problem
    analytic: dict[str, Comparison] = field(default_factory=dict)
    expected: dict[str, Comparison] = field(default_factory=dict)
    relative: dict[str, RelativeJudgement] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.analytic.values()) and all(r.ok for r in self.relative.values())

    @property
    def worst_ratio(self) -> float:
        vals = [c.ratio for c in self.analytic.values()]
        return max(vals) if vals else 0.0

    def failure_lines(self) -> list[str]:
        lines = [f"(a) analytic bound: {c.describe()}" for c in self.analytic.values() if not c.ok]
        lines += [f"(b) relative to eager: {r.describe()}" for r in self.relative.values() if not r.ok]
        return lines


def _out_dtypes(out: ImplOutputs) -> dict[str, torch.dtype]:
    return {k: v.dtype for k in OUTPUTS if isinstance(v := out.get(k), torch.Tensor)}


@functools.lru_cache(maxsize=64)
def _eager_errors(p: Problem) -> dict[str, tuple[float, torch.dtype]]:
    """RMSE of the eager built-in against the oracle per output, with eager's output dtype (cached)."""
    from numcheck.impls.eager import eager_impls

    eager = eager_impls()[0]
    t = build(p)
    out = run_impl(eager, p, t)
    ref = run_oracle(p, t, all_ignored="nan")
    res = {}
    for name, o in _oracle_outputs(ref).items():
        v = out.get(name)
        if v is None or o is None:
            continue
        res[name] = (float((v.to(torch.float64) - o).nan_to_num(0.0).square().mean().sqrt()), v.dtype)
    return res


def _oracle_outputs(ref) -> dict[str, torch.Tensor | None]:
    return {"loss": ref.loss, "z_loss": ref.z_loss, "grad_x": ref.grad_x, "grad_weight": ref.grad_weight,
            "grad_bias": ref.grad_bias}


def check_accuracy(impl: Any, p: Problem, *, levels: tuple[Level, ...] = ("hard",), relative: bool = True,
                   t: Tensors | None = None, layout: str = "contiguous",
                   frozen: frozenset[str] = frozenset(),
                   leaves: dict[str, torch.Tensor] | None = None) -> AccuracyResult:
    """Run ``impl`` (its inputs laid out as ``layout``, see :func:`properties.harness.strided_copy`; the inputs
    in ``frozen`` without gradients; the caller's ``leaves``, see :func:`properties.harness.run_impl`) and the
    oracle on ``p`` and judge every output (see the module docstring); the gradients of frozen inputs are not
    judged."""
    t = t if t is not None else build(p)
    out = run_impl(impl, p, t, layout=layout, frozen=frozen, leaves=leaves)
    conv = impl.support.all_ignored or "nan"
    ref = run_oracle(p, t, all_ignored=conv)
    refs = _oracle_outputs(ref)
    res = AccuracyResult(problem=p)
    dtypes = _out_dtypes(out)
    skip = {FROZEN_GRADS[k] for k in frozen}
    names = [n for n in OUTPUTS if refs.get(n) is not None and (n != "z_loss" or out.z_loss is not None)
             and n not in skip]
    hard_bounds: dict[str, torch.Tensor] = {}
    ranges = range_dtypes(p, dtypes)  # ±inf judged against the format each output was held in
    for level in dict.fromkeys(("hard",) + tuple(levels)):
        bounds = linear_ce_bounds(p, t, ref, error_model(impl.support, p, dtypes, level))
        if level == "hard":
            hard_bounds = bounds
        target = res.analytic if level == "hard" else res.expected
        for n in names:
            target[n] = compare(n, out.get(n), refs[n], bounds[n], range_dtype=ranges.get(n))
    if relative and not (p.all_ignored and p.reduction == "mean"):
        eager_err = _eager_errors(p)
        lowp_path = impl.support.grad_accumulation != "fp32"
        x_path = getattr(impl.support, "grad_x_accumulation", "fp32")
        products = getattr(impl.support, "target_logit", "logits") == "rounded_products"
        for n in names:
            v = out.get(n)
            if v is None or n not in eager_err:
                continue
            o = refs[n]
            rmse = float((v.to(torch.float64) - o).nan_to_num(0.0).square().mean().sqrt())
            e_rmse, e_dtype = eager_err[n]
            k = RELATIVE_K.get(v.dtype, 3.0)
            slack = RELATIVE_SLACK_ROUNDINGS * unit_roundoff(v.dtype) * float(o.nan_to_num(0.0).square().mean().sqrt())
            slack += RELATIVE_SLACK_BOUND * float(hard_bounds[n].to(torch.float64).nan_to_num(0.0).square().mean().sqrt())
            allowed = k * e_rmse + slack
            # A declared deviation eager does not share is judged by (a) alone (its derived term is in the bound).
            if lowp_path and n in ("grad_weight", "grad_bias"):
                judged, note = False, f"not judged: declares {impl.support.grad_accumulation} accumulation"
            elif p.upstream == "loss_scale" and n.startswith("grad_"):
                # An impl that forms gradients in forward (before the scale is known) loses what underflows
                # there and multiplies it by 2^17 afterwards: the bound's η·(1+|u|) term allows it, and eager,
                # which forms them in backward, is not the yardstick for that.
                judged, note = False, "not judged: under a loss scale (gradients formed before it, η·(1+|u|))"
            elif x_path != "fp32" and n == "grad_x":
                judged, note = False, f"not judged: declares {x_path} accumulation of grad_x"
            elif products and n == "loss":
                judged, note = False, "not judged: declares target_logit='rounded_products'"
            else:
                judged, note = True, ""
            ok = (rmse <= allowed) or not judged or math.isnan(rmse) and math.isnan(e_rmse)
            res.relative[n] = RelativeJudgement(n, ok, judged, rmse, e_rmse, allowed, note)
    return res
