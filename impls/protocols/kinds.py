"""The kinds of implementation numcheck judges: the one list every layer iterates (one line per kind).

Each entry is its protocol module's :class:`~impls.protocols.kind.Kind` (the kind's name is defined there, once).
A new kind adds its protocol module and one line here; :mod:`impls.registry` validates by it, ``import numcheck``
exports its public names, the pytest plugin parametrizes its fixture, and the report's family table
(:mod:`reports.report.families`) is keyed by its name.

Listing order: linear+CE, then the FP8 linears (single, grouped), then the distributed kinds (vocabulary-parallel
linear+CE, tensor-parallel FP8 linear).
"""

from __future__ import annotations

from numcheck.impls.protocols import dist_linear_ce, fp8_linear, grouped_fp8_linear, linear_ce, tp_fp8_linear
from numcheck.impls.protocols.kind import Kind

KINDS: tuple[Kind, ...] = (
    linear_ce.KIND,
    fp8_linear.KIND,
    grouped_fp8_linear.KIND,
    dist_linear_ce.KIND,
    tp_fp8_linear.KIND,
)
#: Each kind by its name.
BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
#: The kind names, in listing order.
NAMES: tuple[str, ...] = tuple(BY_NAME)
