"""Implementations under test and the protocol they follow.

- :mod:`impls.protocols.linear_ce`: the linear+CE protocol (:class:`LinearCESupport`, :func:`linear_ce_impl`).
- :mod:`impls.registry`: built-ins, ``--impl`` specs, ``NUMCHECK_IMPLS`` and the ``numcheck.impls`` entry points.
- :mod:`impls.builtin`: the factories of the built-in impls, one per module that defines some.
- :mod:`impls.measure`: capability probes and measurement (memory, timing, accumulation error).
"""

from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport, linear_ce_impl, make_support

__all__ = ["FunctionImpl", "LinearCESupport", "linear_ce_impl", "make_support"]
