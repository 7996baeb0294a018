"""Deliberately broken FP8 quantized linears: the FP8 properties must flag every one of them.

Each mutant is the built-in :class:`impls.builtin.fp8_linear.Fp8Linear` with one seam overridden, declared for
the recipes where its bug is observable, and loadable like any outside impl
(``--impl numcheck.tests.self.helpers.fp8_mutants:MUTANTS``). :data:`CAUGHT_BY` names the property that must fail
(the tables of :mod:`tests.self.helpers.mutant_table`).
"""

from __future__ import annotations

import torch

from numcheck.impls.builtin.fp8_linear import Fp8Linear
from numcheck.impls.protocols.fp8_linear import DelayedScalingState
from numcheck.reference.fp8_formats import Fp8Format
from numcheck.reference.fp8_recipes import ROWWISE_KINDS, Fp8Recipe, rowwise_recipes
from numcheck.reference.numerics import fp8_linear as _ql
from numcheck.reference.numerics.fp8_linear import QTensor
from numcheck.tests.self.helpers.mutant_table import caught_by_table
from numcheck.tests.self.helpers.mutant_table import recipes_of as _recipes


class ColumnwiseFromRowwiseQuantized(Fp8Linear):
    """save_original_input=True quantizes x columnwise in backward from the *rowwise-quantized* x
    (dequantized) instead of the original x: double quantization, visible wherever blocks differ by usage."""

    def columnwise_x_source(
        self, x_saved: torch.Tensor, recipe: Fp8Recipe, state: DelayedScalingState | None
    ) -> torch.Tensor:
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

    def quantize_operand(
        self,
        t: torch.Tensor,
        recipe: Fp8Recipe,
        role: str,
        usage: str,
        state: DelayedScalingState | None,
        *,
        record: bool,
    ) -> QTensor:
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

    def quantize_operand(
        self,
        t: torch.Tensor,
        recipe: Fp8Recipe,
        role: str,
        usage: str,
        state: DelayedScalingState | None,
        *,
        record: bool,
    ) -> QTensor:
        if role != "w" or usage != "rowwise":
            return super().quantize_operand(t, recipe, role, usage, state, record=record)
        from torch.utils.weak import WeakIdKeyDictionary

        cache = self.__dict__.setdefault("_weight_cache", WeakIdKeyDictionary())
        if t not in cache:
            cache[t] = super().quantize_operand(t, recipe, role, usage, state, record=record)
        return cache[t]


#: The mutants, each with the property (in :data:`properties.fp8.props.FP8_PROPERTIES`) that must flag it.
MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (
            ColumnwiseFromRowwiseQuantized("mutant_colwise_from_rowwise[blockwise]", _recipes("blockwise")),
            "save_original_input",
        ),
        (
            ColumnwiseFromRowwiseQuantized("mutant_colwise_from_rowwise[mxfp8]", _recipes("mxfp8")),
            "save_original_input",
        ),
        (MXScaleRoundedWrongWay("mutant_mx_scale_wrong_way", _recipes("mxfp8")), "accuracy"),
        (SavesCopyOfX("mutant_saves_copy_of_x", _recipes("current")), "saved_tensors"),
        (DelayedUsesCurrentAmax("mutant_delayed_current_amax", _recipes("delayed")), "accuracy"),
        (DelayedAllowsSaveOriginalInput("mutant_delayed_allows_soi", _recipes("delayed")), "save_original_input"),
        (AssumesContiguousX("mutant_assumes_contiguous_x", _recipes("current")), "strided"),
        (SharedSavedXWorkspace("mutant_shared_saved_x_workspace", _recipes("blockwise")), "two_layers"),
        (StaleWeightCache("mutant_stale_weight_cache", _recipes("mxfp8")), "optimizer_step"),
    ]
)


# -- quantizer edges: each one change to one of the built-in quantizer's seams (scale_from_amax,
# mx_scale_code, cast) ------------------------------------------------------------------------------------------


class Pow2ScaleThroughLog2(Fp8Linear):
    """A power-of-2 scale taken as 2^floor(log2(fp8_max/amax)) through fp32 ``log2`` instead of from the bits of
    fp8_max/amax: where that ratio is a few ulps below 2^k, log2 rounds up to k exactly and the scale is twice too
    large (the block's amax then lands on the format maximum); elsewhere the same scale."""

    def scale_from_amax(
        self, amax: torch.Tensor, fp8_max: float, *, power_of_2: bool, epsilon: float, value_for_inf: float
    ) -> torch.Tensor:
        s = super().scale_from_amax(amax, fp8_max, power_of_2=False, epsilon=epsilon, value_for_inf=value_for_inf)
        if not power_of_2:
            return s
        ok = torch.isfinite(s) & (s > 0)
        e = torch.floor(torch.log2(torch.where(ok, s, torch.ones_like(s)))).clamp(-126, 127)
        return torch.where(ok, _ql.pow2_f32(e), s)


