"""Every known divergence still exists (strict xfail on its example) where it is declared (its devices and, for a
third-party release, its release range), is absent on an installed release outside that range, and names at least
one registered impl."""

from __future__ import annotations

import fnmatch

import pytest

from numcheck.impls.registry import ImplEntry, builtin_impls
from numcheck.properties.core.device import DEVICE_TYPE as DEVICE
from numcheck.properties.linear_ce import props
from numcheck.properties.linear_ce.known import KNOWN


def _ids(entries) -> list[str]:
    return [f"{k.impls}:{k.example.short()}" for k in entries]


def _builtin(pattern: str):
    return [
        e.impl
        for e in builtin_impls()
        if isinstance(e, ImplEntry) and e.kind == "linear-ce" and fnmatch.fnmatchcase(e.name, pattern)
    ]


@pytest.mark.parametrize("entry", KNOWN, ids=_ids(KNOWN))
def test_entry_names_registered_impls(entry):
    """A known-divergence entry matches at least one built-in impl (else it is stale)."""
    assert _builtin(entry.impls), f"known divergence {entry.impls!r} matches no built-in impl: remove it"


@pytest.mark.parametrize("entry", KNOWN, ids=_ids(KNOWN))
def test_example_is_covered(entry):
    """An entry's example is one of the cases it covers (else the draws would still reach what it shows)."""
    assert entry.applies(entry.example.replace(device=DEVICE)), f"{entry.impls!r}: its example fails its predicate"


def _runnable(entry) -> tuple[object, list]:
    """The entry's example on this device and the matching built-ins that can run it here (skips when none)."""
    if DEVICE not in entry.devices:
        pytest.skip(f"{entry.impls!r} was seen on {', '.join(entry.devices)}; this suite runs on {DEVICE}")
    example = entry.example.replace(device=DEVICE)
    impls = [
        i
        for i in _builtin(entry.impls)
        if i.support.unavailable_reason() is None
        and i.support.refuses(
            dtype=example.param_dtype, device=DEVICE, options=example.features, reduction=example.reduction
        )
        is None
    ]
    if not impls:
        pytest.skip(f"no impl matching {entry.impls!r} can run its example on {DEVICE} here")
    return example, impls


def _properties(entry) -> tuple[str, ...]:
    return ("accuracy",) if "*" in entry.properties else entry.properties


def _shadowed(entry, impls, example) -> list:
    """The impls on which another entry holding here covers the example (a release whose every backward raises,
    say): there the example cannot show whether this entry's divergence is present, so its check is left to the
    releases where it stands alone."""
    return [
        i
        for i in impls
        for prop in _properties(entry)
        if any(k is not entry and k.matches(i.name, prop, example) for k in KNOWN)
    ]


@pytest.mark.parametrize("entry", KNOWN, ids=_ids(KNOWN))
def test_divergence_still_present(entry):
    """The entry's example still fails its property on every matching, available impl (strict), on this device
    and, for a third-party divergence, on the installed release when it is inside the entry's range."""
    if entry.releases is not None and not entry.releases.hold():
        pytest.skip(
            f"{entry.impls!r} holds for {entry.releases.describe()}: outside its range "
            f"(test_divergence_absent_outside_its_releases checks it is gone)"
        )
    example, impls = _runnable(entry)
    if entry.history_dependent:
        pytest.skip(f"{entry.impls!r} depends on the process's history; shown by {entry.history_dependent}")
    impls = _unshadowed(entry, impls, example)
    for prop in _properties(entry):
        for impl in impls:
            # A property's verdict (AssertionError), or the impl's own exception, which the suite's runner reports
            # as that property's failure (failures.impl_raised): a release whose backward raises.
            with pytest.raises(Exception):  # noqa: B017 - either kind, as the comment above says
                props.PROPERTIES[prop](impl, example)


RELEASE_KEYED = [k for k in KNOWN if k.releases is not None]


@pytest.mark.parametrize("entry", RELEASE_KEYED, ids=_ids(RELEASE_KEYED))
def test_divergence_absent_outside_its_releases(entry):
    """On an installed release outside an entry's range (a known version) the entry's example passes its property
    on every matching impl: the range says exactly where the divergence is."""
    assert entry.releases is not None
    if entry.releases.version() is None:
        pytest.skip(f"{entry.impls!r}: the installed {entry.releases.package} release is unknown here")
    if entry.releases.hold():
        pytest.skip(f"{entry.impls!r} holds for {entry.releases.describe()} (test_divergence_still_present)")
    example, impls = _runnable(entry)
    impls = _unshadowed(entry, impls, example)
    for prop in _properties(entry):
        for impl in impls:
            props.PROPERTIES[prop](impl, example)


