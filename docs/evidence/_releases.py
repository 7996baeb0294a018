"""The mechanics every release table of ``docs/evidence/`` shares (``liger_releases.py``,
``liger_distill_releases.py``, ``te_releases.py``, ``torchao_releases.py``): what each script judges, and how its
table reads, stay in the script; finding, installing and running the releases, and the hash of the numcheck code a
table was judged by, are here.

* :func:`adapter_code_hash`: the content hash a table's first line records (``tests/self/test_ci_evidence.py``
  compares it with the checkout's);
* :func:`available_releases` and :func:`install`: a package's releases from the index, each into ``DIR/<version>``;
  :func:`sweep_parser` and :func:`releases_in`: the arguments every sweep takes and the release folders it judges;
* :func:`release_env`, :func:`run`, :func:`junit`, :func:`machine`: a release judged in a fresh process, a pytest
  run's JUnit counts, where it ran;
* :func:`per_release` and :func:`per_release_main`: a script that judges in-process (``script --here``) run once per release
  folder, that folder first on ``PYTHONPATH`` after this checkout;
* :func:`failure_figures`: a failure's error/bound as a row prints it, named by the output it is of.

Not a script: the release scripts import it from their own folder (``docs/evidence/`` is no package).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[2]


def content_hash(contents: list[bytes]) -> str:
    """SHA-256 over the SHA-256 of each content in order (the files' bytes alone: no path, no timestamp)."""
    h = hashlib.sha256()
    for data in contents:
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def adapter_code_hash(files: tuple[str, ...], root: Path = ROOT) -> str:
    """:func:`content_hash` of ``files`` (paths relative to ``root``); a missing one is named."""
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise SystemExit(f"adapter code hash: {', '.join(missing)} not found under {root} (moved? update the list)")
    return content_hash([(root / f).read_bytes() for f in files])


def _at_least(text: str, oldest: Version) -> bool:
    try:
        return Version(text) >= oldest
    except InvalidVersion:
        return False


def available_releases(package: str, oldest: Version) -> list[str]:
    """The releases of ``package`` the package index lists, from ``oldest`` on, in version order."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("Available versions:"))
    return sorted((v.strip() for v in line.split(":", 1)[1].split(",") if _at_least(v.strip(), oldest)), key=Version)


def install(folder: Path, package: str, oldest: Version) -> int:
    """``pip install --no-deps --target folder/<version>`` of every release of ``package`` from ``oldest`` on (a
    folder that exists is kept); non-zero when an install failed."""
    folder.mkdir(parents=True, exist_ok=True)
    rc = 0
    for v in available_releases(package, oldest):
        target = folder / v
        if target.is_dir():
            print(f"{v}: {target} exists", flush=True)
            continue
        print(f"{v}: installing into {target}", flush=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check"]
        rc |= subprocess.run([*pip, "--target", str(target), f"{package}=={v}"]).returncode
    return rc


def sweep_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every release sweep takes (its description the first paragraph of ``doc``): the folder of
    per-release folders, ``--install`` (:func:`install`), ``--only`` (:func:`releases_in`) and ``-n`` (the
    suite's pytest-xdist workers)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="folder of per-release folders")
    ap.add_argument("--install", action="store_true", help="install every release into DIR, then stop")
    ap.add_argument("--only", default="", help="comma-separated releases (default: every folder in DIR)")
    ap.add_argument("-n", "--jobs", type=int, default=2, help="pytest-xdist workers for the suite")
    return ap


def releases_in(folder: Path, oldest: Version, only: str = "") -> list[str]:
    """The release folders of ``folder`` (named by their version, from ``oldest`` on), in version order; ``only``:
    comma-separated releases to keep."""
    found = [p.name for p in folder.iterdir() if p.is_dir() and _at_least(p.name, oldest)]
    if only:
        found = [v for v in found if v in set(only.split(","))]
    return sorted(found, key=Version)


def release_env(*path: str | Path, **extra: str) -> dict[str, str]:
    """This environment with ``PYTHONPATH`` set to ``path`` and ``extra`` set, and no ``NUMCHECK_IMPLS`` (a release
    is judged on the impls its script names)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in path), **extra)
    env.pop("NUMCHECK_IMPLS", None)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, float]:
    """``cmd`` in this checkout: exit status (124 when it timed out), stdout and stderr, seconds."""
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\n(timed out after {timeout:.0f} s)", time.monotonic() - start


