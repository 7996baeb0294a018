"""Deliberately broken tensor-parallel FP8 linears: each is :class:`impls.builtin.tp_fp8_linear.TPFp8Linear` with one seam
overridden, declared where its bug shows; :data:`CAUGHT_BY` names the drawn suite test that must fail it (the tables
of :mod:`tests.self.helpers.mutant_table`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from numcheck.impls.builtin.tp_fp8_linear import CallConfig, Dequantized, TPFp8Linear, _logged
from numcheck.reference.numerics.fp8_linear import tensor_amax
from numcheck.tests.self.helpers.mutant_table import caught_by_table
from numcheck.tests.self.helpers.mutant_table import recipes_of as _recipes


def _local_amax(t: torch.Tensor) -> torch.Tensor:
    """The rank's own amax of ``t`` (not reduced over the group)."""
    return tensor_amax(t.detach().to(torch.float32))


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
        return partial[cfg.comm.rank * m : (cfg.comm.rank + 1) * m].contiguous()


#: The mutants, each with the drawn suite test that must catch it.
MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (AmaxNotReduced("mutant_tp_amax_not_reduced", _recipes("current")), "dist_accuracy_and_same_scale"),
        (AmaxNotReduced("mutant_tp_amax_not_reduced[delayed]", _recipes("delayed")), "dist_accuracy_and_same_scale"),
        (SPGatherLocalScale("mutant_tp_sp_gather_local_scale", _recipes("current")), "dist_accuracy_and_same_scale"),
        (SoiRequantizesLocalShard("mutant_tp_soi_local_shard", _recipes("current")), "dist_save_original_input"),
        (SoiRequantizesLocalShard("mutant_tp_soi_local_shard[mxfp8]", _recipes("mxfp8")), "dist_save_original_input"),
        (RowOutputNotReduced("mutant_tp_row_output_not_reduced", _recipes("current")), "dist_accuracy_and_same_scale"),
    ]
)


class PartialsInOutputDeclaredFp32(TPFp8Linear):
    """Declares ``partial_dtype="float32"`` but rounds each rank's partial of a sharded reduction (row-parallel y,
    column-parallel dgrad) to the output dtype and reduces it there."""

    def __init__(self, name: str, recipes: tuple[Any, ...], description: str = "") -> None:
        super().__init__(name, recipes, description)
        self.support = dataclasses.replace(self.support, partial_dtype="float32")

    def partial_dtype(self, out_dtype: torch.dtype) -> torch.dtype:
        return out_dtype


#: Mutants of a declared reduction dtype, each with the drawn suite test that must catch it.
DTYPE_MUTANTS, DTYPE_CAUGHT_BY = caught_by_table(
    [
        (
            PartialsInOutputDeclaredFp32("mutant_tp_partials_in_output_declared_fp32", _recipes("current")),
            "dist_accuracy_and_same_scale",
        ),
    ]
)

#: Each mutant alone, in the tables' order, so ``--impl numcheck.tests.self.helpers.dist_fp8_mutants:ATTR`` loads one
#: of them (the detection table's specs, tools/detection.py).
(
    amax_not_reduced,
    amax_not_reduced_delayed,
    sp_gather_local_scale,
    soi_local_shard,
    soi_local_shard_mxfp8,
    row_output_not_reduced,
) = MUTANTS
(partials_in_output_declared_fp32,) = DTYPE_MUTANTS
