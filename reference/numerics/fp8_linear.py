"""The single FP8 quantized linear: one autograd Function per recipe kind, ``save_original_input`` both ways.

These are the numerics of the built-in ``fp8_linear[<kind>]`` (:mod:`impls.builtin.fp8_linear`, which implements
every variant of one recipe kind from :func:`reference.fp8_recipes.standard_recipes` under the protocol of
:mod:`impls.protocols.fp8_linear`) and of the judge's yardstick for the grouped family's ``per_expert_linear``
(:mod:`numcheck.properties.fp8.yardstick`):

* Quantization runs in fp32 torch ops on the tensor's device, the way the TE kernels do: NaN-ignoring
  block amax, ``fp8_max / amax`` as an fp32 division (or the stored delayed scale, or an E8M0 code from
  the exponent bits), ``fp32(x·s)``, an explicit clamp to ±fp8_max and then the cast. The clamp makes the
  result independent of whether this torch release's eager cast saturates (2.13 does, 2.6 and 2.11 give
  NaN for E4M3 and inf for E5M2).
* Every operand is stored "K-major": a :class:`QTensor` whose scaling blocks run along its last
  dimension. A columnwise quantization of ``t`` is computed as the rowwise quantization of ``tᵀ``
  (so it is held transposed, as TE holds it), and every GEMM is ``A·Bᵀ`` of two K-major operands.
* GEMMs go through ``torch._scaled_mm`` where the probe the numerics are given
  (:func:`impls.measure.capabilities.scaled_mm`) says the device runs that scaling mode for that pair of FP8 dtypes
  and the shapes meet its alignment (every dimension a multiple of 16, K a multiple of 128 for block scales);
  otherwise exact emulation: dequantize to fp32 and multiply in fp32. MXFP8 is always emulated (native MX GEMMs are
  Blackwell-only).
* ``save_original_input=False`` saves the columnwise FP8 copy of x (data + scales); ``True`` saves x
  itself and quantizes it columnwise in backward. Delayed scaling with ``True`` raises ``ValueError``.
  The weight is saved as the caller's tensor and requantized columnwise in backward in both modes.

The methods :meth:`Fp8LinearNumerics.original_x_to_save`, :meth:`Fp8LinearNumerics.columnwise_x_source`,
:meth:`Fp8LinearNumerics.scale_from_amax`, :meth:`Fp8LinearNumerics.mx_scale_code`, :meth:`Fp8LinearNumerics.cast`
and :meth:`Fp8LinearNumerics.quantize_operand` are the seams the suite's mutants
(``tests/self/helpers/fp8_mutants.py``) override on the built-in. The per-tensor step
(:meth:`Fp8LinearNumerics.quantize_per_tensor`) is shared with the tensor-parallel built-in
(:mod:`impls.builtin.tp_fp8_linear`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from numcheck.reference.fp8_formats import DTYPE_MAX, FP32_MAX, Fp8Format
from numcheck.reference.fp8_recipes import ROWWISE_KINDS, Fp8Recipe

#: Whether ``torch._scaled_mm`` runs scaling mode ``mode`` for FP8 operand dtypes ``a_dtype``, ``b_dtype`` (names)
#: on a device: ``(device, mode, a_dtype, b_dtype) -> bool`` (:func:`numcheck.impls.measure.capabilities.scaled_mm`).
ScaledMmProbe = Callable[[Any, str, str, str], bool]

#: The built-in's name, ``fp8_linear[<kind>]`` per recipe kind (the yardstick keeps it in failure lines).
NAME = "fp8_linear"

_SIGN_EXP_MASK = -8388608  # 0xFF800000 as int32: keep sign and exponent bits (round a scale down to 2^k)


@dataclass(frozen=True)
class QTensor:
    """A K-major quantized operand: FP8 ``data [R, C]`` with blocks ``block`` running along C.

    ``scale_inv`` is the fp32 dequantization scale per block ``[nbR, nbC]`` (0-d for per-tensor);
    ``code`` the E8M0 codes (uint8) for MXFP8, else ``None``.
    """

    data: torch.Tensor
    scale_inv: torch.Tensor
    code: torch.Tensor | None
    block: tuple[int, int]
    fmt: Fp8Format

    @property
    def per_tensor(self) -> bool:
        return self.scale_inv.dim() == 0

    def expanded_scale_inv(self) -> torch.Tensor:
        if self.per_tensor:
            return self.scale_inv
        R, C = self.data.shape
        br, bc = self.block
        return self.scale_inv.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:R, :C]

    def dequantize(self) -> torch.Tensor:
        """fp32 ``data · scale_inv`` (rounded to fp32 when the scale is not a power of two)."""
        return self.data.to(torch.float32) * self.expanded_scale_inv()

    def saved(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tensors to keep for backward: data and fp32 scales, or data and E8M0 codes (MXFP8)."""
        return (self.data, self.code if self.code is not None else self.scale_inv)


