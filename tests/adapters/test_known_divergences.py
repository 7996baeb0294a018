"""Every known divergence still exists (strict xfail on its example) and names at least one registered impl."""

from __future__ import annotations

import fnmatch

import pytest

from numcheck.impls.registry import ImplEntry, builtin_impls
from numcheck.properties import checks
from numcheck.properties.strategies import DEVICE_TYPE as DEVICE
from numcheck.properties.known_divergences import KNOWN


def _builtin(pattern: str):
    return [e.impl for e in builtin_impls()
            if isinstance(e, ImplEntry) and e.kind == "linear_ce" and fnmatch.fnmatchcase(e.name, pattern)]


@pytest.mark.parametrize("entry", KNOWN, ids=[k.impls for k in KNOWN])
def test_entry_names_registered_impls(entry):
    """A known-divergence entry matches at least one built-in impl (else it is stale)."""
    assert _builtin(entry.impls), f"known divergence {entry.impls!r} matches no built-in impl: remove it"


@pytest.mark.parametrize("entry", KNOWN, ids=[k.impls for k in KNOWN])
def test_example_is_covered(entry):
    """An entry's example is one of the cases it covers (else the draws would still reach what it shows)."""
    assert entry.applies(entry.example.replace(device=DEVICE)), f"{entry.impls!r}: its example fails its predicate"


@pytest.mark.parametrize("entry", KNOWN, ids=[k.impls for k in KNOWN])
def test_divergence_still_present(entry):
    """The entry's example still fails its property on every matching, available impl (strict), on this device."""
    if DEVICE not in entry.devices:
        pytest.skip(f"{entry.impls!r} was seen on {', '.join(entry.devices)}; this suite runs on {DEVICE}")
    example = entry.example.replace(device=DEVICE)
    impls = [i for i in _builtin(entry.impls) if i.support.unavailable_reason() is None
             and i.support.refuses(dtype=example.param_dtype, device=DEVICE, options=example.features,
                                   reduction=example.reduction) is None]
    if not impls:
        pytest.skip(f"no impl matching {entry.impls!r} can run on {DEVICE} here")
    if entry.history_dependent:
        pytest.skip(f"{entry.impls!r} depends on the process's history; shown by {entry.history_dependent}")
    for prop in (("accuracy",) if "*" in entry.properties else entry.properties):
        for impl in impls:
            with pytest.raises(AssertionError):
                checks.PROPERTIES[prop](impl, example)


@pytest.mark.parametrize("devices", [(), ("gpu",), ("cpu", "tpu")])
def test_entry_rejects_unknown_devices(devices):
    """A known-divergence entry must name the device types it was seen on, from cpu and cuda only."""
    from numcheck.properties.problems import Problem
    from numcheck.properties.known_divergences import KnownDivergence

    with pytest.raises(ValueError, match="devices must be a non-empty subset"):
        KnownDivergence(impls="eager", properties=("accuracy",), devices=devices, applies=lambda p: True,
                        reason="r", example=Problem(N=1, H=1, V=1))


def test_history_dependent_entries_name_a_shown_place():
    """An entry whose strict check is skipped as history-dependent names where it is shown (a committed probe)."""
    from pathlib import Path

    # the checkout's root, wherever in it this module lives: the nearest folder above it with pyproject.toml
    root = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
    for k in KNOWN:
        if k.history_dependent:
            assert (root / k.history_dependent).is_file(), \
                f"{k.impls!r}: history_dependent names {k.history_dependent!r}, which does not exist under {root}"


def test_data_predicates_do_not_cover_a_whole_test():
    """An entry decided by the data never excuses a whole test from its forced fields (frozen inputs, confident
    rows still draw for cce[filter_eps=default]); one decided by fields does (Liger's frozen_x)."""
    from numcheck.properties.problems import Problem
    from numcheck.properties.known_divergences import covers_every

    fields = Problem(N=1, H=1, V=1, regime="confident", device="cuda")
    assert covers_every("cce[filter_eps=default]", "accuracy", fields) is None
    assert covers_every("liger[accum=None]", "frozen_x", fields) is not None
