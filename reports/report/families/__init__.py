"""The report's families: one :class:`~reports.report.families.family.ReportFamily` per kind, one line each.

Each family module (``reports/report/families/<family>.py``) holds its kind's grid cases, its record and the
property table it judges by; :mod:`reports.report.run` (and ``numcheck repro``) iterate :data:`FAMILIES` instead of
switching on ``impl.kind``. A new kind adds its module and one line here (keyed by its name, imported from its
protocol module through the family). Its order is report.md's order of the family tables (and the rows of
``ratio_distribution.png``).
"""

from __future__ import annotations

from numcheck.reports.report.families import (
    dist_linear_ce,
    fp8_linear,
    grouped_fp8_linear,
    linear_ce,
    linear_distill,
    linear_preference,
    tp_fp8_linear,
)
from numcheck.reports.report.families.family import ReportFamily

FAMILIES: dict[str, ReportFamily] = {
    f.kind: f
    for f in (
        linear_ce.FAMILY,
        dist_linear_ce.FAMILY,
        tp_fp8_linear.FAMILY,
        fp8_linear.FAMILY,
        grouped_fp8_linear.FAMILY,
        linear_distill.FAMILY,
        linear_preference.FAMILY,
    )
}
