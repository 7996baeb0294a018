"""Known divergences of TransformerEngine's fused cross-entropy (``te_parallel_ce[...]``,
:mod:`numcheck.impls.adapters.transformer_engine`) and the environment artifact of its kernels under Triton's
interpreter (:data:`ARTIFACTS`), with the predicates that decide them, collected by
:mod:`numcheck.properties.linear_ce.known` (the machinery: :mod:`numcheck.properties.core.known`; the vocabulary-
parallel entries: :mod:`numcheck.properties.distributed.linear_ce.known`)."""

from __future__ import annotations

from typing import Any

import torch
from packaging.version import Version

from numcheck.properties.core.known import KnownDivergence, Releases
from numcheck.properties.core.tensors import kernel_store
from numcheck.properties.linear_ce.cases import Problem, Tensors


def te_release() -> str | None:
    """The TransformerEngine release the adapter loaded (:func:`numcheck.impls.adapters.transformer_engine.release`)."""
    from numcheck.impls.adapters import transformer_engine

    return transformer_engine.release()


def te_ignored_rows_counted(p: Problem) -> bool:
    """Whether ``p`` is a ``mean`` with some rows ignored and some not (V > 1: at V = 1 every loss and gradient is
    0, whatever the normalizer): there TransformerEngine 2.4–2.11 divides by all N rows, not the non-ignored ones."""
    if p.reduction != "mean" or p.V < 2 or p.ignored == 0 or p.ignored >= 1.0:
        return False
    from numcheck.properties.linear_ce.cases import build

    n_valid = int((build(p).target != p.ignore_index).sum())
    return 0 < n_valid < p.N


def te_per_row_upstream_dropped(p: Problem) -> bool:
    """Whether ``p`` is a ``none`` call whose per-row upstream gradient differs between rows (V > 1): TE before 2.8
    scales every row's gradient by the first row's upstream."""
    if p.reduction != "none" or p.upstream != "per_row" or p.N < 2 or p.V < 2:
        return False
    from numcheck.properties.linear_ce.cases import build

    up = build(p).upstream
    return up is not None and bool((up != up.reshape(-1)[0]).any())


def te_gradient_stored_in_logits(p: Problem, t: Tensors | None = None) -> Any:
    """The outputs TransformerEngine ≤ 2.17's fused CE gives on ``p``'s bf16 logits, emulated with exact arithmetic
    except its stores into the logits' dtype: forward stores ``(p_j − ε/V)/n`` (``mean``; ``none``: not divided)
    in the logits buffer, then adds ``−(1 − ε)/n`` to the target entry read back from it and stores that again;
    backward multiplies each stored entry by the upstream gradient and stores the product (skipped for a scalar
    upstream of exactly 1). Each store rounds as a Triton kernel's does here (:func:`~numcheck.properties.core.tensors.kernel_store`: to nearest,
    truncated under the interpreter). The loss is the float64 oracle's (these stores do not touch it); the GEMM's
    backward is exact and rounded once, as the model allows. ``n`` is the non-ignored count (2.12's normalizer;
    before 2.12 a case with ignored rows is :func:`te_ignored_rows_counted`'s); for ``none`` before 2.5 it is N,
    as those releases divide ``reduce_loss=False``'s gradient by the rows too (their entry in :data:`KNOWN`, which
    leaves V = 1 to this one: there the division is all that reaches the outputs, through these stores)."""
    import torch.nn.functional as F

    from numcheck.properties.linear_ce.cases import build
    from numcheck.properties.linear_ce.harness import ImplOutputs, run_oracle

    t = t if t is not None else build(p)
    low = t.weight.dtype
    b = t.bias.to(low) if t.bias is not None else None
    z = F.linear(t.x, t.weight, b).double()
    valid = t.target != p.ignore_index
    mean = p.reduction == "mean"
    n = max(int(valid.sum()), 1) if mean else (p.N if _te_divides_none_by_rows() else 1)
    eps = p.label_smoothing
    g = kernel_store(((torch.softmax(z, dim=-1) - eps / p.V) / n).float(), low).double()
    rows = torch.arange(p.N, device=z.device)
    y = torch.where(valid, t.target, torch.zeros_like(t.target))
    g[rows, y] = kernel_store((g[rows, y] - (1 - eps) / n).float(), low).double()
    g = torch.where(valid[:, None], g, torch.zeros_like(g))
    up = t.upstream
    if up is not None and not (up.numel() == 1 and float(up) == 1.0):
        scale = up.double().reshape(-1, 1) if not mean else up.double().reshape(1, 1)
        g = kernel_store((g * scale).float(), low).double()
    ref = run_oracle(p, t, all_ignored="zero")
    return ImplOutputs(
        loss=ref.loss.float(),
        z_loss=None,
        grad_x=(g @ t.weight.double()).to(low),
        grad_weight=(g.T @ t.x.double()).to(low),
        grad_bias=g.sum(0).to(low).to(t.bias.dtype) if t.bias is not None else None,
    )


