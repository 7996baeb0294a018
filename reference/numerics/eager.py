"""``eager``: the plain PyTorch composition every optimized impl is measured beside.

Logits are computed by ``F.linear`` in the input (or autocast) dtype — the [N, V] tensor the optimized impls
avoid — then softcap, ``F.cross_entropy`` and the z-loss are applied with ordinary differentiable ops.
This is the "same dtype eager" baseline of the relative judgement in :mod:`properties.linear_ce.tolerance`: the judge
runs it as judgement (b)'s yardstick (:func:`numcheck.properties.linear_ce.harness.eager_yardstick`), and the built-in
impl ``eager`` (:mod:`impls.builtin.eager`) is the same function under the same declaration (:data:`DECLARATION`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: The impl's name, and what it declares (the fields of ``impls.protocols.linear_ce.LinearCESupport``): every
#: option, the all-ignored mean as NaN (0/0, as F.cross_entropy gives it), fp32 grad_weight accumulation (one
#: [N, V] × [N, H] matmul), the cross-entropy in the compute dtype.
NAME = "eager"
DECLARATION: dict[str, object] = {
    "returns_z_loss": True,
    "all_ignored": "nan",
    "grad_accumulation": "fp32",
    "ce_dtype": "compute",
}
DESCRIPTION = "F.linear in the input/autocast dtype, then F.cross_entropy (materializes [N, V])"


def eager_linear_ce(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    class_weights: torch.Tensor | None = None,
    softcap: float | None = None,
    z_loss_scale: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager linear + CE; returns ``(loss, z_loss)`` with the z-loss already included in ``loss``."""
    if bias is not None and bias.dtype != weight.dtype:
        bias = bias.to(weight.dtype)  # F.linear wants one dtype; autocast then casts all three alike
    logits = F.linear(x, weight, bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    cw = class_weights.to(logits.dtype) if class_weights is not None else None
    loss = F.cross_entropy(
        logits, target, weight=cw, reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing
    )
    valid = target != ignore_index
    lse = torch.logsumexp(logits.float(), dim=-1)
    z_row = torch.where(valid, z_loss_scale * lse * lse, torch.zeros_like(lse))
    if reduction == "mean":
        z = z_row.sum() / valid.sum()
    elif reduction == "sum":
        z = z_row.sum()
    else:
        z = z_row
    if z_loss_scale:
        loss = loss + z.to(loss.dtype)
    return loss, z
