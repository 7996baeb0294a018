"""The trivial wrong answers every FP8 and grouped property that judges against the oracle must fail: no tolerance
may be wide enough to pass them (tests/self/properties/test_discrimination.py).

Each is the built-in :class:`impls.builtin.fp8_linear.Fp8Linear` (or the grouped loop over it,
:class:`impls.builtin.grouped_fp8_linear.GroupedLoopLinear`) with one thing wrong, named by :data:`WRONG`:

* ``zeros`` — every output (y, and so every gradient) zero;
* ``dropped_last_scale_block`` — the last scale block along K left at scale 1 (a scale tensor one block short);
* ``permuted_block_scales`` — the block scales along K rotated by one block;
* ``e5m2_read_as_e4m3`` — HYBRID's E5M2 gradient codes decoded as E4M3 (TE #3342's grouped backward);
* ``missing_micro_batch`` — the second call's weight gradient never reaches the weight (Primus PR #1046).
"""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls.builtin.fp8_linear import Fp8Linear
from numcheck.impls.builtin.grouped_fp8_linear import GroupedLoopLinear
from numcheck.reference.fp8_formats import E4M3
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.numerics.fp8_linear import QTensor

WRONG: tuple[str, ...] = (
    "zeros",
    "dropped_last_scale_block",
    "permuted_block_scales",
    "e5m2_read_as_e4m3",
    "missing_micro_batch",
)


def _blocks_wrong(q: QTensor, wrong: str) -> QTensor:
    """``q`` with its K-blocks' scales (the last dim of ``scale_inv`` and of the E8M0 ``code``) made ``wrong``."""
    if q.per_tensor or q.scale_inv.shape[-1] < 2:
        return q
    si, code = q.scale_inv.clone(), q.code.clone() if q.code is not None else None
    if wrong == "dropped_last_scale_block":
        si[:, -1] = 1.0
        if code is not None:
            code[:, -1] = 127  # E8M0 2^0
    else:
        si = si.roll(1, dims=1)
        code = code.roll(1, dims=1) if code is not None else None
    return QTensor(q.data, si.contiguous(), code, q.block, q.fmt)


class WrongLinear(Fp8Linear):
    """:class:`Fp8Linear` giving the wrong answer ``wrong`` (one of :data:`WRONG`; any other name: none)."""

    def __init__(self, wrong: str, recipes: tuple[Fp8Recipe, ...]) -> None:
        super().__init__(f"wrong_{wrong}", recipes)
        self.wrong = wrong
        self.calls = 0

    def quantize_operand(self, t: torch.Tensor, recipe: Fp8Recipe, role: str, usage: str, state: Any, *, record: bool):
        q = super().quantize_operand(t, recipe, role, usage, state, record=record)
        if self.wrong in ("dropped_last_scale_block", "permuted_block_scales"):
            return _blocks_wrong(q, self.wrong)
        if self.wrong == "e5m2_read_as_e4m3" and q.fmt.name != E4M3.name:
            data = q.data.view(torch.uint8).view(getattr(torch, E4M3.torch_dtype_name))
            return QTensor(data, q.scale_inv, q.code, q.block, E4M3)
        return q

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, **kw: Any):
        self.calls += 1
        if self.wrong == "missing_micro_batch" and self.calls == 2:
            weight = weight.detach()
        y = super().__call__(x, weight, bias, **kw)
        return y * 0 if self.wrong == "zeros" else y


class WrongGroupedLoop(GroupedLoopLinear):
    """The grouped loop built-in over :class:`WrongLinear` (every expert's call gets it wrong the same way; for
    ``missing_micro_batch``, the whole second grouped call's weight gradients are lost)."""

    def __init__(self, wrong: str, recipes: tuple[Fp8Recipe, ...]) -> None:
        super().__init__(f"wrong_grouped_{wrong}", recipes=recipes, empty_splits=True)
        per_expert = "right" if wrong == "missing_micro_batch" else wrong  # the grouped call loses it here
        self.single = {k: WrongLinear(per_expert, lin.support.recipes) for k, lin in self.single.items()}
        self.wrong = wrong
        self.calls = 0

    def __call__(self, x: torch.Tensor, weights: Any, biases: Any = None, **kw: Any) -> torch.Tensor:
        self.calls += 1
        if self.wrong == "missing_micro_batch" and self.calls == 2:
            weights = weights.detach() if isinstance(weights, torch.Tensor) else [w.detach() for w in weights]
        return super().__call__(x, weights, biases, **kw)
