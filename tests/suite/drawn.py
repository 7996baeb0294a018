"""One example of a drawn suite test under pytest: the shared runner's example, its skip as ``pytest.skip`` and
its metrics handed to ``hypothesis.target`` (used by the suite's test modules).

With ``NUMCHECK_DRAWN_LOG=DIR`` set, every example also appends what it drew (one JSON line: the test, the impl
and each drawn value, tensors by shape, dtype and a hash of their bytes) to ``DIR/drawn-<pid>.jsonl``, one file
per process (xdist workers included): :mod:`numcheck.properties.core.drawn_log`, which the distributed suites
record through too.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import target

from numcheck.properties.core.drawn_log import DRAWN_LOG_ENV, fingerprint, recorded
from numcheck.properties.core.runner import SuiteProperty, run_example, skip_reason, target_scores

__all__ = ["DRAWN_LOG_ENV", "fingerprint", "run_drawn"]


def run_drawn(prop: SuiteProperty, impl: Any, data: Any) -> None:
    """One example of ``prop`` on ``impl`` from ``data``: skipped where it does not apply, its scores targeted."""
    __tracebackhide__ = True
    why = skip_reason(prop, impl)
    if why:
        pytest.skip(why)
    with recorded(data, prop.name, impl) as drawing:
        results = run_example(prop, impl, drawing)
    for label, value in target_scores(results).items():
        target(value, label=label)
