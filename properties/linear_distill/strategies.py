"""The linear-distill draws: a :class:`~properties.linear_distill.cases.DistillCase` inside a declaration.

Sizes are the smallest that reach each regime (CPU CI): N ≤ 24 rows, H ≤ 16, V ≤ 48; ``chunks`` draws N to make
3 to 16+ chunks of the impl's declared rows (at most :data:`MAX_CHUNKED_ROWS` rows), the last one ragged: an
accumulator across chunks errs with their count; for a ``chunk_rule`` (chunks from the shape, as Liger's ⌈V/H⌉)
it draws V ≫ H on 9 to 40 rows instead, which keeps an interpreted kernel cheap."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from numcheck.properties.core.device import DEVICE
from numcheck.properties.linear_distill.cases import DistillCase

#: β inside (0, 1): a few values exact in binary and a few not.
INNER_BETAS: tuple[float, ...] = (0.5, 0.25, 0.1, 0.7, 0.9)
#: Temperatures ≠ 1 (exact in binary and not).
TEMPERATURES: tuple[float, ...] = (0.5, 2.0, 3.0, 0.7)
UPSTREAMS: tuple[float, ...] = (1.0, 0.75, 2.0)
#: The most rows a many-chunk draw takes (16 chunks of the chunked built-in's 8 rows).
MAX_CHUNKED_ROWS = 128


def _n_rows(draw: st.DrawFn, support: Any, H: int, V: int, chunks: bool) -> int:
    if not chunks:
        return draw(st.integers(1, 24), label="N")
    rows = support.rows_per_chunk(MAX_CHUNKED_ROWS, H, V)
    if rows >= MAX_CHUNKED_ROWS:
        return draw(st.integers(8, 24), label="N")
    chunks = draw(st.integers(3, max(3, (MAX_CHUNKED_ROWS - 1) // rows)), label="chunks")
    return min(chunks * rows + draw(st.integers(1, max(rows - 1, 1)), label="ragged"), MAX_CHUNKED_ROWS)


@st.composite
def distill_cases(
    draw: st.DrawFn,
    support: Any,
    *,
    beta: float | None = None,
    temperature: float | None = None,
    chunks: bool = False,
    ignored: bool | None = None,
) -> DistillCase:
    """A case in one of ``support``'s dtypes using only its declared options; ``beta``, ``temperature`` pin those,
    ``ignored`` forces (True) or forbids (False) ignored rows."""
    if chunks and support.chunk_rule is not None:  # chunks from the shape (Liger's ⌈V/H⌉): V ≫ H, N small
        H, V = draw(st.integers(2, 6), label="H"), draw(st.integers(24, 48), label="V")
        N = draw(st.integers(9, 40), label="N")
    else:
        H, V = draw(st.integers(2, 16), label="H"), draw(st.integers(2, 48), label="V")
        N = _n_rows(draw, support, H, V, chunks)
    betas = INNER_BETAS + ((0.0, 1.0) if support.beta_endpoints else ())
    b = beta if beta is not None else draw(st.sampled_from(betas), label="beta")
    if temperature is None:
        temperature = draw(st.sampled_from(TEMPERATURES), label="T") if "temperature" in support.options else 1.0
    can_ignore = "ignore_index" in support.options and N > 1
    ign = 0
    if can_ignore and ignored is not False:
        some = st.integers(1, N - 1)
        ign = draw(some if ignored else st.one_of(st.just(0), some), label="ignored")
    return DistillCase(
        N=N,
        H=H,
        V=V,
        dtype=str(draw(st.sampled_from(sorted(support.dtypes, key=str)), label="dtype")).removeprefix("torch."),
        beta=b,
        temperature=temperature,
        ignored=ign,
        ignore_index=draw(st.sampled_from((-100, -1)), label="ignore_index"),
        scale=draw(st.sampled_from((1.0, 2.0, 6.0)), label="scale"),
        teacher_scale=draw(st.sampled_from((1.0, 3.0, 8.0)), label="teacher_scale"),
        upstream=draw(st.sampled_from(UPSTREAMS), label="upstream"),
        seed=draw(st.integers(0, 2**16), label="seed"),
        device=DEVICE,
    )