def pow2_f32(e: torch.Tensor) -> torch.Tensor:
    """Exact float32 2^e for integer e in [−149, 127], built from the bits."""
    e = e.to(torch.int32)
    normal = e >= -126
    bits_n = (torch.clamp(e, min=-126) + 127) << 23
    bits_s = torch.bitwise_left_shift(torch.ones_like(e), torch.clamp(e + 149, 0, 22))
    return torch.where(normal, bits_n, bits_s).view(torch.float32)


def e8m0_scale_inv(code: torch.Tensor) -> torch.Tensor:
    """fp32 2^(c−127) of E8M0 codes; 255 → NaN."""
    c = code.to(torch.int32)
    return torch.where(c == 255, torch.full(c.shape, float("nan"), device=c.device), pow2_f32(c - 127))


def _block_amax(t32: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp32 ``[nbR, nbC]`` max |t| per block, NaN ignored; partial blocks as if zero-padded."""
    R, C = t32.shape
    br, bc = block
    nr, nc = -(-R // br), -(-C // bc)
    a = t32.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    a = F.pad(a, (0, nc * bc - C, 0, nr * br - R))
    return a.view(nr, br, nc, bc).amax(dim=(1, 3))


def _scale_from_amax(
    amax: torch.Tensor, fp8_max: float, *, power_of_2: bool, epsilon: float, value_for_inf: float
) -> torch.Tensor:
    """TE's compute_scale_from_amax in fp32 torch ops."""
    a = torch.where(amax < epsilon, torch.full_like(amax, epsilon), amax)
    special = torch.isinf(a) | (a == 0) | torch.isnan(a)
    s = torch.full_like(a, fp8_max) / torch.where(special, torch.ones_like(a), a)
    s = torch.where(torch.isinf(s), torch.full_like(s, value_for_inf), s)
    if power_of_2:
        s = (s.view(torch.int32) & _SIGN_EXP_MASK).view(torch.float32)
    return torch.where(special, torch.ones_like(s), s)


def mx_scale_code_rceil(amax: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """E8M0 code (int32) rounding the descale amax·fp32(1/fp8_max) *up* to a power of two (TE)."""
    rcp = torch.tensor(1.0 / fmt.max_finite, dtype=torch.float32, device=amax.device)
    d = amax * rcp
    bits = d.view(torch.int32)
    E = (bits >> 23) & 0xFF
    M = bits & 0x7FFFFF
    inc = (M > 0) & (E != 254) & ~((E == 0) & (M <= 0x400000))
    code = E + inc.to(torch.int32)
    code = torch.where(d == 0, torch.zeros_like(code), code)
    code = torch.where(torch.isinf(d), torch.full_like(code, 254), code)
    return torch.where(torch.isnan(d), torch.full_like(code, 255), code)


def mx_scale_code_floor(amax: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """E8M0 code (int32) of 2^(floor(log2 amax) − emax) (OCP MX v1.0)."""
    E = (amax.view(torch.int32) >> 23) & 0xFF
    code = torch.clamp(E - 127 - fmt.mx_emax + 127, 0, 254)
    code = torch.where(amax == 0, torch.zeros_like(code), code)
    code = torch.where(torch.isinf(amax), torch.full_like(code, 254), code)
    return torch.where(torch.isnan(amax), torch.full_like(code, 255), code)


def _cast(t32: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """fp8(clamp(fp32(t·s), ±max)); NaN stays NaN through the clamp."""
    v = t32 * scale
    return torch.clamp(v, -fmt.max_finite, fmt.max_finite).to(fmt.torch_dtype)


def expand_blocks(s: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """Per-block values ``s`` ``[nbR, nbC]`` repeated over each ``block`` and cut to ``shape``."""
    return s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: shape[0], : shape[1]]


def k_major_fp32(t: torch.Tensor, usage: str) -> torch.Tensor:
    """``t`` (detached) as the contiguous fp32 K-major source of a quantization for ``usage``: ``tᵀ`` columnwise."""
    src = t.detach().t() if usage == "columnwise" else t.detach()
    return src.to(torch.float32).contiguous()


def tensor_amax(t32: torch.Tensor) -> torch.Tensor:
    """fp32 0-d max |t| of a 2-D fp32 tensor, NaN ignored (:func:`_block_amax` with one block)."""
    return _block_amax(t32, (max(1, t32.shape[0]), max(1, t32.shape[1]))).reshape(())


def recipes_kind(recipes: tuple[Fp8Recipe, ...], owner: str) -> str:
    """The one recipe kind ``recipes`` share; ``ValueError`` naming ``owner`` (the impl) when they mix kinds."""
    kinds = {r.kind for r in recipes}
    if len(kinds) != 1:
        raise ValueError(f"{owner}: recipes must share one kind, got {sorted(kinds)}")
    return kinds.pop()


class _QuantLinearFunction(torch.autograd.Function):
    """Forward and backward of y = Q(x)·Q(W)ᵀ + b; subclasses pin the recipe kind."""

    recipe_kind = ""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        impl: "Fp8LinearNumerics",
        recipe: Fp8Recipe,
        save_original_input: bool,
        state: Any,
    ) -> torch.Tensor:
        qx = impl.quantize_operand(x, recipe, "x", "rowwise", state, record=True)
        qw = impl.quantize_operand(weight, recipe, "w", "rowwise", state, record=True)
        y32 = impl.gemm_nt(qx, qw)
        if bias is not None:
            y32 = y32 + bias.to(torch.float32)
        ctx.impl, ctx.recipe, ctx.state = impl, recipe, state
        ctx.save_original_input = save_original_input
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.x_dtype = x.dtype
        if save_original_input:
            ctx.save_for_backward(weight, impl.original_x_to_save(x))
        else:
            qxc = impl.quantize_operand(x, recipe, "x", "columnwise", state, record=False)
            ctx.qxc_meta = (qxc.block, qxc.fmt, qxc.code is not None)
            ctx.save_for_backward(weight, *qxc.saved())
        return y32.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        impl, recipe, state = ctx.impl, ctx.recipe, ctx.state
        saved = ctx.saved_tensors
        weight = saved[0]
        dy = dy.contiguous()
        if ctx.save_original_input:
            x = impl.columnwise_x_source(saved[1], recipe, state)
            qxc = (
                impl.quantize_operand(x, recipe, "x", "columnwise", state, record=False)
                if recipe.quantizes("wgrad")
                else x
            )
        else:
            block, fmt, is_mx = ctx.qxc_meta
            data, s = saved[1], saved[2]
            qxc = QTensor(data, e8m0_scale_inv(s) if is_mx else s, s if is_mx else None, block, fmt)
        qdy = impl.quantize_operand(dy, recipe, "dy", "rowwise", state, record=True)
        qwc = impl.quantize_operand(weight, recipe, "w", "columnwise", state, record=False)
        dgrad = impl.gemm_nt(qdy, qwc).to(ctx.x_dtype)
        if recipe.quantizes("wgrad"):
            qdyc = impl.quantize_operand(dy, recipe, "dy", "columnwise", state, record=False)
            wgrad = impl.gemm_nt(qdyc, qxc).to(weight.dtype)
        else:  # high precision (rowwise_gw_hp): dyᵀ·x of the caller's tensors, accumulated in fp32
            wgrad = (dy.to(torch.float32).t() @ qxc.to(torch.float32)).to(weight.dtype)
        bgrad = dy.to(torch.float32).sum(dim=0).to(ctx.bias_dtype) if ctx.has_bias else None
        return dgrad, wgrad, bgrad, None, None, None, None


class _DelayedScalingLinear(_QuantLinearFunction):
    recipe_kind = "delayed"


class _CurrentScalingLinear(_QuantLinearFunction):
    recipe_kind = "current"


class _BlockwiseLinear(_QuantLinearFunction):
    recipe_kind = "blockwise"


class _MXFP8Linear(_QuantLinearFunction):
    recipe_kind = "mxfp8"


class _RowwiseLinear(_QuantLinearFunction):
    recipe_kind = "rowwise"


class _RowwiseGwHpLinear(_QuantLinearFunction):
    recipe_kind = "rowwise_gw_hp"


FUNCTIONS: dict[str, type[_QuantLinearFunction]] = {
    f.recipe_kind: f
    for f in (
        _DelayedScalingLinear,
        _CurrentScalingLinear,
        _BlockwiseLinear,
        _MXFP8Linear,
        _RowwiseLinear,
        _RowwiseGwHpLinear,
    )
}


class Fp8LinearNumerics:
    """The numerics of the single FP8 linear for the recipes of one kind: the quantization seams, the GEMM and the
    autograd function of that kind (:data:`FUNCTIONS`), without a protocol front. The built-in impl
    (:class:`impls.builtin.fp8_linear.Fp8Linear`) is this plus its declaration and argument checks; the judge's
    yardstick for the grouped family's ``per_expert_linear`` (:mod:`numcheck.properties.fp8.yardstick`) is this too.

    Args:
        recipe_kind: a kind of :data:`reference.fp8_recipes.RECIPE_KINDS`.
        scaled_mm_works: whether ``torch._scaled_mm`` runs a scaling mode for a pair of FP8 dtypes on a device
            (:func:`numcheck.impls.measure.capabilities.scaled_mm`, :data:`ScaledMmProbe`); asked at each GEMM.
    """

    def __init__(self, recipe_kind: str, scaled_mm_works: ScaledMmProbe) -> None:
        self.recipe_kind = recipe_kind
        self.function = FUNCTIONS[recipe_kind]
        self.scaled_mm_works = scaled_mm_works

    def apply(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        recipe: Fp8Recipe,
        save_original_input: bool,
        scaling_state: Any,
    ) -> torch.Tensor:
        """y = Q(x)·Q(W)ᵀ + b through this kind's autograd function (arguments already checked)."""
        return self.function.apply(x, weight, bias, self, recipe, bool(save_original_input), scaling_state)

    # -- pieces (mutants override these seams) -----------------------------------------------------
    def original_x_to_save(self, x: torch.Tensor) -> torch.Tensor:
        """What ``save_original_input=True`` keeps for backward: the caller's x itself (same storage)."""
        return x

    def columnwise_x_source(self, x_saved: torch.Tensor, recipe: Fp8Recipe, state: Any) -> torch.Tensor:
        """The tensor the backward pass quantizes columnwise when ``save_original_input=True``: x itself."""
        return x_saved

    def scale_from_amax(
        self, amax: torch.Tensor, fp8_max: float, *, power_of_2: bool, epsilon: float, value_for_inf: float
    ) -> torch.Tensor:
        """The fp32 scale of a tensor or of each block from its amax (TE's rule, :func:`_scale_from_amax`)."""
        return _scale_from_amax(amax, fp8_max, power_of_2=power_of_2, epsilon=epsilon, value_for_inf=value_for_inf)

    def mx_scale_code(self, amax: torch.Tensor, fmt: Fp8Format, rounding: str) -> torch.Tensor:
        """E8M0 code of an MXFP8 block from its amax (fp32), ``rceil`` or ``floor``."""
        return mx_scale_code_rceil(amax, fmt) if rounding == "rceil" else mx_scale_code_floor(amax, fmt)

    def cast(self, t32: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
        """fp8(t·s), saturating at ±fp8_max (:func:`_cast`)."""
        return _cast(t32, scale, fmt)

    def quantize_per_tensor(
        self,
        t32: torch.Tensor,
        amax: torch.Tensor,
        recipe: Fp8Recipe,
        role: str,
        state: Any,
        *,
        record: bool,
    ) -> QTensor:
        """Per-tensor (delayed, current) quantization of the K-major fp32 ``t32`` whose amax is ``amax`` (0-d):
        delayed scaling takes the stored scale (and records ``amax`` if asked), current scaling the scale from
        ``amax``; then the saturating cast."""
        fmt = recipe.format_of(role)
        if recipe.kind == "delayed":
            if state is None:
                raise ValueError("delayed scaling needs a DelayedScalingState")
            scale = state.scale_tensor(role, t32.device)
            if record:
                state.record(role, amax)
        else:
            scale = self.scale_from_amax(
                amax,
                fmt.max_finite,
                power_of_2=bool(recipe.power_of_2_scales),
                epsilon=recipe.amax_epsilon,
                value_for_inf=FP32_MAX,
            ).reshape(())
        data = self.cast(t32, scale, fmt)
        scale_inv = torch.ones_like(scale) / scale
        return QTensor(data, scale_inv.reshape(()).clone(), None, (t32.shape[0], t32.shape[1]), fmt)

    def quantize_operand(
        self,
        t: torch.Tensor,
        recipe: Fp8Recipe,
        role: str,
        usage: str,
        state: Any,
        *,
        record: bool,
    ) -> QTensor:
        """K-major quantization of ``t`` for (role, usage); records the amax for delayed scaling if asked."""
        t32 = k_major_fp32(t, usage)
        block = recipe.block_of(role, usage)
        if block is None:  # one scale per tensor: delayed, current, rowwise_gw_hp's W for dgrad
            return self.quantize_per_tensor(t32, tensor_amax(t32), recipe, role, state, record=record)
        fmt = recipe.format_of(role)
        if usage == "columnwise":
            block = (block[1], block[0])
        shape = (t32.shape[0], t32.shape[1])
        block = tuple(max(1, n) if b is None else b for b, n in zip(block, shape))  # None: the whole row
        amax = _block_amax(t32, block)
        if recipe.kind != "mxfp8":
            vfi = FP32_MAX if recipe.kind in ROWWISE_KINDS else DTYPE_MAX.get(t.dtype, FP32_MAX)
            scale = self.scale_from_amax(
                amax,
                fmt.max_finite,
                power_of_2=bool(recipe.power_of_2_scales),
                epsilon=recipe.amax_epsilon,
                value_for_inf=vfi,
            )
            data = self.cast(t32, expand_blocks(scale, shape, block), fmt)
            return QTensor(data, (torch.ones_like(scale) / scale).contiguous(), None, block, fmt)
        code = self.mx_scale_code(amax, fmt, recipe.mx_scale_rounding)
        scale = torch.where(code == 255, torch.full_like(amax, float("nan")), pow2_f32(127 - code))
        scale_inv = e8m0_scale_inv(code)
        data = self.cast(t32, expand_blocks(scale, shape, block), fmt)
        return QTensor(data, scale_inv, code.to(torch.uint8), block, fmt)

    def gemm_nt(self, a: QTensor, b: QTensor) -> torch.Tensor:
        """fp32 ``deq(a) · deq(b)ᵀ`` of two K-major operands: ``_scaled_mm`` where probed, else emulated."""
        mode = _native_mode(a, b)
        if mode is not None and self.scaled_mm_works(
            a.data.device, mode, a.fmt.torch_dtype_name, b.fmt.torch_dtype_name
        ):
            sa, sb = _native_scales(mode, a, b)
            return torch._scaled_mm(a.data, b.data.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        return a.dequantize() @ b.dequantize().t()


def _native_mode(a: QTensor, b: QTensor) -> str | None:
    """The ``_scaled_mm`` scaling mode for this pair, or ``None`` when shapes or blocks do not fit one."""
    m, k = a.data.shape
    n = b.data.shape[0]
    if a.code is not None or b.code is not None or k == 0:
        return None
    if m % 16 or k % 16 or n % 16:
        return None
    if a.per_tensor and b.per_tensor:
        return "tensorwise"
    if a.block == (1, 128) and k % 128 == 0:
        if b.block == (1, 128):
            return "blockwise_1x128"
        # K a multiple of 512: K/128 a multiple of 4, where torch releases that pad the tile-scale stride
        # to 4 and those that do not agree on the layout (the probe uses K = 512).
        if b.block == (128, 128) and n % 128 == 0 and k % 512 == 0:
            return "blockwise_128x128"
    return None


def _native_scales(mode: str, a: QTensor, b: QTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale tensors in the layouts :func:`impls.measure.capabilities.scaled_mm` probes."""
    if mode == "tensorwise":
        return a.scale_inv, b.scale_inv
    sa = a.scale_inv.t().contiguous().t()  # [m, k/128], outer-dim-major
    if mode == "blockwise_1x128":
        return sa, b.scale_inv.t().contiguous()  # [k/128, n]
    return sa, b.scale_inv.t()  # [k/128, n/128] as the transpose of the row-major tile grid


def declaration(recipes: tuple[Fp8Recipe, ...], kind: str) -> dict[str, Any]:
    """What the single FP8 linear declares for ``recipes`` (all of ``kind``): the fields of
    ``impls.protocols.fp8_linear.Fp8LinearSupport`` — fp32, bf16 and fp16 inputs, ``save_original_input`` both
    ways, a bias, the protocol's quantizer, and the GEMM accumulation of :func:`accumulation_declaration`."""
    return {
        "recipes": recipes,
        "dtypes": frozenset({torch.float32, torch.bfloat16, torch.float16}),
        # a recipe whose wgrad runs in high precision reads x itself in backward: no FP8 copy of x to save instead
        "save_original_input": frozenset({True} if any(not r.quantizes("wgrad") for r in recipes) else {False, True}),
        "bias": True,
        "exposes_quantize": True,
        **accumulation_declaration(kind),
    }


def accumulation_declaration(kind: str) -> dict[str, dict[str, Any]]:
    """Declared accumulation per device (``accum_unit_roundoff`` and ``accum_chunk``).

    CPU: ``_scaled_mm`` (tensorwise) and the emulation accumulate exact FP8 products in fp32: (2⁻²⁴, one
    level). CUDA: MXFP8 is emulated in fp32. Per-tensor and blockwise GEMMs run natively on Hopper, whose
    FP8 tensor cores keep about 14 accumulator bits and are promoted to fp32 every 128 products
    (DeepSeek-V3 report §3.3.2; our H200 measurements of cuBLAS without fast accumulation fit this): (2⁻¹³ — a chopping
    14-bit accumulator — over chunks of 128, then fp32). Measured on an H200 (torch 2.11, fp32 output,
    M=N=256, K from 128 to 32768, N(0,1) inputs and one 1024× outlier per row): the worst error against the
    dequantized reference was 0.13 of this bound for tensorwise GEMMs and 0.12 for 1×128 × 128×128 block
    GEMMs (both at the smallest K with outliers), falling to 0.02 at K = 32768; a single fp32 level (2⁻²⁴)
    is exceeded up to 276× at K = 128.
    """
    if kind == "mxfp8" or kind in ROWWISE_KINDS:  # emulated on every device (no rowwise _scaled_mm mode probed)
        return {"accum_unit_roundoff": {"cpu": 2.0**-24, "cuda": 2.0**-24}, "accum_chunk": {"cpu": None, "cuda": None}}
    return {"accum_unit_roundoff": {"cpu": 2.0**-24, "cuda": 2.0**-13}, "accum_chunk": {"cpu": None, "cuda": 128}}
