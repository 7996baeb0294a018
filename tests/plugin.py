"""numcheck's pytest plugin (entry point ``pytest11: numcheck``): which impls run, numcheck's hypothesis profiles,
and the fixtures of the property suite and of users' own tests.

Run the suite against your impl from any directory::

    pytest -n auto --pyargs numcheck.tests.suite --impl mypkg.flce:impl

- ``--impl SPEC`` (repeatable) restricts the run to those impls: built-in names or ``package.module:attr``.
  Without it: every built-in, plus ``NUMCHECK_IMPLS`` and the ``numcheck.impls`` entry points.
- Every test that takes ``linear_ce_impl`` (or ``fp8_linear_impl``, ``grouped_fp8_linear_impl``, ``dist_linear_ce_impl``,
  ``tp_fp8_linear_impl``, or a user's ``numcheck_impl``) is parametrized over every loaded impl of that kind, ids are the impl names, and
  collection is identical on every xdist worker (discovery is deterministic). A test of a kind that no selected
  impl has is not collected (deselected; the summary says so, under xdist too): ``--impl`` naming only linear+CE
  impls runs no FP8 or distributed test, never the built-ins in their place. numcheck's own protocol tests (the
  suite's tests that take no impl) run only when no ``--impl`` is given. An impl that failed to load is one
  error, ``numcheck::load[SPEC]``, naming it and the cause (its kind is unknown, so no test is parametrized
  with it); the others run. One that cannot run here is skipped with the reason.
- A failing suite test whose exception is numcheck's verdict
  (:class:`~numcheck.properties.core.failures.PropertyFailure`: an output out of bounds, or the impl raised) is
  reported with numcheck's message only (impl, case, what failed or what was raised where, the repro line) and
  numcheck's notes (the covering row), without pytest's traceback, argument dumps or hypothesis' falsifying
  example (the message names the case; its repro line reruns it).
- ``--hypothesis-show-statistics`` counts each test's covering rows (run before hypothesis' draws) and the
  distributed tests' draws (whose ``@given`` runs inside the test).
- ``--numcheck-record=DIR``: every accuracy and strided-inputs judgement's error/bound per output is written to
  ``DIR/records-<worker>.jsonl`` (:mod:`numcheck.properties.core.records`; ``numcheck sweep`` reads them).
- Known divergences are findings: after a run of numcheck's suite the summary names every recorded known
  divergence that applied to a selected impl here (:func:`numcheck.properties.distributed.linear_ce.known.applicable`: library,
  release, what is wrong; the same records as report.json's ``known_divergences``), and environment artifacts as
  "not judged here". ``--numcheck-strict`` (for gating a release upgrade) makes them failures: a test skipped as a
  known divergence fails, and the session exits 1 when a library's known divergence applied (an artifact never).
- ``--numcheck-poison`` / ``--no-numcheck-poison``: judge every impl kind with uninitialised memory filled (NaN),
  or none; without either, every kind numcheck ships runs with it (the distributed suites in their ranks) and a
  kind registered from outside without
  (:mod:`numcheck.properties.core.poison`: why, what it costs per family; the option sets ``NUMCHECK_POISON``, which
  :func:`numcheck.check`, ``numcheck report`` and xdist workers read too).
- ``--numcheck-production``: also run the production-shape tier (``numcheck.tests.suite.test_production``, marker
  ``numcheck_production``; CUDA only, minutes: :mod:`numcheck.properties.production.tier`). Off by default. Its
  name before 0.2.0, ``--numcheck-scale``, still works with a warning; giving both is one usage error.
- Hypothesis profiles (:mod:`numcheck.properties.core.profiles`) ``numcheck-ci`` (derandomized, bounded;
  ``NUMCHECK_CI_EXAMPLES`` examples, default 12), ``numcheck-ci-seeded`` (the same, not derandomized: for
  ``--hypothesis-seed``), ``numcheck-dev`` and ``numcheck-thorough``. numcheck's own test modules take the profile
  chosen with ``--hypothesis-profile`` when it is one of these, else the one ``NUMCHECK_HYPOTHESIS_PROFILE`` names
  (``ci``, ``dev``, ... or the full name), else ``numcheck-ci``. No profile is ever loaded for the process: a
  user's own tests keep theirs.

Inert for every other pytest run, in time too: the options are registered, but nothing is discovered, imported
(no torch, hypothesis or triton: this module imports only pytest and the standard library at its top),
parametrized, or set (threads, ``TRITON_INTERPRET``) until a numcheck test module is collected or a test asks
for one of the fixtures. ``tools/bench_plugin_overhead.py`` measures what it costs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, MutableMapping

import pytest

if TYPE_CHECKING:
    from hypothesis import strategies as st

    from numcheck.impls.registry import BrokenImpl, ImplEntry
    from numcheck.properties.core.runner import SuiteProperty

_ENTRIES_KEY = pytest.StashKey[list]()
_ARRANGED_KEY = pytest.StashKey[bool]()
_RECORDING_KEY = pytest.StashKey[bool]()
_TESTS_DIR = Path(__file__).resolve().parent
#: The package the folder tests/ is (this module is numcheck.tests.plugin).
_TESTS_PACKAGE = __name__.rpartition(".")[0]
_SUITE_DIR = _TESTS_DIR / "suite"
#: The impl fixtures this plugin defines (below): one per kind (its descriptor's ``fixture``) and ``numcheck_impl``
#: over the kinds marked ``generic``. The kinds each is parametrized over: :func:`_fixture_kinds`.
_IMPL_FIXTURES: tuple[str, ...] = (
    "linear_ce_impl",
    "fp8_linear_impl",
    "dist_linear_ce_impl",
    "tp_fp8_linear_impl",
    "grouped_fp8_linear_impl",
    "numcheck_impl",
)
#: How the fixture of every kind ends (:class:`numcheck.impls.protocols.kind.Kind` checks it): a test asking for an
#: argument named so may take a kind registered after the plugin's own (:func:`pytest_generate_tests`).
_KIND_FIXTURE_SUFFIX = "_impl"
#: The impl fixtures' names before numcheck 0.2.0 (each kind's descriptor's ``former_fixture``), old → new: still
#: parametrized as the new one, with a :class:`~numcheck.errors.RenamedWarning` once per process; a test taking both
#: is one collection error naming both (:func:`_former_fixtures`). Spelled here (the plugin imports no torch).
_FORMER_FIXTURES: dict[str, str] = {
    "quant_impl": "fp8_linear_impl",
    "grouped_quant_impl": "grouped_fp8_linear_impl",
    "tp_quant_impl": "tp_fp8_linear_impl",
}
#: Every name an impl fixture goes by: today's and the old ones.
_ALL_IMPL_FIXTURES: tuple[str, ...] = (*_IMPL_FIXTURES, *_FORMER_FIXTURES)
#: The production-shape tier's option before 0.2.0 (now ``--numcheck-production``).
_FORMER_PRODUCTION = "--numcheck-scale"
#: The fixture that runs one test over every kind marked ``generic`` (users' own tests, the suite's shared ones).
_GENERIC_FIXTURE = "numcheck_impl"
_NO_IMPL_MARK = "numcheck_no_impl"
#: The marker naming the impls a suite test runs on in CI's oldest-torch leg (:func:`_params`).
_TORCH_IMPLS_MARK = "torch_versions_impls"
_NOT_COLLECTED_KEY = pytest.StashKey[dict]()
#: The key under which an xdist worker hands its not-collected counts to the controller (``workeroutput``).
_WORKER_OUTPUT = "numcheck_not_collected"
#: The not-collected label of numcheck's own protocol tests (the suite's tests that take no impl).
_OWN_TESTS = "numcheck's own protocol"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("numcheck", "numcheck property suite")
    group.addoption(
        "--impl",
        action="append",
        default=[],
        metavar="SPEC",
        help="run numcheck's suite (and the numcheck_impl fixture) on these impls only: built-in name "
        "or package.module:attr (repeatable)",
    )
    group.addoption(
        "--numcheck-record",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the observed error/bound of every accuracy judgement to DIR/records-<worker>.jsonl "
        "(one file per xdist worker; numcheck sweep reads them)",
    )
    group.addoption(
        "--numcheck-strict",
        action="store_true",
        default=False,
        help="fail on recorded known divergences (for gating a release upgrade): a test skipped as one fails, and "
        "the session exits 1 when a library's known divergence applies to a selected impl",
    )
    group.addoption(
        "--numcheck-poison",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="judge every impl kind with uninitialised memory filled (torch.empty returns NaN), or with "
        "--no-numcheck-poison none; default: every kind numcheck ships (NUMCHECK_POISON=on|off|default)",
    )
    group.addoption(
        "--numcheck-production",
        action="store_true",
        default=False,
        help="also run the production-shape tier (tests marked numcheck_production; CUDA only, minutes)",
    )
    group.addoption(
        _FORMER_PRODUCTION,
        action="store_true",
        default=False,
        help="old name of --numcheck-production (renamed in 0.2.0; goes in 0.3.0)",
    )


def _former_production(config: pytest.Config) -> None:
    """``--numcheck-scale`` (before 0.2.0) sets ``--numcheck-production``, warning once; both given is one usage
    error naming both."""
    if not config.getoption(_FORMER_PRODUCTION):
        return
    from numcheck.errors import both_names, warn_renamed

    if config.getoption("--numcheck-production"):
        raise pytest.UsageError(both_names("option", _FORMER_PRODUCTION, "--numcheck-production"))
    warn_renamed("option", _FORMER_PRODUCTION, "--numcheck-production", stacklevel=2)
    config.option.numcheck_production = True


#: The production-shape tier's marker before 0.2.0 (now ``numcheck_production``).
_FORMER_PRODUCTION_MARK = "numcheck_scale"


def _former_marker(config: pytest.Config) -> bool:
    """``-m`` naming ``numcheck_scale`` (before 0.2.0) selects the ``numcheck_production`` tests, warning once (it
    would otherwise silently select nothing); naming both is one usage error naming both. True when the old name is
    in use (:func:`pytest_itemcollected` then marks each production test with it too)."""
    import re

    expr = str(getattr(config.option, "markexpr", "") or "")
    if not re.search(rf"\b{_FORMER_PRODUCTION_MARK}\b", expr):
        return False
    from numcheck.errors import both_names, warn_renamed

    if re.search(r"\bnumcheck_production\b", expr):
        raise pytest.UsageError(both_names("pytest marker", _FORMER_PRODUCTION_MARK, "numcheck_production"))
    warn_renamed("pytest marker", _FORMER_PRODUCTION_MARK, "numcheck_production", stacklevel=2)
    return True


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under ``-m numcheck_scale`` (:func:`_former_marker`) a ``numcheck_production`` test carries the old marker too,
    so pytest's own ``-m`` selection keeps it."""
    if getattr(item.config, "_numcheck_former_mark", False) and item.get_closest_marker("numcheck_production"):
        item.add_marker(_FORMER_PRODUCTION_MARK)


