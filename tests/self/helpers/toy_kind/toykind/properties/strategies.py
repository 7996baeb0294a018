"""The toy family's draws: a :class:`~toykind.properties.cases.ToyCase` inside a declaration."""

from __future__ import annotations

from hypothesis import strategies as st

from toykind.properties.cases import ToyCase


@st.composite
def toy_cases(draw: st.DrawFn, support: object) -> ToyCase:
    """A case in one of ``support``'s dtypes, 1 to 300 elements."""
    return ToyCase(
        n=draw(st.integers(1, 300)), dtype=draw(st.sampled_from(support.dtypes)), seed=draw(st.integers(0, 2**16))
    )
