#!/usr/bin/env python3
"""Where CI's minutes go: the cost table of one CI run, from the JUnit XML each leg writes
(``.ci-out/junit-torch<version>.xml``) and the steps' times ``.ci/run`` records (``.ci-out/steps.tsv``).

    python .ci/costs.py LEG=JUNIT.xml [LEG=JUNIT.xml ...] [--steps .ci-out/steps.tsv] [--top 10]
                        [--tests-over 1] [--workers 2]

Prints markdown: the time per step (set-ups, lint, wheel leg, legs), each leg's test-seconds, the ``--top`` most
expensive tests (one parametrization each) and test functions (summed over their parametrizations), the seconds per
test module and leg, and every test at or over ``--tests-over`` seconds in some leg. ``results/ci-costs.md`` is
this output for a CI run; ``tests/self/test_ci_costs.py`` checks that the function of every test over
:data:`COSTLY_S` there carries ``@pytest.mark.costly(reason=...)``.

Times are pytest's per-test seconds: with ``-n 2`` two run at once, so a leg's wall time is about their sum over
the workers. A failed case keeps its time (a failure's shrinking inflates it) and is flagged. The JUnit parsing is
``junit_compare.py``'s."""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from junit_compare import Key, _key, cases  # noqa: E402

#: A test function whose seconds in some leg of the committed table exceed this carries ``@pytest.mark.costly``.
COSTLY_S = 20.0


class Leg:
    """One leg's JUnit: seconds and case count per (module, function) and per (module, test case: the function with
    its parameters), and those with a failed case."""

    def __init__(self, label: str, path: str) -> None:
        self.label, self.path = label, path
        self.seconds: collections.Counter[Key] = collections.Counter()
        self.count: collections.Counter[Key] = collections.Counter()
        self.failed: set[Key] = set()
        for tc in cases(path):
            fn = _key(tc.get("classname", ""), tc.get("name", ""))
            case = (fn[0], fn[1].rsplit(".", 1)[0] + "." + tc.get("name", "") if "." in fn[1] else tc.get("name", ""))
            bad = tc.find("failure") is not None or tc.find("error") is not None
            for k in (fn, ("case",) + case):
                self.seconds[k] += float(tc.get("time") or 0.0)  # type: ignore[index]
                self.count[k] += 1  # type: ignore[index]
                if bad:
                    self.failed.add(k)  # type: ignore[arg-type]

    def module_seconds(self) -> collections.Counter[str]:
        per: collections.Counter[str] = collections.Counter()
        for k, s in self.seconds.items():
            if k[0] != "case":
                per[k[0]] += s
        return per


def _cell(leg: Leg, k: Key) -> str:
    if k not in leg.count:
        return "-"
    return f"{leg.seconds[k]:.1f}" + (" (failed)" if k in leg.failed else "")


def steps_table(path: str) -> list[str]:
    """The time per step ``.ci/run`` recorded (one ``name<TAB>seconds<TAB>outcome`` line per step)."""
    rows = [ln.split("\t") for ln in Path(path).read_text().splitlines() if ln.strip()]
    out = ["## Time per step", "", "| step | seconds | outcome |", "| --- | ---: | --- |"]
    out += [f"| {r[0]} | {r[1]} | {r[2] if len(r) > 2 else ''} |" for r in rows]
    total = sum(int(r[1]) for r in rows if r[1].isdigit())
    return out + [f"| **total** | **{total}** | |", ""]


def legs_table(legs: list[Leg], workers: int) -> list[str]:
    out = [
        "## Legs",
        "",
        f"| leg | tests | failed | test-seconds | ÷ {workers} workers |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for g in legs:
        fns = [k for k in g.seconds if k[0] != "case"]
        total = sum(g.seconds[k] for k in fns)
        failed = sum(g.count[k] for k in g.failed if k[0] == "case")
        out.append(f"| {g.label} | {sum(g.count[k] for k in fns)} | {failed} | {total:.0f} | {total / workers:.0f} |")
    return out + [""]


def modules_table(legs: list[Leg]) -> list[str]:
    per = [g.module_seconds() for g in legs]
    mods = sorted(set().union(*per), key=lambda m: -max(p.get(m, 0.0) for p in per))
    head = " | ".join(f"{g.label} s" for g in legs)
    out = ["## Per test module (seconds, summed over its tests)", "", f"| module | {head} |"]
    out.append("| --- |" + " ---: |" * len(legs))
    for m in mods:
        out.append(f"| {m} | " + " | ".join(f"{p[m]:.1f}" if m in p else "-" for p in per) + " |")
    return out + [""]


def tests_table(legs: list[Leg], keys: list[Key], title: str) -> list[str]:
    """Functions (seconds summed over their cases, and how many) or test cases (``("case", module, test)`` keys)."""
    if keys and keys[0][0] == "case":
        head = " | ".join(f"{g.label} s" for g in legs)
        out = [f"## {title}", "", f"| test module | test | {head} |", "| --- | --- |" + " ---: |" * len(legs)]
        return out + [f"| {k[1]} | {k[2]} | " + " | ".join(_cell(g, k) for g in legs) + " |" for k in keys] + [""]
    head = " | ".join(f"{g.label} s | {g.label} cases" for g in legs)
    out = [f"## {title}", "", f"| test module | test function | {head} |", "| --- | --- |" + " ---: |" * 2 * len(legs)]
    for k in keys:
        cells = " | ".join(f"{_cell(g, k)} | {g.count.get(k, 0)}" for g in legs)
        out.append(f"| {k[0]} | {k[1]} | {cells} |")
    return out + [""]


def render(legs: list[Leg], steps: str | None, top: int, over: float, workers: int) -> str:
    """The whole table, markdown."""
    worst = collections.Counter({k: max(g.seconds.get(k, 0.0) for g in legs) for g in legs for k in g.seconds})
    fns = collections.Counter({k: s for k, s in worst.items() if k[0] != "case"})
    tests = collections.Counter({k: s for k, s in worst.items() if k[0] == "case"})
    lines = [f"# CI cost table ({', '.join(f'{g.label}: {Path(g.path).name}' for g in legs)})", ""]
    if steps:
        lines += steps_table(steps)
    lines += legs_table(legs, workers)
    lines += tests_table(legs, [k for k, _ in tests.most_common(top)], f"The {top} most expensive tests")
    lines += tests_table(legs, [k for k, _ in fns.most_common(top)], f"The {top} most expensive test functions")
    lines += modules_table(legs)
    keys = sorted((k for k, s in tests.items() if s >= over), key=lambda k: (-tests[k], k))
    title = f"Every test at or over {over:g} s in some leg (over {COSTLY_S:g} s: its function is marked costly)"
    lines += tests_table(legs, keys, title)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("legs", nargs="+", metavar="LEG=JUNIT", help="a leg's label and its JUnit XML")
    ap.add_argument("--steps", help="the steps' times .ci/run recorded (.ci-out/steps.tsv)")
    ap.add_argument("--top", type=int, default=10, help="how many of the most expensive functions (default 10)")
    ap.add_argument("--tests-over", type=float, default=1.0, help="list every function over this many seconds")
    ap.add_argument("--workers", type=int, default=2, help="xdist workers a leg ran with (default 2)")
    a = ap.parse_args(argv)
    legs = []
    for spec in a.legs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"costs: {spec!r} is not LEG=JUNIT.xml (e.g. torch2.13.0=.ci-out/junit-torch2.13.0.xml)")
        legs.append(Leg(label, path))
    print(render(legs, a.steps, a.top, a.tests_over, a.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
