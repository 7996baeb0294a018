"""Known divergences of Liger-Kernel's fused linear cross-entropy (``liger[...]``,
:mod:`numcheck.impls.adapters.liger`), with the predicates that decide them, collected by
:mod:`numcheck.properties.linear_ce.known` (the machinery: :mod:`numcheck.properties.core.known`)."""

from __future__ import annotations

import math

import torch

from numcheck.properties.core.known import KnownDivergence, Releases
from numcheck.properties.core.tensors import kernel_store
from numcheck.properties.linear_ce.cases import Problem, Tensors


def liger_release() -> str | None:
    """The liger-kernel release the adapter imported (:func:`numcheck.impls.adapters.liger.release`)."""
    from numcheck.impls.adapters import liger

    return liger.release()


def liger_z_loss_buffer(p: Problem) -> tuple[float, float]:
    """``(unbuffered, buffered)`` returned z-loss of ``p`` on the logits Liger computes (the product of the
    problem's own low-precision operands rounded to their dtype, softcap applied): the float64 sum of the rows'
    ``λ·lse²`` (divided by the non-ignored count under ``mean``), and what Liger's input-dtype buffer makes of it
    (each row rounded to the dtype, their sum taken in fp32 and rounded to the dtype, as ``torch.sum`` of an fp16
    or bf16 tensor does). The buffered value equals Liger's output bit for bit on the measured fp16 cases
    (docs/evidence/liger_fp16_z_loss.py)."""
    from numcheck.properties.linear_ce.cases import build

    t = build(p)
    low = p.compute_dtype
    valid = t.target != p.ignore_index
    n = int(valid.sum())
    z = t.x[valid].double() @ t.weight.double().T + (t.bias.double() if t.bias is not None else 0.0)
    z = z.to(low).double()
    if p.softcap is not None:
        z = p.softcap * torch.tanh(z / p.softcap)
    rows = p.z_loss_scale * z.logsumexp(dim=-1) ** 2 / (max(n, 1) if p.reduction == "mean" else 1)
    return float(rows.sum()), float(kernel_store(rows.float(), low).float().sum().to(low))


#: Unit roundoff of the dtypes Liger's z-loss buffer can have.
_BUFFER_U = {"float16": 2.0**-11, "bfloat16": 2.0**-8}


def liger_z_loss_buffer_diverges(p: Problem) -> bool:
    """Whether Liger's input-dtype z-loss buffer moves the returned z-loss of ``p`` beyond what the returned
    value's own rounding explains: the buffered value (:func:`liger_z_loss_buffer`) not finite where the
    unbuffered one is (an fp16 sum past 65504), or off it by more than its limit.

    fp16 (limit (2u + n·2⁻²⁴)·Σ, u = 2⁻¹¹): with every row normal each is rounded to within u of itself (rows are
    positive, so together within u·Σ), the fp32 sum adds at most n·2⁻²⁴·Σ and the fp16 result one more u; beyond
    that needs rows below fp16's smallest normal 2⁻¹⁴, kept to an absolute 2⁻²⁵ (the ``mean`` of many rows).
    bf16 (limit (u + n·2⁻²⁴)·Σ, u = 2⁻⁸): bf16 has fp32's range, so no row is subnormal, but the tolerance
    model allows the returned z-loss one rounding in its dtype, not a rounding of every row before the sum: a
    buffer error beyond one rounding of the result is the buffer's. Under Triton's interpreter the bf16 rows are
    truncated (:func:`~numcheck.properties.core.tensors.kernel_store`), so their errors add up in one direction (seen at 1.12–1.14× the bound,
    N = 37 and 64).
    Low-precision parameters only (under AMP the input, and so the buffer, stay fp32); ``none`` returns the
    rows themselves, each rounded once."""
    u = _BUFFER_U.get(p.dtype)
    if u is None or p.autocast is not None or p.z_loss_scale == 0 or p.reduction == "none":
        return False
    if p.ignored >= 1.0:
        return False
    exact, buffered = liger_z_loss_buffer(p)
    if not math.isfinite(buffered):
        return math.isfinite(exact)
    slack = 2 * u if p.dtype == "float16" else u
    return abs(buffered - exact) > (slack + p.N * 2.0**-24) * abs(exact)


def liger_unit_upstream_overflow(p: Problem, t: Tensors | None = None) -> bool:
    """Whether a gradient of ``p`` for a unit upstream gradient overflows fp16 where Liger keeps it: Liger's
    forward computes grad_x, grad_W and grad_b for an upstream of 1 and stores them in the parameters' dtype
    (``grad_weight.to(weight.dtype)`` after its fp32 accumulator, with ``accum_dtype=torch.float32`` too); its
    backward then multiplies them by the upstream u (``element_mul_kernel``). For fp16 parameters an entry whose
    exact unit-upstream value |g/u| passes fp16's overflow threshold is ±inf before the multiplication, though the
    exact u·(g/u) may fit: on the H200, ``Problem(N=2049, H=8, V=2, dtype='float16', reduction='sum',
    class_weights=True, upstream='scalar', regime='post_norm', seed=336811)`` (u = 0.648) gave grad_W −inf where
    the oracle's value is −48199 (its unit-upstream value −74335). Scalar upstream of ``mean``/``sum`` only (``none``
    has a per-row upstream Liger does not pre-multiply in the same way); fp16 parameters only (bf16 has fp32's
    range; under AMP the parameters, and so the stored gradients, are fp32)."""
    from numcheck.properties.core.compare import overflow_threshold
    from numcheck.properties.linear_ce.cases import build
    from numcheck.properties.linear_ce.harness import run_oracle

    if p.dtype != "float16" or p.autocast is not None or p.upstream == "one" or p.reduction == "none" or p.N == 0:
        return False
    t = t if t is not None else build(p)
    u = float(t.upstream.double().abs().max())
    if not (u > 0 and math.isfinite(u)):
        return False
    ref = run_oracle(p, t)
    limit = overflow_threshold(torch.float16)
    grads = [g for g in (ref.grad_x, ref.grad_weight, ref.grad_bias) if g is not None]
    return any(bool(((g.abs() / u >= limit) & (g.abs() < limit)).any()) for g in grads)  # inf where it fits


