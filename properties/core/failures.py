"""Failure messages: which impl, which property, which case, which output, how far off, and how to rerun it."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import traceback
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, Iterable, Iterator, Mapping

from numcheck.errors import PropertyFailure
from numcheck.impls.registry import spec_of

#: What a property returns for a case it cannot judge (a condition on the drawn values that the draw did not
#: meet: no row ignored, a bias shift the bias dtype cannot hold exactly). The runner rejects such a case like a
#: filtered draw, so it is neither counted nor passed (:func:`numcheck.properties.core.runner.run_example`).
NOT_JUDGED: Mapping[str, float] = MappingProxyType({})


def judged(metrics: Mapping[str, float]) -> bool:
    """Whether a property's ``metrics`` come from a judged case (anything but :data:`NOT_JUDGED`)."""
    return metrics is not NOT_JUDGED


def _module_root(module: ModuleType) -> Path | None:
    """The ``sys.path`` entry ``module`` was imported from: the folder holding its top-level package (found from
    that package, not from ``module``'s file: numcheck.tests.self.helpers is tests/self/helpers/ in a checkout,
    beside numcheck/, through setup.py's package_dir)."""
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    file = getattr(top, "__file__", None)
    if not file:
        return None
    return Path(file).absolute().parents[1 if Path(file).name == "__init__.py" else 0]


def _installed(root: Path) -> bool:
    """Whether a fresh interpreter finds modules under ``root`` without ``PYTHONPATH`` (site-packages, stdlib)."""
    paths = sysconfig.get_paths()
    return any(root.resolve() == Path(paths[k]).resolve() for k in ("purelib", "platlib", "stdlib") if k in paths)


@functools.lru_cache(maxsize=None)
def _fresh_origin(top: str) -> str | None:
    """The file a fresh interpreter of this environment imports the top-level package ``top`` from, run as a console
    script is (no ``PYTHONPATH``, another directory), or None: an editable install (``pip install -e .``) is found
    there through its finder although its folder is not a ``sys.path`` entry, and ``PYTHONPATH`` pointing at such a
    checkout would shadow it with the bare folder (numcheck's own checkout holds only ``numcheck/__init__.py`` under
    ``numcheck/``: its subpackages come through setup.py's ``package_dir``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = f"import importlib.util as u; s = u.find_spec({top!r}); print(s.origin if s and s.origin else '')"
    try:
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout.strip() or None


def _found_fresh(module: ModuleType) -> bool:
    """Whether a fresh ``numcheck`` process imports ``module``'s top-level package from the same file as this one."""
    name = module.__name__.partition(".")[0]
    file = getattr(sys.modules.get(name), "__file__", None)
    origin = _fresh_origin(name)
    return bool(file and origin) and Path(origin).resolve() == Path(file).resolve()


def _spec_in_module(impl: Any) -> str | None:
    """``module:attr`` of a module-level name bound to ``impl`` (an impl passed as an object, not by spec)."""
    fn = getattr(impl, "fn", None)
    for module_name in (getattr(fn, "__module__", None), type(impl).__module__):
        module = sys.modules.get(module_name or "")
        if module is None or module_name == "__main__":
            continue
        for attr, value in vars(module).items():
            if value is impl:
                return f"{module_name}:{attr}"
    return None


def impl_invocation(impl: Any) -> tuple[str, str]:
    """``(environment prefix, --impl argument)`` with which a fresh ``numcheck`` process in any directory loads
    ``impl``: its name for a built-in; else the spec it was loaded by (or a module-level name bound to it),
    directly when the spec names this impl alone, through ``NUMCHECK_IMPLS`` (and its name) when the spec names
    several; ``PYTHONPATH`` names the module's folder when a fresh interpreter does not import it from there
    (pytest's ``pythonpath``, a conftest's folder, the current directory of ``python -m pytest``: none of them is on a
    console script's path; an editable install is, through its finder: :func:`_fresh_origin`)."""
    spec = spec_of(impl.name) or _spec_in_module(impl)
    if not spec or spec == impl.name:
        return "", impl.name
    module_name, _, attr = spec.partition(":")
    module = sys.modules.get(module_name)
    env = ""
    root = _module_root(module) if module is not None else None
    if root is not None and not _installed(root) and not _found_fresh(module):
        env = f"PYTHONPATH={shlex.quote(str(root))} "
    target: Any = module
    for part in (attr or "IMPLS").split("."):
        target = getattr(target, part, None)
    if target is impl:
        return env, spec
    return f"{env}NUMCHECK_IMPLS={shlex.quote(spec)} ", impl.name


