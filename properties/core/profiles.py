"""numcheck's hypothesis profiles, registered (never loaded) on import: the pytest plugin and
:func:`numcheck.check` both run the suite under one of them.

``numcheck-ci``: derandomized, ``NUMCHECK_CI_EXAMPLES`` examples (default 12); ``numcheck-ci-seeded``: the same,
not derandomized (with ``--hypothesis-seed``, checks that ci verdicts do not hang on one seed); ``numcheck-dev``:
60 examples; ``numcheck-thorough``: 1000. None has a deadline: an impl under Triton's interpreter takes seconds.

Every setting that decides what is drawn is given here, so no profile inherits it from whatever hypothesis
profile happens to be loaded when this module is imported (hypothesis loads its ``ci`` profile, derandomized,
whenever a ``CI`` variable is set: ``numcheck-ci-seeded`` would then ignore ``--hypothesis-seed``; and a user's
own profile loaded before ``import numcheck`` would otherwise leak in through :func:`numcheck.check`). The ci
profiles keep no example database, so a verdict never depends on what an earlier run in the same directory saw;
``numcheck-dev`` and ``numcheck-thorough`` keep hypothesis' default one (under ``.hypothesis/`` in the current
directory, none under ``CI``), replaying an earlier failure first. Which cases are drawn is also kept
independent of the loaded modules (:mod:`numcheck.properties.core.draw_isolation`).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, Phase, settings

#: numcheck's hypothesis profiles, the first the default.
PROFILES: tuple[str, ...] = ("numcheck-ci", "numcheck-ci-seeded", "numcheck-dev", "numcheck-thorough")
DEFAULT_PROFILE = PROFILES[0]

_COMMON: dict[str, Any] = dict(
    deadline=None,
    print_blob=True,
    phases=tuple(Phase),
    backend="hypothesis",
    report_multiple_bugs=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
        HealthCheck.filter_too_much,
    ],
)


def ci_examples() -> int:
    """The ci profiles' example count: ``NUMCHECK_CI_EXAMPLES`` (default 12); ValueError naming it if malformed."""
    raw = os.environ.get("NUMCHECK_CI_EXAMPLES", "12")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"NUMCHECK_CI_EXAMPLES must be a positive integer number of examples, got {raw!r}")
    return n


def numcheck_name(name: str) -> str:
    """The full profile name for ``name`` (``ci`` → ``numcheck-ci``; full names pass); ValueError for others."""
    full = name if name.startswith("numcheck-") else f"numcheck-{name}"
    if full not in PROFILES:
        raise ValueError(
            f"{name!r} names no numcheck hypothesis profile; use one of {', '.join(PROFILES)} "
            f"(or ci, ci-seeded, dev, thorough)"
        )
    return full


settings.register_profile("numcheck-ci", max_examples=ci_examples(), derandomize=True, database=None, **_COMMON)
settings.register_profile("numcheck-ci-seeded", max_examples=ci_examples(), derandomize=False, database=None, **_COMMON)
settings.register_profile("numcheck-dev", max_examples=60, derandomize=False, **_COMMON)
settings.register_profile("numcheck-thorough", max_examples=1000, derandomize=False, **_COMMON)
