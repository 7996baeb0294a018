"""Every exception a numcheck user meets, in one place (each is re-exported by ``import numcheck`` too), all
subclasses of :class:`NumcheckError`. numcheck's own modules import them from here, never through another module.

This module imports nothing of numcheck, so every layer can raise these.

>>> import numcheck
>>> issubclass(numcheck.InvalidDeclaration, ValueError), issubclass(numcheck.PropertyFailure, AssertionError)
(True, True)
>>> issubclass(numcheck.BadInput, numcheck.NumcheckError)
True
"""

from __future__ import annotations

from typing import Any


class NumcheckError(Exception):
    """The base of every exception numcheck raises for its user: ``except numcheck.NumcheckError`` catches them all.
    Each also derives from the built-in exception its callers already catch (``ValueError``, ``AssertionError``,
    ...)."""


class InvalidDeclaration(NumcheckError, ValueError, TypeError):
    """A declaration of what an impl supports is malformed. Its message names the declaring ``file:line``.

    It is a ``ValueError`` (a bad value) and a ``TypeError`` (a bad keyword, a call the impl cannot take), so
    callers catching either one, as the registry catches ``TypeError`` from a protocol check, keep working.
    """


class InvalidAssertion(NumcheckError, ValueError, TypeError):
    """A bad argument to :func:`numcheck.assert_linear_ce` or :func:`numcheck.assert_fp8_linear` (a
    ``ValueError`` and a ``TypeError``, as hypothesis' ``InvalidArgument`` is one kind of error for every misuse)."""


class PropertyFailure(NumcheckError, AssertionError):
    """A property does not hold for an impl on a problem; the message carries everything to act on it.

    ``case``: the failing problem (or case), when known. ``ratio``: the failing judgement's own error/bound, for a
    failure that has one (a bitwise property's has none). ``raised``: the impl raised instead of returning, so
    nothing was judged on ``case``."""

    def __init__(
        self, message: str = "", *, case: Any = None, ratio: float | None = None, raised: bool = False
    ) -> None:
        super().__init__(message)
        self.case, self.ratio, self.raised = case, ratio, raised


class ProtocolViolation(NumcheckError, AssertionError):
    """The impl returned something the protocol forbids (wrong shape, no autograd graph, ...)."""


class BadInput(NumcheckError, ValueError):
    """Bad input to a ``numcheck`` command (a flag's value, a file it reads): printed as one line naming what and
    where, exit 2."""


class ClaimsError(BadInput):
    """A claims file of ``numcheck premerge --base`` that cannot be used: the message names the file, the line and
    the table."""


try:  # the group hypothesis raises for several distinct failures
    _GROUP: type = BaseExceptionGroup  # noqa: F821 - a builtin from Python 3.11
except NameError:  # Python 3.10: hypothesis depends on the exceptiongroup backport
    from exceptiongroup import BaseExceptionGroup as _GROUP


def grouped(exc: BaseException) -> list[BaseException]:
    """The exceptions of ``exc``: its members when it is an exception group, else ``[exc]``."""
    return list(exc.exceptions) if isinstance(exc, _GROUP) else [exc]


# -- names renamed in 0.2.0 ------------------------------------------------------------------------------------------
class RenamedWarning(NumcheckError, FutureWarning):
    """An old name (renamed in numcheck 0.2.0: "fp8" for "quant", "production" for "scale", kind names that are no
    module's) was used; it still works until 0.3.0. A ``FutureWarning``, so it is shown by default (and a
    :class:`NumcheckError`, as every warning or exception numcheck gives its user). Each old name
    warns once per process (:func:`warn_renamed`)."""


#: The old names that have warned in this process, as ``(what, old)``.
_WARNED: set[tuple[str, str]] = set()


def warn_renamed(what: str, old: str, new: str, stacklevel: int = 3) -> None:
    """Warn once per process that ``old`` (a ``what``: "numcheck attribute", "pytest fixture", ...) is now ``new``;
    see CHANGELOG.md (the old names go in 0.3.0).

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     warn_renamed("doc example", "old_x", "new_x"); warn_renamed("doc example", "old_x", "new_x")
    >>> [str(w.message) for w in seen]  # doctest: +NORMALIZE_WHITESPACE
    ["numcheck: the doc example 'old_x' was renamed 'new_x' in numcheck 0.2.0; the old name works until 0.3.0"]
    """
    if (what, old) in _WARNED:
        return
    _WARNED.add((what, old))
    import warnings

    warnings.warn(
        f"numcheck: the {what} {old!r} was renamed {new!r} in numcheck 0.2.0; the old name works until 0.3.0",
        RenamedWarning,
        stacklevel=stacklevel,
    )


def both_names(what: str, old: str, new: str) -> str:
    """The one error message for an old name and its new one given together (``old`` is ``new``'s old name)."""
    return f"both the {what} {new!r} and its old name {old!r} are given; {old!r} was renamed {new!r}: give only {new!r}"
