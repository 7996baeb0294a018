"""Where reports live: the baselines shipped inside the package, a checkout's baseline folders, and the rule that
nothing is ever written into the installed package.

* **Shipped baselines** are the committed ``reports/<device>-torch<version>/report.json`` files. They are package
  data of ``numcheck.reports`` (pyproject's ``[tool.setuptools.package-data]``) and are read only through
  :mod:`importlib.resources`, so they are found the same way in a checkout, an editable install and a wheel.
* A **user's baseline** is a path (``--compare BASE.json``, ``--baseline BASE.json``), never looked up.
* **A checkout** (numcheck's own repository: ``pyproject.toml`` naming numcheck beside ``reports/``) is the only
  place ``--update-baseline`` writes to; an installed numcheck refuses it.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import torch

from numcheck.reports.report.schema import REPO, Traversable, device_label, device_name, load, torch_release

#: The package whose data the baselines are (the folder ``reports/baselines/`` of the repository).
BASELINE_PACKAGE = "numcheck.reports.baselines"
#: A baseline folder's name: ``<device label>-torch<release>`` (``cpu-torch2.13.0``, ``h200-torch2.11``).
BASELINE_DIR = re.compile(r"^[a-z0-9][a-z0-9-]*-torch\d+(\.\d+)*$")


def report_dir_name(device: str) -> str:
    """``<device label>-torch<release>`` of this machine: the folder name of its report (``cpu-torch2.13.0``)."""
    return f"{device_label(device)}-torch{torch_release()}"


def shipped_baselines() -> list[Traversable]:
    """Every baseline ``report.json`` shipped with this numcheck (package data), sorted by folder name."""
    root = resources.files(BASELINE_PACKAGE)
    found = [
        entry / "report.json"
        for entry in root.iterdir()
        if entry.is_dir() and BASELINE_DIR.match(entry.name) and (entry / "report.json").is_file()
    ]
    return sorted(found, key=lambda t: str(t))


def _release(torch_version: str) -> str:
    return str(torch_version).split("+", 1)[0]


def matches_here(report: dict, device: str) -> bool:
    """Whether ``report`` was made on this kind of device (same device type; on CUDA the same GPU model) under
    this torch release: the report a new one here should be compared with."""
    env = report.get("environment", {})
    dev = torch.device(device)
    if env.get("device") != dev.type or _release(env.get("torch", "")) != torch_release():
        return False
    return dev.type != "cuda" or env.get("device_name") == device_name(device)


def baseline_for(device: str) -> Traversable | None:
    """The shipped baseline for ``device`` under this torch release, or None (then there is nothing to compare).

    A folder named :func:`report_dir_name` is preferred; otherwise every shipped baseline's environment is read
    (a GPU folder is named after its GPU, ``h200-torch2.11``, not after the device label). Raises ValueError,
    naming the file, when a shipped baseline read on the way is not a complete report."""
    shipped = shipped_baselines()
    name = report_dir_name(device)
    ordered = sorted(shipped, key=lambda t: _parent_name(t) != name)
    for candidate in ordered:
        if matches_here(load(candidate), device):
            return candidate
    return None


def _parent_name(resource: Traversable) -> str:
    return Path(str(resource)).parent.name


def package_dirs() -> list[Path]:
    """The installed package's folders (``numcheck/`` and each subpackage's, wherever its files are: one tree in a
    wheel, the checkout's top-level folders in an editable install): nothing is written under them except by
    ``--update-baseline`` in a checkout."""
    from numcheck.reports.common import package_folders

    return sorted({d.resolve() for d in package_folders().values()})


def inside_package(path: Path) -> Path | None:
    """The package folder ``path`` lies in (or is), or None."""
    target = path.resolve()
    for d in package_dirs():
        if target == d or d in target.parents:
            return d
    return None


def checkout_root() -> Path | None:
    """numcheck's source checkout this code runs from (``pyproject.toml`` naming numcheck beside ``reports/``),
    or None for an installed numcheck (a wheel in site-packages)."""
    pyproject = REPO / "pyproject.toml"
    try:
        text = pyproject.read_text()
    except OSError:
        return None
    named = re.search(r'^name\s*=\s*"numcheck"\s*$', text, re.MULTILINE)
    return REPO if named and (REPO / "reports" / "__init__.py").is_file() else None


def baseline_dir_to_update(device: str) -> Path:
    """The checkout's folder of this device's baseline (``<checkout>/reports/<name>/``): the shipped one's folder
    when one matches here, else :func:`report_dir_name`. Raises ValueError for an installed numcheck."""
    root = checkout_root()
    if root is None:
        where = Path(str(resources.files("numcheck"))).resolve()
        raise ValueError(
            f"--update-baseline rewrites a committed baseline in numcheck's source checkout, but this "
            f"numcheck is installed at {where} (no checkout: an installed package is never written to). "
            f"Run it in a clone of numcheck (pip install -e .), or write your own report with --out DIR"
        )
    current = baseline_for(device)
    name = _parent_name(current) if current is not None else report_dir_name(device)
    return root / "reports" / "baselines" / name
