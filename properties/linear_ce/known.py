"""The linear+CE family's known divergences: one table (:data:`KNOWN`) collected from each vendor's module, in
this order: :mod:`~numcheck.properties.linear_ce.known_torch` (PyTorch's own),
:mod:`~numcheck.properties.linear_ce.known_liger`, :mod:`~numcheck.properties.linear_ce.known_cce` and
:mod:`~numcheck.properties.linear_ce.known_te`, and the environment artifacts (:data:`ARTIFACTS`); the lookups the
suite, the report and the production-shape tier use (:func:`known`, :func:`covers_every`,
:func:`known_on_tensors`). The machinery is :mod:`numcheck.properties.core.known`. A new vendor adds its module
here and one line to :data:`KNOWN`."""

from __future__ import annotations

from numcheck.properties.core.known import KnownDivergence
from numcheck.properties.linear_ce import known_cce, known_liger, known_te, known_torch
from numcheck.properties.linear_ce.cases import Problem, Tensors

#: Every single-device linear+CE entry, by vendor.
KNOWN: list[KnownDivergence] = [*known_torch.KNOWN, *known_liger.KNOWN, *known_cce.KNOWN, *known_te.KNOWN]
#: Environment artifacts (:data:`numcheck.properties.linear_ce.known_te.ARTIFACTS`).
ARTIFACTS: tuple[KnownDivergence, ...] = known_te.ARTIFACTS


def covers_every(impl_name: str, prop: str, fields: Problem) -> KnownDivergence | None:
    """The entry that covers every draw sharing the forced ``fields`` of a test (one decided by fields alone)."""
    for k in KNOWN:
        if not k.by_data and k.matches(impl_name, prop, fields):
            return k
    return None


def known(impl_name: str, prop: str, p: Problem) -> KnownDivergence | None:
    """The entry covering this impl, property and case, if any."""
    for k in KNOWN:
        if k.matches(impl_name, prop, p):
            return k
    return None


def known_on_tensors(impl_name: str, prop: str, p: Problem, t: Tensors) -> KnownDivergence | None:
    """The entry covering this impl, property and case whose tensors are ``t`` (:meth:`KnownDivergence.matches_tensors`)."""
    for k in KNOWN:
        if k.matches_tensors(impl_name, prop, p, t):
            return k
    return None
