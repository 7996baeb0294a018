"""The third-party libraries numcheck's adapters call, collected from each family's known-divergence modules (the
pattern of impl names, the distribution, and how its installed release is read): whose release a report judged.
A new vendor's module adds its ``LIBRARIES`` here."""

from __future__ import annotations

import fnmatch
from typing import Callable

from numcheck.properties.distributed.linear_ce import known as dist_known
from numcheck.properties.fp8 import known_torchao
from numcheck.properties.linear_ce import known_cce, known_liger, known_te, known_torch
from numcheck.properties.linear_distill import known_liger as known_liger_distill
from numcheck.properties.linear_preference import known_liger as known_liger_preference

#: The libraries numcheck's adapters call, by impl name (fnmatch pattern): whose release a report judged.
ADAPTER_LIBRARIES: tuple[tuple[str, str, Callable[[], str | None]], ...] = (
    *known_te.LIBRARIES,
    *known_liger.LIBRARIES,
    *known_cce.LIBRARIES,
    *dist_known.LIBRARIES,
    *known_torch.LIBRARIES,
    *known_torchao.LIBRARIES,
    *known_liger_distill.LIBRARIES,
    *known_liger_preference.LIBRARIES,
)


def adapter_library(impl_name: str) -> tuple[str, str | None] | None:
    """``(library, installed release)`` of the third-party library numcheck's adapter ``impl_name`` calls, or
    ``None`` for an impl that is no adapter of one."""
    for pattern, library, release in ADAPTER_LIBRARIES:
        if fnmatch.fnmatchcase(impl_name, pattern):
            return library, release()
    return None
