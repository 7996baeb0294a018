"""numcheck's pytest plugin (entry point ``pytest11: numcheck``): which impls run, numcheck's hypothesis profiles,
and the fixtures of the property suite and of users' own tests.

Run the suite against your impl from any directory::

    pytest -n auto --pyargs numcheck.tests.suite --impl mypkg.flce:impl

- ``--impl SPEC`` (repeatable) restricts the run to those impls: built-in names or ``package.module:attr``.
  Without it: every built-in, plus ``NUMCHECK_IMPLS`` and the ``numcheck.impls`` entry points.
- Every test that takes ``linear_ce_impl`` (or ``quant_impl``, ``grouped_quant_impl``, ``dist_linear_ce_impl``,
  ``tp_quant_impl``, or a user's ``numcheck_impl``) is parametrized over every loaded impl of that kind, ids are the impl names, and
  collection is identical on every xdist worker (discovery is deterministic). A test of a kind that no selected
  impl has is not collected (deselected; the summary says so): ``--impl`` naming only linear+CE impls runs no
  FP8 or distributed test, never the built-ins in their place. An impl that failed to load is still collected: its tests fail with the load
  error, so a broken outside impl is reported by name and never hides the others. One that cannot run here is
  skipped with the reason.
- ``--numcheck-record=DIR``: every accuracy and strided-inputs judgement's error/bound per output is written to
  ``DIR/records-<worker>.jsonl`` (:mod:`numcheck.properties.core.records`; ``numcheck sweep`` reads them).
- ``--numcheck-scale``: also run the production-shape tier (``numcheck.tests.suite.test_production``, marker
  ``numcheck_scale``; CUDA only, minutes: :mod:`numcheck.properties.production.tier`). Off by default.
- Hypothesis profiles (:mod:`numcheck.properties.core.profiles`) ``numcheck-ci`` (derandomized, bounded;
  ``NUMCHECK_CI_EXAMPLES`` examples, default 12), ``numcheck-ci-seeded`` (the same, not derandomized: for
  ``--hypothesis-seed``), ``numcheck-dev`` and ``numcheck-thorough``. numcheck's own test modules take the profile chosen with ``--hypothesis-profile`` when
  it is one of these, else the one ``NUMCHECK_HYPOTHESIS_PROFILE`` names (``ci``, ``dev``, ... or the full
  name), else ``numcheck-ci``. No profile is ever loaded for the process: a user's own tests keep theirs.

Inert for every other pytest run: the options are registered, but nothing is discovered, imported (no triton),
parametrized, or set (threads, ``TRITON_INTERPRET``) until a numcheck test module is collected or a test asks
for one of the fixtures.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

import numcheck.tests as _tests_package
from numcheck.impls import interpreter
from numcheck.impls.registry import BrokenImpl, ImplEntry, discover
from numcheck.properties.core import matmul_precision, records
from numcheck.properties.core.draw_isolation import draw_key, isolated_draws
from numcheck.properties.fp8.strategies import quant_cases
from numcheck.properties.core.profiles import DEFAULT_PROFILE, PROFILES, numcheck_name
from numcheck.properties.core.runner import SuiteProperty, budget, run_rows, skip_reason, unsatisfiable_reason
from numcheck.properties.core.strategies import problems

_ENTRIES_KEY = pytest.StashKey[list]()
_ARRANGED_KEY = pytest.StashKey[bool]()
_TESTS_DIR = Path(_tests_package.__file__).resolve().parent
_SUITE_DIR = _TESTS_DIR / "suite"
#: Each impl fixture and the kinds it is parametrized over.
_IMPL_FIXTURES: dict[str, tuple[str, ...]] = {
    "linear_ce_impl": ("linear_ce",), "quant_impl": ("quant_linear",), "dist_linear_ce_impl": ("dist_linear_ce",),
    "tp_quant_impl": ("tp_quant_linear",), "grouped_quant_impl": ("grouped_quant_linear",),
    "numcheck_impl": ("linear_ce", "quant_linear")}
_NO_IMPL_MARK = "numcheck_no_impl"
_NOT_COLLECTED_KEY = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("numcheck", "numcheck property suite")
    group.addoption("--impl", action="append", default=[], metavar="SPEC",
                    help="run numcheck's suite (and the numcheck_impl fixture) on these impls only: built-in name "
                         "or package.module:attr (repeatable)")
    group.addoption("--numcheck-record", type=Path, default=None, metavar="DIR",
                    help="write the observed error/bound of every accuracy judgement to DIR/records-<worker>.jsonl "
                         "(one file per xdist worker; numcheck sweep reads them)")
    group.addoption("--numcheck-scale", action="store_true", default=False,
                    help="also run the production-shape tier (tests marked numcheck_scale; CUDA only, minutes)")


def profile_name() -> str:
    """The numcheck profile numcheck's tests run under: the loaded hypothesis profile if it is a numcheck one
    (``--hypothesis-profile numcheck-dev``), else ``NUMCHECK_HYPOTHESIS_PROFILE``'s, else ``numcheck-ci``."""
    current = settings.get_current_profile_name()
    if current in PROFILES:
        return current
    env = os.environ.get("NUMCHECK_HYPOTHESIS_PROFILE")
    if not env:
        return DEFAULT_PROFILE
    try:
        return numcheck_name(env)
    except ValueError as exc:
        raise pytest.UsageError(f"NUMCHECK_HYPOTHESIS_PROFILE: {exc}") from None


