"""What numcheck's pytest plugin costs a pytest run that collects no numcheck test, and how long the single-impl
suite run takes: the two figures the README's promises rest on (the plugin at most 0.3 s, the suite on one
outside impl at most 60 s on a 2-core machine).

1. **Overhead**: pytest on a trivial test file in an empty folder (its own ``pytest.ini``, so no configuration of
   numcheck's checkout applies), once with numcheck's plugin loaded (its ``pytest11`` entry point) and once with
   ``-p no:numcheck``, alternated ``--repeats`` times; the figure is the median of the paired differences (each
   pair ran back to back, so load that changes slowly cancels). Every other plugin (hypothesis, xdist) is loaded
   in both. Also printed: ``import numcheck.tests.plugin`` on its own, in a fresh interpreter that has imported
   pytest (median over the repeats).
2. **Suite**: the README's plugin command, ``pytest -n 2 --pyargs numcheck.tests.suite --impl outside_impl:impl``,
   on a copy of ``examples/outside_impl.py`` in a temporary folder (found through ``PYTHONPATH``, as a user's
   module), from that folder: wall time and pytest's summary line. ``--skip-suite`` leaves it out.

Run from a checkout with this interpreter's numcheck (an editable install of the checkout; ``PYTHONPATH`` is passed
on to the subprocesses)::

    python tools/bench_plugin_overhead.py --repeats 7

On a loaded machine the figures carry the load: run it on an idle one for the figure to quote, or say so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The limits the README states.
OVERHEAD_LIMIT_S = 0.3
SUITE_LIMIT_S = 60.0
TRIVIAL_TEST = "def test_nothing_of_numcheck():\n    assert 1 + 1 == 2\n"
IMPORT_PLUGIN = (
    "import time, pytest; t0 = time.perf_counter(); import numcheck.tests.plugin; print(time.perf_counter() - t0)"
)


def _env() -> dict[str, str]:
    """This process's environment, without what would change pytest's or numcheck's behaviour."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NUMCHECK_"))}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of ``cmd`` run in ``cwd``, and its result (raises if it failed)."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
    secs = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode} in {cwd}:\n{r.stdout}\n{r.stderr}")
    return secs, r


def overhead(repeats: int) -> dict[str, float]:
    """The median paired difference (plugin loaded − ``-p no:numcheck``) of a trivial pytest run, the two medians,
    and the median time of ``import numcheck.tests.plugin`` after pytest."""
    with tempfile.TemporaryDirectory(prefix="numcheck-overhead-") as tmp:
        folder = Path(tmp)
        (folder / "pytest.ini").write_text("[pytest]\n")
        (folder / "test_trivial.py").write_text(TRIVIAL_TEST)
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_trivial.py"]
        if "numcheck.tests.plugin" not in _timed([*base, "--trace-config"], folder)[1].stdout:  # warms the cache too
            raise RuntimeError(
                "numcheck's plugin is not registered in this environment (no pytest11 entry "
                "point): install numcheck first"
            )
        with_plugin, without, imports = [], [], []
        for _ in range(repeats):
            a, _ = _timed(base, folder)
            b, _ = _timed([*base, "-p", "no:numcheck"], folder)
            with_plugin.append(a)
            without.append(b)
            imports.append(float(_timed([sys.executable, "-c", IMPORT_PLUGIN], folder)[1].stdout.strip()))
    diffs = [a - b for a, b in zip(with_plugin, without)]
    return {
        "overhead": statistics.median(diffs),
        "with": statistics.median(with_plugin),
        "without": statistics.median(without),
        "import": statistics.median(imports),
        "spread": max(diffs) - min(diffs),
    }


def suite_run(example: Path) -> tuple[float, str]:
    """Wall seconds of the README's plugin command with ``-n 2`` on a copy of ``example``, and pytest's last
    line."""
    with tempfile.TemporaryDirectory(prefix="numcheck-suite-") as tmp:
        folder = Path(tmp)
        shutil.copy(example, folder / "outside_impl.py")
        env = _env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--pyargs",
            "numcheck.tests.suite",
            "--impl",
            "outside_impl:impl",
        ]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
        secs = time.perf_counter() - t0
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    if r.returncode != 0:
        raise RuntimeError(f"the suite run exited {r.returncode}:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}")
    return secs, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="pairs of trivial runs (default 7)")
    parser.add_argument("--skip-suite", action="store_true", help="measure the overhead only")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f} at the start")
    o = overhead(args.repeats)
    ok = o["overhead"] <= OVERHEAD_LIMIT_S
    print(
        f"plugin overhead: {o['overhead']:.3f} s (median of {args.repeats} paired differences, spread "
        f"{o['spread']:.3f} s; trivial run {o['with']:.2f} s with numcheck's plugin, {o['without']:.2f} s with "
        f"-p no:numcheck; import numcheck.tests.plugin alone {o['import']:.3f} s) — limit {OVERHEAD_LIMIT_S} s: "
        f"{'OK' if ok else 'OVER'}"
    )
    if not args.skip_suite:
        example = Path(__file__).resolve().parent.parent / "examples" / "outside_impl.py"
        secs, summary = suite_run(example)
        suite_ok = secs <= SUITE_LIMIT_S
        ok = ok and suite_ok
        print(
            f"single-impl suite run (pytest -n 2 --pyargs numcheck.tests.suite --impl outside_impl:impl): "
            f"{secs:.1f} s — limit {SUITE_LIMIT_S:.0f} s: {'OK' if suite_ok else 'OVER'}; pytest: {summary}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
