"""Toy impls a user would bring: a correct sum, and one off by 1e-3·Σ|x| (beyond the bound γ_{n−1}·Σ|x| for
n < 16000)."""

from __future__ import annotations

from toykind.protocol import toy_impl


@toy_impl(name="toy_sum")
def impl(x):
    """torch's own sum."""
    return x.sum()


@toy_impl(name="toy_off")
def off(x):
    """The sum plus 1e-3·Σ|x|."""
    return x.sum() + 1e-3 * x.abs().sum()
