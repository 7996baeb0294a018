"""Triton's interpreter with :func:`numcheck.impls.interpreter.share_language_patches`,
:func:`~numcheck.impls.interpreter.skip_unasserted_overflow_checks` and
:func:`~numcheck.impls.interpreter.tabulate_np_dtypes` installed (as :mod:`numcheck.impls.triton_lang` installs
them under ``TRITON_INTERPRET=1``): a kernel calling nested ``@triton.jit`` helpers computes bitwise what the
shipped interpreter computes, redoes the language swap once per launch instead of once per helper call, and leaves
``triton.language`` as it found it after the launch; its integer ops build no overflow check that the interpreter
would drop unasserted; a dtype's numpy type comes from a table built once, with the same answers; and
:func:`~numcheck.impls.interpreter.reserve_launch_stack` runs each launch in a frame-stack chunk of its own."""

from __future__ import annotations

import pytest
import torch

from numcheck.impls import interpreter
from numcheck.impls.triton_lang import INTERPRET, tl, triton

pytestmark = pytest.mark.skipif(not INTERPRET or triton is None, reason="needs Triton's interpreter (no CUDA here)")

if INTERPRET and triton is not None:

    @triton.jit
    def _softplus(x):
        return tl.log(1.0 + tl.exp(x))

    @triton.jit
    def _scaled(x, s):
        return _softplus(x) * s

    @triton.jit
    def _rows_kernel(X, Y, N, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for k in range(0, 4):  # four nested calls per program
            x = tl.load(X + row * N + cols, mask=cols < N, other=0.0)
            acc += _scaled(x + k, 0.5)
        tl.store(Y + row * N + cols, acc, mask=cols < N)


def _run() -> torch.Tensor:
    x = torch.linspace(-3.0, 3.0, 6 * 5, dtype=torch.float32).reshape(6, 5)
    y = torch.empty_like(x)
    _rows_kernel[(6,)](x, y, 5, BLOCK=8)
    return y


def _count_swaps(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The calls that reach the interpreter's own ``_patch_lang`` (through the shared one where installed)."""
    from triton.runtime import interpreter as ti

    calls: list[object] = []
    shared = interpreter._SHARED.get("installed")
    own = shared.original if shared is not None else ti._patch_lang

    def counted(fn: object) -> object:
        if getattr(fn, "__name__", "") in ("_rows_kernel", "_softplus", "_scaled"):  # not a library function's
            calls.append(fn)
        return own(fn)

    if shared is not None:
        monkeypatch.setattr(shared, "original", counted)
    else:
        monkeypatch.setattr(ti, "_patch_lang", counted)
    return calls


def test_installed_under_the_interpreter():
    """Importing numcheck's Triton module under the interpreter installs it (Triton 3.9's interpreter)."""
    from triton.runtime import interpreter as ti

    if not hasattr(ti, "_LangPatchScope"):
        pytest.skip("this Triton's interpreter patches the language once and never restores it: nothing to share")
    assert interpreter.share_language_patches() and "installed" in interpreter._SHARED


def test_nested_calls_swap_once_per_launch_and_compute_the_same_bits(monkeypatch):
    """One swap per launch with sharing (the launch's own), one per launch plus one per nested call without it
    (6 programs × 4 loop turns × 2 helpers); the outputs are bitwise equal, and after each launch every builtin of
    ``triton.language`` is the original again."""
    from triton.runtime import interpreter as ti

    if not interpreter.share_language_patches():
        pytest.skip("this Triton's interpreter has nothing to share")
    before = {n: getattr(tl, n) for n in ("exp", "log", "load", "program_id")}
    calls = _count_swaps(monkeypatch)
    shared_out = _run()
    assert len(calls) == 1, len(calls)
    assert {n: getattr(tl, n) for n in before} == before
    try:
        interpreter.unshare_language_patches()
        calls = _count_swaps(monkeypatch)
        own_out = _run()
        assert len(calls) == 1 + 6 * 4 * 2, len(calls)
    finally:
        monkeypatch.undo()
        interpreter.share_language_patches()
    assert ti._patch_lang.__self__ is interpreter._SHARED["installed"]
    assert torch.equal(shared_out, own_out)
    assert {n: getattr(tl, n) for n in before} == before


def _count_overflow_asserts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What each ``device_assert`` the interpreter's integer ops make returns (the kernel asserts nothing itself)."""
    from triton.runtime import interpreter as ti

    sem = ti.interpreter_semantic
    own = sem.device_assert
    returned: list[object] = []

    def counted(cond, msg, mask):
        returned.append(own(cond, msg, mask))
        return returned[-1]

    monkeypatch.setattr(sem, "device_assert", counted)
    return returned


def test_overflow_checks_that_cannot_fire_are_skipped_and_compute_the_same_bits(monkeypatch):
    """Installed under the interpreter (its options say debug=False): the kernel's integer ops build no overflow
    check; with the interpreter's own options each builds one, which ``device_assert`` drops unasserted (returns
    None); the outputs are bitwise equal either way."""
    from triton.runtime import interpreter as ti

    if not hasattr(ti.interpreter_builder.options, "sanitize_overflow"):
        pytest.skip("this Triton's interpreter has no overflow checks")
    assert not ti.interpreter_builder.options.sanitize_overflow, "importing impls.triton_lang installs it"
    assert interpreter.skip_unasserted_overflow_checks()
    assert not ti.interpreter_builder.options.sanitize_overflow and not ti.interpreter_builder.options.debug
    returned = _count_overflow_asserts(monkeypatch)
    skipped_out = _run()
    assert returned == []
    try:
        interpreter.restore_overflow_checks()
        assert ti.interpreter_builder.options.sanitize_overflow
        own_out = _run()
        assert returned and all(r is None for r in returned), returned
    finally:
        monkeypatch.undo()
        interpreter.skip_unasserted_overflow_checks()
    assert torch.equal(skipped_out, own_out)


def test_overflow_checks_stay_where_the_interpreter_asserts(monkeypatch):
    """With options that say debug=True (its asserts fire), nothing is skipped."""
    import dataclasses

    from triton.runtime import interpreter as ti

    if not hasattr(ti.interpreter_builder.options, "sanitize_overflow"):
        pytest.skip("this Triton's interpreter has no overflow checks")
    interpreter.restore_overflow_checks()
    try:
        debug = dataclasses.replace(ti.interpreter_builder.options, debug=True, sanitize_overflow=True)
        monkeypatch.setattr(ti.interpreter_builder, "options", debug)
        assert not interpreter.skip_unasserted_overflow_checks()
        assert ti.interpreter_builder.options is debug
    finally:
        monkeypatch.undo()
        interpreter.skip_unasserted_overflow_checks()


def test_np_dtype_table_answers_as_the_interpreter_and_computes_the_same_bits():
    """The table answers every Triton dtype (and pointers, and blocks of either) as the interpreter's own
    function does, and is installed in its place; a kernel's outputs are bitwise equal with and without it."""
    from triton.runtime import interpreter as ti

    if not hasattr(ti, "_get_np_dtype"):
        pytest.skip("this Triton's interpreter has no _get_np_dtype")
    assert "own" in interpreter._TABLE, "importing impls.triton_lang installs it"
    assert interpreter.tabulate_np_dtypes() and ti._get_np_dtype is not interpreter._TABLE["own"]
    own = interpreter._TABLE["own"]
    kinds = [getattr(tl, n) for n in ("int1", "float16", "float32", "bfloat16", "int32", "uint64", "float8e4nv")]
    kinds += [tl.pointer_type(tl.float32), tl.block_type(tl.float32, [4]), tl.block_type(tl.pointer_type(tl.int8), [2])]
    for k in kinds:
        assert ti._get_np_dtype(k) == own(k), k
    tabled_out = _run()
    try:
        interpreter.untabulate_np_dtypes()
        assert ti._get_np_dtype is own
        own_out = _run()
    finally:
        interpreter.tabulate_np_dtypes()
    assert torch.equal(tabled_out, own_out)


def _at_depth(n: int, fn):
    """``fn()`` called ``n`` Python frames deeper than here."""
    return fn() if n == 0 else _at_depth(n - 1, fn)


def _run_one_row() -> torch.Tensor:
    x = torch.linspace(-3.0, 3.0, 5, dtype=torch.float32).reshape(1, 5)
    y = torch.empty_like(x)
    _rows_kernel[(1,)](x, y, 5, BLOCK=8)
    return y


def _worst_faults_per_launch(depths: range) -> int:
    """The most minor page faults one launch of the one-program kernel took, over launches from each depth."""
    import resource

    worst = 0
    for d in depths:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        _at_depth(d, _run_one_row)
        worst = max(worst, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return worst


def test_launches_run_in_a_stack_chunk_of_their_own_and_compute_the_same_bits():
    """Launched from every fifth depth over more than a 16 KiB frame-stack chunk (one ``_at_depth`` frame per
    step), no launch maps fresh pages call after call: a launch whose hot calls straddle a chunk's edge takes
    page faults per call (measured without the reserve: over 100 at 12 of these 80 depths, up to 748; with it,
    19 at most); the outputs are bitwise equal with and without it."""
    from triton.runtime import interpreter as ti

    if not hasattr(getattr(ti, "InterpretedFunction", None), "run"):
        pytest.skip("this Triton's interpreter has no InterpretedFunction.run")
    assert "own" in interpreter._RESERVED, "importing impls.triton_lang installs it"
    assert interpreter.reserve_launch_stack() and ti.InterpretedFunction.run is not interpreter._RESERVED["own"]
    _run_one_row()  # the first launch rewrites the kernel and makes numpy's first allocations
    assert _worst_faults_per_launch(range(0, 400, 5)) < 100
    reserved_out = _run()
    try:
        interpreter.unreserve_launch_stack()
        own_out = _run()
    finally:
        interpreter.reserve_launch_stack()
    assert torch.equal(reserved_out, own_out)
