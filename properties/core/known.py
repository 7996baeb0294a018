"""Known divergences: real, reported differences of third-party impls that the property suite must not keep
re-finding on every run, and must notice when they go away. This module is the machinery every family shares; the
entries live beside each family, one module per vendor (linear+CE's :mod:`numcheck.properties.linear_ce.known`
collects :mod:`~numcheck.properties.linear_ce.known_torch`, :mod:`~numcheck.properties.linear_ce.known_liger`,
:mod:`~numcheck.properties.linear_ce.known_cce` and :mod:`~numcheck.properties.linear_ce.known_te`; FP8's are
:mod:`numcheck.properties.fp8.known_torchao`, the distributed ones
:mod:`numcheck.properties.distributed.linear_ce.known`).

Every kind of entry is one :class:`KnownDivergence`: it names the impls (fnmatch pattern), the properties it affects,
the devices it was seen on, the cases it covers (a predicate on the case), the outputs it is off in (every output,
or some, judged under the model of what the release computes), the reason, and one example; an entry about a
third-party library also names the releases it holds for (:class:`Releases`, a version range over the release the
adapter imported). An entry covers a case only on its devices and releases, so a divergence seen on CPU is still
looked for on CUDA, a divergence of 0.8.5 is still looked for on 0.5.8 (and reported there if present), and the
example runs on the suite's device (``NUMCHECK_DEVICE``). The single-device linear+CE entries are
:data:`numcheck.properties.linear_ce.known.KNOWN`: tests/suite/test_properties.py leaves matching cases out of its
draws; tests/adapters/test_known_divergences.py runs every entry's example as a strict xfail, so a fix upstream
turns CI red until the entry is removed, an entry that matches no registered impl is reported, and on an installed
release outside an entry's range the example must pass (so the range is exact where it has been measured). A
distributed impl's entries (:data:`numcheck.properties.distributed.linear_ce.known.DIST_KNOWN`) are checked the same
way by tests/adapters/test_megatron_fused.py and tests/adapters/test_transformer_engine.py.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Callable

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class Releases:
    """The releases of a third-party package an entry holds for: ``specifier`` (PEP 440, e.g. ``">=0.6.3"``) over
    the version ``installed()`` reads, that of the module the adapter actually imported (``None`` when unknown).
    An unknown release is in no range: the entry then covers nothing, so the draws still test those cases."""

    package: str
    specifier: str
    installed: Callable[[], str | None]

    def __post_init__(self) -> None:
        SpecifierSet(self.specifier)  # raises InvalidSpecifier naming the bad text

    def version(self) -> Version | None:
        """The installed release as a :class:`Version`, ``None`` when unknown or not a PEP 440 version."""
        text = self.installed()
        try:
            return Version(text) if text else None
        except InvalidVersion:
            return None

    def hold(self) -> bool:
        """Whether the installed release is known and inside the range."""
        v = self.version()
        return v is not None and SpecifierSet(self.specifier).contains(v, prereleases=True)

    def describe(self) -> str:
        return f"{self.package}{self.specifier} (installed: {self.installed() or 'unknown'})"


def library_release(library: str) -> str | None:
    """The installed release of distribution ``library`` (torch's own version for ``"torch"``), ``None`` when not
    installed."""
    if library == "torch":
        return torch.__version__
    if not library:
        return None
    from importlib import metadata

    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


#: :attr:`KnownDivergence.outputs` of an entry off in every output.
EVERY_OUTPUT: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class KnownDivergence:
    """One known divergence, of any kind: of a single-device impl (``applies`` takes its case: a linear+CE
    :class:`~numcheck.properties.linear_ce.cases.Problem`, an FP8 ``Fp8Case``) or of a
    distributed one (``applies`` takes its case, a
    :class:`~numcheck.properties.distributed.linear_ce.cases.DistCase`, and :attr:`example_world_size` is set);
    off in every output (a covered case is left out of the draws) or in some (:attr:`outputs`, judged under
    :attr:`model` while the case's other outputs keep the impl's own model, so a second defect hiding behind the
    first is still caught)."""

    impls: str  # fnmatch pattern over impl names ("[[]" matches a literal "[")
    properties: tuple[str, ...]  # property names, or ("*",) for every property
    devices: tuple[str, ...]  # device types it was seen on ("cpu", "cuda")
    applies: Callable[[Any], bool]  # the cases it covers: a Problem (a DistCase for a distributed impl's entry)
    reason: str
    example: Any  # a case of the entry's family (a linear+CE Problem, a Fp8Case, a DistCase's Problem)
    #: ``applies`` reads the problem's data (its tensors), not only its fields: a problem carrying some fields
    #: then says nothing about every draw with those fields (see :func:`covers_every`).
    by_data: bool = False
    #: For a divergence that depends on the process's history (a compile cache), which no single example in a
    #: test worker reproduces: the committed probe (a path from the repo root) that shows it. Its strict check
    #: is skipped, naming the probe.
    history_dependent: str | None = None
    #: For a divergence of a third-party release: the releases it holds for (``None``: every release).
    releases: Releases | None = None
    #: For a ``by_data`` entry: the same predicate on given tensors (``applies`` reads those
    #: :func:`properties.linear_ce.cases.build` draws), for callers whose tensors are not ``build(p)``'s (the
    #: production-shape tier's, :mod:`properties.production.inputs`). ``None``: decidable on ``build(p)`` only.
    applies_to_tensors: Callable[[Any, Any], bool] | None = None
    #: The outputs the release is off in: :data:`EVERY_OUTPUT`, or the names of some outputs.
    outputs: tuple[str, ...] = EVERY_OUTPUT
    #: For an entry of some outputs: the impl's error model (linear+CE's
    #: :class:`~numcheck.properties.linear_ce.tolerance.ErrorModel`) mapped to the model of what the release
    #: computes, under which those outputs are judged (``None`` for an entry of every output).
    model: Callable[[Any], Any] | None = None
    #: For a distributed impl's entry: the world size its example runs at; such an entry covers every distributed
    #: property (they judge the outputs of one run).
    example_world_size: int | None = None
    #: For a distributed impl's entry: where its example's targets lie
    #: (:attr:`~numcheck.properties.distributed.linear_ce.cases.DistCase.placement`).
    example_placement: str = "as_built"
    #: The distribution whose code diverges ("torch", "liger-kernel", "transformer-engine", ...): the report names
    #: it with its installed release (:meth:`release`). Every entry of the tables gives it.
    library: str = ""
    #: What is wrong, in one line (the report's headline and last line; :attr:`reason` is the evidence).
    summary: str = ""
    #: An artifact of this environment (Triton's interpreter), not the library's divergence: the report lists it as
    #: "not judged here" and ``--strict`` does not fail on it. Such an entry holds only where its example is covered
    #: (``applies(example)``: the environment shows the artifact).
    artifact: bool = False

    def __post_init__(self) -> None:
        bad = set(self.devices) - {"cpu", "cuda"}
        if not self.devices or bad:
            raise ValueError(
                f"known divergence {self.impls!r}: devices must be a non-empty subset of "
                f"('cpu', 'cuda'), got {self.devices!r}"
            )
        if not self.outputs or ("*" in self.outputs and self.outputs != EVERY_OUTPUT):
            raise ValueError(
                f"known divergence {self.impls!r}: outputs must be {EVERY_OUTPUT!r} or the names of "
                f"some outputs, got {self.outputs!r}"
            )
        if self.every_output != (self.model is None):
            raise ValueError(
                f"known divergence {self.impls!r}: an entry of some outputs gives the model they are "
                f"judged under (model=...), one of every output none; got outputs={self.outputs!r}"
            )
        if self.example_world_size is not None and self.properties != ("*",):
            raise ValueError(
                f"known divergence {self.impls!r}: a distributed impl's entry covers every property "
                f"(properties=('*',)), got {self.properties!r}"
            )
        if "\n" in self.summary or (
            self.library and self.releases is not None and self.library != self.releases.package
        ):
            raise ValueError(
                f"known divergence {self.impls!r}: summary is one line and library names the package of its "
                f"releases; got library={self.library!r}, summary={self.summary!r}"
            )
        if self.example_world_size is None and self.example_placement != "as_built":
            raise ValueError(
                f"known divergence {self.impls!r}: example_placement is a distributed example's "
                f"(give example_world_size), got {self.example_placement!r}"
            )

    @property
    def every_output(self) -> bool:
        """Whether the release is off in every output (a covered case is left out of the draws)."""
        return self.outputs == EVERY_OUTPUT

    def _about(self, impl_name: str, prop: str, device: str) -> bool:
        """Whether the entry is about this impl and property on ``device``'s type, on the installed release."""
        props_ok = "*" in self.properties or prop in self.properties
        on_device = torch.device(device).type in self.devices
        return (
            fnmatch.fnmatchcase(impl_name, self.impls)
            and props_ok
            and on_device
            and (self.releases is None or self.releases.hold())
        )

    def release(self) -> str | None:
        """The installed release of :attr:`library` this entry is judged against (``None`` when unknown)."""
        return self.releases.installed() if self.releases is not None else library_release(self.library)

    def applies_here(self, impl_name: str, device: str, support: Any = None) -> bool:
        """Whether the entry is about impl ``impl_name`` under some property on ``device``'s type and the installed
        release, and can be reached here: its example's dtype, options and autocast declared by ``support`` (the
        impl's declaration; not checked when ``None``). An artifact's cases are out of the declaration by design:
        it applies where this environment shows it (:attr:`artifact`)."""
        return (
            fnmatch.fnmatchcase(impl_name, self.impls)
            and torch.device(device).type in self.devices
            and (self.releases is None or self.releases.hold())
            and (bool(self.applies(self.example)) if self.artifact else self.declared_by(support, device))
        )

    def declared_by(self, support: Any, device: str) -> bool:
        """Whether ``support`` (``None``: not known) declares the example's dtype, options and autocast on
        ``device``, in any reduction it declares (an entry whose examples all lie outside the declaration here, a
        dtype the impl leaves out on this device, covers nothing here)."""
        if support is None or not hasattr(support, "reductions"):  # not a linear+CE declaration: not checked
            return True
        p = self.example
        return (
            support.refuses(
                dtype=p.param_dtype,
                device=torch.device(device).type,
                options=p.features,
                reduction=p.reduction if p.reduction in support.reductions else next(iter(support.reductions)),
                autocast=p.compute_dtype if p.autocast else None,
            )
            is None
        )

    def finding(self, impl_name: str) -> dict[str, Any]:
        """The entry as a report names it for ``impl_name`` (JSON-ready): impl, library, release, summary, artifact,
        the outputs it is off in and the full reason."""
        return {
            "impl": impl_name,
            "library": self.library,
            "release": self.release() or "unknown",
            "summary": self.summary,
            "artifact": self.artifact,
            "outputs": list(self.outputs),
            "reason": self.reason,
        }

    def matches(self, impl_name: str, prop: str, p: Any) -> bool:
        return self._about(impl_name, prop, p.device) and self.applies(p)

    def matches_tensors(self, impl_name: str, prop: str, p: Any, t: Any) -> bool:
        """:meth:`matches` for a case whose tensors are ``t`` (not ``build(p)``): a ``by_data`` entry decides on
        ``t`` with :attr:`applies_to_tensors`, and covers nothing when it has none (its data cannot be read)."""
        if not self.by_data:
            return self.matches(impl_name, prop, p)
        if self.applies_to_tensors is None:
            return False
        return self._about(impl_name, prop, p.device) and self.applies_to_tensors(p, t)

    def covers_case(self, impl_name: str, case: Any) -> bool:
        """For a distributed impl's entry: whether it covers ``case`` (a DistCase) of impl ``impl_name``, under
        every property, on the installed release."""
        return self._about(impl_name, "*", case.problem.device) and self.applies(case)
