"""The property library's families: one :class:`~numcheck.properties.core.family.SuiteFamily` per kind whose suite
runs drawn tests in one process, one line each, keyed by the kind's name (imported from its protocol module through
the family's ``suite``).

:func:`numcheck.check` runs the kinds registered here, the assertions (:mod:`numcheck.properties.assertions`) find a
kind's property table and assertion here, and the pytest plugin finds the suite entry a drawn test of the shipped
suite runs and the strategy of the ``numcheck_problems`` fixture. A new family adds its ``suite`` module's
``FAMILY`` and one line here. (The distributed families run their draws inside their tests, on their ranks: they
have no entry there, but one in :data:`RANKED`, their drawn tests by name.)

>>> from numcheck.properties.suites import SUITES
>>> [s.case_type.__name__ for s in SUITES.values()]
['Problem', 'Fp8Case', 'GroupedCase', 'DistillCase', 'PreferenceCase']
"""

from __future__ import annotations

import numcheck.properties.distributed.linear_ce.suite
import numcheck.properties.distributed.tp_fp8.suite
import numcheck.properties.fp8.grouped.suite
import numcheck.properties.fp8.suite
import numcheck.properties.linear_ce.suite
import numcheck.properties.linear_distill.suite
import numcheck.properties.linear_preference.suite
from numcheck.properties.core.family import RankedSuite, SuiteFamily

#: Each family's suite by its kind's name, in the kinds' listing order.
SUITES: dict[str, SuiteFamily] = {
    s.kind: s
    for s in (
        numcheck.properties.linear_ce.suite.FAMILY,
        numcheck.properties.fp8.suite.FAMILY,
        numcheck.properties.fp8.grouped.suite.FAMILY,
        numcheck.properties.linear_distill.suite.FAMILY,
        numcheck.properties.linear_preference.suite.FAMILY,
    )
}

#: The families whose drawn tests run on ranks (none in :data:`SUITES`), by kind: each one's drawn tests by name,
#: as a tool runs them outside pytest (``tools/detection.py``). A distributed family adds its suite's ``RANKED``.
RANKED: dict[str, RankedSuite] = {
    s.kind: s
    for s in (
        numcheck.properties.distributed.linear_ce.suite.RANKED,
        numcheck.properties.distributed.tp_fp8.suite.RANKED,
    )
}
