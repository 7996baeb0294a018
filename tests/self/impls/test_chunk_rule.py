"""A chunked impl's chunk size as a declaration: ``chunk_rows`` or ``chunk_rule`` (a function of N, H, V),
checked where it is declared, read by the tolerance model (the chunk count of a narrow running sum) and by the
draws (:mod:`numcheck.properties.linear_ce.chunks`)."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch.nn.functional as F

from numcheck import LinearCESupport, linear_ce_impl, make_support
from numcheck.errors import InvalidDeclaration
from numcheck.properties.linear_ce import chunks
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.tolerance import error_model


def _ce(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)


def _raise_site(excinfo: pytest.ExceptionInfo) -> str:
    """``file:line`` of the line in this file that made the raising declaration (the innermost frame here)."""
    entry = [e for e in excinfo.traceback if str(e.path) == __file__][-1]
    return f"{__file__}:{entry.lineno + 1}"


def _v_over_h(N: int, H: int, V: int) -> int:
    """Liger-Kernel's rule: about ⌈V/H⌉ chunks."""
    return 1 << (-(-N // -(-V // H)) - 1).bit_length()


def _fails_on_one_row(N: int, H: int, V: int) -> int:
    return N // (N - 1)


#: (declaration, words its message must hold). Each lambda is the user's declaring line.
BAD: dict[str, tuple[Callable[[], Any], tuple[str, ...]]] = {
    "not_callable": (
        lambda: linear_ce_impl(name="m", chunk_rule=64)(_ce),
        ("chunk_rule=64 is not callable", "chunk_rule=lambda N, H, V: 64"),
    ),
    "both": (lambda: make_support(chunk_rows=64, chunk_rule=_v_over_h), ("both chunk_rows=64 and chunk_rule",)),
    "raises": (
        lambda: linear_ce_impl(name="m", chunk_rule=_fails_on_one_row)(_ce),
        ("raised ZeroDivisionError", "on N=1, H=1, V=1", "_fails_on_one_row"),
    ),
    "zero": (lambda: make_support(chunk_rule=lambda N, H, V: 0), ("returned 0 on N=1, H=1, V=1", "int >= 1")),
    "float": (lambda: make_support(chunk_rule=lambda N, H, V: N / 2), ("returned 0.5", "int >= 1")),
    "bool": (lambda: LinearCESupport(chunk_rule=lambda N, H, V: True), ("returned True",)),
    "arity": (lambda: make_support(chunk_rule=lambda N: N), ("raised TypeError",)),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_chunk_rule_is_refused_at_the_users_line(case: str) -> None:
    """A chunk rule that is no function of (N, H, V) to an int >= 1, or one declared beside chunk_rows, raises
    InvalidDeclaration at the declaring line, saying what the rule did and the fix."""
    declare, words = BAD[case]
    with pytest.raises(InvalidDeclaration) as excinfo:
        declare()
    msg = str(excinfo.value)
    assert msg.startswith(_raise_site(excinfo) + ": "), f"{case}: message does not start at the declaring line:\n{msg}"
    for w in words:
        assert w in msg, f"{case}: message lacks {w!r}:\n{msg}"


def test_chunk_rule_sets_the_chunk_count_of_the_bound() -> None:
    """The tolerance model's chunk count K (a running sum rounded after each chunk: K·u) is ⌈N / rule(N, H, V)⌉
    for a declared rule, ⌈N / chunk_rows⌉ for a fixed size, and N (one chunk a row) for neither."""
    p = Problem(N=300, H=4, V=100, dtype="bfloat16")
    ruled = make_support(grad_accumulation="param_dtype", chunk_rule=_v_over_h)
    fixed = make_support(grad_accumulation="param_dtype", chunk_rows=64)
    neither = make_support(grad_accumulation="param_dtype")
    assert error_model(ruled, p, {}).chunks == math.ceil(300 / _v_over_h(300, 4, 100)) == 19
    assert error_model(fixed, p, {}).chunks == 5
    assert error_model(neither, p, {}).chunks == 300


class _Impl:
    """A minimal impl object: a name, a kind and a support (the layouts read nothing else)."""

    def __init__(self, support: LinearCESupport) -> None:
        self.name, self.kind, self.support = "layout_probe", "linear-ce", support


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("rows", [1, 7, 64, 1024])
def test_fixed_chunk_size_draws_reach_many_chunks(rows: int, dtype: str) -> None:
    """A declared chunk_rows, however large, gives many-chunk draws of many_chunks(dtype) ≥ MANY_CHUNKS chunks,
    the last one ragged, with few classes and features where the rows are many."""
    lay = chunks.layout(_Impl(make_support(chunk_rows=rows)))
    assert lay.source == "chunk_rows"
    k = chunks.many_chunks(dtype, rows)
    lo, hi = lay.n_range(k)
    assert k >= chunks.MANY_CHUNKS and math.ceil(lo / rows) == math.ceil(hi / rows) == k
    assert k == chunks.MANY_CHUNKS_BY_DTYPE[dtype] or hi > chunks.MANY_CHUNK_MAX_ROWS - rows
    assert f"{lo} rows in {k} chunks of {rows} (the declared chunk_rows)" == lay.describe(lo, 2, 4)


def test_chunk_rule_draws_choose_shapes_with_many_chunks() -> None:
    """For a declared rule the draws take the cheapest shapes of a grid on which it gives many chunks: Liger's
    rule gives them at V ≫ H."""
    for k in (chunks.MANY_CHUNKS, chunks.many_chunks("bfloat16")):
        shapes = chunks.rule_shapes(_v_over_h, k, chunks.MANY_CHUNK_MIN_H, chunks.MANY_CHUNK_MIN_V)
        assert shapes, k
        for N, H, V in shapes:
            assert math.ceil(N / min(_v_over_h(N, H, V), N)) >= k and H >= chunks.MANY_CHUNK_MIN_H, (k, N, H, V)
            assert chunks.cost(N, V) <= chunks.RULE_COST_CAP
    lay = chunks.layout(_Impl(make_support(chunk_rule=_v_over_h)))
    assert lay.source == "chunk_rule" and lay.describe(257, 1, 257) == (
        "257 rows in 257 chunks of 1 (the declared chunk_rule at H=1, V=257)"
    )


def test_a_rule_that_never_gives_many_chunks_gets_its_most() -> None:
    """A rule whose chunk count the grid cannot raise to the target (at most 16 chunks) gets the shapes with the
    most chunks it gives, cheapest first, rather than none."""
    shapes = chunks.rule_shapes(lambda N, H, V: max(1, -(-N // 16)), chunks.MANY_CHUNKS)
    assert shapes and all(math.ceil(N / max(1, -(-N // 16))) == 16 for N, _, _ in shapes)


def test_a_rule_short_of_the_target_gets_the_cheapest_shapes_of_its_most() -> None:
    """Liger's rule cannot give fp16's many chunks within the cost cap; its draws take the most chunks it gives, at
    the cheapest shapes that give them, not at the rows of the unreachable target's grid (N = 4097: twice the cost,
    and the cost is that of every judgement of the draw)."""
    k = chunks.many_chunks("float16")
    shapes = chunks.rule_shapes(_v_over_h, k, chunks.MANY_CHUNK_MIN_H, chunks.MANY_CHUNK_MIN_V)
    reached = {math.ceil(N / min(_v_over_h(N, H, V), N)) for N, H, V in shapes}
    assert len(reached) == 1 and chunks.MANY_CHUNKS_BY_DTYPE["bfloat16"] < min(reached) < k, (shapes, reached)
    first = chunks._rule_grid(_v_over_h, k, k, chunks.MANY_CHUNK_MIN_H, chunks.MANY_CHUNK_MIN_V)
    most = min(first)[0]
    cheapest_there = min(c for short, c, *_ in first if short == most)
    assert -most <= min(reached)
    assert max(chunks.cost(N, V) for N, _, V in shapes[:2]) * 2 <= cheapest_there, (shapes, cheapest_there)


def test_undeclared_draws_cross_every_assumed_chunk_size() -> None:
    """An impl that declares no chunking gets draws past UNDECLARED_CHUNK_ROWS rows, said so in the message."""
    lay = chunks.layout(_Impl(make_support()))
    lo, _ = lay.n_range(chunks.MANY_CHUNKS)
    assert lay.source == "undeclared" and lo > chunks.UNDECLARED_CHUNK_ROWS
    assert "no chunk size declared" in lay.describe(lo, 2, 4)


def test_slow_impls_draw_fewer_rows_and_chunks() -> None:
    """An impl that declares ``slow`` (Triton's interpreter on a CPU) gets MANY_CHUNKS chunks in every dtype and,
    declaring no chunk size, SLOW_UNDECLARED_ROWS rows, both said in the message; the same impl not slow gets the
    full counts."""
    assert chunks.many_chunks("bfloat16", 1, slow=True) == chunks.MANY_CHUNKS < chunks.many_chunks("bfloat16", 1)
    slow = chunks.layout(_Impl(make_support(slow=True)))
    lo, hi = slow.n_range(chunks.MANY_CHUNKS)
    assert lo == chunks.SLOW_UNDECLARED_ROWS < hi < chunks.UNDECLARED_CHUNK_ROWS
    assert "SLOW_UNDECLARED_ROWS" in slow.describe(lo, 2, 4)
    assert chunks.layout(_Impl(make_support(slow=False))).n_range(chunks.MANY_CHUNKS)[0] > chunks.UNDECLARED_CHUNK_ROWS


def test_slow_impls_draw_long_batches_in_the_coarsest_compute_dtype_only() -> None:
    """A slow impl's long-batch draws take the coarsest compute dtype it declares (bf16: 257-513 rows, plain and
    AMP), never fp16's 2049 rows; fp16 where it is the only narrow one; the same impl not slow draws every mode;
    every draw still passes its compute dtype's exact integers."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from numcheck.properties.linear_ce.strategies import LONG_N_BY_COMPUTE, long_batch_modes, long_batch_problems

    every = dict(dtypes=("float32", "bfloat16", "float16"), autocast=("bfloat16", "float16"))
    slow, fast = make_support(slow=True, **every), make_support(slow=False, **every)
    assert {c for _, c in long_batch_modes(slow)} == {"bfloat16"}
    assert {k for k, _ in long_batch_modes(slow)} == {"plain", "amp"}
    assert {c for _, c in long_batch_modes(fast)} == {"bfloat16", "float16"}
    only_fp16 = make_support(slow=True, dtypes=("float32", "float16"), autocast=("float16",))
    assert {c for _, c in long_batch_modes(only_fp16)} == {"float16"}

    @settings(max_examples=20, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draws(data):
        p = data.draw(long_batch_problems(slow))
        compute = p.autocast or p.dtype
        assert compute == "bfloat16" and p.N in LONG_N_BY_COMPUTE["bfloat16"], p

    draws()