class MXRceilThroughLog2(Fp8Linear):
    """The MXFP8 RCEIL code as ceil(log2(amax·fp32(1/fp8_max))) + 127 through fp32 ``log2`` instead of from the
    exponent and mantissa bits: a descale a few ulps above 2^k has an fp32 log2 of exactly k (for |k| ≥ 2), so
    the code is one too small and the block's amax overflows (saturates); FLOOR as the built-in."""

    def mx_scale_code(self, amax: torch.Tensor, fmt: Fp8Format, rounding: str) -> torch.Tensor:
        if rounding != "rceil":
            return super().mx_scale_code(amax, fmt, rounding)
        d = amax * torch.tensor(1.0 / fmt.max_finite, dtype=torch.float32, device=amax.device)
        ok = torch.isfinite(d) & (d > 0)
        code = (torch.ceil(torch.log2(torch.where(ok, d, torch.ones_like(d)))) + 127).clamp(0, 254).to(torch.int32)
        code = torch.where(d == 0, torch.zeros_like(code), code)
        code = torch.where(torch.isinf(d), torch.full_like(code, 254), code)
        return torch.where(torch.isnan(d), torch.full_like(code, 255), code)


class MXRceilRoundsUpPowersOfTwo(Fp8Linear):
    """The MXFP8 RCEIL code rounding up when the descale's mantissa is ``>= 0`` instead of ``> 0`` (a non-strict
    comparison): a descale that is exactly 2^k (an amax of fp8_max·2^k, or 1 ulp below it) gets the code of 2^(k+1),
    half the resolution; every other block as the built-in."""

    def mx_scale_code(self, amax: torch.Tensor, fmt: Fp8Format, rounding: str) -> torch.Tensor:
        code = super().mx_scale_code(amax, fmt, rounding)
        if rounding != "rceil":
            return code
        d = amax * torch.tensor(1.0 / fmt.max_finite, dtype=torch.float32, device=amax.device)
        bits = d.view(torch.int32)
        exact = torch.isfinite(d) & (d > 0) & ((bits & 0x7FFFFF) == 0) & (((bits >> 23) & 0xFF) > 0)
        return torch.where(exact & (code < 254), code + 1, code)


class NoSaturation(Fp8Linear):
    """A cast that does not saturate: a scaled value that rounds past the format maximum becomes NaN (E4M3, which
    has no inf) or ±inf (E5M2), as a non-saturating hardware cast gives, instead of ±fp8_max. Round-to-nearest-even
    decides the edge: E4M3's 464 still rounds to 448 (the tie goes to the even 448), E5M2's 61440 overflows."""

    def cast(self, t32: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
        v = t32 * scale
        ulp = 2.0 ** (int(torch.tensor(fmt.max_finite).log2().floor()) - fmt.mbits)
        edge = fmt.max_finite + ulp / 2
        over = (v.abs() >= edge) if fmt.has_inf else (v.abs() > edge)
        big = torch.copysign(torch.full_like(v, float("inf") if fmt.has_inf else float("nan")), v)
        return super().cast(torch.where(over, big, v), torch.ones_like(scale), fmt)


#: The quantizer-edge mutants (the detection table's FP8 rows with ``mutant_mx_scale_wrong_way`` above), each
#: declared for the recipes where its change is observable.
EDGE_MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (
            Pow2ScaleThroughLog2(
                "mutant_pow2_scale_log2[current]", tuple(r for r in _recipes("current") if r.power_of_2_scales)
            ),
            "quantizer",
        ),
        (
            Pow2ScaleThroughLog2(
                "mutant_pow2_scale_log2[blockwise]", tuple(r for r in _recipes("blockwise") if r.power_of_2_scales)
            ),
            "quantizer",
        ),
        (
            MXRceilThroughLog2(
                "mutant_mx_rceil_log2", tuple(r for r in _recipes("mxfp8") if r.mx_scale_rounding == "rceil")
            ),
            "quantizer",
        ),
        (
            MXRceilRoundsUpPowersOfTwo(
                "mutant_mx_rceil_nonstrict", tuple(r for r in _recipes("mxfp8") if r.mx_scale_rounding == "rceil")
            ),
            "quantizer",
        ),
        (
            NoSaturation(
                "mutant_no_saturation[mxfp8]", tuple(r for r in _recipes("mxfp8") if r.mx_scale_rounding == "floor")
            ),
            "accuracy",
        ),
        (NoSaturation("mutant_no_saturation[delayed]", _recipes("delayed")), "accuracy"),
    ],
    after=CAUGHT_BY,
)