def repro_command(impl: Any, prop: str, problem: Any) -> str:
    """One shell line that re-runs exactly this property on exactly this problem (a case of any family, a
    linear+CE ``Problem`` or a ``Fp8Case``, whose ``repr`` rebuilds it) for this impl, as printed, from any
    directory: ``numcheck repro``."""
    env, name = impl_invocation(impl)
    return f"{env}numcheck repro --impl {shlex.quote(name)} --property {prop} --problem {shlex.quote(repr(problem))}"


#: Lines every failure message raised inside :func:`context` carries after its case (what the case means for the
#: impl: how many chunks its rows make).
_CONTEXT: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("numcheck_failure_context", default=())


@contextlib.contextmanager
def context(*lines: str | None) -> Iterator[None]:
    """Inside this block every failure message (:func:`failure_message`) carries ``lines`` (empty ones left out)
    after its case line."""
    token = _CONTEXT.set(_CONTEXT.get() + tuple(line for line in lines if line))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def failure_message(impl: Any, prop: str, problem: Any, lines: Iterable[str], *, reproduce: str | None = None) -> str:
    """The full text of a :class:`PropertyFailure` (``problem``: a case of any family, a ``Problem`` or a
    ``Fp8Case``), with the lines of the enclosing :func:`context`; ``reproduce`` in place of the repro command,
    for a case no command can rebuild."""
    body = "\n".join(f"  {line}" for line in (*_CONTEXT.get(), *lines))
    return (
        f"property {prop!r} fails for impl {impl.name!r}\n"
        f"  case: {problem!r}\n"
        f"{body}\n"
        f"  reproduce: {reproduce or repro_command(impl, prop, problem)}"
    )


def fail(impl: Any, prop: str, problem: Any, *lines: str, ratio: float | None = None) -> None:
    """Raise :class:`PropertyFailure` with :func:`failure_message` (``ratio``: the failing judgement's
    error/bound, where it has one)."""
    __tracebackhide__ = True
    raise PropertyFailure(failure_message(impl, prop, problem, lines), case=problem, ratio=ratio)


def _innermost_module(exc: BaseException) -> str:
    """The ``__name__`` of the module whose code raised ``exc`` (its traceback's last frame; ``""`` if none)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last.tb_frame.f_globals.get("__name__", "") if last is not None else ""


def _numcheck_module(name: str) -> bool:
    return name == "numcheck" or name.startswith("numcheck.")


#: numcheck's modules that hold impls (built-in and adapters, and its self tests' user-style and mutant impls):
#: what they raise is an impl's exception, not a verdict or a bug of the suite.
_IMPL_MODULES: tuple[str, ...] = ("numcheck.impls.", "numcheck.tests.self.helpers.")


def _judging_module(name: str) -> bool:
    """Whether ``name`` is numcheck's own judging code (numcheck outside its impls)."""
    return _numcheck_module(name) and not name.startswith(_IMPL_MODULES)


def raised_by_suite(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the suite's own verdicts: a :class:`PropertyFailure`, or an ``AssertionError``
    raised by numcheck's own judging code (its innermost frame in a ``numcheck.*`` module that holds no impls: a
    protocol check, a judgement). An ``AssertionError`` from an impl's own ``assert`` (a third-party kernel's
    argument check, one of numcheck's built-in or test impls) is not."""
    if isinstance(exc, PropertyFailure):
        return True
    return isinstance(exc, AssertionError) and _judging_module(_innermost_module(exc))


def exception_lines(exc: BaseException) -> list[str]:
    """What was raised, for a failure message: its type and first message line, and the innermost frame (file,
    line, function, source line). Raised by an impl (or the third-party code it calls) unless that frame is in
    numcheck's own judging code (``numcheck.*`` outside the modules of :data:`_IMPL_MODULES`), which is then named
    instead."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    more = " [...]" if len(text.splitlines()) > 1 else ""
    kind = (
        type(exc).__qualname__
        if type(exc).__module__ == "builtins"
        else f"{type(exc).__module__}.{type(exc).__qualname__}"
    )
    who = (
        "numcheck's own code (a suite bug, not a verdict on the impl)"
        if _judging_module(_innermost_module(exc))
        else "the impl"
    )
    lines = [f"{who} raised {kind}: {first}{more}"]
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        f = frames[-1]
        lines.append(f"raised at {f.filename}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else ""))
    return lines


def impl_raised(impl: Any, prop: str, problem: Any, exc: BaseException) -> PropertyFailure:
    """The :class:`PropertyFailure` for an impl that raised ``exc`` while ``prop`` ran it on ``problem`` (to be
    raised ``from exc``, so the original traceback stays attached and hypothesis tells failures of different
    origins apart)."""
    return PropertyFailure(failure_message(impl, prop, problem, exception_lines(exc)), case=problem, raised=True)
