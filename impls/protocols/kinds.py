"""The kinds of implementation numcheck judges: the one list every layer iterates (one line per kind).

Each entry is its protocol module's :class:`~impls.protocols.kind.Kind` (the kind's name is defined there, once).
A new kind adds its protocol module and one line here; :mod:`impls.registry` validates by it, ``import numcheck``
exports its public names, the pytest plugin parametrizes its fixture, and the report's family table
(:mod:`reports.report.families`) is keyed by its name.

Listing order: linear+CE, then the FP8 linears (single, grouped), then the distributed kinds (vocabulary-parallel
linear+CE, tensor-parallel FP8 linear).
"""

from __future__ import annotations

from numcheck.errors import warn_renamed
from numcheck.impls.protocols import (
    dist_linear_ce,
    fp8_linear,
    grouped_fp8_linear,
    linear_ce,
    linear_distill,
    linear_preference,
    tp_fp8_linear,
)
from numcheck.impls.protocols.kind import Kind

KINDS: tuple[Kind, ...] = (
    linear_ce.KIND,
    fp8_linear.KIND,
    grouped_fp8_linear.KIND,
    dist_linear_ce.KIND,
    tp_fp8_linear.KIND,
    linear_distill.KIND,
    linear_preference.KIND,
)
#: Each kind by its name.
BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
#: The kind names, in listing order.
NAMES: tuple[str, ...] = tuple(BY_NAME)
#: Each kind's name before numcheck 0.2.0 (:attr:`~impls.protocols.kind.Kind.former`) → its name now.
FORMER: dict[str, str] = {k.former: k.name for k in KINDS if k.former}


def current_name(kind: str, warn: bool = True) -> str:
    """``kind``, or the name now of a kind's name before 0.2.0 (a report made before, a hand-built impl), warning
    once per process (:class:`~numcheck.errors.RenamedWarning`) unless ``warn`` is false; any other string
    unchanged."""
    new = FORMER.get(kind) if isinstance(kind, str) else None
    if new is None or not warn:
        return kind if new is None else new
    warn_renamed("impl kind", kind, new, stacklevel=4)
    return new
