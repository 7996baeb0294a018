"""What keeps the cases numcheck draws a function of (test, impl, profile, seed) alone, however the suite is
invoked: one file, a ``-k`` selection, the whole suite, ``--pyargs`` from an installed wheel, any xdist worker.

hypothesis (from 6.131, the ``hypothesis.internal.constants_ast`` module) mixes the literal constants of every
*local* module loaded in the process (any file outside site-packages and the standard library that is not a test
file) into generation: each integer, float, string or bytes choice is, with probability 0.05 (0.15 for floats),
replaced by one of them, derandomized runs included. Which modules are loaded, and whether numcheck itself counts
as local (a checkout: yes; a wheel in site-packages: no), depends on how the suite was invoked, so the same
(test, impl) drew different cases (seen: ``seed=1024``, a literal of numcheck's own code, became
``seed=1244770883`` once a module full of literals was imported). hypothesis has no setting or environment
variable for it, so :func:`isolated_draws` empties that pool while numcheck's own tests run: the global constants
hypothesis ships (the same for every invocation of one hypothesis release) stay. It patches two internals of
``hypothesis.internal.conjecture.providers``: a release without the feature is left alone; one that has it under
other names fails with :class:`IsolationUnavailable` (and tests/self/properties/test_scope_independence.py fails whenever
the draws depend on the loaded modules, whatever the reason).

:func:`draw_key` is the per-(test, impl) part of a derandomized test's seed under pytest, free of the path the
test module was collected by.
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any, Iterator

#: The internals of ``hypothesis.internal.conjecture.providers`` :func:`isolated_draws` replaces.
PATCHED = ("_get_local_constants", "CONSTANTS_CACHE.cache")


class IsolationUnavailable(RuntimeError):
    """The installed hypothesis mixes local constants into generation but not through the internals numcheck
    neutralises (:data:`PATCHED`): numcheck's draws would depend on the loaded modules."""


_depth = 0
_saved: Any = None


def _has(obj: Any, dotted: str) -> bool:
    """Whether ``obj`` has the attribute path ``dotted`` (``a.b``)."""
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _providers() -> Any:
    """hypothesis' providers module when this release mixes local constants into generation, else ``None``;
    :class:`IsolationUnavailable` naming what is missing when it does so under other names."""
    if importlib.util.find_spec("hypothesis.internal.constants_ast") is None:
        return None  # a release before local constants (6.130 and older)
    import hypothesis
    from hypothesis.internal.conjecture import providers

    missing = [name for name in PATCHED if not _has(providers, name)]
    if missing:
        raise IsolationUnavailable(
            f"hypothesis {hypothesis.__version__} collects local constants (hypothesis.internal.constants_ast) but "
            f"hypothesis.internal.conjecture.providers has no {', '.join(missing)}: numcheck cannot keep its draws "
            f"independent of the loaded modules; update numcheck.properties.core.draw_isolation for this release"
        )
    return providers


def _no_local_constants() -> Any:
    """An empty pool of local constants (the type hypothesis' own pool has)."""
    from hypothesis.internal.constants_ast import Constants

    return Constants()


@contextlib.contextmanager
def isolated_draws() -> Iterator[None]:
    """While inside, hypothesis draws no constant collected from loaded local modules (re-entrant; the cache of
    permitted constants is emptied on entry and on the last exit, so no pool leaks in or out)."""
    global _depth, _saved
    providers = _providers()
    if providers is None:
        yield
        return
    if _depth == 0:
        _saved = providers._get_local_constants
        providers._get_local_constants = _no_local_constants
        providers.CONSTANTS_CACHE.cache.clear()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            providers._get_local_constants = _saved
            providers.CONSTANTS_CACHE.cache.clear()


def draw_key(rel_path: str, nodeid: str) -> bytes:
    """The key a numcheck test's derandomized seed and example-database entry take under pytest: the test
    module's path inside numcheck's tests/ and the node id's part after the module (test name and parameter ids,
    the impl's among them). hypothesis' own plugin keys parametrized tests by the whole node id, which carries
    the path relative to the rootdir (``tests/suite/...`` in a checkout, nothing from elsewhere), and
    keys tests parametrized only through an indirect fixture not at all."""
    within = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
    return f"numcheck|{rel_path}::{within}".encode()
