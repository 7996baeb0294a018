#!/usr/bin/env python3
"""Where a CI leg's minutes went between two runs: per test module and per test function, from the JUnit XML that
``.ci/run`` writes per leg (``.ci-out/junit-torch<version>.xml``).

    python .ci/junit_compare.py BASE.xml HEAD.xml [--top 40]

Times are pytest's per-test seconds (with ``-n 2`` two run at once, so a leg's wall time is about half their
sum). A function that failed on either side is left out of both: a failure's shrinking inflates its time, and
the line says which were left out. Compare runs of one machine only; CPUs differ by 2x and more."""

from __future__ import annotations

import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ET

Key = tuple[str, str]  # (test module, test function without its parameters)


def _key(classname: str, name: str) -> Key:
    """The module and function a JUnit test case belongs to (``tests.self.test_x.TestC`` + ``test_f[p]``)."""
    parts = classname.split(".")
    at = max((i for i, p in enumerate(parts) if p.startswith("test_")), default=len(parts) - 1)
    return parts[at], ".".join(parts[at + 1 :] + [re.sub(r"\[.*$", "", name)])


def cases(path: str) -> list[ET.Element]:
    """The ``<testcase>`` elements of one JUnit file; a clear exit when it cannot be read or holds none."""
    try:
        found = list(ET.parse(path).iter("testcase"))
    except (OSError, ET.ParseError) as e:
        raise SystemExit(f"junit: cannot read {path!r} as JUnit XML: {e}") from None
    if not found:
        raise SystemExit(f"junit: {path!r} holds no test cases (a --collect-only run, or pytest exit 5?)")
    return found


def load(path: str) -> tuple[collections.Counter[Key], set[Key]]:
    """Seconds per (module, function), summed over parametrizations, and the functions with a failing case."""
    times: collections.Counter[Key] = collections.Counter()
    failed: set[Key] = set()
    for tc in cases(path):
        k = _key(tc.get("classname", ""), tc.get("name", ""))
        times[k] += float(tc.get("time") or 0.0)
        if tc.find("failure") is not None or tc.find("error") is not None:
            failed.add(k)
    return times, failed


def main(argv: list[str] | None = None) -> int:
    """Print the per-module table and the functions that grew most."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("head")
    ap.add_argument("--top", type=int, default=40, help="how many functions to list by growth (default 40)")
    a = ap.parse_args(argv)
    base, bad_b = load(a.base)
    head, bad_h = load(a.head)
    drop = bad_b | bad_h
    if drop:
        print("left out (a case failed on one side): " + ", ".join(f"{m}::{f}" for m, f in sorted(drop)))
    keys = (set(base) | set(head)) - drop
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for m, f in keys:
        per[m][0] += base.get((m, f), 0.0)
        per[m][1] += head.get((m, f), 0.0)
    print(f"{'module':40s} {'base s':>8s} {'head s':>8s} {'delta':>8s}")
    for m, (b, h) in sorted(per.items(), key=lambda kv: kv[1][0] - kv[1][1]):
        print(f"{m:40s} {b:8.1f} {h:8.1f} {h - b:+8.1f}")
    tb, th = sum(v[0] for v in per.values()), sum(v[1] for v in per.values())
    print(f"{'TOTAL (test-seconds)':40s} {tb:8.1f} {th:8.1f} {th - tb:+8.1f}")
    print(f"\nfunctions by growth (top {a.top}):")
    rows = sorted(keys, key=lambda k: base.get(k, 0.0) - head.get(k, 0.0))[: a.top]
    for m, f in rows:
        b, h = base.get((m, f), 0.0), head.get((m, f), 0.0)
        print(f"{h - b:+8.1f} {b:8.1f} {h:8.1f}  {m}::{f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
