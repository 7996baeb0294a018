"""The options of a linear+CE call, validated once and shared by the oracle, the impls and the properties."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class CEOptions:
    """Cross-entropy options, with PyTorch's defaults.

    Attributes:
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: rows whose target equals it are ignored.
        label_smoothing: ε in [0, 1].
        class_weights: ``[V]`` float tensor (``F.cross_entropy``'s ``weight``) or ``None``.
        softcap: s > 0 or ``None``; logits become ``s·tanh(z/s)``.
        z_loss_scale: λ ≥ 0; ``λ·lse²`` is added to each non-ignored row (Liger's ``lse_square_scale``).
    """

    reduction: str = "mean"
    ignore_index: int = -100
    label_smoothing: float = 0.0
    class_weights: torch.Tensor | None = field(default=None, compare=False)
    softcap: float | None = None
    z_loss_scale: float = 0.0

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        if isinstance(self.ignore_index, bool) or not isinstance(self.ignore_index, int):
            raise ValueError(f"ignore_index must be an int, got {self.ignore_index!r}")
        ls = self.label_smoothing
        if not isinstance(ls, (int, float)) or not (0.0 <= float(ls) <= 1.0):
            raise ValueError(f"label_smoothing must be a float in [0, 1], got {ls!r}")
        if self.softcap is not None and (
            not isinstance(self.softcap, (int, float)) or not self.softcap > 0 or math.isinf(self.softcap)
        ):
            raise ValueError(f"softcap must be a finite float > 0 or None, got {self.softcap!r}")
        zl = self.z_loss_scale
        if not isinstance(zl, (int, float)) or not (zl >= 0.0) or math.isinf(zl):
            raise ValueError(f"z_loss_scale must be a finite float >= 0, got {zl!r}")
        cw = self.class_weights
        if cw is not None:
            if not isinstance(cw, torch.Tensor):
                raise ValueError(f"class_weights must be a tensor or None, got {type(cw).__name__}")
            if cw.dim() != 1:
                raise ValueError(f"class_weights must be 1-D [V], got shape {tuple(cw.shape)}")
            if not cw.is_floating_point():
                raise ValueError(f"class_weights must be a floating tensor, got dtype {cw.dtype}")

    @property
    def features(self) -> frozenset[str]:
        """The optional features in effect, named as :data:`impls.protocols.linear_ce.LINEAR_CE_OPTIONS` names them
        (``bias`` and ``ignore_index`` depend on the tensors and are added by the caller)."""
        out = set()
        if self.label_smoothing != 0.0:
            out.add("label_smoothing")
        if self.class_weights is not None:
            out.add("class_weights")
        if self.softcap is not None:
            out.add("softcap")
        if self.z_loss_scale != 0.0:
            out.add("z_loss")
        return frozenset(out)

    def call_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for an impl call: reduction and ignore_index always, others only when set."""
        kw: dict[str, Any] = {"reduction": self.reduction, "ignore_index": self.ignore_index}
        if self.label_smoothing != 0.0:
            kw["label_smoothing"] = float(self.label_smoothing)
        if self.class_weights is not None:
            kw["class_weights"] = self.class_weights
        if self.softcap is not None:
            kw["softcap"] = float(self.softcap)
        if self.z_loss_scale != 0.0:
            kw["z_loss_scale"] = float(self.z_loss_scale)
        return kw

    def replace(self, **changes: Any) -> "CEOptions":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def describe(self) -> str:
        """Short text for messages: only what differs from the defaults, plus the reduction."""
        parts = [f"reduction={self.reduction}"]
        if self.ignore_index != -100:
            parts.append(f"ignore_index={self.ignore_index}")
        if self.label_smoothing:
            parts.append(f"label_smoothing={self.label_smoothing}")
        if self.class_weights is not None:
            parts.append("class_weights=[V]")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap}")
        if self.z_loss_scale:
            parts.append(f"z_loss_scale={self.z_loss_scale}")
        return ", ".join(parts)


def options_from_kwargs(**kwargs: Any) -> CEOptions:
    """Build :class:`CEOptions` from the impl-call keywords, naming any unknown keyword."""
    known = {"reduction", "ignore_index", "label_smoothing", "class_weights", "softcap", "z_loss_scale"}
    unknown = set(kwargs) - known
    if unknown:
        raise ValueError(f"unknown linear+CE option(s) {sorted(unknown)}; known: {sorted(known)}")
    return CEOptions(**kwargs)