@contextlib.contextmanager
def numcheck_profile() -> Iterator[None]:
    """numcheck's profile as hypothesis' default while a numcheck test module is imported (its ``@given`` and
    ``@settings`` take their defaults then), the caller's profile back afterwards: never left loaded."""
    before = settings.get_current_profile_name()
    settings.load_profile(profile_name())
    try:
        yield
    finally:
        settings.load_profile(before)


def _is_numcheck(path: Path) -> bool:
    """Whether ``path`` is inside numcheck's tests/ (through any link)."""
    return path.resolve().is_relative_to(_TESTS_DIR)


def _arrange(config: pytest.Config) -> None:
    """What numcheck's tests need before anything imports triton: Triton's interpreter where there is no CUDA,
    and one intra-op thread per xdist worker (the workers already fill the cores; small tensor ops were measured
    up to 40x slower with two threads contending on a loaded 2-core machine). Once per session."""
    if config.stash.get(_ARRANGED_KEY, False):
        return
    config.stash[_ARRANGED_KEY] = True
    interpreter.arrange()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """numcheck's test modules are imported under numcheck's profile, after :func:`_arrange`."""
    if not (isinstance(collector, pytest.Module) and _is_numcheck(collector.path)):
        return (yield)
    _arrange(collector.config)
    with numcheck_profile():
        return (yield)


