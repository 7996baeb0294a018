"""Held-out single-defect impls for the self tests holding ``numcheck report --quick`` to every property the suite
runs (:mod:`reports.report.property_grid`): each has exactly one defect that only a property other than one-call
accuracy on the old quick grid shows, and is written apart from the mutant tables (none of them is in
``fp8_mutants``, ``grouped_fp8_mutants`` or ``mutants``, so the grid cannot have been fitted to them).

* :data:`soi_backward_from_quantized` — save_original_input=True quantizes x for wgrad from the forward's rowwise
  FP8 x (MXFP8), dequantized and rounded back to x's dtype, instead of x itself;
* :data:`zero_amax_nan` — current scaling's scale is fp8_max / amax with no amax = 0 rule (an all-zero tensor gets an
  infinite scale, 0·inf = NaN);
* :data:`delayed_scale_not_carried` — delayed scaling records each amax but quantizes every step with the initial
  scale 1, never the one its history gives;
* :data:`grouped_main_grad_overwritten` — fused wgrad accumulation stores wgrad into ``main_grad`` instead of
  adding it;
* :data:`grouped_empty_expert_stale` — the weight-gradient buffer is reused across calls of one shape and an expert
  without rows keeps the previous call's slot;
* :data:`nondeterministic_ce` — a linear+CE declared deterministic whose grad_weight sums its rows in an order
  that flips on every call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import numcheck
from numcheck.impls.builtin.fp8_linear import Fp8Linear
from numcheck.impls.builtin.grouped_fp8_linear import GroupedFusedLinear
from numcheck.impls.protocols.fp8_linear import DelayedScalingState
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.numerics.fp8_linear import QTensor


class _SoiFromQuantized(Fp8Linear):
    def columnwise_x_source(
        self, x_saved: torch.Tensor, recipe: Fp8Recipe, state: DelayedScalingState | None
    ) -> torch.Tensor:
        q = self.quantize_operand(x_saved, recipe, "x", "rowwise", state, record=False)
        return q.dequantize().to(x_saved.dtype)


class _ZeroAmaxNan(Fp8Linear):
    def scale_from_amax(
        self, amax: torch.Tensor, fp8_max: float, *, power_of_2: bool, epsilon: float, value_for_inf: float
    ) -> torch.Tensor:
        return torch.full_like(amax, fp8_max) / amax


class _DelayedScaleNotCarried(Fp8Linear):
    def quantize_per_tensor(
        self,
        t32: torch.Tensor,
        amax: torch.Tensor,
        recipe: Fp8Recipe,
        role: str,
        state: DelayedScalingState | None,
        *,
        record: bool,
    ) -> QTensor:
        if recipe.kind == "delayed" and state is not None:
            if record:
                state.record(role, amax)
            scale = torch.ones((), dtype=torch.float32, device=t32.device)
            fmt = recipe.format_of(role)
            data = self.cast(t32, scale, fmt)
            return QTensor(data, torch.ones_like(scale), None, (t32.shape[0], t32.shape[1]), fmt)
        return super().quantize_per_tensor(t32, amax, recipe, role, state, record=record)


#: Declared for MXFP8, whose rowwise (1×32) and columnwise (32×1) blocks differ: under per-tensor scaling the
#: dequantized x has x's amax and requantizes to the same codes, so the defect would be invisible there.
soi_backward_from_quantized = _SoiFromQuantized(
    "heldout_soi_backward_from_quantized", (Fp8Recipe("mxfp8"),), "save_original_input=True requantizes FP8 x"
)
zero_amax_nan = _ZeroAmaxNan("heldout_zero_amax_nan", (Fp8Recipe("current"),), "amax 0 gives an infinite scale")
delayed_scale_not_carried = _DelayedScaleNotCarried(
    "heldout_delayed_scale_not_carried", (Fp8Recipe("delayed"),), "delayed scaling ignores its amax history"
)


class _MainGradOverwritten(GroupedFusedLinear):
    def accumulate_main_grad(self, main_grad: torch.Tensor, wgrad32: torch.Tensor) -> None:
        main_grad.copy_(wgrad32)


class _EmptyExpertStale(GroupedFusedLinear):
    def wgrad_buffer(self, c: Any, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buf = self.__dict__.get("_last")
        if buf is None or buf.shape != (c.G, *shape) or buf.dtype != dtype or buf.device != device:
            buf = torch.zeros((c.G, *shape), dtype=dtype, device=device)
            self.__dict__["_last"] = buf
        return buf


def _grouped(cls: type, name: str, description: str) -> GroupedFusedLinear:
    return cls(
        name,
        description,
        recipes=(Fp8Recipe("current"),),
        bitwise_per_expert=True,
        fused_wgrad_accumulation=frozenset({False, True}),
    )


grouped_main_grad_overwritten = _grouped(
    _MainGradOverwritten, "heldout_grouped_main_grad_overwritten", "main_grad = wgrad instead of +="
)
grouped_empty_expert_stale = _grouped(
    _EmptyExpertStale, "heldout_grouped_empty_expert_stale", "an empty expert keeps the last call's wgrad"
)


class _FlippingSum(torch.autograd.Function):
    """fp32 logits and CE; grad_weight = Σ_rows g_r ⊗ x_r summed first-to-last on even calls, last-to-first on odd."""

    calls = 0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Any, ignore: int) -> Any:
        ctx.save_for_backward(x, weight, target, bias)
        ctx.ignore_index = ignore
        z = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        return F.cross_entropy(z, target, reduction="sum", ignore_index=ignore)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        x, weight, target, bias = ctx.saved_tensors
        z = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, torch.zeros_like(target))
        G = (torch.softmax(z, dim=1) - F.one_hot(safe, z.shape[1]).float()) * valid[:, None] * g.float()
        rows = list(range(x.shape[0]))
        if _FlippingSum.calls % 2:
            rows.reverse()
        _FlippingSum.calls += 1
        gw = torch.zeros_like(weight, dtype=torch.float32)
        for r in rows:
            gw += torch.outer(G[r], x[r].float())
        gb = None if bias is None else G.sum(0).to(bias.dtype)
        return (G @ weight.float()).to(x.dtype), gw.to(weight.dtype), None, gb, None


@numcheck.linear_ce_impl(name="heldout_nondeterministic_ce", dtypes=("float32",), autocast=(), reductions=("sum",))
def nondeterministic_ce(x, weight, target, bias=None, *, reduction="sum", ignore_index=-100):
    """fp32 CE whose grad_weight's summation order flips between calls (declared deterministic)."""
    return _FlippingSum.apply(x, weight, target, bias, ignore_index)
