"""Triton as numcheck's kernels see it: the modules (or why they cannot be imported) and whether they run
interpreted.

:mod:`impls.builtin.triton_ce` and :mod:`impls.builtin.split_accum` take ``triton``/``tl`` from here. The mode is read once,
when this module is first imported: ``TRITON_INTERPRET`` must be set by then, which numcheck's entry points do
through :func:`impls.interpreter.arrange` when CUDA is absent (this module does not set it).
"""

from __future__ import annotations

import os

import torch

from numcheck.impls.interpreter import (
    reserve_launch_stack,
    share_language_patches,
    skip_unasserted_overflow_checks,
    tabulate_np_dtypes,
)

try:
    import triton
    import triton.language as tl

    _IMPORT_ERROR: str | None = None
except Exception as exc:  # pragma: no cover - depends on the installation
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    _IMPORT_ERROR = f"triton cannot be imported: {type(exc).__name__}: {exc}"

#: Whether numcheck's Triton kernels run in Triton's interpreter (decided when this module was imported).
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

if INTERPRET and _IMPORT_ERROR is None:
    # nested @triton.jit calls stop redoing the launch's language swap (half of an interpreted kernel's time)
    share_language_patches()
    # integer ops stop computing overflow checks the interpreter would drop unasserted (TE's CE: a third of its time)
    skip_unasserted_overflow_checks()
    # a Triton dtype's numpy type from a table built once, not rebuilt per tensor (Liger's CE: an eighth of its time)
    tabulate_np_dtypes()
    # each launch runs in a frame-stack chunk of its own, not astride a chunk's edge (mmap/munmap per call)
    reserve_launch_stack()


def unavailable_reason() -> str | None:
    """Why numcheck's Triton kernels cannot run here, or ``None``."""
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR
    if not INTERPRET and not torch.cuda.is_available():
        return "no CUDA device and TRITON_INTERPRET was off when numcheck imported triton (impls.triton_lang)"
    return None
