"""Adapters for torchao's prototype FP8 training paths, each declared from the installed release and registered
unavailable, with the reason read from the release, where it cannot run here:

``torchao_mxfp8[<rounding>]`` (fp8-linear): ``torchao.prototype.moe_training.mxfp8_linear.MXFP8Linear`` with
``kernel_preference=KernelPreference.EMULATED`` (torch code on any device), one impl per
``ScaleCalculationMode`` numcheck's ``mxfp8`` recipe has (``RCEIL`` → ``rceil``, ``FLOOR`` → ``floor``). Read from
0.18.0's ``mxfp8_linear.py``: E4M3 for x, W and dy in 1×32 blocks along each GEMM's reduction dimension (``mx_mm``:
x and W ``dim0`` for y, dy ``dim0`` and Wᵀ for dgrad, dyᵀ and xᵀ for wgrad), E8M0 block scales
(``MXTensor.to_mx``), x and W saved in high precision and quantized again in backward (``save_for_backward(input_hp,
weight_hp)``: ``save_original_input=True`` only), the bias added after the GEMM's output in its dtype
(``MXFP8Linear.forward``). Every dimension must be a multiple of the block (``to_mx`` asserts "the last dimension
... must be divisible by block_size 32", and backward quantizes along M and N too): :func:`mx_shapes` runs the release
on x [64, 32], W [96, 32] and then with each dimension in turn at 40, and declares ``dim_multiple`` 32 for each one it
refuses, so the suite draws only those shapes (and skips the partial-block regimes, naming the field).

``torchao_grouped_fp8[rowwise]`` (grouped-fp8-linear): ``torchao.prototype.moe_training.fp8_grouped_mm.
_to_fp8_rowwise_then_scaled_grouped_mm`` (MoE training's FP8 rowwise grouped GEMM, torchtitan's path): x per row,
each expert's W per output column over K, dy per row for dgrad and per expert column over its tokens for wgrad,
E4M3, power-of-2 scales with the kernels' ``EPS`` floor (``kernels/float8_rowwise.py``), the output in
``Float8TrainingOpConfig().out_dtype`` (bfloat16: an fp32 input would round through it, so only the dtypes equal to
it are declared), fast accumulation (``use_fast_accum=True``: Hopper's 2⁻¹³, one chain), x and W saved in high
precision, no bias; K, N and every group a multiple of 16 (its asserts; groups unpadded,
``pad_token_groups_for_grouped_mm=False``). Its Triton kernels and ``torch._scaled_grouped_mm`` need CUDA:
:func:`grouped_refusal` runs it once on a tiny problem on the device and, where it raises, the impl is unavailable
with that error (on the CPU: "requires triton installed" and no CPU kernel of ``aten::_scaled_grouped_mm``).
No numcheck-written emulation stands in for torchao's code. Its scaling is numcheck's ``rowwise`` kind per expert
(read from 0.18.0's ``_Float8GroupedMM``: forward ``triton_fp8_rowwise_2d_scale_and_cast`` of x and
``triton_fp8_colwise_3d_scale_and_cast`` of B_t, each W row over K; dgrad dy per row and
``triton_fp8_rowwise_3d_transpose_rhs``, each W column over N; wgrad ``triton_fp8_per_group_colwise_scales_dual``,
dy and x per expert column over its rows; power-of-2 scales), which the grouped declaration takes, so on CUDA the
grouped suite judges it (``tools/gpu/torchao.sh``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from numcheck.errors import InvalidDeclaration
from numcheck.impls.adapters.torchao import HOPPER_ACCUM_UNIT_ROUNDOFF, load, placement
from numcheck.impls.protocols.fp8_linear import Fp8FunctionImpl, Fp8LinearSupport
from numcheck.impls.protocols.grouped_fp8_linear import GroupedFp8Support, GroupedFunctionImpl
from numcheck.reference.fp8_recipes import Fp8Recipe

#: numcheck's MX scale roundings by torchao's ``ScaleCalculationMode`` member name.
MX_ROUNDINGS: dict[str, str] = {"RCEIL": "rceil", "FLOOR": "floor"}
MX_DTYPES: frozenset[torch.dtype] = frozenset({torch.float32, torch.bfloat16})
#: torchao's FP8 grouped GEMM's alignment of K, N and each group's rows (its asserts).
GROUPED_ALIGNMENT = 16


def _reason(text: str) -> str:
    return text


def _why(text: str) -> Any:
    return functools.partial(_reason, text)


@functools.lru_cache(maxsize=None)
def mx_module() -> tuple[Any, Any, Any] | str:
    """``(MXFP8Linear, KernelPreference, ScaleCalculationMode)`` of the installed release, or why not."""
    info = load()
    if isinstance(info, str):
        return info
    try:
        from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
    except Exception as exc:
        return (
            f"torchao {info.version} has no MXFP8Linear in torchao.prototype.moe_training ({type(exc).__name__}: {exc})"
        )
    if not hasattr(KernelPreference, "EMULATED"):
        return f"torchao {info.version}'s KernelPreference has no EMULATED"
    return MXFP8Linear, KernelPreference, ScaleCalculationMode


def _mx_module(found: tuple[Any, Any, Any], mode: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    cls, pref, modes = found
    out_features, in_features = weight.shape
    return cls(
        in_features,
        out_features,
        bias=bias is not None,
        device="meta",
        dtype=weight.dtype,
        kernel_preference=pref.EMULATED,
        scale_calculation_mode=getattr(modes, mode),
    )


#: The MX block; the base shape of :func:`mx_shapes` (every dimension a multiple of it, each its own size).
MX_BLOCK = 32
_MX_PROBE = {"M": 64, "K": 32, "N": 96}


def _mx_run(found: tuple[Any, Any, Any], M: int, K: int, N: int) -> str | None:
    """Run the release's emulated MXFP8Linear (RCEIL) forward and backward on x [M, K], W [N, K]: what it raised."""
    w = torch.zeros(N, K)
    x = torch.ones(M, K, requires_grad=True)
    try:
        torch.func.functional_call(_mx_module(found, "RCEIL", w, None), {"weight": w}, (x,)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - whatever it raises is the reason
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
    return None


@functools.lru_cache(maxsize=None)
def mx_shapes() -> tuple[dict[str, int], str] | str:
    """The shapes the release's emulated MXFP8Linear takes, read by running it: ``({dim: MX_BLOCK}, message)`` for
    each dimension it refuses at 40 (the others multiples of 32), with the first refusal's message; or why it does not
    run even where every dimension is a multiple of the block."""
    found = mx_module()
    if isinstance(found, str):
        return found
    version = load().version  # type: ignore[union-attr]
    broken = _mx_run(found, *_MX_PROBE.values())
    if broken:
        return f"torchao {version}'s MXFP8Linear (emulated) fails on x [64, 32], W [96, 32]: {broken}"
    refused = {d: _mx_run(found, *{**_MX_PROBE, d: 40}.values()) for d in _MX_PROBE}
    dims = {d: MX_BLOCK for d, why in refused.items() if why}
    return dims, next((f"{d}=40: {why}" for d, why in refused.items() if why), "")


def mx_fn(found: tuple[Any, Any, Any], mode: str, declared: Fp8Recipe) -> Any:
    label = f"torchao_mxfp8[{MX_ROUNDINGS[mode]}]"

    def fn(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
        """``y = MXFP8Linear(x)`` (emulated) on the caller's ``weight`` and ``bias``."""
        if recipe != declared:
            raise ValueError(f"{label} runs {declared.name}; cannot run {recipe.name}")
        if not save_original_input:
            raise ValueError(f"{label}: save_original_input=False is not available: MXFP8Linear saves x itself")
        params = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
        return torch.func.functional_call(_mx_module(found, mode, weight, bias), params, (x,))

    return fn


def mx_impl(mode: str) -> Fp8FunctionImpl:
    """``torchao_mxfp8[rounding]`` for torchao's ``ScaleCalculationMode.<mode>``."""
    found = mx_module()
    recipe = Fp8Recipe("mxfp8", mx_scale_rounding=MX_ROUNDINGS[mode])
    label = f"torchao_mxfp8[{MX_ROUNDINGS[mode]}]"
    reason = found if isinstance(found, str) else None
    if reason is None and not hasattr(found[2], mode):
        reason = f"torchao {load().version}'s ScaleCalculationMode has no {mode}"  # type: ignore[union-attr]
    shapes = mx_shapes() if reason is None else reason
    if isinstance(shapes, str):
        reason = shapes
    dims, refusal = ({}, "") if isinstance(shapes, str) else shapes
    support = Fp8LinearSupport(
        recipes=(recipe,),
        dtypes=MX_DTYPES,
        devices=(placement()[0],),
        save_original_input=(True,),
        bias=True,
        bias_after_output_rounding=True,  # MXFP8Linear.forward: output + bias.to(output.dtype)
        dim_multiple=dims or 1,  # the dimensions the release refuses off the block (mx_shapes)
        requires=_why(reason) if reason else None,
    )
    if reason:
        return Fp8FunctionImpl(name=label, fn=_raising(label, reason), support=support, description=reason)
    shape_text = f"; {', '.join(dims)} multiples of {MX_BLOCK} (it refuses {refusal})" if dims else ""
    desc = (
        f"torchao {load().version} MXFP8Linear, kernel_preference=EMULATED, ScaleCalculationMode.{mode}: "  # type: ignore[union-attr]
        f"{recipe.name}, E4M3 in 1x32 blocks with E8M0 scales, x saved and quantized again in backward{shape_text}"
    )
    return Fp8FunctionImpl(name=label, fn=mx_fn(found, mode, recipe), support=support, description=desc)


def _raising(label: str, reason: str) -> Any:
    def fn(*args: Any, **kwargs: Any) -> Any:
        """Raise: the impl cannot run here."""
        raise RuntimeError(f"{label} unavailable: {reason}")

    return fn


def torchao_mx_impls() -> list[Fp8FunctionImpl]:
    """One ``torchao_mxfp8`` impl per scale rounding of :data:`MX_ROUNDINGS`."""
    return [mx_impl(mode) for mode in MX_ROUNDINGS]


@functools.lru_cache(maxsize=None)
def grouped_module() -> tuple[Any, Any, float] | str:
    """``(_to_fp8_rowwise_then_scaled_grouped_mm, Float8TrainingOpConfig, EPS)`` of the release, or why not."""
    info = load()
    if isinstance(info, str):
        return info
    try:
        from torchao.prototype.moe_training.config import Float8TrainingOpConfig
        from torchao.prototype.moe_training.fp8_grouped_mm import _to_fp8_rowwise_then_scaled_grouped_mm
        from torchao.prototype.moe_training.kernels import float8_rowwise
    except Exception as exc:
        return f"torchao {info.version} has no FP8 rowwise grouped GEMM in torchao.prototype.moe_training ({type(exc).__name__}: {exc})"
    return _to_fp8_rowwise_then_scaled_grouped_mm, Float8TrainingOpConfig, float(getattr(float8_rowwise, "EPS", 1e-12))


def _grouped_call(found: tuple[Any, Any, float], x: torch.Tensor, weights: Any, m_splits: Any) -> torch.Tensor:
    """y of the release's grouped GEMM: W [G, N, K] as B_t [G, K, N] column-major, group end offsets in int32."""
    fn, config, _ = found
    w = weights if isinstance(weights, torch.Tensor) else torch.stack(list(weights))
    ends = torch.tensor(m_splits, device=x.device, dtype=torch.int64).cumsum(0).to(torch.int32)
    return fn(x, w.transpose(-2, -1), ends, out_dtype=config().out_dtype, pad_token_groups_for_grouped_mm=False)


@functools.lru_cache(maxsize=None)
def grouped_refusal(device: str) -> str | None:
    """Run the release's grouped GEMM once on ``device`` (2 experts of 16 rows, K = N = 16): why it fails, or
    ``None``."""
    found = grouped_module()
    if isinstance(found, str):
        return found
    dtype = found[1]().out_dtype or torch.bfloat16
    try:
        x = torch.ones(32, 16, device=device, dtype=dtype, requires_grad=True)
        w = torch.ones(2, 16, 16, device=device, dtype=dtype, requires_grad=True)
        _grouped_call(found, x, w, (16, 16)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - whatever it raises is the reason
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return (
            f"torchao {load().version}'s FP8 rowwise grouped GEMM does not run on {device}: "  # type: ignore[union-attr]
            f"{type(exc).__name__}: {first} (its Triton kernels and torch._scaled_grouped_mm "
            "need CUDA)"
        )
    return None


def grouped_impl() -> GroupedFunctionImpl:
    """``torchao_grouped_fp8[rowwise]``, declared from the release (module docstring); unavailable with the reason
    where the release lacks it, where numcheck's grouped declaration refuses its recipe, or where it cannot run."""
    label = "torchao_grouped_fp8[rowwise]"
    found = grouped_module()
    if isinstance(found, str):
        return _unavailable_grouped(label, found)
    device = placement()[0]
    out_dtype = found[1]().out_dtype
    recipe = Fp8Recipe("rowwise", fp8_format="E4M3", power_of_2_scales=True, amax_epsilon=found[2])
    try:
        support = GroupedFp8Support(
            recipes=(recipe,),
            dtypes=(MX_DTYPES & {out_dtype}) if out_dtype is not None else MX_DTYPES,
            devices=(device,),
            save_original_input=(True,),
            bias=False,
            accum_unit_roundoff={device: HOPPER_ACCUM_UNIT_ROUNDOFF},
            split_alignment=GROUPED_ALIGNMENT,
            feature_alignment=GROUPED_ALIGNMENT,
            requires=functools.partial(grouped_refusal, device),
        )
    except InvalidDeclaration as exc:
        first = str(exc).split(": ", 1)[-1].splitlines()[0]
        run = grouped_refusal(device)
        return _unavailable_grouped(
            label,
            f"torchao {load().version}'s FP8 grouped GEMM ({recipe.name}: x per row, W per column, dy per row "  # type: ignore[union-attr]
            f"and per expert column): numcheck's grouped declaration refuses its declaration ({first})"
            + (f"; and {run}" if run else ""),
        )

    def fn(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None, main_grad=None):
        """y of torchao's FP8 rowwise grouped GEMM; the declared rules are checked before it runs."""
        return _checked_grouped(found, label, support, x, weights, biases, m_splits, recipe, save_original_input)

    desc = (
        f"torchao {load().version} moe_training _to_fp8_rowwise_then_scaled_grouped_mm: {recipe.name}, out_dtype "  # type: ignore[union-attr]
        f"{out_dtype}, fast accumulation, K, N and groups multiples of {GROUPED_ALIGNMENT}, x saved"
    )
    return GroupedFunctionImpl(name=label, fn=fn, support=support, description=desc)


def _unavailable_grouped(label: str, reason: str) -> GroupedFunctionImpl:
    """``label`` registered unavailable: its ``requires`` gives ``reason``, its call raises it."""

    def fn(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None, main_grad=None):
        """Raise: the impl cannot run here."""
        raise RuntimeError(f"{label} unavailable: {reason}")

    support = GroupedFp8Support(recipes=(Fp8Recipe("current"),), devices=("cpu",), requires=_why(reason))
    return GroupedFunctionImpl(name=label, fn=fn, support=support, description=f"{label}: not judged (see 'here')")


def _checked_grouped(found, label, support, x, weights, biases, m_splits, recipe, save_original_input):
    """Refuse what the declaration excludes (ValueError naming it), then run the release's grouped GEMM."""
    if recipe not in support.recipes:
        raise ValueError(f"{label} runs {support.recipes[0].name}; cannot run {recipe.name}")
    if not save_original_input:
        raise ValueError(f"{label}: save_original_input=False is not available: torchao saves x itself")
    if biases is not None:
        raise ValueError(f"{label}: biases are not available (torchao's grouped GEMM has none)")
    experts = weights.shape[0] if isinstance(weights, torch.Tensor) else len(weights)
    if len(m_splits) != experts:  # the release takes offsets, one per expert: the count is this translation's to check
        raise ValueError(f"{label}: m_splits {tuple(m_splits)} names {len(m_splits)} experts, the weights {experts}")
    bad = [m for m in m_splits if not isinstance(m, int) or m < 0 or m % GROUPED_ALIGNMENT]
    if bad or sum(m_splits) != x.shape[0]:
        raise ValueError(f"{label}: m_splits {tuple(m_splits)} must be ints >= 0, multiples of 16, summing to M")
    k, n = x.shape[1], (weights.shape[1] if isinstance(weights, torch.Tensor) else weights[0].shape[0])
    if k % GROUPED_ALIGNMENT or n % GROUPED_ALIGNMENT:
        raise ValueError(f"{label}: the dimension K={k} or N={n} is not a multiple of {GROUPED_ALIGNMENT}")
    return _grouped_call(found, x, weights, m_splits)


def torchao_grouped_impls() -> list[GroupedFunctionImpl]:
    """torchao's FP8 rowwise grouped GEMM (unavailable, with the reason, where it cannot run)."""
    return [grouped_impl()]
