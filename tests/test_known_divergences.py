"""Every known divergence still exists (strict xfail on its example) and names at least one registered impl."""

from __future__ import annotations

import fnmatch

import pytest

from impls.registry import ImplEntry, builtin_impls
from properties import checks
from tests.known_divergences import KNOWN


def _builtin(pattern: str):
    return [e.impl for e in builtin_impls()
            if isinstance(e, ImplEntry) and e.kind == "linear_ce" and fnmatch.fnmatchcase(e.name, pattern)]


@pytest.mark.parametrize("entry", KNOWN, ids=[k.impls for k in KNOWN])
def test_entry_names_registered_impls(entry):
    """A known-divergence entry matches at least one built-in impl (else it is stale)."""
    assert _builtin(entry.impls), f"known divergence {entry.impls!r} matches no built-in impl: remove it"


@pytest.mark.parametrize("entry", KNOWN, ids=[k.impls for k in KNOWN])
def test_divergence_still_present(entry):
    """The entry's example still fails its property on every matching, available impl (strict)."""
    impls = [i for i in _builtin(entry.impls) if i.support.unavailable_reason() is None
             and i.support.refuses(dtype=entry.example.param_dtype, device="cpu", options=entry.example.features,
                                   reduction=entry.example.reduction) is None]
    if not impls:
        pytest.skip(f"no impl matching {entry.impls!r} can run here")
    for prop in (("accuracy",) if "*" in entry.properties else entry.properties):
        for impl in impls:
            with pytest.raises(AssertionError):
                checks.PROPERTIES[prop](impl, entry.example)
