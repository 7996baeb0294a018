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

#: The environment variable naming the folder drawn cases are recorded in (unset: nothing is recorded).
DRAWN_LOG_ENV = "NUMCHECK_DRAWN_LOG"


def fingerprint(value: Any) -> str:
    """A drawn value as text that is equal exactly when the values are: ``repr``, tensors (also inside a tuple)
    by shape, dtype and a hash of their bytes (a tensor's ``repr`` elides elements)."""
    import torch  # here, not at the top: the plugin reads log_folder() in every pytest run

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


class DrawnLogError(ValueError):
    """``NUMCHECK_DRAWN_LOG`` names a folder that cannot be created or written."""


def log_folder() -> Path | None:
    """The folder ``NUMCHECK_DRAWN_LOG`` names, created (with its parents) when missing; ``None`` when the log is
    off. Raises :class:`DrawnLogError` naming the variable and the path when it is not a folder numcheck can write
    (the plugin calls this before any test runs, so a bad value is one error, not one per drawn test).

    >>> import os, tempfile
    >>> os.environ[DRAWN_LOG_ENV] = os.path.join(tempfile.mkdtemp(), "not", "yet")
    >>> log_folder().is_dir()
    True
    >>> del os.environ[DRAWN_LOG_ENV]
    """
    value = os.environ.get(DRAWN_LOG_ENV)
    if not value:
        return None
    folder = Path(value).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DrawnLogError(
            f"{DRAWN_LOG_ENV}={value}: cannot create that folder for the drawn-case log "
            f"({type(exc).__name__}: {exc.strerror or exc}); set it to a folder, or unset it"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DrawnLogError(f"{DRAWN_LOG_ENV}={value}: the folder is not writable; set it to one that is, or unset it")
    return folder


def log_example(test: str, impl: Any, drawn: list[str]) -> None:
    """Append one example's draws to this process's file in the log folder (nothing when the log is off); the
    folder is created when missing (:func:`log_folder`)."""
    folder = log_folder()
    if folder is None:
        return
    line = json.dumps({"test": test, "impl": impl.name, "drawn": drawn})
    with open(folder / f"drawn-{os.getpid()}.jsonl", "a") as f:
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
