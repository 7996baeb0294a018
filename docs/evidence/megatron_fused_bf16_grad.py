"""Evidence: megatron-core's fused_vocab_parallel_cross_entropy returns the gradient of fp32 logits rounded to
bf16 (its output is docs/evidence/megatron_fused_bf16_grad.txt).

Run from the repository root: ``python docs/evidence/megatron_fused_bf16_grad.py`` (gloo on CPU, world sizes 1, 2
and 4 through numcheck's DistPool). For each world size, every rank computes its shard of the logits
z_r = x·W_rᵀ + b_r in the problem's dtype, upcast to fp32 as the adapter does, and differentiates the sum of the
non-ignored per-token losses of the fused and of the unfused (``tensor_parallel.vocab_parallel_cross_entropy``)
release functions with respect to z_r. Here the float64 gradient is formed by hand, softmax(z) − onehot(y) on the
non-ignored rows, from the same rounded z; the script prints each one's error, whether the fused gradient is
bitwise the unfused one rounded to bf16, and then what numcheck's dist_accuracy makes of the adapter on the same
case, first under the impl's own model (the known divergence switched off) and then as the suite judges it.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from numcheck.errors import PropertyFailure
from numcheck.impls.adapters.megatron import MegatronVocabParallel, megatron_version
from numcheck.impls.protocols.dist_linear_ce import shard_bounds
from numcheck.properties.distributed.linear_ce import known as dist_known
from numcheck.properties.distributed.linear_ce.cases import DistCase
from numcheck.properties.distributed.linear_ce.props import dist_accuracy
from numcheck.properties.distributed.pool.pool import DistPool
from numcheck.properties.linear_ce.cases import Problem, build

PROBLEM = Problem(N=7, H=5, V=16, bias=True, ignored=0.3, seed=3)
TIMEOUT_S = 300.0


def rank_grads(rank: int, world_size: int, group: Any, args: tuple) -> dict[str, torch.Tensor]:
    """This rank's per-token losses and the gradient of the non-ignored losses' sum w.r.t. its fp32 logits shard,
    through the fused and the unfused release functions."""
    from megatron.core import parallel_state as ps
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

    x, w, b, target, valid = args
    out = {}
    for name in ("fused", "unfused"):
        z = torch.nn.functional.linear(x, w, b).detach().requires_grad_(True)
        tgt = torch.where(valid, target, torch.zeros_like(target))
        if name == "fused":
            loss = fused_vocab_parallel_cross_entropy(z.float()[None], tgt[None], group)[0]
        else:
            ps._TENSOR_MODEL_PARALLEL_GROUP, ps._MPU_TENSOR_MODEL_PARALLEL_RANK = group, None
            ps._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE = None
            loss = vocab_parallel_cross_entropy(z.float(), tgt)
            ps._TENSOR_MODEL_PARALLEL_GROUP = None
        torch.where(valid, loss, torch.zeros_like(loss)).sum().backward()
        out[f"loss_{name}"], out[f"dz_{name}"] = loss.detach(), z.grad
    return out


def by_hand(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The float64 per-token losses and gradient of the non-ignored losses' sum w.r.t. the (rounded) logits."""
    t = build(p)
    z = torch.nn.functional.linear(t.x, t.weight, t.bias).double()
    valid = t.target != t.options.ignore_index
    y = torch.where(valid, t.target, torch.zeros_like(t.target))
    lse = z.logsumexp(dim=-1)
    loss = lse - z.gather(1, y[:, None])[:, 0]
    g = torch.softmax(z, dim=-1)
    g[torch.arange(p.N), y] -= 1.0
    return loss, g * valid[:, None], valid


def release_table(p: Problem) -> None:
    """The gradient errors of both release functions at P = 1, 2, 4."""
    t = build(p)
    loss64, g64, valid = by_hand(p)
    for P in (1, 2, 4):
        args = []
        for r in range(P):
            lo, hi = shard_bounds(p.V, P, r)
            args.append((t.x, t.weight[lo:hi].contiguous(), t.bias[lo:hi].contiguous(), t.target, valid))
        ranks = DistPool.get(P, "gloo").run(rank_grads, args, TIMEOUT_S)
        fused = torch.cat([r["dz_fused"] for r in ranks], dim=1)
        unfused = torch.cat([r["dz_unfused"] for r in ranks], dim=1)
        nz = g64 != 0
        for name, g in (("fused", fused), ("unfused", unfused)):
            err = (g.double() - g64).abs()
            print(
                f"  P={P} {name:8s} dz dtype {str(g.dtype):14s} max |dz - dz64| / max |dz64| = "
                f"{float(err.max() / g64.abs().max()):.3e}; element-wise max relative "
                f"{float((err[nz] / g64[nz].abs()).max()):.3e}; loss max |err| "
                f"{float((ranks[0][f'loss_{name}'].double() - loss64)[valid].abs().max()):.3e}"
            )
        same = torch.equal(fused, unfused.to(torch.bfloat16).to(unfused.dtype))
        print(
            f"  P={P} fused dz bitwise == unfused dz rounded to bf16: {same}; fused dz == unfused dz: "
            f"{torch.equal(fused, unfused)}"
        )


def suite_judgement(p: Problem) -> None:
    """dist_accuracy on the adapter at P = 1, 2, 4: the impl's own model, then the suite's (divergence known)."""
    impl = MegatronVocabParallel(fused=True)
    saved = dist_known.DIST_KNOWN
    for label, entries in (("impl's own model (divergence switched off)", ()), ("as the suite judges it", saved)):
        dist_known.DIST_KNOWN = entries
        for P in (1, 2, 4):
            case = DistCase(problem=p, world_size=P, placement="boundary")
            try:
                print(f"  {label}, P={P}: holds, worst error/bound {dist_accuracy(impl, case)['error/bound']:.3f}")
            except PropertyFailure as exc:
                failing = [ln.strip() for ln in str(exc).splitlines() if "beyond bound" in ln]
                print(f"  {label}, P={P}: FAILS\n    " + "\n    ".join(failing))
    dist_known.DIST_KNOWN = saved


def main() -> int:
    print(f"megatron-core {megatron_version()}, torch {torch.__version__}, gloo on CPU")
    for p in (PROBLEM, PROBLEM.replace(dtype="bfloat16")):
        print(f"\n{p!r}: gradient of the logits (release functions, fp32 logits upcast from {p.dtype})")
        release_table(p)
        print(f"{p!r}: numcheck's dist_accuracy on megatron_fused_vocab_parallel (targets on shard boundaries)")
        suite_judgement(p)
    return 0


if __name__ == "__main__":
    # Run the importable module's main: the ranks unpickle rank_grads by its module's name (this folder is on
    # sys.path), and in a rank ``__main__`` is another program.
    import megatron_fused_bf16_grad

    sys.exit(megatron_fused_bf16_grad.main())
