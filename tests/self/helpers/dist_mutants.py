"""Distributed mutants: each the built-in vocab_parallel[nan] with exactly one step replaced by a known class of
vocabulary-parallel bug. Module level, so the ranks can unpickle them."""

from __future__ import annotations

from typing import Any

import torch

from numcheck.impls.builtin.vocab_parallel import VocabParallelCE
from numcheck.tests.self.helpers.grouped_fp8_mutants import FRESH_PAGES_BYTES


class LocalVocabSmoothing(VocabParallelCE):
    """Label smoothing normalised by the local shard's vocabulary (ε/V_r instead of ε/V)."""

    def smoothing_weight(self, eps: float, vocab_size: int, shard_size: int) -> float:
        return eps / shard_size


class NoGradXAllReduce(VocabParallelCE):
    """grad_x left as the rank's partial: the copy of x into the shard's matmul has no all-reduce in backward."""

    def input_for_shard(self, x: torch.Tensor, group: Any) -> torch.Tensor:
        return x


class TargetOffsetOffByOne(VocabParallelCE):
    """A target on the first class of the next shard also counted by this rank (``<=`` for ``<``)."""

    def owns_target(self, local: torch.Tensor, size: int) -> torch.Tensor:
        return (local >= 0) & (local <= size)


class LocalLseZLoss(VocabParallelCE):
    """z-loss λ·lse² from the rank's local lse instead of the global one."""

    def z_loss_lse(self, lse: torch.Tensor, local_lse: torch.Tensor) -> torch.Tensor:
        return local_lse


class UnownedTargetLogitUninitialised(VocabParallelCE):
    """The rank's target-logit partial in a buffer from ``torch.empty``, written only at the rows whose target the
    rank owns (Megatron's vocab-parallel CE zeroes those rows explicitly): the rows of targets on other shards —
    every row, on a rank that owns no target — add whatever the memory held to the all-reduced target logit. The
    buffer is a view into a :data:`FRESH_PAGES_BYTES` ``torch.empty`` (fresh pages the OS zeroes, as the grouped
    ``uninitialised_empty_wgrad`` builds it): zeros, the right partial, unless uninitialised memory is poisoned
    (:mod:`numcheck.properties.core.poison`, in the ranks too), when the loss is NaN."""

    def target_logit(self, z: torch.Tensor, local: torch.Tensor, owns: torch.Tensor) -> torch.Tensor:
        n = owns.numel()
        buf = torch.empty(max(n, FRESH_PAGES_BYTES // z.dtype.itemsize), dtype=z.dtype, device=z.device)[:n]
        idx = local.clamp(0, max(z.shape[1] - 1, 0))[:, None]
        buf[owns] = z.gather(1, idx).squeeze(1)[owns]
        return buf


class _Mutant:
    spec_module = "numcheck.tests.self.helpers.dist_mutants"


def dist_impls() -> list[VocabParallelCE]:
    """The four mutants, named ``mutant_dist[...]``."""
    out = []
    for cls in (LocalVocabSmoothing, NoGradXAllReduce, TargetOffsetOffByOne, LocalLseZLoss):
        m = cls(f"mutant_dist[{cls.__name__}]", "nan", cls.__doc__.strip().split("\n")[0])
        m.spec_module = _Mutant.spec_module
        out.append(m)
    return out


#: Each mutant alone, in :func:`dist_impls`' order, so ``--impl numcheck.tests.self.helpers.dist_mutants:ATTR`` loads
#: one of them (the detection table's specs, tools/detection.py).
local_vocab_smoothing, no_grad_x_all_reduce, target_offset_off_by_one, local_lse_z_loss = dist_impls()

#: Not in :func:`dist_impls`: caught only with poisoned memory (tests/self/mutants/test_poisoned_memory.py judges it).
unowned_target_logit_uninitialised = UnownedTargetLogitUninitialised(
    "mutant_dist[UnownedTargetLogitUninitialised]",
    "nan",
    "target-logit partial from torch.empty, written only at the rows whose target the rank owns",
)
unowned_target_logit_uninitialised.spec_module = _Mutant.spec_module
