"""Impls declared as a user declares them (``numcheck.linear_ce_impl`` / ``numcheck.fp8_linear_impl`` on a
module-level function, as the README shows), each exercising one way numcheck must report a single cause once and
clearly:

- :data:`always_raises`: a kernel launcher that raises on every call (no property may pass, none may count a case,
  each fails once with numcheck's message);
- :data:`counted`: a correct fp32 impl that counts its calls (how many cases a property judged);
- :data:`loss_off`: correct but its loss 1% too large (a failure with an error/bound of its own);
- :data:`equal_shortcut`: a Liger-style fused impl whose backward skips the upstream scaling when
  ``torch.equal(grad_output, 1)``: right on every device, but it reads a value, so it cannot run on ``meta``;
- :data:`fp8_nan_flushed`: an FP8 linear whose quantizer writes code 0 where the input is NaN (the oracle keeps
  NaN): caught only on a drawn tensor holding a NaN, so its failure's repro line must rebuild that tensor.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

import numcheck

#: What :data:`always_raises` raises.
RAISED = "kernel launch failed: no device for this kernel"


@numcheck.linear_ce_impl(
    name="user_always_raises",
    dtypes=("float32", "bfloat16"),
    options=("bias", "ignore_index"),
    autocast=(),
    logits_dtype="float32",
    all_ignored="nan",
)
def always_raises(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """A launcher whose kernel never runs: it raises on every call."""
    raise RuntimeError(RAISED)


#: Every call of :data:`counted` (its reduction), in order.
CALLS: list[str] = []


@numcheck.linear_ce_impl(
    name="user_counted",
    dtypes=("float32",),
    options=("bias", "ignore_index"),
    autocast=(),
    logits_dtype="float32",
    all_ignored="nan",
)
def counted(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """F.linear and F.cross_entropy in fp32, each call appended to :data:`CALLS`."""
    CALLS.append(reduction)
    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)


@numcheck.linear_ce_impl(
    name="user_loss_off",
    dtypes=("float32",),
    options=("bias", "ignore_index"),
    autocast=(),
    logits_dtype="float32",
    all_ignored="nan",
)
def loss_off(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """Correct, except that the loss is 1% too large."""
    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index) * 1.01


class _FusedCE(torch.autograd.Function):
    """Forward computes the loss and both gradients (as Liger's fused kernels do); backward scales them by the
    upstream gradient, skipping the scaling when it is exactly 1."""

    @staticmethod
    def forward(ctx, x, weight, target, reduction, ignore_index):  # noqa: D102
        with torch.enable_grad():
            xd, wd = x.detach().requires_grad_(True), weight.detach().requires_grad_(True)
            loss = F.cross_entropy(
                F.linear(xd.float(), wd.float()), target, reduction=reduction, ignore_index=ignore_index
            )
            gx, gw = torch.autograd.grad(loss, (xd, wd))
        ctx.save_for_backward(gx, gw)
        return loss.detach()

    @staticmethod
    def backward(ctx, grad_output):  # noqa: D102
        gx, gw = ctx.saved_tensors
        if not torch.equal(grad_output, torch.ones((), dtype=grad_output.dtype, device=grad_output.device)):
            gx, gw = gx * grad_output, gw * grad_output
        return gx, gw, None, None, None


@numcheck.linear_ce_impl(
    name="user_equal_shortcut",
    dtypes=("float32",),
    options=("ignore_index",),
    autocast=(),
    reductions=("mean", "sum"),
    logits_dtype="float32",
    all_ignored="nan",
)
def equal_shortcut(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """Fused forward and backward, the backward's scaling skipped for an upstream gradient of exactly 1."""
    return _FusedCE.apply(x, weight, target, reduction, ignore_index)


def _builtin_fp8():
    """numcheck's reference-grade current-scaling FP8 linear, which this impl builds on."""
    from numcheck.impls.registry import builtin

    return builtin("fp8_linear[current]")


def _quantize_nan_flushed(t, *, recipe, role, usage, scaling_state=None):
    """The built-in quantizer, except that a NaN input gets code 0 (+0) instead of NaN."""
    q = _builtin_fp8().quantize(t, recipe=recipe, role=role, usage=usage, scaling_state=scaling_state)
    codes = q.data.view(torch.uint8).clone()
    codes[torch.isnan(t)] = 0
    return dataclasses.replace(q, data=codes.view(q.data.dtype))


@numcheck.fp8_linear_impl(
    name="user_fp8_nan_flushed", recipes=("current",), dtypes=("float32",), quantize=_quantize_nan_flushed
)
def fp8_nan_flushed(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
    """The built-in current-scaling FP8 linear (its quantizer is the defect under test)."""
    return _builtin_fp8()(
        x, weight, bias, recipe=recipe, save_original_input=save_original_input, scaling_state=scaling_state
    )


@numcheck.fp8_linear_impl(
    name="user_fp8_cuda_only",
    recipes=("current",),
    dtypes=("bfloat16",),
    devices=("cuda",),
    accum_unit_roundoff={"cuda": 2.0**-13},
)
def fp8_cuda_only(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
    """Declared for CUDA only, as an adapter of a real FP8 path declares itself (torchao's on a GPU); its per-device
    fields have no CPU entry, so nothing may call it with CPU tensors."""
    if x.device.type != "cuda":
        raise AssertionError(f"user_fp8_cuda_only called on {x.device}: it declares only cuda")
    return _builtin_fp8()(
        x, weight, bias, recipe=recipe, save_original_input=save_original_input, scaling_state=scaling_state
    )


@numcheck.grouped_fp8_linear_impl(
    name="user_grouped_saves_x", recipes=("current",), dtypes=("bfloat16",), save_original_input=(True,), bias=False
)
def grouped_saves_x(
    x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None, main_grad=None
):
    """numcheck's grouped loop, declared as torchao's grouped GEMM declares itself: x is always saved (only
    ``save_original_input=True``), no bias; a call in the other mode raises, as torchao's adapter does."""
    from numcheck.impls.registry import builtin

    if not save_original_input:
        raise ValueError("user_grouped_saves_x: save_original_input=False is not available: it saves x itself")
    return builtin("grouped_fp8_linear[loop]")(
        x,
        weights,
        biases,
        m_splits=m_splits,
        recipe=recipe,
        save_original_input=True,
        scaling_state=scaling_state,
        main_grad=main_grad,
    )
