"""Every exception a numcheck user meets, in one place (each is re-exported by ``import numcheck`` too).

This module imports nothing of numcheck, so every layer can raise these.

>>> import numcheck
>>> issubclass(numcheck.InvalidDeclaration, ValueError), issubclass(numcheck.PropertyFailure, AssertionError)
(True, True)
"""

from __future__ import annotations


class InvalidDeclaration(ValueError, TypeError):
    """A declaration of what an impl supports is malformed. Its message names the declaring ``file:line``.

    It is a ``ValueError`` (a bad value) and a ``TypeError`` (a bad keyword, a call the impl cannot take), so
    callers catching either one, as the registry catches ``TypeError`` from a protocol check, keep working.
    """


class InvalidAssertion(ValueError, TypeError):
    """A bad argument to :func:`numcheck.assert_linear_ce` or :func:`numcheck.assert_quant_linear` (a
    ``ValueError`` and a ``TypeError``, as hypothesis' ``InvalidArgument`` is one kind of error for every misuse)."""


class PropertyFailure(AssertionError):
    """A property does not hold for an impl on a problem; the message carries everything to act on it."""


class ProtocolViolation(AssertionError):
    """The impl returned something the protocol forbids (wrong shape, no autograd graph, ...)."""


class BadInput(ValueError):
    """Bad input to a ``numcheck`` command (a flag's value, a file it reads): printed as one line naming what and
    where, exit 2."""


class ClaimsError(BadInput):
    """A claims file of ``numcheck premerge --base`` that cannot be used: the message names the file, the line and
    the table."""
