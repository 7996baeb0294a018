"""Deliberately broken grouped FP8 linears (mixture-of-experts): the grouped suite must flag every one of them.

Each mutant is the built-in :class:`impls.builtin.grouped_fp8_linear.GroupedFusedLinear` with one seam overridden —
one plausible grouped-kernel bug — declared for the recipes where it is observable, and loadable like any outside
impl (``--impl numcheck.tests.self.helpers.grouped_fp8_mutants:MUTANTS``). :data:`CAUGHT_BY` names the property
(:data:`properties.fp8.grouped.props.GROUPED_PROPERTIES`) that must fail it.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from numcheck.impls.builtin.grouped_fp8_linear import Call, GroupedFusedLinear, SplitQuantized
from numcheck.reference.fp8_formats import Fp8Format
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.numerics.fp8_linear import QTensor
from numcheck.tests.self.helpers.mutant_table import caught_by_table
from numcheck.tests.self.helpers.mutant_table import recipes_of as _recipes


class SharedScaleAcrossExperts(GroupedFusedLinear):
    """Per-tensor scales from one amax over the whole input (every expert's rows) instead of each expert's own: the
    experts' quantizers share one scale, so a quiet expert next to a loud one loses its precision."""

    def split_amax(self, t32: torch.Tensor, c: Call) -> torch.Tensor:
        amax = super().split_amax(t32, c)
        return torch.full_like(amax, float(amax.max()))


class SplitOffsetsOffByOne(GroupedFusedLinear):
    """Each expert's first row taken as the end of the previous expert's (row offsets one too far for every expert
    after the first): the boundary rows are quantized and multiplied with the previous expert's weight."""

    def row_offsets(self, m_splits: tuple[int, ...]) -> tuple[int, ...]:
        off = list(super().row_offsets(m_splits))
        for i in range(1, len(off) - 1):
            off[i] = min(off[i] + 1, off[i + 1])
        return tuple(off)


class ZeroAmaxInfScale(GroupedFusedLinear):
    """The per-expert scale as fp8_max / amax without the rule's amax = 0 case: an expert whose amax is 0 — no token,
    or only zero (padding) rows — gets an infinite scale, and 0·inf makes its FP8 codes NaN."""

    def split_scales(
        self, amax: torch.Tensor, fmt: Fp8Format, recipe: Fp8Recipe, role: str, c: Call, experts: Sequence[int]
    ) -> torch.Tensor:
        if recipe.kind == "delayed":
            return super().split_scales(amax, fmt, recipe, role, c, experts)
        return torch.full_like(amax, fmt.max_finite) / amax


class WrongExpertQuantizerInBackward(GroupedFusedLinear):
    """Backward quantizes expert i's dy with expert i+1's quantizer (its stored delayed scale, and records the amax
    into that expert's history): an index shifted when the per-GEMM quantizers are looked up for the grads."""

    def dy_quantizer_of(self, i: int, c: Call) -> int:
        return (i + 1) % c.G


class Bf16MainGradAccumulation(GroupedFusedLinear):
    """Fused wgrad accumulation through bf16: main_grad + wgrad rounded to bf16 before it is stored back in fp32."""

    def accumulate_main_grad(self, main_grad: torch.Tensor, wgrad32: torch.Tensor) -> None:
        main_grad.copy_((main_grad + wgrad32).to(torch.bfloat16).to(torch.float32))


class FirstMicroBatchOnlyMainGrad(GroupedFusedLinear):
    """Fused wgrad accumulation that reaches main_grad only on the first micro-batch (Primus PR #1046): an expert's
    slice of a main_grad it has already added into is left alone, so the step's gradient is the first
    micro-batch's alone. Kept per main_grad buffer (weakly: a new buffer is a new step)."""

    def accumulate_main_grad(self, main_grad: torch.Tensor, wgrad32: torch.Tensor) -> None:
        reached = self.__dict__.setdefault("_reached", {})
        base = main_grad if main_grad._base is None else main_grad._base
        ref, slices = reached.get(id(base), (None, set()))
        if ref is None or ref() is not base:  # a buffer not seen before (or a new one at a reused id): a new step
            slices = set()
            reached[id(base)] = (weakref.ref(base), slices)
        if main_grad.storage_offset() in slices:
            return
        slices.add(main_grad.storage_offset())
        super().accumulate_main_grad(main_grad, wgrad32)


class StaleWgradWorkspace(GroupedFusedLinear):
    """The [G, N, K] weight-gradient buffer is a workspace kept per shape and not cleared: an expert with no rows
    skips its GEMM and returns what the previous call left in its slot."""

    def wgrad_buffer(self, c: Call, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        ws = self.__dict__.setdefault("_workspaces", {})
        key = (c.G, *shape, dtype, device)
        if key not in ws:
            ws[key] = torch.zeros((c.G, *shape), dtype=dtype, device=device)
        return ws[key]


#: Bytes of the allocation :class:`UninitialisedEmptyExpertWgrad` takes its buffer from: above glibc's largest
#: mmap threshold (32 MiB on 64-bit), so every call's buffer is a fresh mapping the OS hands over zeroed.
FRESH_PAGES_BYTES = 64 << 20


class UninitialisedEmptyExpertWgrad(GroupedFusedLinear):
    """The [G, N, K] weight-gradient buffer allocated with ``torch.empty`` and written only by the experts that got
    rows: an empty expert's gradient is whatever the memory held (MSLK PR #158; pytorch #172439, #193633). The
    buffer is a view into a :data:`FRESH_PAGES_BYTES` ``torch.empty``: on the CPU that memory is fresh pages, zeros —
    exactly the right gradient of an empty expert — unless uninitialised memory is poisoned
    (:mod:`numcheck.properties.core.poison`), when it is NaN. Built so, the contrast does not depend on what the
    allocator recycled: a small ``torch.empty`` would hold leftovers of earlier tensors, sometimes zeros."""

    def wgrad_buffer(self, c: Call, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        n = c.G * shape[0] * shape[1]
        fresh = torch.empty(max(n, FRESH_PAGES_BYTES // dtype.itemsize), dtype=dtype, device=device)
        return fresh[:n].view(c.G, *shape)


@dataclass
class _PerElement(SplitQuantized):
    """A columnwise quantization whose blocks ignore the experts: each expert's part carries its elements' scales."""

    full_scale_inv: torch.Tensor | None = None

    def expert(self, c: Call, i: int) -> QTensor:
        rows = c.rows(i)
        data = self.data[rows].t().contiguous()
        return QTensor(data, self.full_scale_inv[rows].t().contiguous(), None, (1, 1), self.fmt)


class SaveOriginalInputQuantizesWholeInput(GroupedFusedLinear):
    """save_original_input=True: backward re-quantizes the saved x columnwise as one tensor, forgetting the split
    (one per-tensor scale for all experts; 32/128-row blocks straddling expert boundaries), while forward's
    columnwise copy (save_original_input=False) is quantized per expert."""

    def requantize_saved_x(self, x: torch.Tensor, c: Call) -> SplitQuantized:
        M = int(x.shape[0])
        whole = Call(c.recipe, (M,), (0, M), c.ws[:1], None, c.grouped, c.soi, None, None)
        q = self.quantize_split(x, whole, "x", "columnwise", record=False)
        if q.per_tensor:
            full = q.scale_inv.reshape(1, 1).expand(x.shape)
        else:
            ids, _ = self.column_block_ids(whole, q.block[0], x.device)
            full = q.scale_inv[ids]
        return _PerElement(q.data, q.scale_inv, None, "columnwise", False, (1, 1), (), q.fmt, full.contiguous())


class SavesCopyOfInput(GroupedFusedLinear):
    """save_original_input=True keeps a private copy of x instead of x itself (no memory saved)."""

    def original_x_to_save(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().clone()


def _fused(cls: type, name: str, recipes: tuple[Fp8Recipe, ...], **support: Any) -> GroupedFusedLinear:
    return cls(
        name,
        cls.__doc__.split("\n")[0],
        recipes=recipes,
        bitwise_per_expert=True,
        fused_wgrad_accumulation=frozenset({False, True}),
        **support,
    )


_current = (Fp8Recipe("current"),)
#: The mutants, each with the property that must flag it (the strategy its test draws from is in
#: tests/self/mutants/test_grouped_fp8_mutants.py).
MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (_fused(SharedScaleAcrossExperts, "mutant_grouped_shared_scale", _recipes("current")), "accuracy"),
        (_fused(SplitOffsetsOffByOne, "mutant_grouped_offsets_off_by_one", _recipes("current", "mxfp8")), "accuracy"),
        (_fused(ZeroAmaxInfScale, "mutant_grouped_zero_amax_inf_scale", _current), "accuracy"),
        (
            _fused(WrongExpertQuantizerInBackward, "mutant_grouped_wrong_expert_dy_quantizer", _recipes("delayed")),
            "accuracy",
        ),
        (_fused(Bf16MainGradAccumulation, "mutant_grouped_bf16_main_grad", _current), "wgrad_accumulation"),
        (
            _fused(FirstMicroBatchOnlyMainGrad, "mutant_grouped_first_micro_batch_main_grad", _current),
            "wgrad_accumulation",
        ),
        (_fused(StaleWgradWorkspace, "mutant_grouped_stale_wgrad_workspace", _current), "empty_experts"),
        (
            _fused(
                SaveOriginalInputQuantizesWholeInput,
                "mutant_grouped_soi_whole_input",
                _recipes("current", "mxfp8", "blockwise"),
            ),
            "save_original_input",
        ),
        (_fused(SavesCopyOfInput, "mutant_grouped_saves_copy_of_x", _current), "saved_bytes"),
    ]
)

#: Each mutant alone, in :data:`MUTANTS`' order, so ``--impl numcheck.tests.self.helpers.grouped_fp8_mutants:ATTR``
#: loads one of them (the detection table's specs, tools/detection.py).
(
    shared_scale,
    offsets_off_by_one,
    zero_amax_inf_scale,
    wrong_expert_dy_quantizer,
    bf16_main_grad,
    first_micro_batch_main_grad,
    stale_wgrad_workspace,
    soi_whole_input,
    saves_copy_of_x,
) = MUTANTS

#: Not in :data:`MUTANTS`: caught only with poisoned memory, which the direct property calls of
#: tests/self/mutants/test_grouped_fp8_mutants.py do not set up (tests/self/mutants/test_poisoned_memory.py judges it).
#: No fused wgrad accumulation declared: with ``main_grad`` the buffer is not returned, so every draw shows it.
uninitialised_empty_wgrad = UninitialisedEmptyExpertWgrad(
    "mutant_grouped_uninitialised_empty_wgrad",
    UninitialisedEmptyExpertWgrad.__doc__.split("\n")[0],
    recipes=_current,
    bitwise_per_expert=True,
    fused_wgrad_accumulation=frozenset({False}),
)


# -- HYBRID backward: E5M2 gradients (TE #3342) --------------------------------------------------------------------
class HybridBackwardQuantizesDyAsE4M3(GroupedFusedLinear):
    """Under a HYBRID recipe (E4M3 forward, E5M2 gradients), backward quantizes every expert's dy as E4M3 (its scale
    from 448, not 57344) in both usages, as a grouped backward that takes the forward's format for the gradients
    (TE #3342); forward, x and W stay right."""

    def quantize_split(
        self, t: torch.Tensor, c: Call, role: str, usage: str, *, record: bool, experts: Sequence[int] | None = None
    ) -> SplitQuantized:
        if role == "dy" and c.recipe.fp8_format == "HYBRID":
            c = dataclasses.replace(c, recipe=c.recipe.replace(fp8_format="E4M3"))
        return super().quantize_split(t, c, role, usage, record=record, experts=experts)


# -- block-scale layout per expert ----------------------------------------------------------------------------------
class ExpertDgradTileScalesUntransposed(GroupedFusedLinear):
    """Each expert's dgrad W (columnwise, ``W_iᵀ [K, N]``) takes its 128×128 tile scales from the rowwise
    ``[nN, nK]`` buffer read as ``[nK, nN]`` (the single linear's ``DgradTileScalesUntransposed``, per expert):
    invisible where the tiles of a W share an exponent, as random weights' do."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        from numcheck.tests.self.helpers.fp8_mutants import DgradTileScalesUntransposed

        super().__init__(*args, **kw)
        self.single = {k: DgradTileScalesUntransposed(v.name, v.support.recipes) for k, v in self.single.items()}


#: The HYBRID mutant on each kind with a HYBRID standard recipe (per-tensor delayed and current, MXFP8).
HYBRID_MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (
            _fused(
                HybridBackwardQuantizesDyAsE4M3,
                "mutant_grouped_hybrid_dy_e4m3",
                tuple(r for r in _recipes("current", "mxfp8") if r.fp8_format == "HYBRID"),
            ),
            "accuracy",
        ),
        (
            _fused(
                ExpertDgradTileScalesUntransposed,
                "mutant_grouped_dgrad_tile_scales_untransposed",
                tuple(r for r in _recipes("blockwise") if r.power_of_2_scales),
            ),
            "accuracy",
        ),
    ],
    after=CAUGHT_BY,
)
hybrid_dy_e4m3, expert_dgrad_tile_scales_untransposed = HYBRID_MUTANTS
