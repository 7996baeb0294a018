"""numcheck's own test run from a checkout (not shipped: the wheel maps only the top-level folders into
``numcheck.*``): the test modules holding a test CI's cost table marks ``costly`` run first, and freed memory is
kept for the next allocation (:func:`keep_freed_memory`).

Under ``pytest -n auto`` xdist hands tests to its workers in collection order, and the checkout collects
tests/adapters, tests/self and then tests/suite, whose linear+CE module is the costliest of the tree: its 20-50 s
tests came last, so one worker could still be on one of them while the other had nothing left. Starting with the
modules that hold such tests leaves the short ones for the end, where they even out the two workers. A module's
tests stay together (module-scoped fixtures are shared between them), in their own order.
"""

from __future__ import annotations

import ctypes
import os
import sys

import pytest

#: glibc's malloc settings for this test run and every process it starts (xdist's workers, the pytest and numcheck
#: subprocesses of numcheck's own tests, gloo ranks), as its environment variables: no allocation served by mmap,
#: and freed memory kept at the heap's top up to 16 GiB. By default glibc serves each allocation past 32 MiB with
#: its own mmap and unmaps it when freed, so every such tensor costs page faults on fresh zeroed pages: the
#: oracle's and the bounds' float64 tensors of the many-chunk draws are 8.4M cells (67 MB) each. Measured on the
#: idle 2-core machine, the suite on tests/self/helpers/user_chunked.py's fp32_sum_rule (the four chunk tests,
#: test_chunk_reach's subprocess): 34.6 s wall, 40.2 s user and 20.2 s system CPU by default; 25.5 s wall, 41.3 s
#: user, 0.8 s system with these (peak 0.9 GB resident).
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}
#: mallopt's parameters (malloc.h) for this process, whose malloc read its environment before this module ran.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Set :data:`MALLOC_ENV` for the processes this one starts (where not already set) and the same through
    ``mallopt`` for this one (the trim threshold at mallopt's int limit); ``False`` off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    for name, value in MALLOC_ENV.items():
        os.environ.setdefault(name, value)
    mallopt(_M_MMAP_MAX, 0)
    mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    return True


keep_freed_memory()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Stable-sort ``items`` so that modules with a ``costly`` test come first, every module's tests kept together."""
    costly = {
        item.module.__name__ for item in items if getattr(item, "module", None) and item.get_closest_marker("costly")
    }
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", "") not in costly)
