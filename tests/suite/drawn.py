"""One example of a drawn suite test under pytest: the shared runner's example, its skip as ``pytest.skip`` and
its metrics handed to ``hypothesis.target`` (used by the suite's test modules)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import target

from numcheck.properties.runner import SuiteProperty, run_example, skip_reason, target_scores


def run_drawn(prop: SuiteProperty, impl: Any, data: Any) -> None:
    """One example of ``prop`` on ``impl`` from ``data``: skipped where it does not apply, its scores targeted."""
    __tracebackhide__ = True
    why = skip_reason(prop, impl)
    if why:
        pytest.skip(why)
    for label, value in target_scores(run_example(prop, impl, data)).items():
        target(value, label=label)
