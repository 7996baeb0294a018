"""Where premerge's A/B accuracy threshold comes from: what a *correct* change does to each output's worst
error/bound.

A change under review replaces one impl (BASE) by another (NEW); a correct change is one correct impl replaced by
another. So the spread that matters is not one impl's across reseedings but NEW against BASE over ordered pairs of
correct impls, on the problems both declare, for several draws of the problems' values. :func:`collect` runs each
impl once per reseeding of the grid (keeping every case's error/bound per output and which cases it refuses);
:func:`pair_stats` forms, for every ordered pair (NEW, BASE) of them and every seed, each output's worst error/bound
of both sides over the cases both declare, and from it the growth NEW/BASE and the headroom NEW takes up,
``(NEW − BASE) / (1 − BASE)`` (:func:`reports.premerge.ab.headroom_taken`); the largest over pairs and seeds is
what correct changes reach. The default thresholds (:data:`reports.premerge.ab.DEFAULT_HEADROOM`) are derived from
this run; docs/premerge-ab.md gives the table and the derivation.

Run it from a checkout (about 7 minutes on a shared 2-core CPU for the default impls and 16 seeds of the quick grid)::

    python tools/premerge_spread.py --seeds 16 [--json spread.json]

A spec that does not load is bad input (exit 2, naming it); an impl unavailable here is left out with its reason
printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

#: Correct built-ins a change moves between: eager, the chunked accumulation paths, torch's native fused CE
#: (whole, and chunked with its grad_weight in the parameter dtype). chunked[addmm_out_dtype] and recompute give
#: chunked[fp32_operands]' values on CPU (the out_dtype path falls back; recompute takes the same path), so they
#: add no pair of their own here. The Triton and third-party impls run under Triton's interpreter on CPU (minutes
#: per grid) and are left out of the default.
DEFAULT_IMPLS = (
    "eager",
    "chunked[fallback]",
    "chunked[fp32_operands]",
    "chunked[lowp_accum]",
    "torch_native[reference]",
    "torch_native[chunked,acc=accurate]",
)

#: Per case: ``None`` when the impl refuses it, else ``{output: error/bound}``.
CaseRatios = dict[str, float] | None


def case_ratios(impl: Any, cases: list[Any]) -> list[CaseRatios]:
    """Each grid case's hard error/bound per output for ``impl`` (``None`` for a case it does not declare)."""
    from numcheck.properties.linear_ce.strategies import refusal
    from numcheck.reports.report.run import run_case

    out: list[CaseRatios] = []
    for gc in cases:
        if refusal(impl.support, gc.case):
            out.append(None)
            continue
        rec = run_case(impl, gc)
        out.append(
            {
                n: o["ratio_hard"]
                for n, o in rec.get("outputs", {}).items()
                if not math.isnan(o.get("ratio_hard", math.nan))
            }
        )
    return out


def _worst(rows: list[dict[str, float]]) -> dict[str, float]:
    """The largest value per output over ``rows``."""
    worst: dict[str, float] = {}
    for row in rows:
        for name, r in row.items():
            worst[name] = max(worst.get(name, 0.0), r)
    return worst


def reseeded(cases: list[Any], seed: int) -> list[Any]:
    """The grid cases with every problem's ``seed`` moved by ``seed·100003`` (same shapes, options, regimes)."""
    return [
        dataclasses.replace(gc, case=dataclasses.replace(gc.case, seed=gc.case.seed + seed * 100003)) for gc in cases
    ]


