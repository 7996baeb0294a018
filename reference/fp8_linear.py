"""Float64 oracle of an FP8-quantized linear layer: forward and backward against two references.

With ``x`` ``[M, K]``, ``W`` ``[N, K]``, optional bias ``b`` ``[N]`` and upstream gradient ``dy`` ``[M, N]``,
and ``Q_role,usage`` the recipe's quantizers (:mod:`reference.fp8_recipes`, :mod:`reference.fp8_scaling`):

* **dequantized reference** — the exact products of the quantized operands, i.e. what an FP8 GEMM would
  give with exact accumulation; its difference from an implementation is accumulation and output
  rounding alone::

      y     = deq(Q_x,row(x)) · deq(Q_w,row(W))ᵀ + b
      dgrad = deq(Q_dy,row(dy)) · deq(Q_w,col(W))
      wgrad = deq(Q_dy,col(dy))ᵀ · deq(Q_x,col(x))
      bgrad = Σ_i dy_i            (from the unquantized dy, as TE's fused cast + dbias does)

  A GEMM the recipe leaves in high precision (``Fp8Recipe.high_precision_gemms``: the wgrad of ``rowwise_gw_hp``)
  reads the original operands here too (``wgrad = dyᵀ · x``): its only error is the accumulation and the output
  rounding of the plain GEMM in the input dtype.

* **original reference** — the same with the original operands (``x·Wᵀ + b``, ``dy·W``, ``dyᵀ·x``); its
  difference from an implementation adds the quantization error (the total error an FP8 user sees).

Everything is computed in float64 on the CPU; inputs are taken as binary32 values (bf16 and fp16 are exact
in it). Delayed scaling quantizes with the given stored scales and records each role's amax.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from numcheck.reference.fp8_formats import F64, round_to_fp32
from numcheck.reference.fp8_recipes import GEMMS, Fp8Recipe
from numcheck.reference.fp8_scaling import Quantized, quantize_operand, tensor_amax

#: The outputs of a quantized linear, in the order reports list them.
FP8_OUTPUTS: tuple[str, ...] = ("y", "dgrad", "wgrad", "bgrad")
#: The GEMM behind each matmul output.
OUTPUT_GEMM: dict[str, str] = {"y": "fprop", "dgrad": "dgrad", "wgrad": "wgrad"}


@dataclass(frozen=True)
class Fp8LinearReference:
    """The oracle's result for one case (all tensors float64 on the CPU).

    Attributes:
        recipe: the recipe.
        operands: ``{(role, usage): Quantized}`` for the quantizations the quantized GEMMs use (six; four when the
            wgrad runs in high precision).
        dq: ``{output: tensor}`` — the dequantized reference.
        true: ``{output: tensor}`` — the original reference.
        abs_products: ``{output: Σ_k |a_k||b_k|}`` of the dequantized operands (the magnitude the
            accumulation error scales with); for ``bgrad`` it is ``Σ_i |dy_i|``.
        reduction: ``{output: length of the sum}`` (K for y, N for dgrad, M for wgrad and bgrad).
        amax: ``{role: max |t|}`` of x, W and dy (NaN ignored) — what delayed scaling records.
    """

    recipe: Fp8Recipe
    operands: dict[tuple[str, str], Quantized]
    dq: dict[str, torch.Tensor]
    true: dict[str, torch.Tensor]
    abs_products: dict[str, torch.Tensor]
    reduction: dict[str, int]
    amax: dict[str, float] = field(default_factory=dict)

    def operand(self, role: str, usage: str) -> Quantized:
        return self.operands[(role, usage)]


def _f64(t: torch.Tensor) -> torch.Tensor:
    return round_to_fp32(t.detach().to("cpu", F64))


def _check_operands(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    bias: torch.Tensor | None,
    recipe: Fp8Recipe,
    delayed_scales: dict[str, float] | None,
) -> None:
    """Raises ``ValueError`` unless the operands of :func:`quantized_linear` have matching 2-D shapes (bias [N])
    and a delayed recipe comes with its three stored scales."""
    if x.dim() != 2 or weight.dim() != 2 or dy.dim() != 2:
        raise ValueError(f"x, weight, dy must be 2-D; got {tuple(x.shape)}, {tuple(weight.shape)}, {tuple(dy.shape)}")
    M, K = x.shape
    N, K2 = weight.shape
    if K2 != K:
        raise ValueError(f"weight has K={K2}, x has K={K}")
    if tuple(dy.shape) != (M, N):
        raise ValueError(f"dy must be [M, N] = [{M}, {N}], got {tuple(dy.shape)}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias must be [N] = [{N}], got {tuple(bias.shape)}")
    if recipe.kind == "delayed":
        if delayed_scales is None or set(delayed_scales) != {"x", "w", "dy"}:
            raise ValueError(f"delayed scaling needs delayed_scales for x, w and dy, got {delayed_scales!r}")


def _quantized_operands(
    src: dict[str, torch.Tensor], recipe: Fp8Recipe, delayed_scales: dict[str, float] | None
) -> dict[tuple[str, str], Quantized]:
    """Each (role, usage) the three GEMMs read, quantized once (a delayed recipe with its stored scale)."""
    operands: dict[tuple[str, str], Quantized] = {}
    for gemm, (a, b) in GEMMS.items():
        if not recipe.quantizes(gemm):
            continue
        for role, usage in (a, b):
            if (role, usage) not in operands:
                stored = delayed_scales[role] if recipe.kind == "delayed" else None  # type: ignore[index]
                operands[(role, usage)] = quantize_operand(src[role], recipe, role, usage, stored_scale=stored)
    return operands


def quantized_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    bias: torch.Tensor | None,
    recipe: Fp8Recipe,
    *,
    delayed_scales: dict[str, float] | None = None,
) -> Fp8LinearReference:
    """Forward and backward of the quantized linear in float64 (see the module docstring).

    ``delayed_scales`` (``{"x": s, "w": s, "dy": s}``) is required for delayed scaling and ignored otherwise.
    """
    _check_operands(x, weight, dy, bias, recipe, delayed_scales)
    M, K = x.shape
    N = weight.shape[0]
    src = {"x": x, "w": weight, "dy": dy}
    operands = _quantized_operands(src, recipe, delayed_scales)
    x64, w64, dy64 = _f64(x), _f64(weight), _f64(dy)
    deq = {k: q.dequantized for k, q in operands.items()}
    for gemm in recipe.high_precision_gemms:  # a GEMM in high precision reads the original operands
        for role, usage in GEMMS[gemm]:
            deq[(role, usage)] = {"x": x64, "w": w64, "dy": dy64}[role]
    ab = {k: v.abs() for k, v in deq.items()}
    b64 = _f64(bias) if bias is not None else None

    dq = {
        "y": deq[("x", "rowwise")] @ deq[("w", "rowwise")].t(),
        "dgrad": deq[("dy", "rowwise")] @ deq[("w", "columnwise")],
        "wgrad": deq[("dy", "columnwise")].t() @ deq[("x", "columnwise")],
    }
    true = {"y": x64 @ w64.t(), "dgrad": dy64 @ w64, "wgrad": dy64.t() @ x64}
    absp = {
        "y": ab[("x", "rowwise")] @ ab[("w", "rowwise")].t(),
        "dgrad": ab[("dy", "rowwise")] @ ab[("w", "columnwise")],
        "wgrad": ab[("dy", "columnwise")].t() @ ab[("x", "columnwise")],
    }
    red = {"y": K, "dgrad": N, "wgrad": M}
    if b64 is not None:
        dq["y"] = dq["y"] + b64
        true["y"] = true["y"] + b64
        absp["y"] = absp["y"] + b64.abs()
        bg = dy64.sum(dim=0)
        dq["bgrad"] = bg
        true["bgrad"] = bg
        absp["bgrad"] = dy64.abs().sum(dim=0)
        red["bgrad"] = M
    amax = {r: tensor_amax(src[r]) for r in ("x", "w", "dy")}
    return Fp8LinearReference(recipe, operands, dq, true, absp, red, amax)
