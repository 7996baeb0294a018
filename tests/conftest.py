"""pytest binding: which impls run, hypothesis profiles, and the ``linear_ce_impl`` / ``quant_impl`` fixtures.

- ``--impl SPEC`` (repeatable) restricts the run to those impls: built-in names or ``package.module:attr``.
  Without it: every built-in, plus ``NUMCHECK_IMPLS`` and the ``numcheck.impls`` entry points.
- Every test that takes ``linear_ce_impl`` (or ``quant_impl``) is parametrized over every loaded impl of that
  kind, ids are the impl names, and collection is identical on every xdist worker (discovery is
  deterministic). An impl that failed to load is still collected: its tests fail with the load error, so a
  broken outside impl is reported by name and never hides the others.
- Hypothesis profiles: ``ci`` (default; derandomized, bounded), ``dev`` and ``thorough``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from numcheck.impls import interpreter

interpreter.arrange()  # before anything below can import triton

from numcheck.impls.registry import BrokenImpl, ImplEntry, discover  # noqa: E402

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
               print_blob=True)
settings.register_profile("ci", max_examples=int(os.environ.get("NUMCHECK_CI_EXAMPLES", "12")), derandomize=True, **_COMMON)
# "ci" without derandomization: with --hypothesis-seed, checks that ci verdicts do not hang on one seed.
settings.register_profile("ci-seeded", max_examples=int(os.environ.get("NUMCHECK_CI_EXAMPLES", "12")), **_COMMON)
settings.register_profile("dev", max_examples=60, **_COMMON)
settings.register_profile("thorough", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("NUMCHECK_HYPOTHESIS_PROFILE", "ci"))

_ENTRIES_KEY = pytest.StashKey[list]()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per xdist worker: the workers already fill the cores, and small tensor ops were
    # measured up to 40x slower with two threads contending on a loaded 2-core machine.
    import torch

    torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--impl", action="append", default=[], metavar="SPEC",
                     help="run only these impls: built-in name or package.module:attr (repeatable)")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_ENTRIES_KEY] = discover(config.getoption("--impl"))


def impl_entries(config: pytest.Config, kind: str) -> list[ImplEntry | BrokenImpl]:
    """Loaded entries of ``kind`` plus every broken entry (whose kind is unknown)."""
    return [e for e in config.stash[_ENTRIES_KEY] if isinstance(e, BrokenImpl) or e.kind == kind]


def _parametrize(metafunc: pytest.Metafunc, fixture: str, kind: str) -> None:
    entries = impl_entries(metafunc.config, kind)
    metafunc.parametrize(fixture, entries, ids=[e.name for e in entries], indirect=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "linear_ce_impl" in metafunc.fixturenames:
        _parametrize(metafunc, "linear_ce_impl", "linear_ce")
    if "quant_impl" in metafunc.fixturenames:
        _parametrize(metafunc, "quant_impl", "quant_linear")


def _unwrap(request: pytest.FixtureRequest):
    entry = request.param
    if isinstance(entry, BrokenImpl):
        pytest.fail(f"impl {entry.spec!r} (from {entry.origin}) could not be loaded: {entry.error}", pytrace=False)
    reason = entry.impl.support.unavailable_reason()
    if reason:
        pytest.skip(f"impl {entry.name!r} unavailable here: {reason}")
    return entry.impl


@pytest.fixture
def linear_ce_impl(request: pytest.FixtureRequest):
    """A loaded linear+CE impl (skipped when it cannot run here, failed when it could not be loaded)."""
    return _unwrap(request)


@pytest.fixture
def quant_impl(request: pytest.FixtureRequest):
    """A loaded quantized-linear impl (skipped when it cannot run here, failed when it could not be loaded)."""
    return _unwrap(request)


@pytest.fixture(scope="module")
def one_thread_per_module():
    """torch's intra-op threads set to 1 for a module, restored after it (modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread_per_module")``)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
