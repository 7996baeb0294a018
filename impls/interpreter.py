"""Whether Triton kernels run compiled or under Triton's interpreter, and the one place that decides it.

Triton reads ``TRITON_INTERPRET`` when ``triton.language`` is first imported (torch imports it as a side effect
of entering a dispatch mode or ``torch.compile``), so the choice must be made before that. Importing numcheck
never sets it: the suite's entry points (the pytest plugin when it collects numcheck's tests, the ``numcheck``
command line, :func:`numcheck.check`) call :func:`arrange` first, and ``numcheck list`` says which mode is live.

>>> from numcheck.impls import interpreter
>>> interpreter.mode() in ("compiled", "interpreter", "none")
True
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from typing import Any, Callable

import torch


def arrange() -> None:
    """Without CUDA, ask for Triton's interpreter (``TRITON_INTERPRET=1``) unless the caller set it already."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def active() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for the interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def too_late() -> bool:
    """Whether triton's language module was imported before the interpreter was asked for (then it cannot take
    effect in this process: its own functions are not interpreted)."""
    return active() is False and "triton.language" in sys.modules


def unready_reason(whose: str) -> str | None:
    """Why ``whose`` Triton kernels (a possessive: ``"Liger's"``) cannot run in this process, or ``None``: they
    need a CUDA device, or the interpreter asked for before triton was imported."""
    if torch.cuda.is_available() or active():
        return None
    if too_late():
        return (
            f"no CUDA device, and triton was imported before TRITON_INTERPRET=1 was set, so {whose} Triton "
            "kernels cannot run under the interpreter in this process: set TRITON_INTERPRET=1 in the "
            "environment, or call numcheck.impls.interpreter.arrange() before triton is imported"
        )
    return (
        f"no CUDA device and TRITON_INTERPRET is not set: {whose} Triton kernels need one or the other "
        "(numcheck's entry points set it through numcheck.impls.interpreter.arrange())"
    )


def mode() -> str:
    """``compiled`` (CUDA), ``interpreter`` (no CUDA, ``TRITON_INTERPRET=1``) or ``none`` (no CUDA, no interpreter:
    Triton kernels cannot run)."""
    if torch.cuda.is_available():
        return "compiled"
    return "interpreter" if active() else "none"


class _SharedPatches:
    """The two replacements :func:`share_language_patches` installs into Triton's interpreter module ``ti``: a
    launch that counts how deep in launches the interpreter is (``GridExecutor.__call__``), and a ``_patch_lang``
    that does nothing for a nested call whose builtins are all swapped already."""

    def __init__(self, ti: Any, tl: Any) -> None:
        self.ti, self.tl = ti, tl
        self.original, self.launch = ti._patch_lang, ti.GridExecutor.__call__
        # Each object _patch_lang swaps builtins on, with the names that are builtins there now (unswapped).
        self.names = {id(p): self._builtin_names(p) for lang in (tl, tl.core) for p in self.reached(lang)}
        self.depth = 0
        self.seen: set[int] = set()  # objects found swapped in this launch: they stay so until it restores them

    def _builtin_names(self, pkg: Any) -> tuple[str, ...]:
        return tuple(n for n, m in inspect.getmembers(pkg) if self.tl.core.is_builtin(m))

    def reached(self, lang: Any) -> tuple[Any, ...]:
        """The objects ``_patch_lang`` swaps builtins on for ``lang`` (tl also has tl.math)."""
        tl = self.tl
        return (lang, lang.tensor, *((lang.math,) if lang is tl else ()), tl.core.tensor_descriptor_base)

    def swapped(self, pkg: Any) -> bool:
        """Whether none of ``pkg``'s builtin names is a builtin now."""
        if id(pkg) not in self.seen and not any(
            self.tl.core.is_builtin(getattr(pkg, n, None)) for n in self.names[id(pkg)]
        ):
            self.seen.add(id(pkg))
        return id(pkg) in self.seen

    def patch_lang(self, fn: Any) -> Any:
        """``_patch_lang``, skipped (an empty scope) for a nested call that would swap nothing."""
        tl = self.tl
        langs = [v for v in fn.__globals__.values() if v is tl or v is tl.core]
        if self.depth and langs and all(self.swapped(p) for lang in langs for p in self.reached(lang)):
            return self.ti._LangPatchScope()
        return self.original(fn)

    def counted_launch(self) -> Callable[..., Any]:
        """``GridExecutor.__call__``, counting the launches under way."""
        shared, launch = self, self.launch

        @functools.wraps(launch)
        def call(executor: Any, *args: Any, **kwargs: Any) -> Any:
            shared.depth += 1
            shared.seen.clear()
            try:
                return launch(executor, *args, **kwargs)
            finally:
                shared.depth -= 1
                shared.seen.clear()

        return call


