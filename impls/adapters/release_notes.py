"""The notes the report header and ``numcheck list`` show for third-party libraries whose release numcheck cannot tell
(:func:`release_notes`). Above the adapters, which read their releases through
:mod:`numcheck.impls.adapters.releases`."""

from __future__ import annotations

from typing import Callable

from numcheck.impls.adapters import cce, liger, megatron, transformer_engine
from numcheck.impls.adapters.releases import Release


def release_notes() -> dict[str, str]:
    """For the report header and ``numcheck list``: each third-party library that is installed here but whose
    release numcheck cannot tell, mapped to why (distribution name -> one line), e.g.
    ``{"liger-kernel": "…/fused_linear_cross_entropy.py is listed by liger-kernel distributions of different
    releases: 0.8.4 at /venv/site-packages, 0.8.5 at /venv/site-packages"}``.

    A library in this mapping is judged, but none of its known divergences (keyed on a release range) can apply: a
    divergence the suite records as known for that release is reported as a failure instead. A library that is not
    installed, or whose release is known, is absent; the mapping is empty in the usual case. Reads each adapter's
    cached loader, so it is cheap once the impls were discovered.

    >>> isinstance(release_notes(), dict)
    True
    """
    readers: dict[str, Callable[[], Release | None]] = {
        liger.DISTRIBUTION: liger.release_info,
        transformer_engine.DISTRIBUTION: transformer_engine.release_info,
        cce.DISTRIBUTION: cce.release_info,
        megatron.DISTRIBUTION: megatron.release_info,
    }
    notes: dict[str, str] = {}
    for library, read in readers.items():
        got = read()
        if got is not None and got.unknown:
            notes[library] = got.note or "its release is unknown"
    return notes
