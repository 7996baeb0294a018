"""Known divergences of Cut Cross-Entropy (``cce[...]``, :mod:`numcheck.impls.adapters.cce`), with the predicate
of its gradient filtering, collected by :mod:`numcheck.properties.linear_ce.known` (the machinery:
:mod:`numcheck.properties.core.known`)."""

from __future__ import annotations

import torch

from numcheck.properties.core.known import KnownDivergence, library_release
from numcheck.properties.linear_ce.cases import Problem, Tensors


def cce_filtering_may_skip(p: Problem, block_cols: int | None = None, t: Tensors | None = None) -> bool:
    """Whether cut-cross-entropy's default gradient filtering can skip a backward block of ``p``
    (``block_cols``: classes per block; default the installed release's) on tensors ``t`` (default
    ``build(p)``'s).

    The backward kernel tiles (valid rows) × classes into blocks (128 × 128 in 25.1.1; one class wide, the worst
    case, when autotuned or unknown) and skips a block only when *every* |softmax − onehot| in it is below
    filter_eps = finfo(dtype).eps/32 (padded lanes are 0). The classes of a block are not contiguous: with
    filtering on, the forward averages each class's logit over the call's rows and the backward takes the
    classes in that order (``cce.py:31,87``: ``argsort(logit_avg)``), so that low classes share blocks. Which
    rows and classes share a block therefore depends on the call (two_calls' halves, a permutation). Every
    skip needs one valid row with at least as many entries below the threshold as the smallest block has
    classes (V mod 128, else 128), and this asks exactly that, on the float64 softmax of the problem's own
    operands with a 2× margin for the kernel's fp32 evaluation: it follows the data (confident rows, V past
    ~1/filter_eps), not a regime name. The rows are taken :data:`FILTER_ROW_ELEMENTS` logits at a time
    (one block for every drawn problem of the suite; a production shape never forms [N, V] in float64), and
    the answer is the first block's that has such a row."""
    from numcheck.impls.adapters import cce
    from numcheck.properties.linear_ce.cases import build

    cols = block_cols or getattr(cce.load(), "backward_block_cols", None) or 1
    t = build(p) if t is None else t
    valid = t.target != p.ignore_index
    if not bool(valid.any()):
        return False
    x, w = t.x[valid], t.weight.double()
    y = t.target[valid].long()
    need = min(p.V % cols or cols, p.V)  # the smallest block's classes
    step = max(1, FILTER_ROW_ELEMENTS // p.V)
    for r0 in range(0, x.shape[0], step):
        z = x[r0 : r0 + step].double() @ w.T + (t.bias.double() if t.bias is not None else 0.0)
        if p.softcap is not None:
            z = p.softcap * torch.tanh(z / p.softcap)
        g = z.softmax(dim=-1)
        g[torch.arange(g.shape[0], device=g.device), y[r0 : r0 + step]] -= 1.0
        small = (g.abs() < 2 * torch.finfo(p.compute_dtype).eps / 32).sum(dim=1)
        if bool((small >= need).any()):
            return True
    return False


#: Logits (rows × V) :func:`cce_filtering_may_skip` forms in float64 at once (1 GiB).
FILTER_ROW_ELEMENTS = 2**27


KNOWN: list[KnownDivergence] = [
    KnownDivergence(
        impls="cce[[]filter_eps=*",
        properties=("*",),
        devices=("cuda",),
        applies=lambda p: p.softcap is not None,
        library="cut-cross-entropy",
        summary="softcap lets the padded vocabulary lanes into the log-sum-exp: wrong loss unless V is a multiple of 128",
        reason=(
            "cut-cross-entropy 25.1.1's kernels with softcap let the padded vocabulary lanes of a 128-class "
            "block, capped at s·tanh(-inf/s) = -s, into the log-sum-exp: the example (N=H=V=1, softcap=1; "
            "exact loss 0, zero gradients) gave loss 4.57 and gradients 0.28 / -0.74 on an H200; the loss is off "
            "at every V not a multiple of 128 (4.4 at V=1, 0.22 at V=129, 0.002 at V=127) and right at V=128 "
            "and 256 (docs/evidence/cce_softcap.txt). With softcap=5 the leak is e^-5-sized and can pass the "
            "bounds."
        ),
        example=Problem(N=1, H=1, V=1, dtype="bfloat16", softcap=1.0),
    ),
    KnownDivergence(
        impls="cce[[]filter_eps=default[]]",
        properties=("*",),
        devices=("cuda",),
        applies=cce_filtering_may_skip,
        library="cut-cross-entropy",
        summary="default gradient filtering zeroes grad_x/grad_weight entries below finfo(dtype).eps/32 (inexact by design)",
        reason=(
            "cut-cross-entropy's default gradient filtering (filter_eps='high' = finfo(dtype).eps/32) skips "
            "every backward block whose |softmax - onehot| are all below it, so those grad_x / grad_weight "
            "entries come back zero: on confident rows (the example), and at V=1025 with ordinary logits for "
            "640 of 1025 grad_weight rows. Inexact by design (filter_eps=None is exact); every property "
            "compares against exact gradients, so each case with some entry below the threshold is covered."
        ),
        example=Problem(N=16, H=32, V=256, dtype="bfloat16", regime="confident", seed=0),
        by_data=True,
        applies_to_tensors=lambda p, t: cce_filtering_may_skip(p, t=t),
    ),
    KnownDivergence(
        impls="cce[[]impl=torch_compile[]]",
        # any test under AMP: which draws a worker ran earlier decides which graph a call finds compiled
        properties=("*",),
        devices=("cuda",),
        applies=lambda p: p.autocast is not None,
        library="cut-cross-entropy",
        summary="impl='torch_compile' reuses the graph compiled under the other autocast dtype",
        reason=(
            "cut-cross-entropy's impl='torch_compile' (a torch.compile'd F.linear + F.cross_entropy) reuses "
            "the graph compiled under one autocast dtype when the same process calls it under the other: on "
            "an H200 with torch 2.11 an fp16 call after a bf16 one returns bf16 eager's loss and grad_x (to "
            "1e-6), 3.4e-3 from fp16 eager's (torch 2.13 on CPU recompiles). Which graph a call finds depends "
            "on the process's compile history (a bf16 call after an fp16 one was wrong too, in a worker with "
            "other graphs compiled), so every AMP case is covered and no single example reproduces it in a "
            "test worker. docs/evidence/cce_compile_autocast.py shows it in a fresh process."
        ),
        example=Problem(N=35, H=16, V=61, dtype="float32", autocast="float16", seed=0),
        history_dependent="docs/evidence/cce_compile_autocast.py",
    ),
]

#: The library numcheck's ``cce`` adapter calls (:data:`numcheck.properties.libraries.ADAPTER_LIBRARIES`).
LIBRARIES = (("cce[[]*", "cut-cross-entropy", lambda: library_release("cut-cross-entropy")),)