#: The installed :class:`_SharedPatches` (empty where :func:`share_language_patches` has not installed one).
_SHARED: dict[str, _SharedPatches] = {}


def share_language_patches() -> bool:
    """Make Triton's interpreter patch ``triton.language`` once per launch instead of once per device-function call.

    Under ``TRITON_INTERPRET=1`` a launch swaps ``triton.language``'s builtins for interpreted ones and restores
    them afterwards; Triton 3.9 also redoes that swap (``_patch_lang``: ``inspect.getmembers`` over ``tl``,
    ``tl.core``, ``tl.tensor``, ``tl.math``) at every call of a nested ``@triton.jit`` function, in every program
    instance, and then finds every builtin already swapped: a no-op that took about a third of the CPU time of
    numcheck's split_fp32 kernels on many one-row chunks (their CE kernel calls helpers per vocabulary block).
    Here a nested call made during a launch skips it when every builtin it would swap (the names
    ``triton.language`` held as builtins when this was installed, on each object the function's globals reach) is
    already swapped, which is exactly when it would change nothing; otherwise, and for every launch, the
    interpreter's own ``_patch_lang`` runs. What a kernel computes is unchanged
    (tests/self/impls/test_interpreter.py).

    Installed by :mod:`impls.triton_lang` when it imports triton under the interpreter. Returns whether it is
    installed: ``False`` for a Triton without this structure (3.2's interpreter patches once and never
    restores), where triton cannot be imported, or where the language is swapped already (mid-launch)."""
    if _SHARED:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except Exception:  # noqa: BLE001 - no triton: nothing to speed up
        return False
    if not all(hasattr(ti, n) for n in ("_patch_lang", "_LangPatchScope", "GridExecutor", "InterpretedFunction")):
        return False
    shared = _SharedPatches(ti, tl)
    if not all(shared.names.values()):  # already swapped: leave it alone
        return False
    ti._patch_lang, ti.GridExecutor.__call__ = shared.patch_lang, shared.counted_launch()
    _SHARED["installed"] = shared
    return True


def unshare_language_patches() -> None:
    """Undo :func:`share_language_patches` (Triton's interpreter as shipped again); a no-op where not installed."""
    shared = _SHARED.pop("installed", None)
    if shared is not None:
        shared.ti._patch_lang, shared.ti.GridExecutor.__call__ = shared.original, shared.launch


