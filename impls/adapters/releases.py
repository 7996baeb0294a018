"""Which release of a third-party library is installed: one reader for every adapter (Liger-Kernel, TransformerEngine,
cut-cross-entropy, Megatron-core), and the notes the report header and ``numcheck list`` show when it is unknown.

The release is that of the distribution whose installed-files record (``RECORD``) lists the module the adapter
imports (or loads from its file), not the first ``.dist-info`` on ``sys.path``: a namespace-package wheel first on
the path is shadowed by a regular package later on it, and ``metadata.version`` would name the wrong release.

Real environments list one distribution more than once: pytest's prepend import mode puts ``site-packages`` on
``sys.path`` a second time for a package collected with ``--pyargs``, a virtual environment reaches it through a
symlinked ``lib64``, ``PYTHONPATH`` may repeat a folder. :func:`distributions` counts a ``.dist-info`` folder once
whatever path reached it (compared by ``os.path.realpath``), and :func:`owning_release` takes owners that agree on
the version as that version. Only owners that name *different* versions make the release unknown: then the
reason names each ``version at folder`` and the adapter's known divergences, keyed on a release, cannot apply —
which :func:`numcheck.impls.adapters.release_notes.release_notes` reports instead of leaving it silent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable


@dataclass(frozen=True)
class Release:
    """What the installed files say about a library's release.

    ``version`` is the release, or ``None`` when it is unknown (no distribution lists the module, or distributions
    naming different versions do); ``note`` says why it is unknown, or, beside a known version, which other
    distributions of the library are on the path without being the one imported (informational)."""

    version: str | None
    note: str | None = None

    @property
    def unknown(self) -> bool:
        return self.version is None


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Liger_Kernel`` -> ``liger-kernel``)."""
    return name.lower().replace("_", "-").replace(".", "-")


def _key(dist: metadata.Distribution) -> str:
    """The ``.dist-info`` folder's real path (the same folder reached through two path entries or a symlink gives
    one key); for a distribution of another finder, its root and version."""
    own = getattr(dist, "_path", None)
    if own is not None:
        return os.path.realpath(str(own))
    return f"{os.path.realpath(str(dist.locate_file('')))}::{dist.version}"


def distributions(name: str | Callable[[str], bool], path: Iterable[str] | None = None) -> list[metadata.Distribution]:
    """Every installed distribution called ``name`` (or whose normalized name ``name`` accepts) on ``path``
    (default ``sys.path``), once per ``.dist-info`` folder, in path order.

    >>> distributions("no-such-distribution-numcheck")
    []
    """
    accept = name if callable(name) else (lambda n, want=normalized(name): n == want)
    found = metadata.distributions(path=list(path)) if path is not None else metadata.distributions()
    seen: dict[str, metadata.Distribution] = {}
    for d in found:
        if accept(normalized(d.metadata["Name"] or "")):
            seen.setdefault(_key(d), d)
    return list(seen.values())


def root(dist: metadata.Distribution) -> Path:
    """The folder ``dist``'s recorded files are relative to, resolved."""
    return Path(str(dist.locate_file(""))).resolve()


def owns(dist: metadata.Distribution, module_file: Path) -> bool:
    """Whether ``dist``'s installed-files record lists ``module_file`` (both compared resolved)."""
    try:
        rel = module_file.resolve().relative_to(root(dist)).as_posix()
    except ValueError:
        return False
    return any(f.as_posix() == rel for f in (dist.files or ()))


def where(dist: metadata.Distribution) -> str:
    """``version at folder``, how a distribution is named in a note."""
    return f"{dist.version} at {root(dist)}"


def owning_release(library: str, module_file: Path, dists: list[metadata.Distribution] | None = None) -> Release:
    """The release of ``library`` (a distribution name) whose record lists ``module_file``, read from ``dists``
    (default: :func:`distributions` of ``library`` on ``sys.path``).

    Owners that agree on the version (one ``.dist-info`` reached twice is already one) give that version; owners
    naming different versions, or none, give ``Release(None, reason)``. A known version's note names the other
    distributions of the library on the path, not imported (``None`` when there are none)."""
    dists = distributions(library) if dists is None else dists
    owners = [d for d in dists if owns(d, module_file)]
    others = [d for d in dists if d not in owners]
    also = ("; also on the path, not imported: " + ", ".join(where(d) for d in others)) if others else ""
    versions = sorted({d.version for d in owners})
    if len(versions) == 1:
        return Release(versions[0], f"imported from {module_file}{also}" if others else None)
    if owners:
        return Release(
            None,
            f"{module_file} is listed by {library} distributions of different releases: "
            + ", ".join(where(d) for d in owners),
        )
    return Release(None, f"no installed {library} distribution lists {module_file}{also}")
