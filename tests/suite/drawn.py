"""One example of a drawn suite test under pytest: the shared runner's example, its skip as ``pytest.skip`` and
its metrics handed to ``hypothesis.target`` (used by the suite's test modules).

With ``NUMCHECK_DRAWN_LOG=DIR`` set, every example also appends what it drew (one JSON line: the test, the impl
and each drawn value, tensors by shape, dtype and a hash of their bytes) to ``DIR/drawn-<pid>.jsonl``, one file
per process (xdist workers included); tests/self/properties/test_scope_independence.py compares these across invocations.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import target

from numcheck.properties.core.runner import SuiteProperty, run_example, skip_reason, target_scores

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


class _Recording:
    """``data`` (hypothesis' ``st.data()`` object) that also keeps the fingerprint of every value drawn."""

    def __init__(self, data: Any) -> None:
        self._data = data
        self.drawn: list[str] = []

    def draw(self, strategy: Any, label: Any = None) -> Any:
        """``data.draw(strategy, label)``, fingerprinted."""
        value = self._data.draw(strategy, label=label)
        self.drawn.append(fingerprint(value))
        return value


def _record(folder: str, prop: SuiteProperty, impl: Any, drawn: list[str]) -> None:
    """Append one example's draws to this process's file in ``folder``."""
    line = json.dumps({"test": prop.name, "impl": impl.name, "drawn": drawn})
    with open(Path(folder) / f"drawn-{os.getpid()}.jsonl", "a") as f:
        f.write(line + "\n")


def run_drawn(prop: SuiteProperty, impl: Any, data: Any) -> None:
    """One example of ``prop`` on ``impl`` from ``data``: skipped where it does not apply, its scores targeted."""
    __tracebackhide__ = True
    why = skip_reason(prop, impl)
    if why:
        pytest.skip(why)
    folder = os.environ.get(DRAWN_LOG_ENV)
    if not folder:
        results = run_example(prop, impl, data)
    else:
        recording = _Recording(data)
        try:
            results = run_example(prop, impl, recording)
        finally:  # a failing example's draws too
            _record(folder, prop, impl, recording.drawn)
    for label, value in target_scores(results).items():
        target(value, label=label)
