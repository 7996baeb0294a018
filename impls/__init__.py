"""Implementations under test and the protocol they follow.

- :mod:`impls.protocol`: the linear+CE protocol (:class:`LinearCESupport`, :func:`linear_ce_impl`).
- :mod:`impls.registry`: built-ins, ``--impl`` specs, ``NUMCHECK_IMPLS`` and the ``numcheck.impls`` entry points.
- :mod:`impls.builtin`: the modules that hold the built-in impls.
"""

from impls.protocol import FunctionImpl, LinearCESupport, linear_ce_impl, make_support

__all__ = ["FunctionImpl", "LinearCESupport", "linear_ce_impl", "make_support"]