def _te_divides_none_by_rows() -> bool:
    """Whether the loaded TransformerEngine release divides ``reduce_loss=False``'s gradient by the row count
    (before 2.5)."""
    release = te_release()
    return release is not None and Version(release) < Version("2.5")


def te_prerounded_gradient_fails(p: Problem, t: Tensors | None = None) -> bool:
    """Whether the stores of :func:`te_gradient_stored_in_logits` alone take ``p`` past the suite's accuracy
    judgement of the TE impl (bf16 parameters without autocast; fp32 stores are the model's own roundings)."""
    if p.dtype != "bfloat16" or p.autocast is not None or p.N == 0:
        return False
    from numcheck.impls.adapters import transformer_engine
    from numcheck.properties.linear_ce.accuracy import check_accuracy

    info = transformer_engine.load()
    if isinstance(info, str):
        return False
    mean = p.reduction == "mean"
    impl = transformer_engine.build_impl("te_parallel_ce[mean]" if mean else "te_parallel_ce[none]", mean, False, info)
    from numcheck.properties.linear_ce.cases import build

    t = t if t is not None else build(p)
    return not check_accuracy(impl, p, t=t, out=te_gradient_stored_in_logits(p, t)).ok


KNOWN: list[KnownDivergence] = [
    KnownDivergence(
        impls="te_parallel_ce[[]*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=lambda p: True,
        library="transformer-engine",
        summary="the backward of every call passing ignore_idx raises (5 gradients for 6 inputs)",
        reason=(
            "TransformerEngine 2.4.0-2.6.0.post1: CrossEntropyFunction.forward takes six inputs (ignore_idx was "
            "added in 2.4) but its backward still returns five gradients, so the backward of every call that "
            "passes ignore_idx raises 'function CrossEntropyFunctionBackward returned an incorrect number of "
            "gradients (expected 6, got 5)' (a call leaving it at its default passes five inputs and runs; the "
            "adapter passes it, as the declared ignore_index option needs): the documented ignore_idx cannot be "
            "trained through. 2.7 returns one per input. Measured on 2.4.0, 2.5.0, 2.6.0 and 2.6.0.post1 "
            "(docs/evidence/te_releases.txt); the same holds with TE's core installed (autograd raises it)."
        ),
        example=Problem(N=4, H=8, V=13, seed=0),
        releases=Releases("transformer-engine", ">=2.4,<2.7", te_release),
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]none*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=lambda p: p.reduction == "none" and p.N > 1 and p.V > 1,
        library="transformer-engine",
        summary="reduce_loss=False's gradient is divided by the row count (every gradient 1/N of the right one)",
        reason=(
            "TransformerEngine before 2.5 divides the gradient of reduce_loss=False (per-row losses) by the "
            "number of rows, as if the loss were their mean (cross_entropy_kernel: the softmax and the target's "
            "-(1-eps) are divided by n_non_ignore = n_rows whatever reduce_loss), while the loss it returns is "
            "the per-row one: every gradient 1/N of the right one (grad_x 3e5 times its bound at N = 7). 2.5 "
            "divides only for reduce_loss=True. Measured on 2.2.0 and 2.3.0; 2.4's code is the same but its "
            "backward raises first (the entry above)."
        ),
        example=Problem(N=7, H=8, V=13, reduction="none", seed=3),
        releases=Releases("transformer-engine", ">=2.2,<2.5", te_release),
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]none*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=te_per_row_upstream_dropped,
        library="transformer-engine",
        summary="reduce_loss=False scales every row's gradient by the first row's upstream gradient",
        reason=(
            "TransformerEngine before 2.8 scales the gradient of reduce_loss=False by the first row's upstream "
            "gradient for every row (element_mul_kernel loads grad_output_ptr without a row offset): a weighted "
            "per-token loss gets wrong gradients, and zero gradients everywhere when the first weight is 0. Fixed "
            "by TE pull request #2139 ('fix cross entropy vanishing gradients', Megatron-LM issue #1750), in 2.8. "
            "Measured on 2.2.0, 2.3.0 and 2.7.0 (grad_x 2.7e7 times its bound at N = 7); 2.4-2.6's backward "
            "raises first."
        ),
        example=Problem(N=7, H=8, V=13, reduction="none", upstream="per_row", seed=3),
        by_data=True,
        releases=Releases("transformer-engine", ">=2.2,<2.8", te_release),
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]mean*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=te_ignored_rows_counted,
        library="transformer-engine",
        summary="reduce_loss=True divides the loss and its gradient by all rows, ignored ones included",
        reason=(
            "TransformerEngine 2.4-2.11's reduce_loss=True divides the loss and its gradient by all N rows, "
            "ignored ones included (its docstring: 'averaged across the B*SQ dimension'), not by the non-ignored "
            "count as torch's mean does: with 3 of 7 rows ignored the loss is 4/7 of the mean (2.2e5 times the "
            "bound). 2.12 counts the non-ignored rows in the kernel (TE pull request #2476, 'fix ce loss "
            "calculation when some tokens are ignored'). Measured on 2.7.0, 2.8.0 and 2.11.0; 2.4-2.6's backward "
            "raises first; 2.2 and 2.3 have no ignore_idx."
        ),
        example=Problem(N=7, H=8, V=13, ignored=0.4, seed=2),
        by_data=True,
        releases=Releases("transformer-engine", ">=2.4,<2.12", te_release),
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=te_prerounded_gradient_fails,
        library="transformer-engine",
        summary="the gradient is kept in the bf16 logits buffer: confident rows lose the target's gradient",
        reason=(
            "TransformerEngine before 2.18 keeps the gradient in the bf16 logits buffer from forward on: it "
            "stores p_j/n rounded to bf16, reads the target's entry back and subtracts (1-eps)/n, and backward "
            "multiplies the stored entries by the upstream gradient and rounds again. On a confident row p_y "
            "rounds to 1, so the target's gradient p_y - 1 = -(1 - p_y) is lost (grad_x and grad_W 190-200 times "
            "their bounds on the example, every row's target leading by 8 + log V). 2.18 stores the gradient in "
            "fp32 ('so it is not quantized before backward'). Covered: bf16 cases where those stores alone, "
            "emulated exactly (te_gradient_stored_in_logits), fail the judgement. Measured on 2.2.0, 2.7.0, "
            "2.8.0, 2.11.0, 2.12.0 and 2.17.1 (docs/evidence/te_releases.txt)."
        ),
        example=Problem(N=7, H=8, V=13, dtype="bfloat16", regime="confident", seed=4),
        by_data=True,
        applies_to_tensors=te_prerounded_gradient_fails,
        releases=Releases("transformer-engine", ">=2.2,<2.18", te_release),
    ),
]


