"""``NUMCHECK_DRAWN_LOG=DIR``: what every drawn example of the suite drew, one JSON line per example (the test,
the impl and each drawn value; tensors by shape, dtype and a hash of their bytes) appended to
``DIR/drawn-<pid>.jsonl``, one file per process (xdist workers and distributed suites included).
``tests/self/properties/test_scope_independence.py`` compares these across invocations.

The single-device suites record through :func:`recorded` (``numcheck.tests.suite.drawn``), the distributed ones
(whose ``@given`` runs inside the test) through :func:`recorded` or :func:`log_example`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

import torch

#: The environment variable naming the folder drawn cases are recorded in (unset: nothing is recorded).
DRAWN_LOG_ENV = "NUMCHECK_DRAWN_LOG"


def fingerprint(value: Any) -> str:
    """A drawn value as text that is equal exactly when the values are: ``repr``, tensors (also inside a tuple)
    by shape, dtype and a hash of their bytes (a tensor's ``repr`` elides elements)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        digest = hashlib.sha1(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()[:16]
        return f"tensor({list(t.shape)}, {t.dtype}, sha1={digest})"
    if isinstance(value, tuple):
        return "(" + ", ".join(fingerprint(v) for v in value) + ")"
    return repr(value)


class Recording:
    """``data`` (hypothesis' ``st.data()`` object) that also keeps the fingerprint of every value drawn."""

    def __init__(self, data: Any) -> None:
        self._data = data
        self.drawn: list[str] = []

    def draw(self, strategy: Any, label: Any = None) -> Any:
        """``data.draw(strategy, label)``, fingerprinted."""
        value = self._data.draw(strategy, label=label)
        self.drawn.append(fingerprint(value))
        return value


def log_example(test: str, impl: Any, drawn: list[str]) -> None:
    """Append one example's draws to this process's file in the log folder (nothing when the log is off)."""
    folder = os.environ.get(DRAWN_LOG_ENV)
    if not folder:
        return
    line = json.dumps({"test": test, "impl": impl.name, "drawn": drawn})
    with open(Path(folder) / f"drawn-{os.getpid()}.jsonl", "a") as f:
        f.write(line + "\n")


@contextlib.contextmanager
def recorded(data: Any, test: str, impl: Any) -> Iterator[Any]:
    """``data`` as is when the log is off; else a :class:`Recording` of it, whose draws are logged when the block
    ends (a failing example's too)."""
    if not os.environ.get(DRAWN_LOG_ENV):
        yield data
        return
    recording = Recording(data)
    try:
        yield recording
    finally:
        log_example(test, impl, recording.drawn)