def impl_entries(config: pytest.Config, kinds: tuple[str, ...] | None) -> list[ImplEntry | BrokenImpl]:
    """Loaded entries of ``kinds`` (every kind for ``None``) plus every broken entry (whose kind is unknown);
    discovered once per session, on first use."""
    if _ENTRIES_KEY not in config.stash:
        _arrange(config)  # before discovery: the built-ins import triton
        config.stash[_ENTRIES_KEY] = discover(config.getoption("--impl"))
    return [e for e in config.stash[_ENTRIES_KEY] if isinstance(e, BrokenImpl) or kinds is None or e.kind in kinds]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each impl fixture over the loaded impls of its kinds. Where none is loaded (``--impl`` named only impls of
    other kinds) the test gets one placeholder marked :data:`_NO_IMPL_MARK`, which
    :func:`pytest_collection_modifyitems` leaves out of the run (never the built-ins in their place)."""
    for fixture, kinds in _IMPL_FIXTURES.items():
        if fixture in metafunc.fixturenames:
            entries = impl_entries(metafunc.config, kinds)
            if entries:
                metafunc.parametrize(fixture, entries, ids=[e.name for e in entries], indirect=True)
            else:
                mark = getattr(pytest.mark, _NO_IMPL_MARK)(" or ".join(kinds))
                metafunc.parametrize(fixture, [pytest.param(None, marks=mark)], ids=[f"no-{kinds[0]}-impl"],
                                     indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of a kind no selected impl has are not collected: deselected (pytest counts them), and the terminal
    summary says which kinds and how many tests (:func:`pytest_terminal_summary`)."""
    left: dict[str, int] = {}
    keep = []
    for item in items:
        mark = item.get_closest_marker(_NO_IMPL_MARK)
        if mark is None:
            keep.append(item)
        else:
            left[mark.args[0]] = left.get(mark.args[0], 0) + 1
    if left:
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker(_NO_IMPL_MARK) is not None])
        items[:] = keep
        config.stash[_NOT_COLLECTED_KEY] = left


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line per impl kind whose tests were left out because no selected impl has it."""
    for kind, n in sorted(config.stash.get(_NOT_COLLECTED_KEY, {}).items()):
        terminalreporter.write_line(f"numcheck: {n} test(s) for {kind} impls not collected: --impl selected none "
                                    f"of that kind")


def _impl_of(item: pytest.Item) -> Any:
    """The impl an item was parametrized with through one of the impl fixtures, or ``None``."""
    funcargs = getattr(item, "funcargs", {})
    return next((funcargs[f] for f in _IMPL_FIXTURES if f in funcargs), None)


def _suite_property(item: pytest.Item) -> SuiteProperty | None:
    """The suite entry a drawn test runs: in its module's ``NUMCHECK_SUITE`` table, the test's name without
    ``test_``, with ``[value]`` of its parameter other than the impl's (``frozen_inputs[x]``)."""
    suite = getattr(getattr(item, "module", None), "NUMCHECK_SUITE", None)
    if suite is None:
        return None
    callspec = getattr(item, "callspec", None)
    params = [str(v) for k, v in (callspec.params.items() if callspec else ()) if k not in _IMPL_FIXTURES]
    base = getattr(item, "originalname", item.name).removeprefix("test_")
    return suite.get(f"{base}[{'-'.join(params)}]" if params else base)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """For the suite's ``@given`` tests: the test's covering rows first (:func:`numcheck.properties.core.runner.run_rows`),
    then the impl's budget of random examples (:func:`numcheck.properties.core.runner.budget`), and a skip, not an
    error, when a known divergence rejected every draw (hypothesis' ``Unsatisfiable``). Every numcheck test runs
    under numcheck's GEMM precision (:func:`numcheck.properties.core.matmul_precision.pinned`); other tests of the
    session keep their own."""
    if not _is_numcheck(item.path):
        return (yield)
    with matmul_precision.pinned():
        return (yield from _suite_call(item))


def _suite_call(item: pytest.Item) -> Any:
    """The body of :func:`pytest_runtest_call` for a numcheck test."""
    fn = getattr(item, "obj", None)
    impl = _impl_of(item)
    own = getattr(fn, "_hypothesis_internal_use_settings", None)
    if own is None or impl is None or not item.path.resolve().is_relative_to(_SUITE_DIR):
        return (yield)
    prop = _suite_property(item)
    # The same attribute hypothesis' own plugin sets per parametrized call (its differing_executors override).
    fn._hypothesis_internal_use_settings = settings(own, max_examples=budget(impl, own.max_examples, prop))
    try:
        if prop is not None and skip_reason(prop, impl) is None:
            run_rows(prop, impl)
        return (yield)
    except Unsatisfiable:
        pytest.skip(unsatisfiable_reason(impl))
    finally:
        fn._hypothesis_internal_use_settings = own


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """numcheck's ``@given`` tests draw the same cases however they were collected: each is keyed (its
    derandomized seed, its example-database entry) by :func:`~numcheck.properties.core.draw_isolation.draw_key`, set
    here after hypothesis' plugin set the node id, which carries the invocation's rootdir; and it draws no
    constant of the loaded local modules (:func:`~numcheck.properties.core.draw_isolation.isolated_draws`)."""
    inner = getattr(getattr(pyfuncitem.obj, "hypothesis", None), "inner_test", None)
    if inner is None or not _is_numcheck(pyfuncitem.path):
        return (yield)
    rel = pyfuncitem.path.resolve().relative_to(_TESTS_DIR).as_posix()
    inner._hypothesis_internal_add_digest = draw_key(rel, pyfuncitem.nodeid)
    with isolated_draws():
        return (yield)