def junit(path: Path) -> dict[str, object]:
    """Counts and, per failing test, the first line of its message, from a JUnit XML file."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures: list[str] = []
    if not path.is_file():
        return {**counts, "failures": ["(no JUnit file: pytest did not finish)"]}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            text = (bad.get("message") or bad.text or "").strip()
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            failures.append(f"{name}: {first[:300]}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures}


def machine() -> str:
    """Where a release was judged: CPU model, core count, torch and triton (a table may gather several machines)."""
    probe = "import torch, triton; print(torch.__version__, triton.__version__)"
    versions = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.split()
    cpu = (
        next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in ln
            ),
            platform.processor() or platform.machine(),
        )
        if Path("/proc/cpuinfo").is_file()
        else platform.machine()
    )
    torch_v, triton_v = (versions + ["?", "?"])[:2]
    return f"{cpu}, {os.cpu_count()} cores, torch {torch_v}, triton {triton_v}, Python {platform.python_version()}"


def per_release(script: str, folders: list[str], header: str) -> int:
    """Print ``header``, then run ``script --here`` once per release folder (``installed``: none added), that
    folder first on ``PYTHONPATH`` after this checkout, each under ``== <folder's name>``; non-zero when one
    failed (its stderr's tail printed)."""
    rc = 0
    print(header, flush=True)
    for folder in folders:
        extra = [] if folder == "installed" else [folder]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *extra, os.environ.get("PYTHONPATH", "")]))
        print(f"== {Path(folder).name}", flush=True)
        proc = subprocess.run([sys.executable, script, "--here"], env=env, capture_output=True, text=True, timeout=900)
        print(proc.stdout, end="", flush=True)
        if proc.returncode:
            print(proc.stderr[-3000:])
            rc = 1
    return rc


def per_release_main(script: str, here: Callable[[], None], header: Callable[[list[str]], str]) -> None:
    """A per-release script's entry point: ``script --here`` judges the release on the path in this process,
    ``script [DIR ...]`` runs :func:`per_release` over the folders (default ``installed``) under
    ``header(folders)``, and exits with its status."""
    if sys.argv[1:] == ["--here"]:
        here()
        return
    folders = sys.argv[1:] or ["installed"]
    sys.exit(per_release(script, folders, header(folders)))


#: One output's line of a failure message (``Comparison.describe`` of ``properties/core/compare.py``).
_OUTPUT_LINE = re.compile(
    r"^\s*(?P<output>\w+) \((?P<dtype>torch\.\w+)\): (?P<bad>\d+) / (?P<numel>\d+) elements beyond bound; "
    r"worst at index (?P<index>\[[^\]]*\]): impl (?P<impl>\S+), oracle (?P<oracle>\S+), \|error\| (?P<error>\S+) > "
    r"bound (?P<bound>\S+) \(error/bound (?P<ratio>[^)]+)\)",
    re.MULTILINE,
)


def _at_floor(m: re.Match) -> bool:
    """Whether the output's worst element is an exact 0 of the oracle whose bound is only its dtype's underflow
    floor (a few absolute η: the roundings of a value that must come out exactly 0, e.g. an ignored row's
    gradient), where error/bound is |error| over that floor: a figure of the order of 1/η, not a count of bounds."""
    import torch

    from numcheck.properties.linear_ce.tolerance import UNDERFLOW

    floor = UNDERFLOW.get(getattr(torch, m["dtype"].removeprefix("torch."), None))
    return float(m["oracle"]) == 0.0 and floor is not None and float(m["bound"]) <= 8 * floor


def _output_figure(m: re.Match) -> str:
    """One failing output: its error/bound, the worst element, and what an exact-0 oracle's figure means."""
    where = f"{m['bad']} / {m['numel']} beyond bound, worst at {m['index']}"
    if _at_floor(m):
        return (
            f"{m['output']} {m['ratio']} ({where}: impl {m['impl']} where the oracle is exactly 0, |error| "
            f"{m['error']} over a bound that is only {m['dtype'].removeprefix('torch.')}'s underflow floor "
            f"{m['bound']})"
        )
    return f"{m['output']} {m['ratio']} ({where}: impl {m['impl']}, oracle {m['oracle']}, bound {m['bound']})"


def failure_figures(exc: BaseException, ratio: float | None, fallback: str | None = None) -> str:
    """A failing row's text: ``error/bound R`` (``ratio``, the failure's error/bound: the largest of its outputs')
    with the output it is of, then each failing output's own figure and worst element, worst first; a failure with
    no element-wise output line (a bitwise or metamorphic property) gives ``error/bound R: <fallback>`` (its first
    170 characters; default: the message's first line after the case, 160)."""
    found = sorted(_OUTPUT_LINE.finditer(str(exc)), key=lambda m: -float(m["ratio"]))
    figure = "-" if ratio is None else f"{ratio:.3g}"
    if not found and fallback is not None:
        return f"error/bound {figure}: {fallback[:170]}"
    if not found:
        lines = [
            ln.strip() for ln in str(exc).splitlines()[2:] if ln.strip() and not ln.strip().startswith("reproduce:")
        ]
        return f"error/bound {figure}: {(lines or [str(exc).splitlines()[0]])[0][:160]}"
    return f"error/bound {figure} of {found[0]['output']}: " + "; ".join(_output_figure(m) for m in found)
