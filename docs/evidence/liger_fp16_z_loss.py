"""Evidence for the known divergence "Liger-Kernel's fp16 z-loss" (numcheck's known-divergence data): the z-loss
Liger returns is kept in the input dtype, so with fp16 parameters it loses the rows that are fp16 subnormals
(``mean`` over many rows) and overflows for ``sum``, while the loss, which contains it, is fp32.

Cause, read in Liger's source (ops/fused_linear_cross_entropy.py and ops/cross_entropy.py, the same from 0.5.3,
which added return_z_loss, to 0.8.5): the forward allocates ``z_loss_1d = torch.zeros(BT, dtype=_input.dtype)``;
the CE kernel stores each row's ``lse_square_scale * lse * lse`` (divided by ``n_non_ignore`` under ``mean``) into
it; the result is ``torch.sum(z_loss_1d)``, an fp16 tensor. ``loss_1d`` is fp32.

For each case the script prints Liger's returned z-loss and loss, the float64 z-loss on the exact logits (the
oracle's), the emulation of the buffer on Liger's fp16 logits
(:func:`numcheck.properties.linear_ce.known_liger.liger_z_loss_buffer`: rows rounded to fp16, summed in fp32,
rounded to fp16), whether Liger equals the emulation bit for bit, how many rows are fp16 subnormals, and whether
the known divergence's predicate covers the case. ``liger_fp16_z_loss.txt`` beside this file is its output for
0.5.8, 0.7.0, 0.8.2 and 0.8.5 on CPU (Triton interpreter).

Usage: python docs/evidence/liger_fp16_z_loss.py [DIR ...]   (as docs/evidence/liger_releases.py: a folder per
release, or ``installed``)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from liger_releases import per_release, release_line  # noqa: E402

CASES = [dict(N=n, H=1, V=2, dtype="float16", z_loss_scale=1e-4, seed=0) for n in (64, 128, 256, 512, 2049)] + [
    dict(N=2049, H=1, V=2, dtype="float16", z_loss_scale=0.5, reduction="sum", regime="large", seed=0),
    dict(N=11, H=16, V=37, dtype="float16", z_loss_scale=1e-2, seed=0),
]


def here() -> None:
    from numcheck.impls import interpreter

    interpreter.arrange()
    import torch

    from numcheck.impls.registry import builtin
    from numcheck.properties.linear_ce.cases import Problem, build
    from numcheck.properties.linear_ce.known_liger import liger_z_loss_buffer, liger_z_loss_buffer_diverges

    print(release_line())
    impl = builtin("liger[accum=None]")
    if "z_loss" not in impl.support.options or not impl.support.returns_z_loss:
        print("  this release declares no returned z-loss")
        return
    for fields in CASES:
        p = Problem(**fields)
        t = build(p)
        loss, z = impl(
            t.x,
            t.weight,
            t.target,
            None,
            reduction=p.reduction,
            ignore_index=p.ignore_index,
            z_loss_scale=p.z_loss_scale,
        )
        logits = t.x.double() @ t.weight.double().T
        rows = p.z_loss_scale * logits.logsumexp(-1) ** 2 / (p.N if p.reduction == "mean" else 1)
        exact = float(rows.sum())
        _, emulated = liger_z_loss_buffer(p)
        sub = int((rows.abs() < torch.finfo(torch.float16).smallest_normal).sum())
        print(
            f"  {p.short()}: liger z_loss {float(z):.6g} ({z.dtype}), exact {exact:.6g}, rel. error "
            f"{(float(z) - exact) / exact:+.3g}; buffer emulated {emulated:.6g} (equal: {float(z) == emulated}); "
            f"{sub}/{p.N} rows subnormal; loss {float(loss):.6g} ({loss.dtype}); covered: "
            f"{liger_z_loss_buffer_diverges(p)}",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1:] == ["--here"]:
        here()
    else:
        sys.exit(per_release(__file__, sys.argv[1:] or ["installed"]))