#: The example of :func:`liger_unit_upstream_overflow` (no class weights: Liger's weighted path does not run under
#: the Triton interpreter, and the strict check runs on the CPU too).
EXAMPLE_UNIT_UPSTREAM = Problem(
    N=2049, H=8, V=2, dtype="float16", reduction="sum", upstream="scalar", regime="post_norm", seed=790
)


KNOWN: list[KnownDivergence] = [
    KnownDivergence(
        impls="liger[[]*",
        properties=("frozen_x",),
        devices=("cpu", "cuda"),
        applies=lambda p: True,
        library="liger-kernel",
        summary="with x frozen and the weight trainable, weight.grad stays None (no gradient at all)",
        reason=(
            "Liger-Kernel's fused linear cross-entropy (0.6.3 on, since its #906 'Filter out redundant "
            "ops/allocations in no_grad mode') computes every gradient only when the input requires grad "
            "(ops/fused_linear_cross_entropy.py: input_requires_grad gates the grad_weight / grad_bias "
            "buffers): with x frozen and the weight trainable (linear probing on a frozen backbone) the loss "
            "has a graph but weight.grad stays None, silently. Measured on 0.7.0, 0.8.2 and 0.8.5; 0.2.1 and "
            "0.5.8 give the right gradients."
        ),
        example=Problem(N=1, H=1, V=1),
        releases=Releases("liger-kernel", ">=0.6.3", liger_release),
    ),
    KnownDivergence(
        impls="liger[[]*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=liger_z_loss_buffer_diverges,
        library="liger-kernel",
        summary="the returned z-loss is kept in the input dtype: fp16/bf16 rows rounded before the sum, inf under 'sum'",
        reason=(
            "Liger-Kernel (0.5.3 on, since return_z_loss was added) keeps the returned z-loss in the input "
            "dtype: each row's lse_square_scale*lse^2 (divided by the non-ignored count under 'mean') is "
            "stored in an fp16 buffer (ops/fused_linear_cross_entropy.py: z_loss_1d = torch.zeros(BT, "
            "dtype=_input.dtype)) and torch.sum of that buffer gives an fp16 result, while the loss itself "
            "is kept in fp32. Under 'mean' over many rows the per-row values are fp16 subnormals: the example "
            "(N=256, z_loss_scale=1e-4) returns 4.7565e-5 for 4.9871e-5 (4.6% off), N=2049 7.9155e-4 for "
            "7.9632e-4 (3.7x the bound), and the per-row values rounded to fp16 and summed give Liger's "
            "numbers bit for bit; under 'sum' the z-loss overflows to inf (N=2049, z_loss_scale=0.5, "
            "regime='large': exact 3.19e6, the fp32 loss finite). Measured on 0.5.8, 0.7.0, 0.8.2 and 0.8.5 "
            "(docs/evidence/liger_fp16_z_loss.py). bf16 parameters get a bf16 buffer: each row rounded at "
            "2^-8 before the sum, beyond the one rounding of the result the model allows (1.03-1.14x the "
            "bound at N=37-50 in the covering rows)."
        ),
        example=Problem(N=256, H=1, V=2, dtype="float16", z_loss_scale=1e-4, seed=0),
        by_data=True,
        releases=Releases("liger-kernel", ">=0.5.3", liger_release),
    ),
    KnownDivergence(
        impls="liger[[]accum=fp32[]]",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=liger_unit_upstream_overflow,
        library="liger-kernel",
        summary="unit-upstream gradients are stored in fp16 before the upstream multiply: inf where the gradient fits",
        reason=(
            "Liger-Kernel computes the gradients for an upstream gradient of 1 in its forward and stores them in "
            "the parameters' dtype, multiplying by the real upstream u only in backward: with accum_dtype=fp32 "
            "and fp16 parameters the fp32 accumulator's unit-upstream grad_W is cast to fp16 first, so an entry "
            "past 65504 is ±inf though u times it fits (seen on the H200, CUDA seed 0: grad_W −inf for an exact "
            "−48199 with u = 0.648; the example, seed 790, covered under torch 2.6 and 2.13, whose upstream "
            "draws differ, on the CPU too: −inf for −20447, u = 0.275; "
            ":func:`liger_unit_upstream_overflow`). With accum_dtype=None the fp16 accumulator is declared, and "
            "its overflowing running sum is the model's legitimate overflow."
        ),
        example=EXAMPLE_UNIT_UPSTREAM,
        by_data=True,
        applies_to_tensors=liger_unit_upstream_overflow,
        releases=Releases("liger-kernel", ">=0.8.5", liger_release),
    ),
]

#: The library numcheck's ``liger`` adapter calls (:data:`numcheck.properties.libraries.ADAPTER_LIBRARIES`).
LIBRARIES = (("liger[[]*", "liger-kernel", liger_release),)
