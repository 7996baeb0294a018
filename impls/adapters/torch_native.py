"""``torch_native[...]``: PyTorch's own ``F.linear_cross_entropy`` (torch >= 2.13), as shipped.

``torch_native[reference]`` calls it with ``options=None`` (``F.linear`` then ``F.cross_entropy``).
``torch_native[chunked,acc=<policy>]`` turns on its chunked path with
``torch.nn.LinearCrossEntropyOptions(acc_policy=<policy>)``, once per ``acc_policy``. For the explicit
policies ``acc_dtype=torch.float32`` is passed, since a policy only changes anything when ``acc_dtype``
differs from a bf16/fp16 input dtype (with ``acc_dtype=None`` an explicit policy resolves to the input
dtype); ``auto`` keeps ``acc_dtype=None``, which resolves to fp32 on CPU and sm80+ CUDA.

Availability is probed (:func:`impls.measure.capabilities.linear_cross_entropy`, and the options class for the
chunked path), never read from a version string.

Declarations, from the source of ``torch/nn/modules/linear_cross_entropy.py`` and checked against the oracle
by ``tests/test_torch_native.py``:

- No softcap and no z-loss anywhere (PyTorch has neither).
- The chunked path supports ``reduction`` mean/sum/none, class weights, bias and ignore_index. With
  ``label_smoothing != 0`` PyTorch documents that ``options`` are ignored and the call "falls through to the
  reference path with a warning": label smoothing is therefore not declared for the chunked variants, and
  the adapter turns that fallback warning into an error (:class:`ChunkedFallback`), so a configuration
  that silently measures the reference path instead of the chunked one can never pass unnoticed.
- The chunked op is a ``torch.library.custom_op`` without an autocast rule: under ``torch.autocast`` it
  computes in the parameters' dtype (fp32), not the autocast dtype, so AMP is not declared for it (its
  results would be measured against the oracle on autocast-rounded operands, which it never sees).
- grad_weight: the chunked path keeps its final accumulator in the input dtype and adds each chunk's
  (acc_dtype) product into it, so the running sum is rounded to the parameter dtype after every chunk:
  ``"param_dtype"``. Chunk rows come from ``chunking_method='auto'`` (shape, device and dtype dependent), so
  ``chunk_rows`` stays undeclared (the tolerance model then assumes the worst case).
- Logits and softmax: the reference path runs ``F.cross_entropy`` on logits in the input dtype (in bf16/fp16
  arithmetic outside autocast: ``ce_dtype="compute"``). In the chunked path ``accurate`` keeps logits and
  softmax in acc_dtype (fp32: ``logits_dtype="float32"``); ``balanced``/``compact``/``auto`` keep fp16 logits
  and exponentiate them in place for fp16 inputs (``"compute"``). Every chunked policy accumulates the scalar
  loss across chunks in the input dtype for bf16 inputs (``output_dtype = dtype`` unless fp16), even with
  ``acc_dtype=float32``: two bf16 roundings per chunk, so all declare ``ce_dtype="compute"`` (without it the
  suite flags ``accurate``'s bf16 loss at ~1.4–1.8× the fp32-softmax bound).
- All rows ignored under ``mean``: the reference path returns NaN with zero gradients (``"nan"``). The
  chunked path returns NaN too, but divides its per-row weights by a NaN normalizer, so its gradients are
  NaN as well — a divergence from the reference path that PyTorch does not document. It is declared
  ``"nan"`` (what PyTorch promises: the reference path's behaviour), so the suite reports it.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F

from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.linear_ce import FunctionImpl, make_support

ACC_POLICIES: tuple[str, ...] = ("accurate", "balanced", "compact", "auto")
_FALLBACK_MARKER = "``options`` ignored"


class ChunkedFallback(RuntimeError):
    """F.linear_cross_entropy ignored the chunked ``options`` and ran its reference path."""


def available() -> str | None:
    """``None`` when ``F.linear_cross_entropy`` runs on CPU here, else the reason."""
    if not hasattr(torch.nn.functional, "linear_cross_entropy"):
        return f"torch.nn.functional.linear_cross_entropy is absent in torch {torch.__version__} (needs torch >= 2.13)"
    if not capabilities.linear_cross_entropy("cpu"):
        return "torch.nn.functional.linear_cross_entropy exists but fails its probe on cpu"
    return None


def chunked_available() -> str | None:
    """``None`` when the chunked path (``torch.nn.LinearCrossEntropyOptions``) exists, else the reason."""
    base = available()
    if base:
        return base
    if not hasattr(torch.nn, "LinearCrossEntropyOptions"):
        return "torch.nn.LinearCrossEntropyOptions is absent: no chunked linear_cross_entropy in this torch"
    return None


def _class_weights_for(x: torch.Tensor, cw: torch.Tensor | None) -> torch.Tensor | None:
    # Outside autocast F.cross_entropy needs ``weight`` in the logits' dtype (x's): cast, as a user must.
    # Under autocast cross_entropy runs in fp32 and casts its arguments itself: pass the weights unrounded.
    if cw is None or cw.dtype == x.dtype or torch.is_autocast_enabled(x.device.type):
        return cw
    return cw.to(x.dtype)


def _no_unsupported(softcap: float | None, z_loss_scale: float) -> None:
    if softcap is not None:
        raise ValueError(f"torch_native has no softcap; got softcap={softcap!r}")
    if z_loss_scale:
        raise ValueError(f"torch_native has no z-loss; got z_loss_scale={z_loss_scale!r}")


def reference(
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
) -> torch.Tensor:
    """``F.linear_cross_entropy(..., options=None)``."""
    _no_unsupported(softcap, z_loss_scale)
    cw = _class_weights_for(x, class_weights)
    if bias is not None and bias.dtype != weight.dtype:
        bias = bias.to(weight.dtype)  # F.linear wants one dtype (as a user must align it); autocast then casts all
    return F.linear_cross_entropy(
        x,
        weight,
        target,
        linear_bias=bias,
        weight=cw,
        reduction=reduction,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        options=None,
    )


def chunked(policy: str) -> Callable[..., torch.Tensor]:
    """The chunked call for one ``acc_policy``; raises :class:`ChunkedFallback` if PyTorch falls back."""
    if policy not in ACC_POLICIES:
        raise ValueError(f"acc_policy must be one of {ACC_POLICIES}, got {policy!r}")

    def call(
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
    ) -> torch.Tensor:
        _no_unsupported(softcap, z_loss_scale)
        acc = None if policy == "auto" else torch.float32
        opts = torch.nn.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = F.linear_cross_entropy(
                x,
                weight,
                target,
                linear_bias=bias,
                weight=class_weights,
                reduction=reduction,
                ignore_index=ignore_index,
                label_smoothing=label_smoothing,
                options=opts,
            )
        for w in caught:
            if _FALLBACK_MARKER in str(w.message):
                raise ChunkedFallback(
                    f"torch_native[chunked,acc={policy}]: PyTorch ran its reference path instead "
                    f"of the chunked one: {w.message}"
                )
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return loss

    call.__name__ = f"chunked_{policy}"
    call.__doc__ = f"``F.linear_cross_entropy`` with ``LinearCrossEntropyOptions(acc_policy={policy!r})``."
    return call


def torch_native_impls() -> list[FunctionImpl]:
    """``torch_native[reference]`` and one ``torch_native[chunked,acc=<policy>]`` per acc_policy."""
    common: dict[str, Any] = dict(reductions=("mean", "sum", "none"), all_ignored="nan")
    out = [
        FunctionImpl(
            name="torch_native[reference]",
            fn=reference,
            support=make_support(
                options=("bias", "ignore_index", "label_smoothing", "class_weights"),
                autocast=("bfloat16", "float16"),
                grad_accumulation="fp32",
                logits_dtype="compute",
                ce_dtype="compute",
                requires=available,
                **common,
            ),
            description="torch F.linear_cross_entropy(options=None): F.linear then F.cross_entropy "
            "(no softcap, no z-loss in PyTorch)",
        )
    ]
    for policy in ACC_POLICIES:
        acc = "acc_dtype=None" if policy == "auto" else "acc_dtype=float32"
        out.append(
            FunctionImpl(
                name=f"torch_native[chunked,acc={policy}]",
                fn=chunked(policy),
                support=make_support(
                    options=("bias", "ignore_index", "class_weights"),
                    autocast=(),
                    grad_accumulation="param_dtype",
                    logits_dtype="float32" if policy == "accurate" else "compute",
                    ce_dtype="compute",
                    requires=chunked_available,
                    **common,
                ),
                description=f"torch F.linear_cross_entropy chunked path, acc_policy={policy}, {acc}; not declared: "
                "label_smoothing (PyTorch falls back to the reference path with a warning; the adapter "
                "raises ChunkedFallback), softcap/z-loss (absent), autocast (the chunked custom op "
                "has no autocast rule and computes in the parameter dtype)",
            )
        )
    return out
