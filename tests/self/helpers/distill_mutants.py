"""The linear-distill mutants: each a passing built-in (:mod:`impls.builtin.linear_distill`) with one bug, declared
as the built-in is, beside the suite test that must catch it (:data:`CAUGHT_BY`, the drawn tests of
:data:`numcheck.properties.linear_distill.suite.DISTILL_SUITE`). ``--impl
numcheck.tests.self.helpers.distill_mutants:MUTANTS`` loads them all.
"""

from __future__ import annotations

import torch

from numcheck.impls.protocols.linear_distill import DistillFunctionImpl, LinearDistillSupport
from numcheck.reference.linear_distill import DistillConvention, jsd_terms, terms_sum
from numcheck.reference.numerics.linear_distill import chunked_loss, eager_loss
from numcheck.tests.self.helpers.mutant_table import caught_by_table

_BOTH = DistillConvention()


def _loss_bf16_sum(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """Chunked (2-row chunks), the chunks' loss sums added in bf16, declaring the built-in's fp32 path."""
    return chunked_loss(
        sx,
        sw,
        tx,
        tw,
        target,
        beta=beta,
        temperature=temperature,
        ignore_index=ignore_index,
        rows=2,
        loss_sum=torch.bfloat16,
    )


def _rounded_logits(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """Logits from a GEMM in the input dtype, then cast to fp32, declaring fp32 logits."""
    return eager_loss(sx, sw, tx, tw, target, beta=beta, temperature=temperature, ignore_index=ignore_index)


def _counts_ignored(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """The sum over rows divided by all N rows, ignored ones included, declaring the non-ignored tokens."""
    conv = DistillConvention(denominator="rows")
    return eager_loss(
        sx, sw, tx, tw, target, beta=beta, temperature=temperature, ignore_index=ignore_index, convention=conv
    )


def _student_temperature(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """The temperature divides the student's logits only, declaring both."""
    conv = DistillConvention(temperature_on="student")
    return eager_loss(
        sx, sw, tx, tw, target, beta=beta, temperature=temperature, ignore_index=ignore_index, convention=conv
    )


def _drops_temperature(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """A wrapper that never passes the temperature on (T = 1), declaring the option."""
    return eager_loss(sx, sw, tx, tw, target, beta=beta, temperature=1.0, ignore_index=ignore_index)


def _teacher_gets_grad(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """The teacher's logits left in the graph: its input and weight receive gradients."""
    log_q = torch.log_softmax(torch.nn.functional.linear(sx, sw).float() / temperature, -1)
    log_p = torch.log_softmax(torch.nn.functional.linear(tx, tw).float() / temperature, -1)
    kept = target != ignore_index
    rows = terms_sum(jsd_terms(log_q, log_p, float(beta), "forward_kl"))
    return torch.where(kept, rows, torch.zeros_like(rows)).sum() / kept.sum()


def _reverse_at_zero(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """The other library convention (β = 0 the reverse KL), declaring forward_kl."""
    conv = DistillConvention(beta_zero="reverse_kl")
    return eager_loss(
        sx, sw, tx, tw, target, beta=beta, temperature=temperature, ignore_index=ignore_index, convention=conv
    )


def _mutant(name: str, fn, **support) -> DistillFunctionImpl:
    return DistillFunctionImpl(f"mutant_distill_{name}", fn, LinearDistillSupport(**support), description=fn.__doc__)


loss_bf16_sum = _mutant("loss_bf16_sum", _loss_bf16_sum, chunk_rows=2)
rounded_logits = _mutant("rounded_logits", _rounded_logits, logits_dtype="float32", dtypes=("bfloat16",))
counts_ignored = _mutant("counts_ignored", _counts_ignored)
student_temperature = _mutant("student_temperature", _student_temperature)
drops_temperature = _mutant("drops_temperature", _drops_temperature)
teacher_gets_grad = _mutant("teacher_gets_grad", _teacher_gets_grad)
reverse_at_zero = _mutant("reverse_at_zero", _reverse_at_zero)

MUTANTS, CAUGHT_BY = caught_by_table(
    [
        (loss_bf16_sum, "distill_chunk_invariance"),
        (rounded_logits, "distill_accuracy"),
        (counts_ignored, "distill_accuracy"),
        (student_temperature, "distill_temperature_scaling"),
        (drops_temperature, "distill_declared_options_take_effect"),
        (teacher_gets_grad, "distill_teacher_frozen"),
        (reverse_at_zero, "distill_beta_endpoints"),
    ]
)
