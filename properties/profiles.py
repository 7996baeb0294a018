"""numcheck's hypothesis profiles, registered (never loaded) on import: the pytest plugin and
:func:`numcheck.check` both run the suite under one of them.

``numcheck-ci``: derandomized, ``NUMCHECK_CI_EXAMPLES`` examples (default 12); ``numcheck-ci-seeded``: the same,
not derandomized (with ``--hypothesis-seed``, checks that ci verdicts do not hang on one seed); ``numcheck-dev``:
60 examples; ``numcheck-thorough``: 1000. None has a deadline: an impl under Triton's interpreter takes seconds.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

#: numcheck's hypothesis profiles, the first the default.
PROFILES: tuple[str, ...] = ("numcheck-ci", "numcheck-ci-seeded", "numcheck-dev", "numcheck-thorough")
DEFAULT_PROFILE = PROFILES[0]

_COMMON: dict[str, Any] = dict(
    deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
                           HealthCheck.filter_too_much])


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
        raise ValueError(f"{name!r} names no numcheck hypothesis profile; use one of {', '.join(PROFILES)} "
                         f"(or ci, ci-seeded, dev, thorough)")
    return full


settings.register_profile("numcheck-ci", max_examples=ci_examples(), derandomize=True, **_COMMON)
settings.register_profile("numcheck-ci-seeded", max_examples=ci_examples(), **_COMMON)
settings.register_profile("numcheck-dev", max_examples=60, **_COMMON)
settings.register_profile("numcheck-thorough", max_examples=1000, **_COMMON)
