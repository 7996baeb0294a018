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

import os
import sys

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