def profile_name() -> str:
    """The numcheck profile numcheck's tests run under: the loaded hypothesis profile if it is a numcheck one
    (``--hypothesis-profile numcheck-dev``), else ``NUMCHECK_HYPOTHESIS_PROFILE``'s, else ``numcheck-ci``."""
    from hypothesis import settings

    from numcheck.properties.core.profiles import DEFAULT_PROFILE, PROFILES, numcheck_name

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
    from hypothesis import settings

    before = settings.get_current_profile_name()
    settings.load_profile(profile_name())
    try:
        yield
    finally:
        settings.load_profile(before)


def _is_numcheck(path: Path) -> bool:
    """Whether ``path`` is inside numcheck's tests/ (the folder tests/ of a checkout, numcheck/tests/ of a wheel)."""
    return path.resolve().is_relative_to(_TESTS_DIR)


def module_name(path: Path) -> str:
    """The name a module or package (``__init__.py``) inside numcheck's tests/ has everywhere else:
    ``numcheck.tests.self.test_layers`` for tests/self/test_layers.py."""
    parts = path.resolve().relative_to(_TESTS_DIR).with_suffix("").parts
    return ".".join((_TESTS_PACKAGE, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _import_frame(entry: Any) -> bool:
    """Whether a traceback entry is the import machinery's (importlib, pytest's assertion rewriting, this plugin)."""
    path = str(entry.path)
    return path.startswith("<frozen ") or path == __file__ or bool({"importlib", "_pytest"} & set(Path(path).parts))


def _import(collector: pytest.Collector, path: Path) -> Any:
    """The module at ``path`` imported by its numcheck name (:func:`module_name`), as pytest imports a test module:
    an import error is the module's collection error, its traceback without the import machinery's frames (all of
    them with ``-vv``)."""
    name = module_name(path)
    try:
        return importlib.import_module(name)
    except (ImportError, SyntaxError) as exc:
        info = pytest.ExceptionInfo.from_current()
        if collector.config.get_verbosity() < 2:
            info.traceback = info.traceback.filter(lambda entry: not _import_frame(entry))
        shown = info.getrepr(style="short") if info.traceback else info.exconly()
        raise collector.CollectError(
            f"{type(exc).__name__} while importing test module '{path}' as {name}.\nTraceback:\n{shown}"
        ) from exc


class NumcheckModule(pytest.Module):
    """A test module of numcheck's tests/, imported by its numcheck name. pytest names a module after its folders:
    in a checkout tests/ is the package ``numcheck.tests`` through setup.py's package_dir, so pytest's name would be
    ``tests.self.test_layers``, a second copy of the module beside the ``numcheck.tests.self.test_layers`` that
    specs and imports name (and of everything it defines: impls registered twice)."""

    def _getobj(self) -> Any:
        module = _import(self, self.path)
        self.config.pluginmanager.consider_module(module)
        return module


class NumcheckPackage(pytest.Package):
    """A package of numcheck's tests/, set up by importing its ``__init__.py`` by its numcheck name (pytest's own
    set-up would import it under the folder's name; numcheck's packages define no ``setup_module``)."""

    def setup(self) -> None:
        _import(self, self.path / "__init__.py")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """numcheck's test modules as :class:`NumcheckModule`; pytest's own for every other file."""
    return NumcheckModule.from_parent(parent, path=module_path) if _is_numcheck(module_path) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """numcheck's test packages as :class:`NumcheckPackage`; pytest's own for every other folder."""
    if _is_numcheck(path) and (path / "__init__.py").is_file():
        return NumcheckPackage.from_parent(parent, path=path)
    return None


def _arrange(config: pytest.Config) -> None:
    """What numcheck's tests need before anything imports triton: Triton's interpreter where there is no CUDA,
    and one intra-op thread per xdist worker and the processes its tests start (:func:`one_thread_per_worker`:
    the workers already fill the cores; small tensor ops were measured up to 40x slower with two threads
    contending on a loaded 2-core machine). Once per session."""
    if config.stash.get(_ARRANGED_KEY, False):
        return
    config.stash[_ARRANGED_KEY] = True
    from numcheck.impls import interpreter

    interpreter.arrange()
    if one_thread_per_worker(os.environ):
        import torch

        torch.set_num_threads(1)


def one_thread_per_worker(environ: MutableMapping[str, str]) -> bool:
    """In an xdist worker (``PYTEST_XDIST_WORKER`` set), ``OMP_NUM_THREADS=1`` in ``environ`` unless set already,
    so the processes its tests start (a suite run as a user runs it, a printed repro line, ``numcheck sweep``)
    take one intra-op thread too: beside the other workers, torch's default of one per core made such a
    subprocess 2-5× slower (test_chunk_reach's fp32_sum_c7 twin beside one other busy process on 2 cores, two
    alternations: 29.2 and 50.8 s CPU, 24.9 and 81.2 s wall with two threads; 10.9 and 12.4 s CPU, 11.2 and
    16.0 s wall with one). Returns whether this is a worker (whose own torch the caller sets to one thread)."""
    if not environ.get("PYTEST_XDIST_WORKER"):
        return False
    environ.setdefault("OMP_NUM_THREADS", "1")
    return True


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """numcheck's test modules are imported under numcheck's profile, after :func:`_arrange`."""
    if not (isinstance(collector, pytest.Module) and _is_numcheck(collector.path)):
        return (yield)
    _arrange(collector.config)
    with numcheck_profile():
        return (yield)


def impl_entries(config: pytest.Config, kinds: tuple[str, ...] | None) -> list[ImplEntry]:
    """Loaded entries of ``kinds`` (every kind for ``None``), discovered once per session, on first use. The
    broken ones (whose kind is unknown) are not among them: :func:`broken_entries`."""
    from numcheck.impls.registry import BrokenImpl

    return [e for e in _discovered(config) if not isinstance(e, BrokenImpl) and (kinds is None or e.kind in kinds)]


def broken_entries(config: pytest.Config) -> list[BrokenImpl]:
    """The specs of this session that could not be loaded (none before discovery, and then without importing the
    registry, which imports torch: a run that collects no numcheck test pays nothing for it)."""
    if _ENTRIES_KEY not in config.stash:
        return []
    from numcheck.impls.registry import BrokenImpl

    return [e for e in config.stash[_ENTRIES_KEY] if isinstance(e, BrokenImpl)]


def _discovered(config: pytest.Config) -> list[Any]:
    """Every entry of this session, loaded or broken: discovered on first use."""
    if _ENTRIES_KEY not in config.stash:
        _arrange(config)  # before discovery: the built-ins import triton
        from numcheck.impls.registry import discover

        config.stash[_ENTRIES_KEY] = discover(config.getoption("--impl"))
    return config.stash[_ENTRIES_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each impl fixture over the loaded impls of its kinds. Where none is loaded (``--impl`` named only impls of
    other kinds, or only impls that failed to load) the test gets one placeholder marked :data:`_NO_IMPL_MARK`,
    which :func:`pytest_collection_modifyitems` leaves out of the run (never the built-ins in their place).

    The fixtures this plugin defines (:data:`_IMPL_FIXTURES`) are parametrized indirectly (the fixture skips an impl
    that cannot run here); a kind registered after them (:data:`numcheck.impls.protocols.kinds.KINDS`, its
    descriptor's ``fixture``, a name ending in ``_impl``) has its argument parametrized directly with the impls, an
    impl that cannot run here marked skipped. The registry (torch) is imported only for a test asking for an
    argument whose name ends in ``_impl``."""
    _former_fixtures(metafunc)
    requested = [f for f in metafunc.fixturenames if f in _ALL_IMPL_FIXTURES or f.endswith(_KIND_FIXTURE_SUFFIX)]
    for fixture in requested:
        kinds = _fixture_kinds(fixture)
        if not kinds:  # an argument of the user's own named like a kind's fixture
            continue
        direct = fixture not in _ALL_IMPL_FIXTURES
        entries = impl_entries(metafunc.config, kinds)
        if entries:
            metafunc.parametrize(fixture, _params(metafunc, entries, direct), indirect=not direct)
        else:
            mark = getattr(pytest.mark, _NO_IMPL_MARK)(" or ".join(kinds))
            metafunc.parametrize(
                fixture, [pytest.param(None, marks=mark)], ids=[f"no-{kinds[0]}-impl"], indirect=not direct
            )


def _former_fixtures(metafunc: pytest.Metafunc) -> None:
    """Warn once per process for each impl fixture ``metafunc``'s test takes by its name before 0.2.0; a test taking
    one by both names fails to collect, with one error naming both."""
    from numcheck.errors import both_names, warn_renamed

    for old, new in _FORMER_FIXTURES.items():
        if old in metafunc.fixturenames:
            if new in metafunc.fixturenames:
                pytest.fail(f"{metafunc.definition.nodeid}: {both_names('pytest fixture', old, new)}", pytrace=False)
            warn_renamed("pytest fixture", old, new, stacklevel=2)


def _fixture_kinds(fixture: str) -> tuple[str, ...]:
    """The kinds (:data:`numcheck.impls.protocols.kinds.KINDS`, in their order) ``fixture`` is parametrized over:
    the kind whose descriptor names it, or for :data:`_GENERIC_FIXTURE` every kind marked ``generic``. Imported
    here, not with the plugin: the protocol modules import torch, and only a test taking an impl fixture needs it."""
    from numcheck.impls.protocols.kinds import KINDS

    fixture = _FORMER_FIXTURES.get(fixture, fixture)
    return tuple(k.name for k in KINDS if (k.generic if fixture == _GENERIC_FIXTURE else k.fixture == fixture))


def _params(metafunc: pytest.Metafunc, entries: list[Any], direct: bool = False) -> list[Any]:
    """One parameter per impl (its entry, or for a ``direct`` parametrization the impl itself, skipped when it
    cannot run here); under a ``torch_versions_impls(*names, reason=...)`` marker the named impls' carry
    ``torch_versions(reason=...)``: CI's oldest-torch leg (``-m torch_versions``) runs the test on those only."""
    mark = metafunc.definition.get_closest_marker(_TORCH_IMPLS_MARK)
    chosen = set(mark.args) if mark is not None else set()
    reason = mark.kwargs.get("reason", "") if mark is not None else ""
    unknown = chosen - {e.name for e in impl_entries(metafunc.config, None)}
    if unknown and not metafunc.config.getoption("--impl"):  # every built-in is loaded: a name none has is a typo
        pytest.fail(
            f"{metafunc.definition.nodeid}: {_TORCH_IMPLS_MARK} names {sorted(unknown)}, which no loaded impl is "
            f"called (`numcheck list` names them)",
            pytrace=False,
        )
    return [
        pytest.param(
            e.impl if direct else e,
            id=e.name,
            marks=[
                *([pytest.mark.torch_versions(reason=reason)] if e.name in chosen else []),
                *([_unavailable(e)] if direct and e.impl.support.unavailable_reason() else []),
            ],
        )
        for e in entries
    ]


def _unavailable(entry: Any) -> pytest.MarkDecorator:
    """The skip of an impl that cannot run here (as :func:`_unwrap` skips it)."""
    return pytest.mark.skip(reason=f"impl {entry.name!r} unavailable here: {entry.impl.support.unavailable_reason()}")


class ImplLoadError(pytest.Item):
    """The one error of an impl spec that could not be loaded: it names the spec, where it was named and the
    cause. No test is parametrized with such an impl (its kind is unknown), so this is its only report."""

    def __init__(self, *, entry: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry

    def setup(self) -> None:
        e = self.entry
        pytest.fail(
            f"impl {e.spec!r} (from {e.origin}) could not be loaded: {e.error}\n"
            f"no numcheck test is collected for it; the other impls are tested as usual",
            pytrace=False,
        )

    def runtest(self) -> None:
        """Never reached: :meth:`setup` fails."""
        raise AssertionError(f"impl {self.entry.spec!r} could not be loaded")

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"numcheck: impl {self.entry.spec!r} could not be loaded"


def _impl_fixture(name: str) -> bool:
    """Whether ``name`` is an impl fixture: one this plugin defines, or a kind's registered after them
    (:func:`_fixture_kinds`; only names ending in ``_impl`` are looked up, which imports the kinds)."""
    return name in _ALL_IMPL_FIXTURES or (name.endswith(_KIND_FIXTURE_SUFFIX) and bool(_fixture_kinds(name)))


def _own_protocol_test(item: pytest.Item) -> bool:
    """Whether ``item`` is one of the shipped suite's tests that take no impl (numcheck checking its own
    protocol code)."""
    names = getattr(item, "fixturenames", ())
    return item.path.resolve().is_relative_to(_SUITE_DIR) and not any(_impl_fixture(f) for f in names)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of a kind no selected impl has are not collected: deselected (pytest counts them), and the terminal
    summary says which kinds and how many tests (:func:`pytest_terminal_summary`). Under ``--impl`` numcheck's
    own protocol tests are left out the same way. Each impl that failed to load gets its one
    :class:`ImplLoadError` (after ``-k`` and ``-m`` selected: a broken impl is reported whatever was selected)."""
    left: dict[str, int] = {}
    keep, drop = [], []
    selected = bool(config.getoption("--impl", None))
    for item in items:
        mark = item.get_closest_marker(_NO_IMPL_MARK)
        label = mark.args[0] if mark is not None else (_OWN_TESTS if selected and _own_protocol_test(item) else None)
        if label is None:
            keep.append(item)
        else:
            drop.append(item)
            left[label] = left.get(label, 0) + 1
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    ids: set[str] = set()
    for entry in broken_entries(config):
        nodeid = f"numcheck::load[{entry.spec}]"
        while nodeid in ids:  # the same spec broken twice (named twice, or a duplicate name): one item each
            nodeid = f"{nodeid[:-1]}+]"
        ids.add(nodeid)
        items.append(ImplLoadError.from_parent(session, name=nodeid, nodeid=nodeid, entry=entry))
    config.stash[_NOT_COLLECTED_KEY] = left
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller prints the summary
        config.workeroutput[_WORKER_OUTPUT] = left


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """Under xdist: the not-collected counts a worker collected (the same on every worker), for the summary."""
    left = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT)
    if left is not None:
        node.config.stash[_NOT_COLLECTED_KEY] = left


def _suite_ran(config: pytest.Config, stats: dict[str, list[Any]]) -> bool:
    """Whether a test of numcheck's suite was reported in this session (on the controller under xdist too)."""
    for reports in stats.values():
        for r in reports:
            where = getattr(r, "location", None)
            if where and (config.rootpath / where[0]).resolve().is_relative_to(_SUITE_DIR):
                return True
    return False


def known_findings(config: pytest.Config, stats: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The known divergences that applied to the session's impls on the suite's device, as report.json's
    ``known_divergences`` records (none when numcheck's suite did not run)."""
    if not _suite_ran(config, stats):
        return []
    from numcheck.properties.core.device import DEVICE_TYPE
    from numcheck.properties.distributed.linear_ce.known import applicable

    return [
        k.finding(e.name)
        for e in impl_entries(config, None)
        if e.impl.support.unavailable_reason() is None
        for k in applicable(e.name, DEVICE_TYPE, e.impl.support)
    ]


def _known_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The known divergences of the session, one line each (module docstring)."""
    found = known_findings(config, terminalreporter.stats)
    strict = config.getoption("--numcheck-strict")
    for d in found:
        what = f"{d['impl']}: {d['library']} {d['release']} — {d['summary']}"
        if d["artifact"]:
            terminalreporter.write_line(f"numcheck: not judged here (environment artifact, not the library's): {what}")
        else:
            terminalreporter.write_line(
                f"numcheck: known divergence, not a pass{' (--numcheck-strict: a failure)' if strict else ''}: {what}"
            )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under ``--numcheck-strict``: exit 1 when a library's known divergence applied to a selected impl."""
    if not session.config.getoption("--numcheck-strict") or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {}) if reporter is not None else {}
    if any(not d["artifact"] for d in known_findings(session.config, stats)):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line per impl kind whose tests were left out because no selected impl has it (and one for numcheck's
    own protocol tests under ``--impl``), and one per known divergence that applied (:func:`_known_summary`)."""
    _known_summary(terminalreporter, config)
    for kind, n in sorted(config.stash.get(_NOT_COLLECTED_KEY, {}).items()):
        if kind == _OWN_TESTS:
            terminalreporter.write_line(
                f"numcheck: {n} test(s) of {_OWN_TESTS} code not collected: they run only without --impl"
            )
        else:
            terminalreporter.write_line(
                f"numcheck: {n} test(s) for {kind} impls not collected: --impl selected none of that kind that loaded"
            )


def _impl_of(item: pytest.Item) -> Any:
    """The impl an item was parametrized with through one of the impl fixtures, or ``None``."""
    funcargs = getattr(item, "funcargs", {})
    return next((funcargs[f] for f in funcargs if _impl_fixture(f)), None)


def _suite_property(item: pytest.Item, impl: Any) -> SuiteProperty | None:
    """The suite entry a drawn test runs: in the table of ``impl``'s family
    (:data:`numcheck.properties.suites.SUITES`), the test's name without ``test_``, with ``[value]`` of its parameter
    other than the impl's (``frozen_inputs[x]``)."""
    from numcheck.properties.suites import SUITES

    family = SUITES.get(impl.kind)
    if family is None:
        return None
    callspec = getattr(item, "callspec", None)
    params = [str(v) for k, v in (callspec.params.items() if callspec else ()) if k not in _ALL_IMPL_FIXTURES]
    base = getattr(item, "originalname", item.name).removeprefix("test_")
    return family.table.get(f"{base}[{'-'.join(params)}]" if params else base)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """For the suite's ``@given`` tests: the test's covering rows first
    (:func:`numcheck.properties.core.runner.run_rows`), then the impl's budget of random examples
    (:func:`numcheck.properties.core.runner.budget`), and a skip, not an error, when a known divergence rejected
    every draw (hypothesis' ``Unsatisfiable``). Every numcheck test runs under numcheck's GEMM precision
    (:func:`numcheck.properties.core.matmul_precision.pinned`); other tests of the session keep their own."""
    if not _is_numcheck(item.path):
        return (yield)
    from numcheck.properties.core import matmul_precision

    with matmul_precision.pinned():
        return (yield from _suite_call(item))


def _suite_call(item: pytest.Item) -> Any:
    """The body of :func:`pytest_runtest_call` for a numcheck test."""
    fn = getattr(item, "obj", None)
    impl = _impl_of(item)
    own = getattr(fn, "_hypothesis_internal_use_settings", None)
    if impl is None or not item.path.resolve().is_relative_to(_SUITE_DIR):
        return (yield)
    if own is None:  # a test whose @given runs inside it (the distributed suites): its statistics collected here
        with _collected_statistics(item):
            return (yield)
    from hypothesis import settings
    from hypothesis.errors import Unsatisfiable

    from numcheck.properties.core.runner import budget, skip_reason, unsatisfiable_reason

    prop = _suite_property(item, impl)
    # The same attribute hypothesis' own plugin sets per parametrized call (its differing_executors override).
    fn._hypothesis_internal_use_settings = settings(own, max_examples=budget(impl, own.max_examples, prop))
    rows = _RowsStatistics()
    try:
        if prop is not None and skip_reason(prop, impl) is None:
            rows.run(prop, impl)
        return (yield)
    except Unsatisfiable:
        pytest.skip(unsatisfiable_reason(impl))
    finally:
        fn._hypothesis_internal_use_settings = own
        rows.note(item)


class _RowsStatistics:
    """The covering rows a test ran before its draws, for ``--hypothesis-show-statistics``."""

    def __init__(self) -> None:
        self.design: int | None = None
        self.passing = self.rejected = self.failing = 0
        self.seconds = 0.0
        self.dimensions = ""

    def run(self, prop: SuiteProperty, impl: Any) -> None:
        """:func:`~numcheck.properties.core.runner.run_rows`, counted."""
        from numcheck.properties.core.runner import rows, run_rows

        design = rows(prop, impl)
        self.design = len(design)
        self.dimensions = ", ".join(dict.fromkeys(d for row in design for d, _ in row.values))
        t0 = time.monotonic()
        try:
            run = run_rows(prop, impl)
        except BaseException:
            self.failing = 1
            raise
        finally:
            self.seconds = time.monotonic() - t0
        self.rejected = len(run.rejected)
        self.passing = len(design) - self.rejected

    def note(self, item: pytest.Item) -> None:
        """Add the rows to the test's hypothesis statistics (hypothesis' plugin reports ``item.hypothesis_statistics``
        at teardown); a test that failed in its rows, before hypothesis ran, gets statistics of its rows alone."""
        if not self.design:
            return
        counts = (
            "a row failed (the test's failure names it)"
            if self.failing
            else f"{self.passing} passing and {self.rejected} rejected (every seeded draw a known divergence)"
        )
        text = (
            f"  - covering rows, run before the draws ({self.seconds:.2f} seconds):\n"
            f"    - {self.design} rows, a pairwise design over {self.dimensions}: {counts}"
        )
        stats = getattr(item, "hypothesis_statistics", None)
        if stats is None:
            item.hypothesis_statistics = f"{item.nodeid}:\n\n{text}\n  - Stopped because a covering row failed"
        else:
            head, _, rest = stats.partition("\n")
            item.hypothesis_statistics = f"{head}\n\n{text}\n{rest.lstrip(chr(10))}"


@contextlib.contextmanager
def _collected_statistics(item: pytest.Item) -> Iterator[None]:
    """The statistics of every ``@given`` run inside ``item`` (hypothesis' plugin collects those of a test that is
    itself ``@given`` only), as ``item.hypothesis_statistics``."""
    from hypothesis.statistics import collector, describe_statistics

    runs: list[str] = []

    def note(stats: Any) -> None:
        runs.append(describe_statistics(stats))

    try:
        with collector.with_value(note):
            yield
    finally:
        if runs:
            item.hypothesis_statistics = f"{item.nodeid}:\n\n" + "\n".join(runs)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """numcheck's ``@given`` tests draw the same cases however they were collected: each is keyed (its
    derandomized seed, its example-database entry) by :func:`~numcheck.properties.core.draw_isolation.draw_key`, set
    here after hypothesis' plugin set the node id, which carries the invocation's rootdir; and it draws no
    constant of the loaded local modules (:func:`~numcheck.properties.core.draw_isolation.isolated_draws`)."""
    inner = getattr(getattr(pyfuncitem.obj, "hypothesis", None), "inner_test", None)
    if inner is None or not _is_numcheck(pyfuncitem.path):
        return (yield)
    from numcheck.properties.core.draw_isolation import draw_key, isolated_draws

    rel = pyfuncitem.path.resolve().relative_to(_TESTS_DIR).as_posix()
    inner._hypothesis_internal_add_digest = draw_key(rel, pyfuncitem.nodeid)
    with isolated_draws():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A numcheck test failing with numcheck's own verdict is reported with the verdict's message (and the
    exception's notes: the covering row, hypothesis' falsifying example) only: the message already names impl,
    case, what failed or what the impl raised where, and the repro line; pytest's traceback would add the
    suite's frames and dumps of the tensors."""
    report = yield
    if report.skipped and item.config.getoption("--numcheck-strict") and _is_numcheck(item.path):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "known divergence" in reason:
            report.outcome = "failed"
            report.longrepr = f"--numcheck-strict: a known divergence is a failure here: {reason}"
    if call.excinfo is not None and report.failed and _is_numcheck(item.path):
        text = _verdict_text(call.excinfo.value)
        if text is not None:
            report.longrepr = _value_repr(text)
    return report


def _verdict_text(exc: BaseException) -> str | None:
    """The text of numcheck's verdicts in ``exc`` (one, or a group of them: hypothesis' distinct failures), with
    numcheck's notes (the covering row); ``None`` when ``exc`` holds anything else (a bug shows with its
    traceback). Hypothesis' notes (the falsifying example, with the impl's whole declaration, and its blob) are
    left out: the message names the case, and its repro line reruns it."""
    from numcheck.errors import PropertyFailure, grouped

    parts = grouped(exc)
    if not all(isinstance(e, PropertyFailure) for e in parts):
        return None
    texts = ["\n".join([str(e), *(n for n in getattr(e, "__notes__", ()) if n.startswith("numcheck:"))]) for e in parts]
    if parts == [exc]:  # not a group
        return texts[0]
    # hypothesis' group: distinct failures, or one that did not fail again on a rerun (Flaky...), said first
    head = f"{exc.message} ({type(exc).__name__})"
    return head + "\n" + "\n\n".join(f"({i}) {t}" for i, t in enumerate(texts, 1))


def _value_repr(text: str) -> Any:
    """A report's ``longrepr`` showing ``text`` alone (pytest's ``value`` style, as for ``pytest.fail(...,
    pytrace=False)``), with ``text``'s first line as the short summary's message."""
    from numcheck.errors import PropertyFailure

    try:
        raise PropertyFailure(text)
    except PropertyFailure:
        info = pytest.ExceptionInfo.from_current()
    longrepr = info.getrepr(style="value", chain=False)
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        with contextlib.suppress(AttributeError, TypeError):
            crash.message = text.splitlines()[0]
    return longrepr


def _unwrap(request: pytest.FixtureRequest) -> Any:
    """The impl of a parametrized impl fixture, skipped if unavailable here."""
    if not hasattr(request, "param"):
        raise pytest.UsageError(
            f"fixture {request.fixturename!r} is parametrized by numcheck's plugin; "
            f"request it as a test argument, not through getfixturevalue"
        )
    entry = request.param
    reason = entry.impl.support.unavailable_reason()
    if reason:
        pytest.skip(f"impl {entry.name!r} unavailable here: {reason}")
    if why := _device_undeclared(request, entry.impl):
        pytest.skip(why)
    return entry.impl


def _device_undeclared(request: pytest.FixtureRequest, impl: Any) -> str | None:
    """Why the shipped suite cannot judge ``impl`` on the device it draws on (NUMCHECK_DEVICE): the impl's kind
    declares devices and this one is not among them (an adapter declaring only CUDA where the real path runs, under
    a suite drawing on the CPU). ``None`` for users' own tests, which choose their devices themselves."""
    devices = getattr(impl.support, "devices", None)
    if devices is None or not Path(str(request.node.path)).resolve().is_relative_to(_SUITE_DIR):
        return None
    from numcheck.properties.core.device import undeclared_device

    return undeclared_device(devices, impl.name)


@pytest.fixture
def linear_ce_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded linear+CE impl (skipped when it cannot run here)."""
    return _unwrap(request)


@pytest.fixture
def fp8_linear_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded quantized-linear impl (skipped when it cannot run here)."""
    return _unwrap(request)


@pytest.fixture
def grouped_fp8_linear_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded grouped quantized linear (mixture-of-experts, :mod:`numcheck.impls.protocols.grouped_fp8_linear`;
    skipped when it cannot run here, failed when it could not be loaded)."""
    return _unwrap(request)


@pytest.fixture
def dist_linear_ce_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded distributed (vocabulary-parallel) linear+CE impl (:mod:`numcheck.impls.protocols.dist_linear_ce`;
    skipped when it cannot run here)."""
    return _unwrap(request)


@pytest.fixture
def tp_fp8_linear_impl(request: pytest.FixtureRequest) -> Any:
    """A loaded tensor-parallel quantized linear (:mod:`numcheck.impls.protocols.tp_fp8_linear`; skipped when it cannot
    run here)."""
    return _unwrap(request)


@pytest.fixture
def quant_impl(request: pytest.FixtureRequest) -> Any:
    """``fp8_linear_impl`` by its name before numcheck 0.2.0 (warns; goes in 0.3.0)."""
    return _unwrap(request)


@pytest.fixture
def grouped_quant_impl(request: pytest.FixtureRequest) -> Any:
    """``grouped_fp8_linear_impl`` by its name before numcheck 0.2.0 (warns; goes in 0.3.0)."""
    return _unwrap(request)


@pytest.fixture
def tp_quant_impl(request: pytest.FixtureRequest) -> Any:
    """``tp_fp8_linear_impl`` by its name before numcheck 0.2.0 (warns; goes in 0.3.0)."""
    return _unwrap(request)


@pytest.fixture
def numcheck_impl(request: pytest.FixtureRequest) -> Any:
    """For users' own tests: each single-device impl (linear+CE or quantized linear) named by ``--impl`` (else
    every discovered one), with the suite's skip rules (an impl that failed to load is its one error,
    ``numcheck::load[SPEC]``). Its declaration is ``numcheck_impl.support``."""
    return _unwrap(request)


@pytest.fixture
def numcheck_problems(numcheck_impl: Any) -> st.SearchStrategy[Any]:
    """For users' own hypothesis tests: the suite's strategy of problems inside ``numcheck_impl``'s declaration
    (its family's ``strategy`` in :data:`numcheck.properties.suites.SUITES`:
    :func:`numcheck.properties.linear_ce.strategies.problems` for linear+CE impls,
    :func:`numcheck.properties.fp8.strategies.fp8_cases` for quantized-linear ones); draw it with
    ``data.draw(numcheck_problems)``."""
    from numcheck.properties.suites import SUITES

    return SUITES[numcheck_impl.kind].strategy(numcheck_impl.support)


@pytest.fixture(scope="module")
def one_thread_per_module() -> Iterator[None]:
    """torch's intra-op threads set to 1 for a module, restored after it (modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread_per_module")``)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


#: numcheck's CI markers, also registered here so the shipped suite runs under a user's ``--strict-markers``.
_CI_MARKERS = (
    "costly(reason): a test over 20 s in CI's cost table (results/ci-costs.md), with why it costs that",
    "torch_versions(reason): runs on every torch release CI tests (the oldest-torch leg runs only these)",
    f"{_TORCH_IMPLS_MARK}(*impls, reason): the impls a suite test runs on in CI's oldest-torch leg",
)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """numcheck's hypothesis profiles registered before hypothesis' plugin loads the one ``--hypothesis-profile``
    names, when it names one of them (only then: registering imports hypothesis). Under
    ``--numcheck-record=DIR``: this process (each xdist worker, or the one process) records into its own
    ``DIR/records-<worker>.jsonl`` (:mod:`numcheck.properties.core.records`)."""
    if str(config.getoption("--hypothesis-profile", None) or "").startswith("numcheck-"):
        import numcheck.properties.core.profiles  # noqa: F401 - registers the profiles
    config.addinivalue_line(
        "markers", "numcheck_production: the production-shape tier (runs only with --numcheck-production, on CUDA)"
    )
    _former_production(config)
    config._numcheck_former_mark = _former_marker(config)  # type: ignore[attr-defined]
    if config._numcheck_former_mark:  # type: ignore[attr-defined]
        config.addinivalue_line("markers", f"{_FORMER_PRODUCTION_MARK}: numcheck_production's name before 0.2.0")
    config.addinivalue_line(
        "markers",
        f"{_NO_IMPL_MARK}(kind): a test of an impl kind no selected impl has (deselected by numcheck's plugin)",
    )
    for line in _CI_MARKERS:
        config.addinivalue_line("markers", line)
    _set_poison(config)
    folder = config.getoption("--numcheck-record", None)
    config.stash[_RECORDING_KEY] = folder is not None
    from numcheck.properties.core import drawn_log  # imports neither torch nor hypothesis

    try:  # output folders created when missing, or refused here with one error before any test runs
        drawn_log.log_folder()
        if folder is not None:
            from numcheck.properties.core import records

            records.start(Path(folder) / f"records-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


_POISON_ENV = "NUMCHECK_POISON"  # numcheck.properties.core.poison.ENV (not imported here: it imports torch)
_POISON_SAVED_KEY = pytest.StashKey[tuple]()


def _set_poison(config: pytest.Config) -> None:
    """``--numcheck-poison`` / ``--no-numcheck-poison`` as ``NUMCHECK_POISON`` for this process (the judging code,
    distributed ranks started from it, and xdist workers read it); the caller's value kept for unconfigure."""
    on = config.getoption("--numcheck-poison", None)
    if on is None:
        return
    config.stash[_POISON_SAVED_KEY] = (os.environ.get(_POISON_ENV),)
    os.environ[_POISON_ENV] = "on" if on else "off"


def pytest_unconfigure(config: pytest.Config) -> None:
    """The record file closed at the end of the session; ``NUMCHECK_POISON`` as it was before the session."""
    saved = config.stash.get(_POISON_SAVED_KEY, None)
    if saved is not None:
        if saved[0] is None:
            os.environ.pop(_POISON_ENV, None)
        else:
            os.environ[_POISON_ENV] = saved[0]
    if config.stash.get(_RECORDING_KEY, False):
        from numcheck.properties.core import records

        if records.recording():
            records.stop()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``numcheck_production`` test is skipped without ``--numcheck-production``; while recording, the records that
    follow belong to ``item``."""
    if item.get_closest_marker("numcheck_production") is not None and not item.config.getoption(
        "--numcheck-production"
    ):
        pytest.skip("the production-shape tier runs only with --numcheck-production (CUDA, minutes)")
    if item.config.stash.get(_RECORDING_KEY, False):
        from numcheck.properties.core import records

        records.set_test(item.nodeid, getattr(item, "originalname", item.name))


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Records made outside a test belong to none; after a module's last test, this process's rank pools close."""
    if item.config.stash.get(_RECORDING_KEY, False):
        from numcheck.properties.core import records

        records.set_test()
    _close_rank_pools(item, nextitem)


#: The module holding the distributed rank pools (imported by the tests that use them, never here).
_POOL_MODULE = "numcheck.properties.distributed.pool.pool"


def _close_rank_pools(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Close the rank pools this process started (:class:`~numcheck.properties.distributed.pool.pool.DistPool`)
    when the next test is in another module, or there is none. An idle rank is not idle: each of its gloo process
    groups (the pool's, and its last call's, kept until the next call) has a loop thread that wakes 100 times a
    second (measured: 98/s per thread, 0.09 s of CPU per rank in 20 s), and a pool kept to the end of a session
    did so for every test after the distributed ones (ranks of world sizes 1, 2 and 4 on each xdist worker). A
    module that uses a pool again starts one: a fork from the zygote, which stays (it waits on its owner's
    connection, 2 wake-ups a second)."""
    pools = sys.modules.get(_POOL_MODULE)
    if pools is None or (nextitem is not None and getattr(nextitem, "module", None) is getattr(item, "module", None)):
        return
    pools.DistPool.close_all()
