"""Distributed impls declared as a user declares them (``numcheck.dist_linear_ce_impl``,
``numcheck.tp_fp8_linear_impl`` on module-level functions), for the self tests that run the distributed suites
on them through ``--impl``: a correct vocabulary-parallel one, the same with grad_x left unreduced, one whose ranks
raise (the suite's failure must carry its message: it ran this impl, not a built-in), and a tensor-parallel FP8
linear."""

from __future__ import annotations

import numcheck
from numcheck.impls.builtin.tp_fp8_linear import tp_fp8_linear_impls
from numcheck.impls.builtin.vocab_parallel import VocabParallelCE
from numcheck.tests.self.helpers.dist_mutants import NoGradXAllReduce

_CORRECT = VocabParallelCE("declared_inner", "nan")
_BUGGY = NoGradXAllReduce("declared_inner_buggy", "nan")
_TP = tp_fp8_linear_impls()[1]  # current scaling

#: One rank's numerics, as the built-in vocab_parallel[nan] declares them.
_RANK = dict(
    dtypes=("float32", "bfloat16"),
    options=("bias", "ignore_index"),
    autocast=(),
    all_ignored="nan",
    world_sizes=(2,),
    backends=("gloo",),
)


@numcheck.dist_linear_ce_impl(name="declared_vocab_parallel", **_RANK)
def declared_vocab_parallel(
    x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100
):
    """The built-in vocabulary-parallel step, behind a user's declaration."""
    return _CORRECT.rank_call(
        x,
        weight_shard,
        target,
        bias_shard,
        group=group,
        vocab_start=vocab_start,
        vocab_size=vocab_size,
        reduction=reduction,
        ignore_index=ignore_index,
    )


@numcheck.dist_linear_ce_impl(name="declared_no_grad_x_all_reduce", **_RANK)
def declared_no_grad_x_all_reduce(
    x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100
):
    """grad_x left as the rank's partial (no all-reduce), behind a user's declaration."""
    return _BUGGY.rank_call(
        x,
        weight_shard,
        target,
        bias_shard,
        group=group,
        vocab_start=vocab_start,
        vocab_size=vocab_size,
        reduction=reduction,
        ignore_index=ignore_index,
    )


#: What :func:`declared_raises` raises on every rank.
RAISED = "declared_raises ran on this rank"


@numcheck.dist_linear_ce_impl(name="declared_raises", **_RANK)
def declared_raises(
    x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100
):
    """Raises :data:`RAISED` on every rank."""
    raise RuntimeError(RAISED)


@numcheck.tp_fp8_linear_impl(
    name="declared_tp_fp8", recipes=_TP.support.recipes, world_sizes=(1, 2), dtypes=("float32",), parallel=("column",)
)
def declared_tp_fp8(
    x,
    weight,
    bias=None,
    *,
    recipe,
    parallel,
    sequence_parallel,
    save_original_input,
    group,
    scale_log,
    scaling_state=None,
):
    """The built-in current-scaling tensor-parallel FP8 linear, behind a user's declaration."""
    return _TP(
        x,
        weight,
        bias,
        recipe=recipe,
        parallel=parallel,
        sequence_parallel=sequence_parallel,
        save_original_input=save_original_input,
        group=group,
        scale_log=scale_log,
        scaling_state=scaling_state,
    )