def _unwrap(request: pytest.FixtureRequest) -> Any:
    """The impl of a parametrized impl fixture: failed if broken, skipped if unavailable here."""
    if not hasattr(request, "param"):
        raise pytest.UsageError(f"fixture {request.fixturename!r} is parametrized by numcheck's plugin; "
                                f"request it as a test argument, not through getfixturevalue")
    entry = request.param
    if isinstance(entry, BrokenImpl):
        pytest.fail(f"impl {entry.spec!r} (from {entry.origin}) could not be loaded: {entry.error}", pytrace=False)
    reason = entry.impl.support.unavailable_reason()
    if reason:
        pytest.skip(f"impl {entry.name!r} unavailable here: {reason}")
    return entry.impl


@pytest.fixture
def linear_ce_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded linear+CE impl (skipped when it cannot run here, failed when it could not be loaded)."""
    return _unwrap(request)


@pytest.fixture
def quant_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded quantized-linear impl (skipped when it cannot run here, failed when it could not be loaded)."""
    return _unwrap(request)


@pytest.fixture
def grouped_quant_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded grouped quantized linear (mixture-of-experts, :mod:`numcheck.impls.protocols.grouped_fp8_linear`;
    skipped when it cannot run here, failed when it could not be loaded)."""
    return _unwrap(request)


@pytest.fixture
def dist_linear_ce_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded distributed (vocabulary-parallel) linear+CE impl (:mod:`numcheck.impls.protocols.dist_linear_ce`; skipped
    when it cannot run here, failed when it could not be loaded)."""
    return _unwrap(request)


@pytest.fixture
def tp_quant_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded tensor-parallel quantized linear (:mod:`numcheck.impls.protocols.tp_fp8_linear`; skipped when it cannot
    run here, failed when it could not be loaded)."""
    return _unwrap(request)


@pytest.fixture
def numcheck_impl(request: pytest.FixtureRequest) -> Any:
    """For users' own tests: each single-device impl (linear+CE or quantized linear) named by ``--impl`` (else
    every discovered one), with the suite's skip and failure rules. Its declaration is ``numcheck_impl.support``."""
    return _unwrap(request)


@pytest.fixture
def numcheck_problems(numcheck_impl: Any) -> st.SearchStrategy[Any]:
    """For users' own hypothesis tests: the suite's strategy of problems inside ``numcheck_impl``'s declaration
    (:func:`numcheck.properties.core.strategies.problems` for linear+CE impls,
    :func:`numcheck.properties.fp8.strategies.quant_cases` for quantized-linear ones); draw it with
    ``data.draw(numcheck_problems)``."""
    if numcheck_impl.kind == "quant_linear":
        return quant_cases(numcheck_impl.support)
    return problems(numcheck_impl.support)


@pytest.fixture(scope="module")
def one_thread_per_module() -> Iterator[None]:
    """torch's intra-op threads set to 1 for a module, restored after it (modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread_per_module")``)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--numcheck-record=DIR``: this process (each xdist worker, or the one process) records into its own
    ``DIR/records-<worker>.jsonl`` (:mod:`numcheck.properties.core.records`)."""
    config.addinivalue_line("markers", "numcheck_scale: the production-shape tier (runs only with --numcheck-scale, "
                                       "on CUDA)")
    config.addinivalue_line("markers", f"{_NO_IMPL_MARK}(kind): a test of an impl kind no selected impl has "
                                       f"(deselected by numcheck's plugin)")
    folder = config.getoption("--numcheck-record", None)
    if folder is not None:
        records.start(Path(folder) / f"records-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The record file closed at the end of the session."""
    if records.recording():
        records.stop()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``numcheck_scale`` test is skipped without ``--numcheck-scale``; while recording, the records that follow
    belong to ``item``."""
    if item.get_closest_marker("numcheck_scale") is not None and not item.config.getoption("--numcheck-scale"):
        pytest.skip("the production-shape tier runs only with --numcheck-scale (CUDA, minutes)")
    if records.recording():
        records.set_test(item.nodeid, getattr(item, "originalname", item.name))


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Records made outside a test belong to none."""
    if records.recording():
        records.set_test()
