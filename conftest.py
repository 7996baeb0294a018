"""numcheck's own test run from a checkout (not shipped: the wheel maps only the top-level folders into
``numcheck.*``): the costliest test modules run first.

Under ``pytest -n auto`` xdist hands tests to its workers in collection order, and the checkout collects
tests/adapters, tests/self and then tests/suite, whose linear+CE module is the costliest of the tree: its 15-50 s
tests came last, so one worker could still be on one of them while the other had nothing left. Taking the modules
in the order of their seconds in CI's committed cost table (results/ci-costs.md, "Per test module"; a module not in
it last) leaves the short ones for the end, where they even out the two workers. A module's tests stay together
(module-scoped fixtures are shared between them), in their own order.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

#: CI's committed cost table (``.ci/costs.py``), whose per-module seconds order the modules.
COST_TABLE = Path(__file__).parent / "results" / "ci-costs.md"


def module_seconds(table: Path = COST_TABLE) -> dict[str, float]:
    """Each test module's seconds (its file's stem) in the newest leg's column of ``table``'s "Per test module"
    section; empty where the table is missing."""
    try:
        text = table.read_text()
    except OSError:
        return {}
    section = text.split("## Per test module", 1)[-1].split("\n## ", 1)[0] if "## Per test module" in text else ""
    rows = re.findall(r"^\| (test_\w+) \| ([0-9.]+) \|", section, flags=re.M)
    return {name: float(seconds) for name, seconds in rows}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Stable-sort ``items`` by their module's seconds in :data:`COST_TABLE`, costliest first, every module's tests
    kept together."""
    seconds = module_seconds()
    if seconds:
        items.sort(key=lambda item: -seconds.get(Path(str(item.path)).stem, -1.0))
