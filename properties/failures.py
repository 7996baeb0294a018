"""Failure messages: which impl, which property, which case, which output, how far off, and how to rerun it."""

from __future__ import annotations

import shlex
from typing import Any, Iterable

from numcheck.impls.registry import spec_of
from numcheck.properties.problems import Problem


class PropertyFailure(AssertionError):
    """A property does not hold for an impl on a problem; the message carries everything to act on it."""


def repro_command(impl: Any, prop: str, problem: Problem) -> str:
    """One shell line that re-runs exactly this property on exactly this problem for this impl."""
    spec = spec_of(impl.name)
    env = ""
    if spec and spec != impl.name:
        env = f"NUMCHECK_IMPLS={shlex.quote(spec)} "
    return f"{env}numcheck repro --impl {shlex.quote(impl.name)} --property {prop} --problem {shlex.quote(repr(problem))}"


def failure_message(impl: Any, prop: str, problem: Problem, lines: Iterable[str]) -> str:
    """The full text of a :class:`PropertyFailure`."""
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
