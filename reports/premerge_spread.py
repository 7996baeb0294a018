"""Where premerge's A/B growth factor comes from: how much one correct impl's worst error/bound per output moves
when only the values of the problems change.

``numcheck premerge --base`` flags an output whose worst error/bound (over the problems both impls declare) is
more than ``--growth-factor`` times BASE's. Two runs of the *same* impl on problems of the same shapes, options and
regimes but other random values (another ``seed`` of each :class:`~properties.problems.Problem`) differ in that
worst ratio too, and that difference is noise a change must not be blamed for. :func:`seed_spread` measures it:
for each impl and output, the worst ratio over the grid for each of several seeds, and the spread
max/min over the seeds. The default factors (:data:`reports.premerge_ab.DEFAULT_GROWTH_FACTORS`) are chosen above the
largest spread of the correct built-ins; its docstring gives the run.

Run it from a checkout (about a minute on a 2-core CPU for the default impls and 8 seeds of the quick grid)::

    PYTHONPATH=$PWD python -m numcheck.reports.premerge_spread --seeds 8
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Any

#: Correct built-ins whose spread sets the factor: eager, and the chunked accumulation paths a change moves between.
DEFAULT_IMPLS = ("eager", "chunked[fallback]", "chunked[fp32_operands]", "chunked[addmm_out_dtype]",
                 "chunked[lowp_accum]", "recompute")


def worst_per_output(impl: Any, cases: list[Any], floor: float) -> dict[str, float]:
    """Worst error/bound (hard) per output of ``impl`` over ``cases`` (grid cases it declares); outputs whose worst is
    below ``floor`` are left out (premerge does not judge growth there)."""
    from numcheck.properties.strategies import refusal
    from numcheck.reports.report_sweep import run_case

    worst: dict[str, float] = {}
    for gc in cases:
        if refusal(impl.support, gc.case):
            continue
        rec = run_case(impl, gc)
        for name, o in rec.get("outputs", {}).items():
            r = o.get("ratio_hard", math.nan)
            if not math.isnan(r):
                worst[name] = max(worst.get(name, 0.0), r)
    return {k: v for k, v in worst.items() if v >= floor}


def reseeded(cases: list[Any], seed: int) -> list[Any]:
    """The grid cases with every problem's ``seed`` moved by ``seed·100003`` (same shapes, options, regimes)."""
    return [dataclasses.replace(gc, case=dataclasses.replace(gc.case, seed=gc.case.seed + seed * 100003))
            for gc in cases]


def seed_spread(impl_specs: tuple[str, ...] = DEFAULT_IMPLS, seeds: int = 8, grid: str = "quick",
                floor: float = 0.0) -> dict[str, dict[str, dict[str, float]]]:
    """``{impl: {output: {"min", "max", "spread"}}}``: the worst error/bound per output over ``grid``'s linear+CE
    cases, for ``seeds`` reseedings of them (seed 0: the grid as is), and max/min over the seeds."""
    from numcheck.impls.registry import BrokenImpl, discover
    from numcheck.reports.report_grid import GRIDS, linear_ce_cases
    from numcheck.reports.report_sweep import one_thread

    base = linear_ce_cases(GRIDS[grid])
    out: dict[str, dict[str, dict[str, float]]] = {}
    with one_thread():
        for e in discover(list(impl_specs)):
            if isinstance(e, BrokenImpl) or e.impl.support.unavailable_reason():
                continue
            per_seed = [worst_per_output(e.impl, reseeded(base, s), floor) for s in range(seeds)]
            names = set.intersection(*(set(w) for w in per_seed)) if per_seed else set()
            out[e.name] = {}
            for n in sorted(names):
                vals = [w[n] for w in per_seed]
                lo, hi = min(vals), max(vals)
                out[e.name][n] = {"min": lo, "max": hi, "spread": hi / lo if lo > 0 else math.inf}
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the spread table (Markdown) and the largest spread."""
    p = argparse.ArgumentParser(prog="python -m numcheck.reports.premerge_spread", description=__doc__.split("\n")[0])
    p.add_argument("--impl", action="append", default=[], metavar="SPEC")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--grid", default="quick")
    p.add_argument("--floor", type=float, default=0.0, help="leave out outputs whose worst is below this")
    a = p.parse_args(argv)
    res = seed_spread(tuple(a.impl) or DEFAULT_IMPLS, a.seeds, a.grid, a.floor)
    print(f"| impl | output | min over {a.seeds} seeds | max | spread max/min |")
    print("| --- | --- | --- | --- | --- |")
    top = (0.0, "", "")
    for impl, outs in res.items():
        for name, s in outs.items():
            print(f"| `{impl}` | {name} | {s['min']:.3g} | {s['max']:.3g} | {s['spread']:.3g} |")
            if s["spread"] > top[0]:
                top = (s["spread"], impl, name)
    print(f"\nlargest spread: {top[0]:.3g} ({top[1]}, {top[2]}); grid {a.grid}, floor {a.floor:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