def _unshadowed(entry, impls, example) -> list:
    """``impls`` less those :func:`_shadowed` names; skips when none is left."""
    shadowed = _shadowed(entry, impls, example)
    left = [i for i in impls if i not in shadowed]
    if not left:
        others = {
            k.impls
            for i in shadowed
            for k in KNOWN
            if k is not entry and any(k.matches(i.name, p, example) for p in _properties(entry))
        }
        pytest.skip(
            f"{entry.impls!r}: its example is covered here by another entry holding on this release "
            f"({', '.join(sorted(others))})"
        )
    return left


@pytest.mark.parametrize("devices", [(), ("gpu",), ("cpu", "tpu")])
def test_entry_rejects_unknown_devices(devices):
    """A known-divergence entry must name the device types it was seen on, from cpu and cuda only."""
    from numcheck.properties.core.known import KnownDivergence
    from numcheck.properties.linear_ce.cases import Problem

    with pytest.raises(ValueError, match="devices must be a non-empty subset"):
        KnownDivergence(
            impls="eager",
            properties=("accuracy",),
            devices=devices,
            applies=lambda p: True,
            reason="r",
            example=Problem(N=1, H=1, V=1),
        )


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"outputs": ("grad_x",)}, "gives the model"),
        ({"model": lambda m: m}, "gives the model"),
        ({"outputs": ()}, "outputs must be"),
        ({"outputs": ("*", "loss"), "model": lambda m: m}, "outputs must be"),
        ({"example_world_size": 2}, "covers every property"),
        ({"example_placement": "boundary"}, "distributed example's"),
    ],
    ids=[
        "some_outputs_without_model",
        "model_without_outputs",
        "no_outputs",
        "star_among_names",
        "dist_one_property",
        "placement_without_world_size",
    ],
)
def test_entry_rejects_an_inconsistent_kind(fields, words):
    """An entry of some outputs names the model they are judged under (one of every output names none), and a
    distributed impl's entry covers every property and places its example's targets only with its world size."""
    from numcheck.properties.core.known import KnownDivergence
    from numcheck.properties.linear_ce.cases import Problem

    with pytest.raises(ValueError, match=words):
        KnownDivergence(
            impls="eager",
            properties=("accuracy",),
            devices=("cpu",),
            applies=lambda p: True,
            reason="r",
            example=Problem(N=1, H=1, V=1),
            **fields,
        )


def test_every_entry_has_an_example_and_a_strict_check():
    """Every known divergence, of either kind, is the one type with an example run strictly: a single-device entry
    (no world size) by this module, off in every output; a distributed one at its world size by the module of its
    impl's family (tests/adapters/test_megatron_fused.py takes the ``megatron_`` entries,
    tests/adapters/test_transformer_engine.py the ``te_vocab_parallel`` ones), so an entry of another family would
    have no strict check."""
    from numcheck.properties.core.known import KnownDivergence
    from numcheck.properties.distributed.linear_ce.known import DIST_KNOWN

    for k in KNOWN:
        assert isinstance(k, KnownDivergence) and k.example_world_size is None and k.every_output, k.impls
    for d in DIST_KNOWN:
        assert isinstance(d, KnownDivergence) and d.example_world_size is not None, d.impls
        assert d.impls.startswith(("megatron_", "te_vocab_parallel")), f"{d.impls!r}: no module checks it strictly"


def test_history_dependent_entries_name_a_shown_place():
    """An entry whose strict check is skipped as history-dependent names where it is shown (a committed probe)."""
    from pathlib import Path

    # the checkout's root, wherever in it this module lives: the nearest folder above it with pyproject.toml
    root = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
    for k in KNOWN:
        if k.history_dependent:
            assert (root / k.history_dependent).is_file(), (
                f"{k.impls!r}: history_dependent names {k.history_dependent!r}, which does not exist under {root}"
            )


