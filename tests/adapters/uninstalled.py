"""An adapter's impls as they register where its third-party package is not installed."""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Iterable

import pytest


def impls_while_uninstalled(
    monkeypatch: pytest.MonkeyPatch, module: str, factory: Callable[[], list[Any]], caches: Iterable[Any]
) -> list[Any]:
    """``factory()`` (an adapter's impl list) called while ``importlib.util.find_spec`` finds no ``module``, with the
    adapter's cached lookups ``caches`` (``functools`` caches) cleared before and after, so neither side sees the
    other's answer."""
    real = importlib.util.find_spec
    caches = tuple(caches)

    def fake(name: str, *a: Any, **k: Any) -> Any:
        """find_spec that finds no ``module``."""
        return None if name == module else real(name, *a, **k)

    for cache in caches:
        cache.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", fake)
    try:
        return factory()
    finally:
        monkeypatch.undo()
        for cache in caches:
            cache.cache_clear()
