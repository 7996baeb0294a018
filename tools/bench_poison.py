"""What poisoned memory (:mod:`numcheck.properties.core.poison`) costs each family's suite: a few of its drawn tests
on built-ins, through the suite's own runner (:func:`numcheck.check`'s, the one the pytest plugin runs) under the
``numcheck-ci`` profile (derandomized: both modes judge the same cases), with ``NUMCHECK_POISON=off`` and ``on``
alternated ``--repeats`` times in one process (imports and first-call warm-up paid by an untimed first pass).

The distributed families (vocabulary-parallel linear+CE, TP/SP FP8) run their drawn tests by name as
``tools/detection.py`` does (:data:`numcheck.properties.suites.RANKED`, shrink phase left out), under gloo; their
impl runs in the pool's rank processes (poisoned there: :mod:`numcheck.properties.core.poison`), whose CPU seconds
(``/proc/PID/stat``, Linux) are added to this process's.

The figure is CPU seconds (``time.process_time``, one intra-op thread; plus the ranks' for a distributed family),
so load from other processes on a shared machine changes it little; per family: the median of the paired on/off
ratios (each pair ran back to back). Run from a checkout::

    PYTHONPATH=. python tools/bench_poison.py --repeats 3 [--family grouped]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

#: A family's table is :data:`RANKED`: its tests run on a pool's ranks, by name.
RANKED = "ranked"
#: family -> (suite table module, or :data:`RANKED`; the tests timed; the built-ins they run on).
FAMILIES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "linear_ce": (
        "numcheck.properties.linear_ce.suite:SUITE",
        ("accuracy", "two_calls", "strided_inputs"),
        ("eager", "chunked[fallback]"),
    ),
    "fp8": (
        "numcheck.properties.fp8.suite:FP8_SUITE",
        (
            "accuracy_against_both_references",
            "save_original_input_is_bitwise_identical",
            "saved_tensor_aliasing_and_bytes",
        ),
        ("fp8_linear[current]", "fp8_linear[mxfp8]"),
    ),
    "grouped": (
        "numcheck.properties.fp8.grouped.suite:GROUPED_SUITE",
        (
            "grouped_accuracy_against_both_references",
            "grouped_empty_experts_exact_zero",
            "grouped_equals_the_linear_per_expert",
        ),
        ("grouped_fp8_linear[fused]",),
    ),
    "linear_distill": (
        "numcheck.properties.linear_distill.suite:DISTILL_SUITE",
        ("distill_accuracy", "distill_chunk_invariance", "distill_teacher_frozen"),
        ("linear_distill[eager]", "linear_distill[chunked]"),
    ),
    "linear_preference": (
        "numcheck.properties.linear_preference.suite:PREFERENCE_SUITE",
        ("preference_accuracy", "preference_chunk_invariance", "preference_ignored_positions"),
        ("linear_preference_eager[dpo]", "linear_preference_chunked[dpo]"),
    ),
    "dist_linear_ce": (
        RANKED,
        ("dist_accuracy[world_size=2]", "dist_world_size_invariance[world_size=2]"),
        ("vocab_parallel[nan]",),
    ),
    "tp_fp8": (
        RANKED,
        ("dist_accuracy_and_same_scale", "dist_save_original_input"),
        ("tp_fp8_linear[current]", "tp_fp8_linear[mxfp8]"),
    ),
}


def _ranks_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of every live pool rank of this process, by pid (Linux ``/proc``)."""
    from numcheck.properties.distributed.pool.pool import DistPool

    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pool in DistPool._pools.values():
        for r in pool.ranks:
            try:
                fields = Path(f"/proc/{r.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[r.process.pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
    return out


def _ranked(family: str, tests: tuple[str, ...], impls: tuple[str, ...]) -> None:
    """A distributed family's tests through its :data:`numcheck.properties.suites.RANKED` entry (no shrinking)."""
    from numcheck.impls.registry import builtin
    from numcheck.properties.suites import RANKED as ranked

    for impl in map(builtin, impls):
        for name in tests:
            status, message = ranked[impl.kind].run(impl, name, "numcheck-ci", False)
            if status not in ("passed", "skipped"):
                raise SystemExit(f"{family} {name} {impl.name}: {status} {message}")


def _pass(family: str, mode: str) -> float:
    """CPU seconds of one pass over ``family``'s tests and impls with ``NUMCHECK_POISON=mode``."""
    import importlib

    from hypothesis import Phase, settings

    import numcheck.properties.core.profiles  # noqa: F401 - registers numcheck-ci
    from numcheck.impls.registry import builtin
    from numcheck.properties.check import _run_drawn

    spec, tests, impls = FAMILIES[family]
    os.environ["NUMCHECK_POISON"] = mode
    if spec is RANKED:
        before, t0 = _ranks_cpu(), time.process_time()
        _ranked(family, tests, impls)
        after = _ranks_cpu()
        return time.process_time() - t0 + sum(v - before.get(pid, 0.0) for pid, v in after.items())
    mod, attr = spec.split(":")
    table = getattr(importlib.import_module(mod), attr)
    base = settings(settings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    t0 = time.process_time()
    for name in tests:
        for impl in impls:
            verdict = _run_drawn(table[name], builtin(impl), base)
            if verdict.status not in ("passed", "skipped"):  # skipped: a test the impl's declaration leaves out
                raise SystemExit(f"{family} {name} {impl} poison={mode}: {verdict}")
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--family", choices=sorted(FAMILIES), action="append")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, CPU seconds (time.process_time)")
    for family in args.family or list(FAMILIES):
        _pass(family, "off")  # warm-up: imports, first calls
        off, on = [], []
        for _ in range(args.repeats):
            off.append(_pass(family, "off"))
            on.append(_pass(family, "on"))
        ratios = [b / a for a, b in zip(off, on)]
        print(
            f"{family:17s} off {' '.join(f'{v:6.2f}' for v in off)} | on {' '.join(f'{v:6.2f}' for v in on)} | "
            f"on/off median {statistics.median(ratios):.3f} (pairs {' '.join(f'{r:.3f}' for r in ratios)})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
