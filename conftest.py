"""numcheck's own test run from a checkout (not shipped: the wheel maps only the top-level folders into
``numcheck.*``): the test modules holding a test CI's cost table marks ``costly`` run first.

Under ``pytest -n auto`` xdist hands tests to its workers in collection order, and the checkout collects
tests/adapters, tests/self and then tests/suite, whose linear+CE module is the costliest of the tree: its 20-50 s
tests came last, so one worker could still be on one of them while the other had nothing left. Starting with the
modules that hold such tests leaves the short ones for the end, where they even out the two workers. A module's
tests stay together (module-scoped fixtures are shared between them), in their own order.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Stable-sort ``items`` so that modules with a ``costly`` test come first, every module's tests kept together."""
    costly = {
        item.module.__name__ for item in items if getattr(item, "module", None) and item.get_closest_marker("costly")
    }
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", "") not in costly)
