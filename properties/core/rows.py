"""The rows of a covering design, and the seeded draws of a row's other fields: what the runner
(:mod:`numcheck.properties.core.runner`) needs of a family's covering design (linear+CE's:
:mod:`numcheck.properties.linear_ce.coverage`) to run its rows the same way in every process."""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from random import Random
from typing import Any, Iterator

from hypothesis import strategies as st
from hypothesis.control import BuildContext
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.internal.conjecture.providers import HypothesisProvider


@dataclass(frozen=True)
class Row:
    """One row of a covering design: ``values`` (dimension → value label, for messages), the case's fields it
    pins (``force``) and the options it turns on where declared (``require``)."""

    values: tuple[tuple[str, str], ...]
    force: dict[str, Any] = field(default_factory=dict, hash=False)
    require: frozenset[str] = frozenset()

    def label(self) -> str:
        """``dim=value, ...``: what the row pins."""
        return ", ".join(f"{d}={v}" for d, v in self.values)


# -- the draws of a row's other fields --------------------------------------------------------------------
class _NoConstants(HypothesisProvider):
    """hypothesis' own provider without its pool of constants collected from loaded modules: a row's draws must
    not depend on which modules are imported."""

    def _maybe_draw_constant(self, *args: Any, **kwargs: Any) -> None:
        return None


@contextlib.contextmanager
def seeded_data(key: str) -> Iterator[st.DataObject]:
    """A hypothesis ``st.data()`` object outside ``@given``, for one example: each draw generated as hypothesis'
    engine generates a fresh example, from a ``Random`` seeded by ``key`` (sha256, so the same in every
    process), inside a build context as for a test's example (``assume`` rejects, ``note`` is quiet): the other
    fields of a covering row, drawn by the property's own strategy. (hypothesis has no public API for a seeded
    draw outside ``@given``; this is its engine's ``ConjectureData``, provider and build context, which
    tests/self/properties/test_coverage.py pins.)"""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    data = ConjectureData(random=Random(seed), provider=_NoConstants)
    with BuildContext(data, is_final=False, wrapped_test=seeded_data):
        yield st.DataObject(data)
