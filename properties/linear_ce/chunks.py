"""How a linear+CE impl cuts a problem's rows into chunks, read from its declaration alone, and the shapes the suite
draws so that a property meets many chunks (or several) whatever the impl lets it set.

A chunked impl (one that sweeps the rows in chunks: Liger-Kernel, the built-ins, most fused kernels) tells the
suite its chunk size one of three ways, and the draws take the first that applies:

1. ``with_chunk_rows(n)``, a method returning the impl with ``n`` rows per chunk (the built-ins have it): an
   optional speed-up only. The draws run the variant of one row a chunk, so :data:`MANY_CHUNKS` chunks cost
   :data:`MANY_CHUNKS` rows.
2. The declaration (:class:`~numcheck.impls.protocols.linear_ce.LinearCESupport`): ``chunk_rows`` (a fixed size:
   the draws take N from ``(K−1)·chunk_rows + 1`` to ``K·chunk_rows`` rows, K chunks the last one ragged, however
   large the size) or ``chunk_rule`` (a function ``(N, H, V) -> rows per chunk``: the draws take the cheapest
   shapes of a grid on which the rule gives K chunks, :func:`rule_shapes`).
3. Nothing declared: N past :data:`UNDECLARED_CHUNK_ROWS`, the largest chunk size the suite assumes an impl may
   use without declaring it, so a draw crosses every such chunk boundary (and gives :data:`MANY_CHUNKS` chunks of
   any size up to ⌊N/MANY_CHUNKS⌋); :data:`SLOW_UNDECLARED_ROWS` where the impl also declares ``slow``.

The draws keep H and V small where N is large (:func:`v_cap`): the error a running sum across chunks adds
grows with the number of chunks, not with the size of each product, and the oracle and the bounds cost about
N·(V + :data:`ROW_COST_CELLS`) (measured, see there).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

from hypothesis import strategies as st

#: The fewest chunks of any many-chunk draw (an fp32 call's; every draw of a declared chunk size reaches it,
#: whatever the size). A running sum of K partials kept in bf16 errs by about √K·u·|partial| where the partials
#: share a sign (post_norm rows, a scalar reduction): measured on the narrow-accumulator mutants that declare
#: only bf16 or fp16, grad_weight at 1.04–1.81 of the bound with K = 129 and 1.41–6.82 with K = 257 (one-row
#: chunks, post_norm, 4 seeds each), the correct built-in at 0.07–0.25. The narrow dtypes' draws take more
#: (:data:`MANY_CHUNKS_BY_DTYPE`).
MANY_CHUNKS = 257

#: The chunks of a many-chunk draw in each dtype (:func:`many_chunks`): 2/u + 1. A running sum of comparable
#: increments kept in a format of unit roundoff u drops each one once it falls under half an ulp of the sum,
#: after about 1/(2u) to 1/u of them (bf16 128–256, fp16 1024–2048): from there on its error grows with every
#: chunk while the bound does not, and at 2/u chunks half of them are dropped. Measured on
#: tests/self/helpers/user_chunked.py (grad_weight error/bound of the running sum kept in the input's dtype,
#: post_norm, 'mean', 3 seeds per H×V of 2×4 to 8×24; its fp32-sum twin at 0.01–0.27 throughout):
#: bf16 over chunks of 7 rows: 257 chunks 0.38–3.4, 513 chunks 3.3–6.2; of 64 rows, 513 chunks 7.3–20;
#: of 1024 rows, 513 chunks 5.5–6.7. fp16 over chunks of 7 rows: 513 chunks 1.3–2.8, 1025 1.5–6.1, 2049
#: 2.0–8.1, 4097 3.0–16; of 64 rows: 1025 chunks 0.19–3.2, 2049 0.35–6.9, 4097 1.6–11.
MANY_CHUNKS_BY_DTYPE: dict[str, int] = {"bfloat16": 513, "float16": 4097, "float32": MANY_CHUNKS}

#: The most rows a many-chunk draw of a narrow dtype takes to reach its :data:`MANY_CHUNKS_BY_DTYPE` (it takes
#: :data:`MANY_CHUNKS` chunks of the declared size in any case). A judgement costs ≈ 6 µs a row at these
#: shapes (the oracle, the bounds and eager's run; 2^20 rows ≈ 6 s), and past 2^20 rows fp16 gains nothing:
#: 'mean''s gradient of the logits, |p − y|/N, is then 2^6 below fp16's smallest normal, and its subnormal
#: rounding, which the bound must allow a correct kernel, outweighs what a narrow running sum drops (measured
#: as above: fp16 over chunks of 1024 rows, 2049 chunks 0.05–0.49 of the bound, 4097 chunks 0.18–0.40; its
#: 'sum' passes fp16's largest value there). bf16 keeps fp32's range: 513 chunks of up to 2044 rows fit.
MANY_CHUNK_MAX_ROWS = 2**20

#: The fewest classes and hidden features of a many-chunk draw. Classes the rows rarely target keep p_ij > 0 in
#: every row, so their column of the logits' gradient has one sign and the chunks' partial sums add up (post_norm's
#: Zipf targets leave such classes from V = 4 on); with H ≥ 2 some column of x has an offset larger than its
#: noise. At V = 2, H = 1 the partial sums of a seed can cancel: measured as above, bf16, 513 chunks of 1024 rows,
#: seed 1: 0.29 of the bound at H=1, V=2, 5.5 at H=2, V=4.
MANY_CHUNK_MIN_V, MANY_CHUNK_MIN_H = 4, 2


def many_chunks(dtype: str, rows: int | None = None, slow: bool = False) -> int:
    """The chunks a many-chunk draw in ``dtype`` (a dtype name) spans for chunks of ``rows`` rows (``None``: any
    size): :data:`MANY_CHUNKS_BY_DTYPE` within :data:`MANY_CHUNK_MAX_ROWS` rows, at least :data:`MANY_CHUNKS`;
    :data:`MANY_CHUNKS` for an impl that declares ``slow`` (Triton's interpreter on a CPU launches a chunk's
    kernel in about 0.1 s: Liger's and numcheck's Triton impls there took 40–120 s a property at 513 chunks; the
    same impls compiled on a GPU declare ``slow=False`` and take every dtype's full count)."""
    if slow:
        return MANY_CHUNKS
    k = MANY_CHUNKS_BY_DTYPE.get(dtype, MANY_CHUNKS)
    if rows is not None:
        k = min(k, MANY_CHUNK_MAX_ROWS // rows)
    return max(MANY_CHUNKS, k)


#: Chunks of a "several chunks" draw (determinism, chunk invariance): a first, an interior and a last chunk, so
#: rows moved across a boundary land in a chunk of each kind.
SEVERAL_CHUNKS = 3

#: The largest chunk size (rows) assumed of an impl that declares none, so the draws for it take N past it.
#: Chunking exists to bound one chunk's logits, C·V values (and as many of their gradient), below the [N, V]
#: that an unchunked pass holds: at the smallest vocabulary of current LLM tokenizers (V = 32000: Llama 2,
#: Mistral) 8192 rows of fp32 logits are 1 GiB, at Llama 3's V = 128256 4 GiB, which is what chunking is there
#: to avoid. The chunk sizes of public code sit far below: Liger-Kernel's ⌈N/⌈V/H⌉⌉ is 256 rows at
#: N = 8192, H = 4096, V = 128256; cut-cross-entropy's blocks are 128 or 256 rows. A larger chunk size must be
#: declared (``chunk_rows``, ``chunk_rule``) to be met many times.
UNDECLARED_CHUNK_ROWS = 8192

#: The rows of a many-chunk draw of an impl that declares no chunk size and declares ``slow`` (Triton's
#: interpreter on a CPU: TransformerEngine's fused CE there, a program per row, 4.2 s of CPU per call at 513 rows,
#: 2.1 s at 257; past :data:`UNDECLARED_CHUNK_ROWS` a draw would cost minutes): :data:`MANY_CHUNKS`, the chunks
#: every other slow impl's many-chunk draws take (:func:`many_chunks`), as one-row chunks, enough for a bf16
#: running sum over rows to fail (MANY_CHUNKS' measurement); 513 before, bf16's 2/u + 1, which no other slow
#: impl's draws take. Its rows cannot cross a chunk size it does not declare anyway; compiled on a GPU the same
#: impl declares ``slow=False`` and takes :data:`UNDECLARED_CHUNK_ROWS` + 1 rows and more.
SLOW_UNDECLARED_ROWS = MANY_CHUNKS

#: Extra rows (past the minimum) a draw of a fixed chunk layout may add, so the last chunk's raggedness varies.
RAGGED_ROWS = 64

#: The oracle's and the bounds' cost per row, in logit cells (a row of V classes costs about V + this):
#: measured on a 2-core CPU at H = 8, bf16, post_norm, one accuracy judgement: ≈ 16 µs a row at V = 2 (N = 262145)
#: and ≈ 52 µs at V = 24 (N = 8193), so ≈ 1.7 µs a cell and 9 cells' worth a row.
ROW_COST_CELLS = 9

#: The logit cells (N·V) a many-chunk draw keeps V under, where N allows (V ≥ 2 always): the largest draw before
#: chunk sizes were read from the declaration, 2049 rows of V = 24.
DRAW_CELLS = 2049 * 24

#: The largest V (and H) of a many-chunk draw, as before (V ≤ 24, H ≤ 8): small, so the error comes from the
#: accumulation across chunks rather than from long dot products.
MAX_V, MAX_H = 24, 8


def rows_per_chunk(support: Any, N: int, H: int, V: int) -> int | None:
    """The rows per chunk ``support`` declares for an ``N × H`` problem of ``V`` classes (at most N), or ``None``
    when it declares neither ``chunk_rows`` nor ``chunk_rule``. A rule that fails on the shape raises
    ``ValueError`` naming the shape."""
    rows = getattr(support, "chunk_rows", None)
    rule = getattr(support, "chunk_rule", None)
    if rows is None and rule is not None:
        try:
            rows = rule(N, H, V)
        except Exception as exc:  # noqa: BLE001 - the impl's own rule
            raise ValueError(
                f"the declared chunk_rule raised {type(exc).__name__}: {exc} on N={N}, H={H}, V={V}"
            ) from exc
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"the declared chunk_rule returned {rows!r} on N={N}, H={H}, V={V}, not an int >= 1")
    return min(rows, N) if rows is not None else None


def chunk_count(support: Any, N: int, H: int, V: int) -> int | None:
    """⌈N / rows per chunk⌉ as ``support`` declares it (:func:`rows_per_chunk`), or ``None`` when undeclared."""
    rows = rows_per_chunk(support, N, H, V)
    return math.ceil(N / rows) if rows is not None else None


def cost(N: int, V: int) -> int:
    """What the oracle and the bounds of an ``N``-row, ``V``-class problem cost, in logit cells (relative)."""
    return N * (V + ROW_COST_CELLS)


def v_cap(N: int) -> int:
    """The largest V of a many-chunk draw of ``N`` rows: :data:`MAX_V` while N·V ≤ :data:`DRAW_CELLS`, never
    below 2."""
    return max(2, min(MAX_V, DRAW_CELLS // N))


#: The grid a chunk rule is searched over: hidden sizes, vocabularies (small ones, and powers of two and their
#: neighbours up to 2^17 + 1, where rules of Liger's kind give many chunks) and row counts (a multiple of the
#: target chunk count, times a power of two, and one past it).
RULE_H: tuple[int, ...] = tuple(range(1, MAX_H + 1))
RULE_V: tuple[int, ...] = tuple(sorted(set(range(2, MAX_V + 1)) | {2**j + d for j in range(5, 18) for d in (-1, 0, 1)}))
RULE_N_DOUBLINGS = 13

#: The most a rule's shape may cost (:func:`cost`): as much as the longest draw of a fixed chunk size
#: (:data:`MANY_CHUNK_MAX_ROWS` rows of :data:`MANY_CHUNK_MIN_V` classes).
RULE_COST_CAP = cost(MANY_CHUNK_MAX_ROWS, MANY_CHUNK_MIN_V)

#: How many of the cheapest shapes a rule's draws choose from (variety in H, V and N for the random draws).
RULE_SHAPES = 8


def _rule_grid(
    rule: Callable[[int, int, int], int], target: int, chunks: int, min_h: int, min_v: int
) -> list[tuple[int, int, int, int, int]]:
    """Every shape of the grid for a ``target`` chunk count (N = target·2^j or one more) within
    :data:`RULE_COST_CAP`, as ``(−chunks reached up to chunks, cost, N, H, V)``."""
    Ns = sorted({target * 2**j + d for j in range(RULE_N_DOUBLINGS) for d in (0, 1)})
    found: list[tuple[int, int, int, int, int]] = []
    for H in (h for h in RULE_H if h >= min_h):
        for V in (v for v in RULE_V if v >= min_v):
            for N in Ns:
                c = cost(N, V)
                if c > RULE_COST_CAP:
                    break
                rows = rule(N, H, V)
                k = math.ceil(N / min(max(int(rows), 1), N))
                found.append((-min(k, chunks), c, N, H, V))
    return found


@functools.lru_cache(maxsize=64)
def rule_shapes(
    rule: Callable[[int, int, int], int], chunks: int, min_h: int = 1, min_v: int = 2
) -> tuple[tuple[int, int, int], ...]:
    """The :data:`RULE_SHAPES` cheapest shapes ``(N, H, V)`` of the grid (:data:`RULE_H`, :data:`RULE_V` from
    ``min_h``, ``min_v`` on; N = chunks·2^j or one more) on which ``rule`` gives at least ``chunks`` chunks within
    :data:`RULE_COST_CAP`, cheapest first; where no shape of the grid does, those that give the most chunks of the
    grid and of the grid for the count reached (cheapest first): the first grid's N are multiples of a count the rule
    cannot reach, so its shapes giving the most chunks take more rows than that count needs. fp16's 4097 chunks under
    Liger's rule: 1025 at best on that grid, at N = 4097 (8.4M cells); on the grid for 1025, 1026 chunks at N = 1026
    (4.2M cells). Measured on tests/self/helpers/user_chunked.py (fp16, post_norm, one judgement each, seeds 1–4):
    the running sum kept in fp16 fails at 3.7–8.4 of the bound at N = 1026 (at N = 4097, 1.4 on seed 1), its
    fp32-sum twin passes at 0.22–0.38; N = 2049, V = 4097 (2049 chunks, off both grids) took 3× the CPU and the fp16
    sum failed at 1.4–7.9."""
    found = set(_rule_grid(rule, chunks, chunks, min_h, min_v))
    if (reached := -min(found)[0]) < chunks:  # short of the target: the grid of the count reached, once
        found |= set(_rule_grid(rule, reached, chunks, min_h, min_v))
    ordered = sorted(found)
    best = ordered[0][0]
    return tuple((N, H, V) for short, _, N, H, V in ordered if short == best)[:RULE_SHAPES]


@dataclass(frozen=True)
class Layout:
    """Where a property's draws put the chunk boundaries of ``impl``: the impl to run (``with_chunk_rows``'
    variant, or the impl itself), how its chunk size is known (``source``: ``"with_chunk_rows"``,
    ``"chunk_rows"``, ``"chunk_rule"`` or ``"undeclared"``), and the rows per chunk where fixed (``rows``) or the
    declared rule (``rule``)."""

    impl: Any
    source: str
    rows: int | None = None
    rule: Callable[[int, int, int], int] | None = None
    slow: bool = False

    def n_range(self, chunks: int) -> tuple[int, int]:
        """The rows a draw of ``chunks`` chunks takes, where the chunk size does not follow from the shapes: from
        (chunks − 1)·rows + 1 on (the last chunk ragged, 1 to min(rows, :data:`RAGGED_ROWS`) rows); past
        :data:`UNDECLARED_CHUNK_ROWS` where undeclared."""
        if self.rows is None and self.slow:
            return SLOW_UNDECLARED_ROWS, SLOW_UNDECLARED_ROWS + RAGGED_ROWS - 1
        if self.rows is None:
            return UNDECLARED_CHUNK_ROWS + 1, UNDECLARED_CHUNK_ROWS + RAGGED_ROWS
        lo = (chunks - 1) * self.rows + 1
        return lo, lo + min(RAGGED_ROWS, self.rows) - 1

    def shape_strategy(
        self, chunks: int, *, max_h: int = MAX_H, min_h: int = 1, min_v: int = 2
    ) -> st.SearchStrategy[tuple[int, int, int]]:
        """``(N, H, V)`` giving ``chunks`` chunks: one of the rule's shapes (:func:`rule_shapes`), else N from
        :meth:`n_range` (its ends first) with ``min_h`` ≤ H ≤ ``max_h`` and ``min_v`` ≤ V ≤ :func:`v_cap`, both
        kept small where N is large."""
        if self.rule is not None:
            return st.sampled_from(rule_shapes(self.rule, chunks, min_h, min_v))
        lo, hi = self.n_range(chunks)

        @st.composite
        def shape(draw: st.DrawFn) -> tuple[int, int, int]:
            N = draw(st.one_of(st.sampled_from(sorted({lo, hi})), st.integers(lo, hi)), label="N")
            cap = max(min_v, v_cap(N))
            H = draw(st.integers(min_h, max(min_h, min(max_h, cap // 3))), label="H")
            return N, H, draw(st.integers(min_v, cap), label="V")

        return shape()

    def describe(self, N: int, H: int, V: int) -> str:
        """What the drawn shape means for the impl's chunks, for a failure message."""
        if self.source == "undeclared" and self.slow:
            return (
                f"{N} rows: no chunk size declared (chunk_rows, chunk_rule) by a slow impl, so "
                f"{SLOW_UNDECLARED_ROWS} rows or a few more (numcheck.properties.linear_ce.chunks.SLOW_UNDECLARED_ROWS)"
            )
        if self.source == "undeclared":
            return (
                f"{N} rows: no chunk size declared (chunk_rows, chunk_rule), so N is past "
                f"{UNDECLARED_CHUNK_ROWS}, the largest chunk size assumed of such an impl "
                f"(numcheck.properties.linear_ce.chunks.UNDECLARED_CHUNK_ROWS)"
            )
        how = {
            "with_chunk_rows": "its with_chunk_rows variant",
            "chunk_rows": "the declared chunk_rows",
            "chunk_rule": f"the declared chunk_rule at H={H}, V={V}",
        }[self.source]
        rows = self.rows if self.rows is not None else rows_per_chunk(self.impl.support, N, H, V)
        return f"{N} rows in {math.ceil(N / rows)} chunks of {rows} ({how})"


def layout(impl: Any, speed_up_rows: int = 1) -> Layout:
    """The :class:`Layout` of ``impl``'s chunks: ``with_chunk_rows(speed_up_rows)`` where it has that method, else
    its declared ``chunk_rows`` or ``chunk_rule``, else undeclared."""
    if callable(getattr(impl, "with_chunk_rows", None)):
        return Layout(impl.with_chunk_rows(speed_up_rows), "with_chunk_rows", rows=speed_up_rows)
    s = impl.support
    if s.chunk_rows is not None:
        return Layout(impl, "chunk_rows", rows=s.chunk_rows)
    if getattr(s, "chunk_rule", None) is not None:
        return Layout(impl, "chunk_rule", rule=s.chunk_rule)
    return Layout(impl, "undeclared", slow=bool(s.slow))


def declares_chunks(impl: Any) -> bool:
    """Whether ``impl`` is chunked over rows by what it exposes or declares: ``with_chunk_rows``, ``chunk_rows``,
    ``chunk_rule``, or a grad_weight accumulation path other than one fp32 sum (``per_chunk_rounding``,
    ``param_dtype``: chunks whose size it leaves undeclared)."""
    s = impl.support
    return (
        callable(getattr(impl, "with_chunk_rows", None))
        or s.chunk_rows is not None
        or getattr(s, "chunk_rule", None) is not None
        or s.grad_accumulation != "fp32"
    )
