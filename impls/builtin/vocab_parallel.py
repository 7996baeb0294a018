"""Built-in vocabulary-parallel linear+CE (Megatron's design over torch.distributed), following
:mod:`numcheck.impls.protocols.dist_linear_ce`.

Each rank computes its logits shard z_r = x·W_rᵀ + b_r in the inputs' dtype (softcap applied in fp32 after the
upcast), then in fp32: the row maximum all-reduced (MAX), its shard's Σ exp(z − m) all-reduced (SUM), the target
logit from the rank owning the target (the others add 0, SUM), and for smoothing its shard's Σ_j w_j·z_j (SUM).
From these global row statistics every rank forms the same loss, PyTorch's convention (ε/V over all V classes),
z-loss λ·lse² from the global lse, ``mean`` normalised by Σ w_y over the non-ignored rows.

Autograd: each all-reduce of a row statistic has the identity as backward (every rank's loss is the same
function of the global statistic, so ∂L/∂(rank r's partial) = ∂L/∂(global)); x enters through a copy whose
backward all-reduces the rank's grad_x partial, in x's dtype (``grad_x_reduce_dtype="input"``). grad_W and grad_b
of the shard come out of the shard's own matmul.

Each step is a method, so that a mutant (tests/self/helpers/dist_mutants.py) differs from this impl in exactly
one of them. Two registrations differ only in the all-ignored ``mean`` convention: ``vocab_parallel[nan]``
(PyTorch's 0/0) and ``vocab_parallel[zero]`` (loss 0).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from numcheck.impls.protocols.dist_linear_ce import DIST_KIND, DistSupport, VocabShardImpl
from numcheck.impls.protocols.linear_ce import LinearCESupport
from numcheck.reference.options import CEOptions


class _SumAcrossRanks(torch.autograd.Function):
    """All-reduce (SUM) of a row statistic; backward is the identity (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: Any) -> torch.Tensor:
        out = t.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return g, None


class CopyToRanks(torch.autograd.Function):
    """x as every rank uses it: identity forward, all-reduce (SUM) of the gradient backward, in the gradient's
    own dtype (x's). Shared with the TransformerEngine adapter's distributed face, whose ranks take x alike."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        g = g.contiguous().clone()
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=ctx.group)
        return g, None


class VocabParallelCE(VocabShardImpl):
    """The built-in vocabulary-parallel impl; ``all_ignored`` picks the all-ignored ``mean`` convention."""

    kind = DIST_KIND

    def __init__(self, name: str, all_ignored: str = "nan", description: str = "") -> None:
        self.name = name
        self.all_ignored = all_ignored
        self.description = description or (
            f"vocabulary-parallel linear+CE over torch.distributed, all-ignored mean = {all_ignored}"
        )
        self.support = LinearCESupport(
            all_ignored=all_ignored,
            autocast=frozenset(),
            returns_z_loss=False,
            grad_accumulation="fp32",
            logits_dtype="compute",
            ce_dtype="float32",
        )
        self.dist = DistSupport(uneven_vocab=True, smoothing="torch", deterministic=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- the steps a mutant may replace ------------------------------------------------------------------
    def input_for_shard(self, x: torch.Tensor, group: Any) -> torch.Tensor:
        """x as this rank's matmul sees it; its gradient is all-reduced across ranks."""
        return CopyToRanks.apply(x, group)

    def owns_target(self, local: torch.Tensor, size: int) -> torch.Tensor:
        """Which rows' targets fall in this rank's shard (``local`` = target − vocab_start)."""
        return (local >= 0) & (local < size)

    def smoothing_weight(self, eps: float, vocab_size: int, shard_size: int) -> float:
        """The weight ε/V of each class's −log p_j in the smoothed loss (V the global vocabulary)."""
        return eps / vocab_size

    def z_loss_lse(self, lse: torch.Tensor, local_lse: torch.Tensor) -> torch.Tensor:
        """The lse the z-loss squares: the global one."""
        return lse

    def target_logit(self, z: torch.Tensor, local: torch.Tensor, owns: torch.Tensor) -> torch.Tensor:
        """This rank's part of each row's target logit (summed across ranks): ``z[i, local_i]`` where it owns the
        row's target, 0 elsewhere."""
        idx = local.clamp(0, max(z.shape[1] - 1, 0))[:, None]
        return torch.where(owns, z.gather(1, idx).squeeze(1), z.new_zeros(z.shape[0]))

    # -- the loss (rank_call: VocabShardImpl's) ----------------------------------------------------------
    def shard_loss(
        self, z: torch.Tensor, target: torch.Tensor, o: CEOptions, *, group: Any, vocab_start: int, vocab_size: int
    ) -> torch.Tensor:
        """This rank's part of linear+CE from its fp32 logits shard; the loss is the same on every rank (module
        docstring)."""
        size = z.shape[1]
        if o.softcap is not None:
            z = o.softcap * torch.tanh(z / o.softcap)
        valid = target != o.ignore_index
        local = torch.where(valid, target, torch.zeros_like(target)) - vocab_start
        owns = valid & self.owns_target(local, size)
        m = z.detach().amax(dim=1) if size else torch.full((z.shape[0],), -torch.inf)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        local_s = torch.exp(z - m[:, None]).sum(dim=1)
        lse = m + torch.log(_SumAcrossRanks.apply(local_s, group))
        z_y = _SumAcrossRanks.apply(self.target_logit(z, local, owns), group)
        cw = o.class_weights
        if cw is not None:
            cw = cw.to(device=z.device, dtype=torch.float32)
            w_shard = cw[vocab_start : vocab_start + size]
            w_y = torch.where(valid, cw[torch.where(valid, target, torch.zeros_like(target))], torch.zeros_like(m))
            S_w = cw.sum()
        else:
            w_shard, w_y, S_w = None, valid.to(torch.float32), torch.tensor(float(vocab_size))
        ce = (1 - o.label_smoothing) * w_y * (lse - z_y)
        if o.label_smoothing:
            wz = (z * w_shard[None, :]).sum(dim=1) if w_shard is not None else z.sum(dim=1)
            smooth = S_w * lse - _SumAcrossRanks.apply(wz, group)
            ce = ce + self.smoothing_weight(o.label_smoothing, vocab_size, size) * smooth * valid
        zl = torch.zeros_like(ce)
        if o.z_loss_scale:
            zlse = self.z_loss_lse(lse, m + torch.log(local_s))
            zl = torch.where(valid, o.z_loss_scale * zlse * zlse, zl)
        ce = torch.where(valid, ce, torch.zeros_like(ce))
        return self._reduce(o.reduction, ce, zl, w_y, valid)

    def _reduce(
        self, reduction: str, ce: torch.Tensor, zl: torch.Tensor, w_y: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """``mean`` (Σ ce / Σ w_y plus Σ ζ / n_valid; all-ignored per :attr:`all_ignored`), ``sum`` or ``none``."""
        if reduction == "none":
            return ce + zl
        if reduction == "sum":
            return ce.sum() + zl.sum()
        D, n = w_y.sum(), valid.sum().to(torch.float32)
        if self.all_ignored == "zero":
            D, n = torch.where(D == 0, torch.ones_like(D), D), n.clamp_min(1)
        return ce.sum() / D + zl.sum() / n


def vocab_parallel_impls() -> list[VocabParallelCE]:
    """``vocab_parallel[nan]`` and ``vocab_parallel[zero]``."""
    return [VocabParallelCE("vocab_parallel[nan]", "nan"), VocabParallelCE("vocab_parallel[zero]", "zero")]