def skip_unasserted_overflow_checks() -> bool:
    """Make Triton's interpreter stop building integer-overflow checks that it then discards.

    Under ``TRITON_INTERPRET=1`` every integer add, subtract and multiply of a kernel (its index and pointer
    arithmetic) first recomputes itself in int64 and compares the result with the int32 range
    (``binary_op_sanitize_overflow_impl``, on because the interpreter's options say ``sanitize_overflow=True``),
    then hands the comparison to ``device_assert``, which returns without asserting anything unless the options say
    ``debug=True`` — and the interpreter's options never do. So the check is computed and dropped on every such
    operation of every program instance: measured (CPU per call, same process), a third of TransformerEngine's
    fused CE at 257 rows, a tenth of Liger's and of numcheck's split_fp32 kernels on one-row chunks. Here the interpreter's options say ``sanitize_overflow=False`` where they say ``debug=False``, which
    skips the computing of a check that could not fire; nothing a kernel computes or raises changes
    (tests/self/impls/test_interpreter.py). Compiled Triton drops these asserts alike unless ``debug`` is on.

    Installed by :mod:`impls.triton_lang` when it imports triton under the interpreter, beside
    :func:`share_language_patches`. Returns whether the interpreter's options now skip the check: ``False`` where
    triton or its interpreter's options cannot be found, or where they say ``debug=True`` (the asserts then fire,
    and the check stays)."""
    try:
        from triton.runtime import interpreter as ti
    except Exception:  # noqa: BLE001 - no triton: nothing to speed up
        return False
    builder = getattr(ti, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or not hasattr(options, "sanitize_overflow"):
        return False
    if getattr(options, "debug", True):
        return False
    if options.sanitize_overflow:
        _SKIPPED_CHECKS["options"] = options
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


#: The interpreter's options before :func:`skip_unasserted_overflow_checks` replaced them (empty where it has not).
_SKIPPED_CHECKS: dict[str, Any] = {}


def restore_overflow_checks() -> None:
    """Undo :func:`skip_unasserted_overflow_checks` (the interpreter's own options again); a no-op where not
    installed."""
    options = _SKIPPED_CHECKS.pop("options", None)
    if options is not None:
        from triton.runtime import interpreter as ti

        ti.interpreter_builder.options = options


def tabulate_np_dtypes() -> bool:
    """Make Triton's interpreter look up a Triton dtype's numpy storage type in one table built once.

    Triton 3.9's interpreter (``_get_np_dtype``, called on every tensor a program instance makes) builds its
    table of 19 dtypes anew at each call before looking one up: measured (CPU per call, same process, with
    :func:`skip_unasserted_overflow_checks` installed), an eighth of Liger's CE at 257 rows, 8% of
    TransformerEngine's. Here the same function, with the table built on the
    first call from the interpreter's own (so the same entries); a type the table lacks goes to the interpreter's
    function, which raises as before. Installed by :mod:`impls.triton_lang` beside :func:`share_language_patches`;
    returns whether it is installed (``False`` where the interpreter has no such function)."""
    if _TABLE:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except Exception:  # noqa: BLE001 - no triton: nothing to speed up
        return False
    own = getattr(ti, "_get_np_dtype", None)
    if own is None:
        return False
    names = ("int1", "float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32")
    names += ("int64", "uint64", "bfloat16", "float8e5", "float8e5b16", "float8e4nv", "float8e4b8", "float8e4b15")
    table: dict[Any, Any] = {}
    for name in names:
        dt = getattr(tl, name, None)
        if dt is not None:
            try:
                table[dt] = own(dt)
            except Exception:  # noqa: BLE001 - not in this release's table: its own function answers
                pass
    pointer, block = tl.pointer_type, tl.block_type
    ptr = own(pointer(tl.int8))

    def get_np_dtype(tt_dtype: Any) -> Any:
        if isinstance(tt_dtype, pointer):
            return ptr
        elem = tt_dtype.element_ty if isinstance(tt_dtype, block) else tt_dtype
        if isinstance(elem, pointer):
            return ptr
        found = table.get(elem)
        return found if found is not None else own(tt_dtype)

    _TABLE["own"] = own
    ti._get_np_dtype = get_np_dtype
    return True


#: The interpreter's own ``_get_np_dtype`` where :func:`tabulate_np_dtypes` replaced it (empty where it has not).
_TABLE: dict[str, Any] = {}


def untabulate_np_dtypes() -> None:
    """Undo :func:`tabulate_np_dtypes`; a no-op where not installed."""
    own = _TABLE.pop("own", None)
    if own is not None:
        from triton.runtime import interpreter as ti

        ti._get_np_dtype = own


#: CPython's frame stack (3.11 on) is a chain of chunks of 16 KiB (``DATA_STACK_CHUNK_SIZE``, Python/pystate.c):
#: a call whose frame does not fit in the current chunk maps a new one (at least its frame plus 1000 slots,
#: ``MINIMUM_OVERHEAD``, in 16 KiB doublings) and its return unmaps it. A call made over and over at that edge
#: maps and unmaps a chunk each time. The slots of the padding frame :func:`reserve_launch_stack` puts under
#: each launch: 32 KiB, more than any 16 KiB chunk has free, so it always opens a 64 KiB chunk
#: (8·(4096 + 1000) bytes rounded up) whose other ≈ 31 KiB hold the launch's own frames.
LAUNCH_STACK_SLOTS = 4096


def _padded_caller(slots: int) -> Callable[..., Any]:
    """A function ``(call, *args, **kwargs) -> call(*args, **kwargs)`` whose frame has ``slots`` more local
    variables (never assigned: only their room counts)."""
    names = ", ".join(f"_{i}" for i in range(slots))
    src = (
        "def padded(call, *args, **kwargs):\n"
        f"    if False:\n        {names} = (None,) * {slots}\n"
        "    return call(*args, **kwargs)\n"
    )
    scope: dict[str, Any] = {}
    exec(compile(src, "<numcheck launch stack>", "exec"), scope)  # noqa: S102 - generated above, no input
    return scope["padded"]


def reserve_launch_stack() -> bool:
    """Make every launch of Triton's interpreter run at the start of a frame-stack chunk of its own.

    An interpreted kernel makes thousands of nested Python calls per program instance (each ``tl`` operation
    goes through the language's wrapper, the semantic layer and numpy), and CPython keeps frames in 16 KiB
    chunks that it maps at a call crossing a chunk's end and unmaps at the return (:data:`LAUNCH_STACK_SLOTS`).
    Where a launch starts depends on how deep its caller is; where it starts a few hundred bytes short of a
    chunk's end, its hot calls cross that edge every time: a pair of mmap/munmap system calls and fresh,
    zeroed pages per call. Measured on a 2-core CPU under pytest (CPU of the test, ``-n 0``):
    ``test_many_chunks[recompute_triton[split_fp32]]`` spent 20.8 of its 46.6 CPU-s in system time
    (2.5 million mmap/munmap pairs, strace) and took 19.3 s with this. Here each launch goes through a frame of
    :data:`LAUNCH_STACK_SLOTS` slots, which never fits a chunk's remainder, so it opens a chunk of its own
    (once per launch) and the launch's frames run inside it, wherever the caller stood. What a kernel computes
    is unchanged (tests/self/impls/test_interpreter.py).

    Installed by :mod:`impls.triton_lang` beside :func:`share_language_patches`, on
    ``InterpretedFunction.run``. Returns whether it is installed (``False`` where the interpreter has no such
    method)."""
    if _RESERVED:
        return True
    try:
        from triton.runtime import interpreter as ti
    except Exception:  # noqa: BLE001 - no triton: nothing to speed up
        return False
    own = getattr(getattr(ti, "InterpretedFunction", None), "run", None)
    if own is None:
        return False
    padded = _padded_caller(LAUNCH_STACK_SLOTS)

    @functools.wraps(own)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        return padded(own, self, *args, **kwargs)

    _RESERVED["own"] = own
    ti.InterpretedFunction.run = run
    return True


#: The interpreter's own ``InterpretedFunction.run`` where :func:`reserve_launch_stack` replaced it.
_RESERVED: dict[str, Any] = {}


def unreserve_launch_stack() -> None:
    """Undo :func:`reserve_launch_stack`; a no-op where not installed."""
    own = _RESERVED.pop("own", None)
    if own is not None:
        from triton.runtime import interpreter as ti

        ti.InterpretedFunction.run = own