def load_impls(specs: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """``({name: impl}, {name: why left out})`` for the linear+CE impls ``specs`` name. Raises ValueError naming a
    spec that does not load (a mistyped name is bad input, not something to skip)."""
    from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
    from numcheck.impls.registry import BrokenImpl, discover

    impls, left_out = {}, {}
    for spec in specs:
        entries = discover([spec])
        broken = [e for e in entries if isinstance(e, BrokenImpl)]
        if broken:
            raise ValueError(f"--impl {spec}: {broken[0].error}")
        lin = [e for e in entries if e.kind == LINEAR_CE_KIND]
        if not lin:
            raise ValueError(f"--impl {spec} names no linear+CE impl ({', '.join(e.name for e in entries) or 'none'})")
        for e in lin:
            why = e.impl.support.unavailable_reason()
            if why:
                left_out[e.name] = why
            else:
                impls[e.name] = e.impl
    return impls, left_out


def collect(impls: dict[str, Any], seeds: int, grid: str) -> dict[str, list[list[CaseRatios]]]:
    """``{impl: [per seed: case_ratios]}`` over ``seeds`` reseedings of ``grid``'s linear+CE cases (seed 0: the
    grid as is)."""
    from numcheck.reports.report.families.linear_ce import linear_ce_cases
    from numcheck.reports.report.grid import GRIDS
    from numcheck.reports.report.run import one_thread

    base = linear_ce_cases(GRIDS[grid])
    with one_thread():
        return {name: [case_ratios(impl, reseeded(base, s)) for s in range(seeds)] for name, impl in impls.items()}


def pair_stats(data: dict[str, list[list[CaseRatios]]]) -> list[dict[str, Any]]:
    """One row per (NEW, BASE, seed, output) over every ordered pair of ``data``'s impls: both sides' worst
    error/bound over the cases both declare, growth NEW/BASE and headroom taken (module docstring)."""
    from numcheck.reports.premerge.ab import growth, headroom_taken

    rows = []
    for new in data:
        for base in data:
            if new == base:
                continue
            for s, (cn, cb) in enumerate(zip(data[new], data[base])):
                both = [(a, b) for a, b in zip(cn, cb) if a is not None and b is not None]
                wn, wb = _worst([a for a, _ in both]), _worst([b for _, b in both])
                for out in sorted(set(wn) & set(wb)):
                    rows.append(
                        {
                            "new": new,
                            "base": base,
                            "seed": s,
                            "output": out,
                            "n_both": len(both),
                            "new_worst": wn[out],
                            "base_worst": wb[out],
                            "growth": growth(wn[out], wb[out]),
                            "headroom": headroom_taken(wn[out], wb[out]),
                        }
                    )
    return rows


def largest(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """Per output, the row with the largest ``key`` (``growth`` or ``headroom``)."""
    top: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r[key] > top.get(r["output"], {key: -math.inf})[key]:
            top[r["output"]] = r
    return top


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of :func:`pair_stats`' rows: per output the largest headroom taken and the largest growth,
    each with its pair, both worsts and the seed."""
    lines = [
        "| output | largest headroom taken | NEW, BASE (seed): worst error/bound | largest growth | NEW, BASE (seed) |",
        "| --- | --- | --- | --- | --- |",
    ]
    th, tg = largest(rows, "headroom"), largest(rows, "growth")
    for out in th:
        h, g = th[out], tg[out]
        lines.append(
            f"| {out} | {h['headroom']:.3f} | `{h['new']}` {h['new_worst']:.3g}, `{h['base']}` "
            f"{h['base_worst']:.3g} ({h['seed']}) | {g['growth']:.2f} | `{g['new']}` {g['new_worst']:.3g}, "
            f"`{g['base']}` {g['base_worst']:.3g} ({g['seed']}) |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print, per output, the largest growth and headroom taken over ordered pairs of correct impls and seeds."""
    p = argparse.ArgumentParser(prog="python tools/premerge_spread.py", description=__doc__.split("\n")[0])
    p.add_argument("--impl", action="append", default=[], metavar="SPEC")
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--grid", default="quick")
    p.add_argument("--json", metavar="FILE", help="also write every case's error/bound and every pair row here")
    a = p.parse_args(argv)
    try:
        impls, left_out = load_impls(tuple(a.impl) or DEFAULT_IMPLS)
    except ValueError as exc:
        print(f"premerge_spread: {exc}", file=sys.stderr)
        return 2
    for name, why in left_out.items():
        print(f"premerge_spread: {name} left out: {why}", file=sys.stderr)
    if len(impls) < 2:
        print(f"premerge_spread: {len(impls)} impl(s) available; pairs need two", file=sys.stderr)
        return 2
    data = collect(impls, a.seeds, a.grid)
    rows = pair_stats(data)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {
                    "grid": a.grid,
                    "seeds": a.seeds,
                    "impls": list(impls),
                    "left_out": left_out,
                    "cases": data,
                    "pairs": rows,
                },
                fh,
            )
    print(f"{len(impls)} impls, {len(impls) * (len(impls) - 1)} ordered pairs, {a.seeds} seeds, grid {a.grid}\n")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
