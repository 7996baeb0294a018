"""Adapter for Megatron-core's vocabulary-parallel cross-entropy (``megatron-core``, installed with
``pip install --no-deps megatron-core==0.16.1``, which ``.ci/setup`` does), read from the installed release.

``megatron_vocab_parallel``: ``megatron.core.tensor_parallel.vocab_parallel_cross_entropy`` (label smoothing,
Megatron's convention ε/(V−1) over the other classes, declared ``smoothing="megatron"``). It reads its group
from ``megatron.core.parallel_state``; the adapter points that module's tensor-parallel group at the call's
group for the call only and restores it after (no group is created). ``megatron_fused_vocab_parallel``:
``megatron.core.fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy`` (group passed explicitly; no
smoothing), run on CUDA with its fuser as the release ships it (``megatron.core.jit.jit_fuser``: ``torch.compile`` on
torch >= 2.2, ``torch.jit.script`` before) and on the CPU with the four fused steps uncompiled (the same Python
functions, as ``megatron.core.jit.disable_jit_fuser`` would give them: inductor's CPU compile of them cost 15–40 s
per shape in every rank on the loaded 2-core machine, about 12 minutes of the torch 2.6 suite, while the CPU path
is not what any training run executes; the defect below is in that Python code, compiled or not), fed [s=1, b=N, V/P] logits and [1, N] targets, its [1, N] per-token
losses taken back (the layout Megatron's ``compute_language_model_loss`` uses, s and b being interchangeable
here: the function works row by row).

The fused variant's backward rounds the gradient of the logits to bf16 whatever their dtype
(``calculate_gradients``: ``grad_input.to(torch.bfloat16)``, also in the 0.8.0 and 0.12.0 source; autograd casts
it to the logits' dtype). For bf16 parameters that is the rounding the logits' own dtype makes anyway (its grad_x, grad_W
and grad_b are bitwise the unfused variant's); for fp32 it is a defect of the release: measured on 0.16.1 (P = 1,
2, 4, Problem(N=7, H=5, V=16, bias=True, ignored=0.3, seed=3)) the fused gradient of the logits is bitwise the
unfused one rounded to bf16, off the float64 one by up to 3.5e-3 relative element-wise (bf16's u = 2⁻⁸ = 3.9e-3)
where the unfused fp32 one is within 5.2e-7, and grad_x, grad_W and grad_b lie 578–2490 times beyond their fp32
bounds (max abs errors 3e-4–1.1e-3 on values ~0.3; the loss is untouched, 9.6e-7 off). Recorded as a known
divergence (:data:`numcheck.properties.distributed.linear_ce.known.DIST_KNOWN`, docs/evidence/megatron_fused_bf16_grad.txt):
the suite judges those gradients under one extra bf16 rounding of G, and the loss under the normal model.

Both take the rank's logits shard and return per-token losses: the adapter computes the shard's logits with
F.linear in the inputs' dtype, feeds x through Megatron's own ``copy_to_tensor_model_parallel_region`` (identity
forward, grad_x all-reduced in x's dtype backward), upcasts the logits to fp32 as Megatron's GPT loss does
(``logits.float()``), masks ignored rows (their target replaced by class 0 and their loss multiplied by 0, as
Megatron's loss mask does) and reduces (``mean`` over the non-ignored rows, ``sum``, ``none``). Megatron splits the
vocabulary evenly (``VocabUtility``): declared ``uneven_vocab=False``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from numcheck.impls.adapters import releases
from numcheck.impls.adapters.unavailable import unavailable_support
from numcheck.impls.protocols.dist_linear_ce import DIST_KIND, DistSupport, VocabShardImpl
from numcheck.impls.protocols.linear_ce import LinearCESupport
from numcheck.reference.options import CEOptions

DISTRIBUTION = "megatron-core"
INSTALL = "pip install --no-deps megatron-core==0.16.1"


def _core_file() -> Path | None:
    """``megatron/core/__init__.py`` as ``import megatron.core`` would find it (the first portion of the
    ``megatron`` namespace holding ``core/``), without importing it; ``None`` when there is none."""
    spec = importlib.util.find_spec("megatron")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(folder) / "core" / "__init__.py"
        if candidate.is_file():
            return candidate
    return None


def release_info() -> releases.Release | None:
    """The release of the megatron-core whose files ``import megatron.core`` finds (:mod:`.releases`), or ``None``
    when megatron-core is not installed."""
    core = _core_file()
    return None if core is None else releases.owning_release(DISTRIBUTION, core)


def megatron_version() -> str | None:
    """The installed megatron-core release, or ``None`` (not installed, or its release unknown)."""
    got = release_info()
    return None if got is None else got.version


def megatron_missing() -> str | None:
    """Why the adapter cannot run here, or ``None``."""
    if release_info() is None:
        return f"megatron-core is not installed ({INSTALL})"
    return None


class MegatronVocabParallel(VocabShardImpl):
    """One Megatron-core entry point behind the distributed protocol (``fused`` picks the fused one)."""

    kind = DIST_KIND

    def __init__(self, fused: bool) -> None:
        self.fused = fused
        self.name = "megatron_fused_vocab_parallel" if fused else "megatron_vocab_parallel"
        options = ("bias", "ignore_index") if fused else ("bias", "ignore_index", "label_smoothing")
        self.dist = DistSupport(uneven_vocab=False, smoothing="megatron", deterministic=True)
        entry = f"{'fused_' if fused else ''}vocab_parallel_cross_entropy"
        got = release_info()
        if got is None:
            why = megatron_missing() or "megatron-core is not installed"
            self.support = unavailable_support(why, ("mean", "sum", "none"))
            self.description = f"Megatron-core {entry} — unavailable: {why}"
            return
        self.support = LinearCESupport(
            options=frozenset(options),
            autocast=frozenset(),
            all_ignored="nan",
            dtypes=frozenset({torch.float32, torch.bfloat16}),
            grad_accumulation="fp32",
            logits_dtype="compute",
            ce_dtype="float32",
            requires=megatron_missing,
        )
        if got.unknown:
            self.description = f"Megatron-core {entry} [release unknown: {got.note}]"
        else:
            self.description = f"Megatron-core {got.version} {entry}"

    def __repr__(self) -> str:
        return f"MegatronVocabParallel(fused={self.fused})"

    def input_for_shard(self, x: torch.Tensor, group: Any) -> torch.Tensor:
        """x through Megatron's own ``copy_to_tensor_model_parallel_region`` (grad_x all-reduced in x's dtype)."""
        from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

        return copy_to_tensor_model_parallel_region(x, group=group)

    def shard_loss(
        self, logits: torch.Tensor, target: torch.Tensor, o: CEOptions, *, group: Any, vocab_start: int, vocab_size: int
    ) -> torch.Tensor:
        """This rank's part through Megatron-core, from its fp32 logits shard (module docstring)."""
        from megatron.core import parallel_state as ps

        valid = target != o.ignore_index
        tgt = torch.where(valid, target, torch.zeros_like(target))
        if self.fused:
            from megatron.core.fusions import fused_cross_entropy as fce

            if logits.device.type == "cpu":
                _uncompile_steps(fce)
            fused_vocab_parallel_cross_entropy = fce.fused_vocab_parallel_cross_entropy

            per_row = fused_vocab_parallel_cross_entropy(logits[None], tgt[None], group)[0]
        else:
            from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

            saved = (
                ps._TENSOR_MODEL_PARALLEL_GROUP,
                ps._MPU_TENSOR_MODEL_PARALLEL_RANK,
                ps._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE,
            )
            ps._TENSOR_MODEL_PARALLEL_GROUP = group
            ps._MPU_TENSOR_MODEL_PARALLEL_RANK = None
            ps._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE = None
            try:
                per_row = vocab_parallel_cross_entropy(logits, tgt, o.label_smoothing)
            finally:
                (
                    ps._TENSOR_MODEL_PARALLEL_GROUP,
                    ps._MPU_TENSOR_MODEL_PARALLEL_RANK,
                    ps._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE,
                ) = saved
        per_row = torch.where(valid, per_row, torch.zeros_like(per_row))  # a masked 0, not 0·(1/0) in backward
        if o.reduction == "none":
            return per_row
        if o.reduction == "sum":
            return per_row.sum()
        return per_row.sum() / valid.sum()


#: The fused module's ``jit_fuser`` steps, looked up by name when its forward and backward run.
FUSED_STEPS = (
    "calculate_logits_max",
    "calculate_predicted_logits",
    "calculate_cross_entropy_loss",
    "calculate_gradients",
)


def _uncompile_steps(module: Any) -> None:
    """Point ``module``'s fused steps at the functions ``torch.compile`` wrapped (``_torchdynamo_orig_callable``), for
    the rest of this (rank) process: the backward runs after the call returns, so the swap cannot be scoped to it.
    A step that is not a ``torch.compile`` wrapper (``torch.jit.script`` on old torch, or already swapped) is left."""
    for name in FUSED_STEPS:
        step = getattr(module, name)
        orig = getattr(step, "_torchdynamo_orig_callable", None)
        if orig is not None:
            setattr(module, name, orig)


def megatron_impls() -> list[MegatronVocabParallel]:
    """The unfused and fused adapters (each unavailable, with the reason, where megatron-core is not installed)."""
    return [MegatronVocabParallel(fused=False), MegatronVocabParallel(fused=True)]
