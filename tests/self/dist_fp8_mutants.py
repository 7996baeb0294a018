"""Deliberately broken tensor-parallel FP8 linears: each is :class:`impls.tp_fp8_linear.TPFp8Linear` with one seam
overridden, declared where its bug shows; :data:`PINNED` says which layout its draws need (the bug lives there)."""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls.quant_linear import _block_amax
from numcheck.impls.tp_fp8_linear import CallConfig, Dequantized, TPFp8Linear, _logged
from numcheck.reference.fp8_recipes import Fp8Recipe, standard_recipes


def _recipes(*kinds: str) -> tuple[Fp8Recipe, ...]:
    return tuple(r for r in standard_recipes() if r.kind in kinds)


def _local_amax(t: torch.Tensor) -> torch.Tensor:
    t32 = t.detach().to(torch.float32)
    return _block_amax(t32, (max(1, t32.shape[0]), max(1, t32.shape[1]))).reshape(())


class AmaxNotReduced(TPFp8Linear):
    """Per-tensor scales from each rank's own amax: ranks quantize with different scales."""

    def reduce_amax(self, amax: torch.Tensor, cfg: CallConfig) -> torch.Tensor:
        return amax


class SPGatherLocalScale(TPFp8Linear):
    """Column-parallel SP: x_r quantized with its own amax's scale before the gather (each shard's codes keep their
    own scale; the gathered x is not the global quantization)."""

    def gather_rowwise_x(self, x_local: torch.Tensor, cfg: CallConfig) -> Any:
        q = self.quantize(x_local, "x", "rowwise", cfg, amax=_local_amax(x_local))
        return Dequantized(cfg.comm.all_gather(q.dequantize().contiguous()), _logged(q, "rowwise"))


class SoiRequantizesLocalShard(TPFp8Linear):
    """save_original_input=True under column SP: backward quantizes the local shard columnwise (its own amax, its
    own blocks) and gathers that, instead of quantizing the gathered original."""

    def wgrad_x_from_saved(self, x_saved: torch.Tensor, cfg: CallConfig) -> Any:
        if not (cfg.parallel == "column" and cfg.sequence_parallel):
            return super().wgrad_x_from_saved(x_saved, cfg)
        q = self.quantize(x_saved, "x", "columnwise", cfg, record=False, amax=_local_amax(x_saved))
        gathered = cfg.comm.all_gather(q.dequantize().t().contiguous()).t().contiguous()
        return Dequantized(gathered, _logged(q, "columnwise"))


class RowOutputNotReduced(TPFp8Linear):
    """Row-parallel: the partial x_r·W_rᵀ is returned without the all-reduce (under SP, the rank's rows of it)."""

    def reduce_row_output(self, partial: torch.Tensor, cfg: CallConfig) -> torch.Tensor:
        if not cfg.sequence_parallel:
            return partial
        m = partial.shape[0] // cfg.comm.world
        return partial[cfg.comm.rank * m:(cfg.comm.rank + 1) * m].contiguous()


MUTANTS: list[TPFp8Linear] = [
    AmaxNotReduced("mutant_tp_amax_not_reduced", _recipes("current")),
    AmaxNotReduced("mutant_tp_amax_not_reduced[delayed]", _recipes("delayed")),
    SPGatherLocalScale("mutant_tp_sp_gather_local_scale", _recipes("current")),
    SoiRequantizesLocalShard("mutant_tp_soi_local_shard", _recipes("current")),
    SoiRequantizesLocalShard("mutant_tp_soi_local_shard[mxfp8]", _recipes("mxfp8")),
    RowOutputNotReduced("mutant_tp_row_output_not_reduced", _recipes("current")),
]

#: The drawn suite test that must catch each mutant.
CAUGHT_BY: dict[str, str] = {
    "mutant_tp_amax_not_reduced": "dist_accuracy_and_same_scale",
    "mutant_tp_amax_not_reduced[delayed]": "dist_accuracy_and_same_scale",
    "mutant_tp_sp_gather_local_scale": "dist_accuracy_and_same_scale",
    "mutant_tp_soi_local_shard": "dist_save_original_input",
    "mutant_tp_soi_local_shard[mxfp8]": "dist_save_original_input",
    "mutant_tp_row_output_not_reduced": "dist_accuracy_and_same_scale",
}
