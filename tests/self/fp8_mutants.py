"""Deliberately broken FP8 quantized linears: the FP8 properties must flag every one of them.

Each mutant is the built-in :class:`impls.quant_linear.Fp8Linear` with one seam overridden, declared for
the recipes where its bug is observable, and loadable like any outside impl
(``--impl numcheck.tests.self.fp8_mutants:MUTANTS``). :data:`CAUGHT_BY` names the property that must fail.
"""

from __future__ import annotations

import torch

from numcheck.impls.quant_linear import Fp8Linear, QTensor
from numcheck.impls.quant_protocol import DelayedScalingState
from numcheck.reference.fp8_formats import Fp8Format
from numcheck.reference.fp8_recipes import Fp8Recipe, standard_recipes


def _recipes(kind: str) -> tuple[Fp8Recipe, ...]:
    return tuple(r for r in standard_recipes() if r.kind == kind)


class ColumnwiseFromRowwiseQuantized(Fp8Linear):
    """save_original_input=True quantizes x columnwise in backward from the *rowwise-quantized* x
    (dequantized) instead of the original x: double quantization, visible wherever blocks differ by usage."""

    def columnwise_x_source(self, x_saved: torch.Tensor, recipe: Fp8Recipe, state: DelayedScalingState | None) -> torch.Tensor:
        return self.quantize_operand(x_saved, recipe, "x", "rowwise", state, record=False).dequantize()


class MXScaleRoundedWrongWay(Fp8Linear):
    """MXFP8 scale rounded the wrong way: RCEIL takes floor(log2(amax/fp8_max)) (the descale rounded down, so
    block maxima overflow and saturate) and FLOOR takes ceil(log2 amax) − emax."""

    def mx_scale_code(self, amax: torch.Tensor, fmt: Fp8Format, rounding: str) -> torch.Tensor:
        if rounding == "rceil":
            d = amax * torch.tensor(1.0 / fmt.max_finite, dtype=torch.float32, device=amax.device)
            code = (d.view(torch.int32) >> 23) & 0xFF  # exponent field: floor(log2 d) + 127, no round-up
        else:
            bits = amax.view(torch.int32)
            code = torch.clamp(((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) > 0).to(torch.int32) - fmt.mx_emax, 0, 254)
        code = torch.where(amax == 0, torch.zeros_like(code), code)
        code = torch.where(torch.isinf(amax), torch.full_like(code, 254), code)
        return torch.where(torch.isnan(amax), torch.full_like(code, 255), code)


class SavesCopyOfX(Fp8Linear):
    """save_original_input=True keeps a private copy of x instead of x itself (no memory saved)."""

    def original_x_to_save(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().clone()


class DelayedUsesCurrentAmax(Fp8Linear):
    """Delayed scaling that ignores the stored scale and scales by the current amax (records amax correctly)."""

    def quantize_operand(self, t: torch.Tensor, recipe: Fp8Recipe, role: str, usage: str,
                         state: DelayedScalingState | None, *, record: bool) -> QTensor:
        if recipe.kind == "delayed" and state is not None:
            if record:
                state.record(role, float(t.detach().float().abs().nan_to_num(0.0).max()))
            current = Fp8Recipe("current", fp8_format=recipe.fp8_format)
            return super().quantize_operand(t, current, role, usage, None, record=False)
        return super().quantize_operand(t, recipe, role, usage, state, record=record)


class DelayedAllowsSaveOriginalInput(Fp8Linear):
    """Delayed scaling that accepts save_original_input=True instead of raising."""

    def __call__(self, x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
        return self.function.apply(x, weight, bias, self, recipe, bool(save_original_input), scaling_state)


class AssumesContiguousX(Fp8Linear):
    """Reads x as a dense row-major [M, K] block from its first element (a kernel indexing x_ptr + i·K + k): right
    for a contiguous x, wrong for a column slice of a wider buffer."""

    def __call__(self, x, weight, bias=None, **kw):
        return super().__call__(torch.as_strided(x, x.shape, (x.shape[1], 1)), weight, bias, **kw)


class SharedSavedXWorkspace(Fp8Linear):
    """save_original_input=True keeps x for backward in a workspace per shape on the impl (to avoid holding the
    caller's tensor): the next forward of the same shape, another layer's, overwrites it."""

    def original_x_to_save(self, x: torch.Tensor) -> torch.Tensor:
        ws = self.__dict__.setdefault("_workspace", {})
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in ws:
            ws[key] = torch.empty_like(x)
        ws[key].data.copy_(x.detach())  # a kernel's write: autograd's version counter does not see it
        return ws[key]


class StaleWeightCache(Fp8Linear):
    """Quantizes each weight once and reuses it for every later forward (the caching of FP8 weights across
    micro-batches), keyed on the weight tensor but blind to its version: after an optimizer step changes the
    weight in place, forward still uses the old one while backward quantizes the new one."""

    def quantize_operand(self, t: torch.Tensor, recipe: Fp8Recipe, role: str, usage: str,
                         state: DelayedScalingState | None, *, record: bool) -> QTensor:
        if role != "w" or usage != "rowwise":
            return super().quantize_operand(t, recipe, role, usage, state, record=record)
        from torch.utils.weak import WeakIdKeyDictionary

        cache = self.__dict__.setdefault("_weight_cache", WeakIdKeyDictionary())
        if t not in cache:
            cache[t] = super().quantize_operand(t, recipe, role, usage, state, record=record)
        return cache[t]


MUTANTS: list[Fp8Linear] = [
    ColumnwiseFromRowwiseQuantized("mutant_colwise_from_rowwise[blockwise]", _recipes("blockwise")),
    ColumnwiseFromRowwiseQuantized("mutant_colwise_from_rowwise[mxfp8]", _recipes("mxfp8")),
    MXScaleRoundedWrongWay("mutant_mx_scale_wrong_way", _recipes("mxfp8")),
    SavesCopyOfX("mutant_saves_copy_of_x", _recipes("current")),
    DelayedUsesCurrentAmax("mutant_delayed_current_amax", _recipes("delayed")),
    DelayedAllowsSaveOriginalInput("mutant_delayed_allows_soi", _recipes("delayed")),
    AssumesContiguousX("mutant_assumes_contiguous_x", _recipes("current")),
    SharedSavedXWorkspace("mutant_shared_saved_x_workspace", _recipes("blockwise")),
    StaleWeightCache("mutant_stale_weight_cache", _recipes("mxfp8")),
]

#: mutant name → the property (in :data:`properties.fp8_checks.FP8_PROPERTIES`) that must flag it.
CAUGHT_BY: dict[str, str] = {
    "mutant_colwise_from_rowwise[blockwise]": "save_original_input",
    "mutant_colwise_from_rowwise[mxfp8]": "save_original_input",
    "mutant_mx_scale_wrong_way": "accuracy",
    "mutant_saves_copy_of_x": "saved_tensors",
    "mutant_delayed_current_amax": "accuracy",
    "mutant_delayed_allows_soi": "save_original_input",
    "mutant_assumes_contiguous_x": "strided",
    "mutant_shared_saved_x_workspace": "two_layers",
    "mutant_stale_weight_cache": "optimizer_step",
}
