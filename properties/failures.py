"""Failure messages: which impl, which property, which case, which output, how far off, and how to rerun it."""

from __future__ import annotations

import shlex
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from numcheck.impls.registry import spec_of
from numcheck.properties.problems import Problem


class PropertyFailure(AssertionError):
    """A property does not hold for an impl on a problem; the message carries everything to act on it."""


def _module_root(module: ModuleType) -> Path | None:
    """The ``sys.path`` entry ``module`` was imported from (the folder holding its top-level package)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    depth = module.__name__.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    return Path(file).resolve().parents[depth]


def _installed(root: Path) -> bool:
    """Whether a fresh interpreter finds modules under ``root`` without ``PYTHONPATH`` (site-packages, stdlib)."""
    paths = sysconfig.get_paths()
    return any(root == Path(paths[k]).resolve() for k in ("purelib", "platlib", "stdlib") if k in paths)


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
    several; ``PYTHONPATH`` names the module's folder when it is not installed (pytest's ``pythonpath``, a
    conftest's folder, the current directory of ``python -m pytest``: none of them is on a console script's path)."""
    spec = spec_of(impl.name) or _spec_in_module(impl)
    if not spec or spec == impl.name:
        return "", impl.name
    module_name, _, attr = spec.partition(":")
    module = sys.modules.get(module_name)
    env = ""
    root = _module_root(module) if module is not None else None
    if root is not None and not _installed(root):
        env = f"PYTHONPATH={shlex.quote(str(root))} "
    target: Any = module
    for part in (attr or "IMPLS").split("."):
        target = getattr(target, part, None)
    if target is impl:
        return env, spec
    return f"{env}NUMCHECK_IMPLS={shlex.quote(spec)} ", impl.name


def repro_command(impl: Any, prop: str, problem: Any) -> str:
    """One shell line that re-runs exactly this property on exactly this problem (a :class:`Problem` or a
    ``QuantCase``) for this impl, as printed, from any directory: ``numcheck repro``."""
    env, name = impl_invocation(impl)
    return (f"{env}numcheck repro --impl {shlex.quote(name)} --property {prop} "
            f"--problem {shlex.quote(repr(problem))}")


def failure_message(impl: Any, prop: str, problem: Any, lines: Iterable[str]) -> str:
    """The full text of a :class:`PropertyFailure` (``problem``: a :class:`Problem` or a ``QuantCase``)."""
    body = "\n".join(f"  {line}" for line in lines)
    return (
        f"property {prop!r} fails for impl {impl.name!r}\n"
        f"  case: {problem!r}\n"
        f"{body}\n"
        f"  reproduce: {repro_command(impl, prop, problem)}"
    )


def fail(impl: Any, prop: str, problem: Problem, *lines: str) -> None:
    """Raise :class:`PropertyFailure` with :func:`failure_message`."""
    __tracebackhide__ = True
    raise PropertyFailure(failure_message(impl, prop, problem, lines))