#: Module-level names, so ``--impl numcheck.tests.self.helpers.fp8_mutants:<name>`` loads each mutant alone.
mx_scale_wrong_way = MUTANTS[2]
(
    pow2_scale_log2_current,
    pow2_scale_log2_blockwise,
    mx_rceil_log2,
    mx_rceil_nonstrict,
    no_saturation_mxfp8,
    no_saturation_delayed,
) = EDGE_MUTANTS


# -- block-scale layout: a block scale read from the wrong block, hidden where neighbouring blocks share an exponent
# (random data, and today's regimes, which vary x's and dy's blocks but leave W's alike); the ``block_exponents``
# regime gives each row and K-block its own exponent -----------------------------------------------------------


class _WrongScaleLayout(Fp8Linear):
    """The built-in's quantization, then :meth:`misplace` on W's block-scaled operand of :attr:`usage` (the
    seam every block-scale layout mutant below overrides)."""

    usage = "rowwise"

    def quantize_operand(
        self,
        t: torch.Tensor,
        recipe: Fp8Recipe,
        role: str,
        usage: str,
        state: DelayedScalingState | None,
        *,
        record: bool,
    ) -> QTensor:
        q = super().quantize_operand(t, recipe, role, usage, state, record=record)
        if role != "w" or usage != self.usage or q.per_tensor:
            return q
        return self.misplace(q, t)

    def misplace(self, q: QTensor, t: torch.Tensor) -> QTensor:
        raise NotImplementedError


class DgradTileScalesUntransposed(_WrongScaleLayout):
    """dgrad's W (quantized columnwise, K-major ``Wᵀ [K, N]``) takes its 128×128 tile scales from the rowwise
    ``[nN, nK]`` buffer read as ``[nK, nN]`` (a transpose missing where the scales are laid out for the GEMM): tile
    (k, n) gets the scale of tile (n, k) on square grids; the codes are cast with the right scales."""

    usage = "columnwise"

    def misplace(self, q: QTensor, t: torch.Tensor) -> QTensor:
        return QTensor(q.data, q.scale_inv.t().contiguous().view(q.scale_inv.shape), q.code, q.block, q.fmt)


class WeightKTailTakesPreviousScale(_WrongScaleLayout):
    """W's scales along K computed for K // 128 blocks, as if K were a multiple of the block (it is one of 32 or 16):
    the partial last K-tile is cast and dequantized with the scale of the full tile before it (its own where there
    is none). Where the two tiles' amaxes share an exponent (power-of-2 scales) nothing changes."""

    def misplace(self, q: QTensor, t: torch.Tensor) -> QTensor:
        if q.scale_inv.shape[1] < 2 or t.shape[1] % 128 == 0:
            return q
        si = q.scale_inv.clone()
        si[:, -1] = si[:, -2]
        t32 = t.detach().to(torch.float32)
        data = self.cast(t32, _ql.expand_blocks(torch.ones_like(si) / si, tuple(t32.shape), q.block), q.fmt)
        return QTensor(data, si, q.code, q.block, q.fmt)


class WeightKBlockScaleShifted(_WrongScaleLayout):
    """fprop's W scale of K-block b read from block b + 1 (mod the blocks of the row): an off-by-one in the scale
    layout's K index; the codes are cast with the right scales."""

    def misplace(self, q: QTensor, t: torch.Tensor) -> QTensor:
        code = None if q.code is None else q.code.roll(-1, dims=1)
        return QTensor(q.data, q.scale_inv.roll(-1, dims=1).contiguous(), code, q.block, q.fmt)


_pow2_blockwise = tuple(r for r in _recipes("blockwise") if r.power_of_2_scales)
#: The block-scale layout mutants, declared for power-of-2 block scales (where equal exponents give equal scales).
#: The transposed dgrad tiles and the K-tail pass the ci profile's accuracy draws and fail its scale-block grids
#: (``accuracy_on_scale_block_grids``); the K-block shift fails both (MXFP8's 1×32 codes differ on random data).
LAYOUT_MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (DgradTileScalesUntransposed("mutant_dgrad_tile_scales_untransposed", _pow2_blockwise), "accuracy"),
        (WeightKTailTakesPreviousScale("mutant_w_k_tail_previous_scale", _pow2_blockwise), "accuracy"),
        (WeightKBlockScaleShifted("mutant_w_k_block_scale_shifted", _recipes("mxfp8")), "accuracy"),
    ],
    after=CAUGHT_BY,
)
dgrad_tile_scales_untransposed, w_k_tail_previous_scale, w_k_block_scale_shifted = LAYOUT_MUTANTS


