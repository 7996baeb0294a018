"""The linear-distill built-ins: ``linear_distill[eager]`` (logits materialised, autograd's backward) and
``linear_distill[chunked]`` (rows in chunks of :data:`CHUNK_ROWS`, the analytic backward formed in forward,
grad_weight accumulated in fp32 across chunks), both of the forward-KL, both-sides-temperature, token-mean
conventions (Liger-Kernel's). The arithmetic is :mod:`reference.numerics.linear_distill`'s.
"""

from __future__ import annotations

from numcheck.impls.protocols.linear_distill import DistillFunctionImpl, LinearDistillSupport
from numcheck.reference.numerics.linear_distill import chunked_loss, eager_loss

#: Rows per chunk of the chunked built-in (small, so the suite's draws make several chunks).
CHUNK_ROWS = 8


def _eager(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """Logits materialised in the compute dtype; fp32 log-softmax and divergence; autograd's backward."""
    return eager_loss(sx, sw, tx, tw, target, beta=beta, temperature=temperature, ignore_index=ignore_index)


def _chunked(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    """Rows in chunks of 8; the student's gradients formed in forward; grad_weight accumulated in fp32."""
    return chunked_loss(
        sx, sw, tx, tw, target, beta=beta, temperature=temperature, ignore_index=ignore_index, rows=CHUNK_ROWS
    )


def linear_distill_impls() -> list[DistillFunctionImpl]:
    """The built-ins, as :func:`numcheck.impls.registry.builtin_factories` lists them."""
    return [
        DistillFunctionImpl("linear_distill[eager]", _eager, LinearDistillSupport(), description=_eager.__doc__ or ""),
        DistillFunctionImpl(
            "linear_distill[chunked]",
            _chunked,
            LinearDistillSupport(chunk_rows=CHUNK_ROWS),
            description=_chunked.__doc__ or "",
        ),
    ]