def interpreter_bf16_constant_wrong() -> bool:
    """Whether Triton's interpreter runs the kernels here and gets a bf16 value plus a Python float constant wrong
    (:func:`numcheck.impls.adapters.transformer_engine.interpreter_bf16_constant`)."""
    from numcheck.impls.adapters import transformer_engine

    got = transformer_engine.interpreter_bf16_constant()
    return got is not None and got != 1.75


#: Environment artifacts: what cannot be judged here because of the environment, not the library (the report lists
#: them as "not judged here"; ``--strict`` does not fail on them). Their cases are already out of the impl's
#: declaration here (the adapter leaves the dtype out with the reason), so the suite never draws them; these entries
#: name them beside the library's divergences.
ARTIFACTS: tuple[KnownDivergence, ...] = (
    KnownDivergence(
        impls="te_*[[]none*",
        properties=("*",),
        devices=("cpu",),
        applies=lambda p: p.dtype == "bfloat16" and interpreter_bf16_constant_wrong(),
        library="transformer-engine",
        summary="bf16 not judged: Triton's interpreter adds a float constant to a bf16 value wrongly, as this kernel does",
        reason=(
            "Interpreter artifact, not a TE defect (impls/adapters/transformer_engine.py, interpreter_limits): under "
            "Triton's interpreter a bf16 value plus a Python float constant comes back as garbage (0.25 + 1.5 gives "
            "6.4e37 with triton 3.9), and TE 2.5-2.17's reduce_loss=False kernel adds -(1 - label_smoothing) to the "
            "bf16 gradient it keeps in the logits buffer, so its bf16 gradients are ~1e37 here; compiled on an H200 "
            "the same releases are within 2e-3 of float64. The adapter leaves bf16 out of the declaration here."
        ),
        example=Problem(N=7, H=8, V=13, dtype="bfloat16", reduction="none", seed=0),
        releases=Releases("transformer-engine", ">=2.5,<2.18", te_release),
        artifact=True,
    ),
)


#: The library numcheck's TransformerEngine adapters call (:data:`numcheck.properties.libraries.ADAPTER_LIBRARIES`).
LIBRARIES = (("te_*", "transformer-engine", te_release),)