# -- rowwise scales (torchao's AXISWISE): a per-row scale applied along the wrong axis, or one scale for every row;
# random rows share a power-of-2 scale's exponent often, the ``block_exponents`` grids give each row its own -------


class _RowwiseXScales(Fp8Linear):
    """The built-in, but fprop's x (rowwise usage of a rowwise kind) quantized by :meth:`wrong` instead."""

    def quantize_operand(
        self,
        t: torch.Tensor,
        recipe: Fp8Recipe,
        role: str,
        usage: str,
        state: DelayedScalingState | None,
        *,
        record: bool,
    ) -> QTensor:
        if recipe.kind not in ROWWISE_KINDS or (role, usage) != ("x", "rowwise"):
            return super().quantize_operand(t, recipe, role, usage, state, record=record)
        return self.wrong(t, recipe, state)

    def wrong(self, t: torch.Tensor, recipe: Fp8Recipe, state: DelayedScalingState | None) -> QTensor:
        raise NotImplementedError


class RowwiseScalesAlongWrongAxis(_RowwiseXScales):
    """fprop's x scaled per *column* (over M) instead of per row (over K): the scales of the wgrad usage, applied
    to the fprop operand (an axiswise_dim of 0 where −1 belongs); codes cast and dequantized with those scales."""

    def wrong(self, t: torch.Tensor, recipe: Fp8Recipe, state: DelayedScalingState | None) -> QTensor:
        q = super().quantize_operand(t, recipe, "x", "columnwise", state, record=False)  # K-major xᵀ, a scale per row
        return QTensor(q.data.t().contiguous(), q.scale_inv.t().contiguous(), None, (q.block[1], q.block[0]), q.fmt)


class RowwiseOneScaleForAllRows(_RowwiseXScales):
    """fprop's x scaled with one scale for the whole tensor (tensorwise granularity where rowwise is declared)."""

    def wrong(self, t: torch.Tensor, recipe: Fp8Recipe, state: DelayedScalingState | None) -> QTensor:
        t32 = _ql.k_major_fp32(t, "rowwise")
        return self.quantize_per_tensor(t32, _ql.tensor_amax(t32), recipe, "x", state, record=False)


_rowwise = tuple(r for r in rowwise_recipes() if r.kind == "rowwise")
#: The rowwise-scale mutants, declared for the rowwise kind's built-in variants (power-of-2 and fp32 scales).
ROWWISE_MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (RowwiseScalesAlongWrongAxis("mutant_rowwise_scales_wrong_axis", _rowwise), "accuracy"),
        (RowwiseOneScaleForAllRows("mutant_rowwise_one_scale", _rowwise), "accuracy"),
    ],
    after=CAUGHT_BY,
)
rowwise_scales_wrong_axis, rowwise_one_scale = ROWWISE_MUTANTS


# -- Hopper's accumulation (the fp8_linear[hopper] built-in, mmaemu's model): a chain longer than declared -----------
from numcheck.impls.builtin.fp8_hopper import HopperFp8Linear, fp8_hopper_impls, hopper_gemm  # noqa: E402


class HopperRestartDropped(HopperFp8Linear):
    """Declared without fast accumulation (a new chain every 128 products, chains added in fp32), but every GEMM runs
    Hopper's fast-accumulation chain over the whole reduction: ``use_fast_accum=True`` where ``False`` was meant (a
    GEMM configuration shared between fprop and the gradient GEMMs, or a flag dropped on its way to the kernel).
    Truncation's one-signed errors then add up along K: on same-sign operands the slow-accumulation bound is exceeded
    from K ≈ 500; random-sign data and the accuracy test's K ≤ 208 hide it."""

    def gemm_nt(self, a: QTensor, b: QTensor) -> torch.Tensor:
        return hopper_gemm(a, b, fast=True)


HOPPER_MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (
            HopperRestartDropped(
                "mutant_hopper_restart_dropped", fp8_hopper_impls()[0].support.recipes, "", fast=False
            ),
            "accuracy",
        ),
    ],
    after=CAUGHT_BY,
)
(hopper_restart_dropped,) = HOPPER_MUTANTS