def test_data_predicates_do_not_cover_a_whole_test():
    """An entry decided by the data never excuses a whole test from its forced fields (frozen inputs, confident
    rows still draw for cce[filter_eps=default]); one decided by fields does (Liger's frozen_x)."""
    from numcheck.properties.linear_ce.cases import Problem
    from numcheck.properties.linear_ce.known import covers_every

    fields = Problem(N=1, H=1, V=1, regime="confident", device="cuda")
    assert covers_every("cce[filter_eps=default]", "accuracy", fields) is None
    frozen = covers_every("liger[accum=None]", "frozen_x", fields)
    (entry,) = [k for k in KNOWN if k.properties == ("frozen_x",)]
    assert (frozen is entry) == entry.releases.hold(), (
        entry.releases.describe()
    )  # a field-decided entry, where it holds


@pytest.mark.parametrize(
    "installed, holds", [("0.6.2", False), ("0.6.3", True), ("0.8.5", True), (None, False), ("not-a-version", False)]
)
def test_release_range_follows_installed_release(installed, holds):
    """An entry keyed on a release range matches only when the installed release is known and inside the range."""
    from numcheck.properties.core.known import KnownDivergence, Releases
    from numcheck.properties.linear_ce.cases import Problem

    entry = KnownDivergence(
        impls="liger[[]*",
        properties=("frozen_x",),
        devices=("cpu", "cuda"),
        applies=lambda p: True,
        reason="r",
        example=Problem(N=1, H=1, V=1),
        releases=Releases("liger-kernel", ">=0.6.3", lambda: installed),
    )
    assert entry.releases.hold() is holds
    assert entry.matches("liger[accum=None]", "frozen_x", Problem(N=1, H=1, V=1)) is holds


def _every_record():
    from numcheck.properties.distributed.linear_ce.known import DIST_KNOWN
    from numcheck.properties.linear_ce.known import ARTIFACTS

    return [*KNOWN, *DIST_KNOWN, *ARTIFACTS]


@pytest.mark.parametrize("entry", _every_record(), ids=_ids(_every_record()))
def test_entry_names_library_summary_and_kind(entry):
    """Every record names the library that diverges (the package of its releases where it has a range), says what
    is wrong in one short line, and says whether it is the library's divergence or an environment artifact
    (only :data:`ARTIFACTS` are artifacts): the report names each from these fields."""
    from numcheck.properties.linear_ce.known import ARTIFACTS

    assert entry.library, f"{entry.impls!r}: no library"
    assert entry.releases is None or entry.releases.package == entry.library
    assert entry.summary and "\n" not in entry.summary and len(entry.summary) <= 160, entry.summary
    assert entry.artifact == any(entry is a for a in ARTIFACTS)


def test_applicable_follows_the_release_and_the_declaration(monkeypatch):
    """TE 2.7.0 has its three divergences on the CPU for the impls that can reach them (the bf16 store's not for an
    impl declaring fp32 only); 2.20.2 none; the interpreter's bf16 constant is an artifact only where it shows."""
    import torch

    from numcheck.impls.adapters import transformer_engine
    from numcheck.impls.protocols.linear_ce import LinearCESupport
    from numcheck.properties.distributed.linear_ce.known import applicable

    def support(red, dtypes):
        return LinearCESupport(dtypes=frozenset(dtypes), options=frozenset({"bias", "ignore_index"}), reductions={red})

    fp32, both = {torch.float32}, {torch.float32, torch.bfloat16}
    monkeypatch.setattr(transformer_engine, "interpreter_bf16_constant", lambda: 6.4e37)
    monkeypatch.setattr(transformer_engine, "release", lambda: "2.7.0")
    mean = applicable("te_parallel_ce[mean]", "cpu", support("mean", both))
    none = applicable("te_parallel_ce[none]", "cpu", support("none", fp32))
    assert [k.summary.split(":")[0][:30] for k in mean] == [
        "reduce_loss=True divides the l",
        "the gradient is kept in the bf",
    ]
    assert [k.artifact for k in none] == [False, True] and "first row's upstream" in none[0].summary
    monkeypatch.setattr(transformer_engine, "release", lambda: "2.20.2")
    assert applicable("te_parallel_ce[mean]", "cpu", support("mean", both)) == []
    assert applicable("te_parallel_ce[none]", "cpu", support("none", fp32)) == []
