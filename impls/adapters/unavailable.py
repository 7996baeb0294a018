"""The declaration of a third-party adapter that cannot run here (its library missing, unusable, or of an unknown
release): every adapter builds it with :func:`unavailable_support`, under every kind (linear+CE and distributed).

It declares nothing the missing library would have had to tell: no options (so no keyword a ``rank_call`` without
``**options`` cannot take), no autocast, no all-ignored convention, only the reduction(s) the impl's name fixes. Its
``requires`` gives the reason, so ``numcheck list`` prints the impl as unavailable with it and the suite, the report
and premerge leave it out with it; validation never finds an option the call cannot take (a guessed declaration
would make the impl BROKEN).
"""

from __future__ import annotations

import functools
from typing import Iterable

from numcheck.impls.protocols.linear_ce import LinearCESupport, make_support


def reason_of(text: str) -> str:
    """``support.requires`` of an unavailable impl (module level, so a distributed impl pickles)."""
    return text


def unavailable_support(reason: str, reductions: Iterable[str] = ("mean",)) -> LinearCESupport:
    """The declaration of an impl that cannot run here because of ``reason``.

    >>> s = unavailable_support("liger-kernel not installed")
    >>> s.unavailable_reason(), sorted(s.options), sorted(s.reductions)
    ('liger-kernel not installed', [], ['mean'])
    """
    return make_support(
        options=(),
        reductions=tuple(reductions),
        autocast=(),
        all_ignored=None,
        requires=functools.partial(reason_of, reason),
    )
