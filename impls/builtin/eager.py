"""``eager``: the plain PyTorch composition every optimized impl is measured beside, as a built-in impl.

The function and its declaration are :mod:`numcheck.reference.numerics.eager`'s, where the judge takes its
yardstick from too (:func:`numcheck.properties.linear_ce.harness.eager_yardstick`).
"""

from __future__ import annotations

from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport
from numcheck.reference.numerics import eager


def eager_impls() -> list[FunctionImpl]:
    """The eager baseline, declared for everything."""
    return [
        FunctionImpl(
            name=eager.NAME,
            fn=eager.eager_linear_ce,
            support=LinearCESupport(**eager.DECLARATION),
            description=eager.DESCRIPTION,
        )
    ]
