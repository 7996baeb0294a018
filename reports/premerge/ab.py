"""``numcheck premerge --impl NEW --base OLD``: a change judged against what it replaces, on the same problems.

For each pair (``--impl`` and ``--base`` given in the same order; several pairs allowed), :func:`measure_pair`:

* **accuracy**: every linear+CE case of the report grid (``--grid``, default quick) that *both* declare runs on
  both (:func:`reports.report.run.run_case`: the hard bound and the relative judgement); the cases only one of
  them declares are listed with the other's reason. Per output: the worst error/bound of each side, the growth
  NEW/BASE and the share of BASE's headroom NEW takes. An output is flagged when that share exceeds its threshold
  (``--headroom``, default :data:`DEFAULT_HEADROOM`, derived below), even when both pass.
* **memory** at the seed's shapes (BT=8192, H=4096, V=131072, bf16, ``mean``): extra peak above the inputs over
  forward+backward and bytes held from forward to backward (:mod:`impls.measure.memory`). On a CPU run the
  calls run on the ``meta`` device (nothing is allocated) with every capability probe pinned to the CPU's own
  answer, so each impl takes the code path the CPU takes; on CUDA they run for real and the figure is
  ``torch.cuda.max_memory_allocated`` (the tracker's beside it).
* **the grad_weight accumulation step** (:func:`step_ab`): where a side exposes ``accumulation_step(gw, G, x)``
  (on the impl object, or on the function a :class:`impls.protocols.linear_ce.FunctionImpl` wraps; optional), the extra
  peak of one call at the seed's chunk: ``gw`` fp32 ``[V, H]``, ``G`` bf16 ``[C, V]``, ``x`` bf16 ``[C, H]``
  (V=131072, H=4096, C=2048) — the step a claim like "extra peak 3072 MiB → 0 MiB" is about. Measured as the
  memory is (``meta`` with the probes pinned on CPU; ``torch.cuda.max_memory_allocated`` on CUDA). A side without
  the attribute: "not measurable for this impl", and the step metrics are not verified.
* **time** (CUDA only): forward+backward at the seed's shapes, NEW and BASE interleaved ``--repeats`` times, each
  a median over CUDA events (:func:`impls.measure.timing.median_ms`); the ratio NEW/BASE is the median of the
  per-repeat ratios, its spread the range over the repeats. On CPU: "not measured here".
* **code paths here**: the capability probes that gate accumulation paths (``addmm(out_dtype=)`` on this device,
  :mod:`impls.measure.capabilities`), the path a built-in chunked impl resolves to
  (:func:`impls.builtin.grad_accum.resolved_path`), and the matmul-family ops each impl actually dispatches in one small
  bf16 forward+backward on this device (op, operand dtypes, ``out_dtype``, result dtype).

:func:`measure` returns everything as JSON; ``python -m numcheck.reports.premerge.ab`` prints that JSON, which is
how ``premerge --python OTHER`` measures in another environment (another torch release) and checks the claims
about it (:mod:`reports.premerge.claims`). :func:`render` writes the Markdown section a contributor pastes into the PR, in
the shape of a "Memory Benchmark" section of a pull request.

What is flagged (:data:`DEFAULT_HEADROOM`, one threshold per output). Two correct impls differ in their worst
error/bound, and by a lot when both are far inside their bounds, so the ratio NEW/BASE says little: over ordered
pairs of correct built-ins on the quick grid's cases both declare, 16 reseedings (:mod:`reports.premerge_spread`),
the ratio reached 19.7 on the loss (0.48 against 0.024) and 5.5 on grad_weight. What a reviewer must not let
through is a change that uses up the margin BASE had below its bound, the margin that protects the cases the grid
does not draw. So an output is flagged when NEW takes more than its threshold of BASE's headroom,
:func:`headroom_taken` = (NEW − BASE)/(1 − BASE) of the worst error/bounds: 0 when NEW is no worse, 1 when NEW
sits at its bound (where the hard check takes over), and 0.01 → 0.03 takes 2%. The most any correct pair took
over the 16 seeds was loss 0.616, z_loss 0.878, grad_x 0.382, grad_weight 0.417, grad_bias 0.153 (going from 8 to
16 seeds raised these maxima 1.0–1.13×, grad_bias 1.33×, the least sampled output); each threshold is 1.5× that,
rounded up, and at most 1 (z_loss: a correct change may take nearly all of its headroom, so only the bound judges
it). The growth NEW/BASE is still shown and is the ``error_growth`` claim metric (over outputs whose NEW worst is
at least :data:`DEFAULT_GROWTH_FLOOR`). ``--headroom H`` sets one threshold for every output. Where BASE itself
is at or past its bound the output is not judged ("BASE itself fails"). docs/premerge-ab.md has the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.properties.linear_ce.costs import memory_ab, paths_ab, step_ab, time_ab
from numcheck.reports.common import ImplSpec, add_impl_arguments

#: Flag an output when NEW takes more than this share of the headroom BASE's worst error/bound leaves below its
#: bound (:func:`headroom_taken`): 1.5 × the largest share a correct change took, over ordered pairs of correct
#: built-ins and reseedings of the quick grid (module docstring; docs/premerge-ab.md).
DEFAULT_HEADROOM: dict[str, float] = {
    "loss": 0.93,
    "z_loss": 1.0,
    "grad_x": 0.58,
    "grad_weight": 0.63,
    "grad_bias": 0.23,
}
#: The ``error_growth`` claim metric (NEW/BASE) counts only outputs where NEW's worst error/bound is at least this.
DEFAULT_GROWTH_FLOOR = 0.05
#: Interleaved timing repeats (NEW, BASE, NEW, BASE, ...) on CUDA, each a median over ``TIME_REP_MS`` of calls.
DEFAULT_REPEATS = 5


@dataclass(frozen=True)
class Pair:
    """One A/B pair: the ``--impl`` spec of the change and the ``--base`` spec it replaces."""

    new: str
    base: str


def pairs_from(impls: list[str], bases: list[str]) -> list[Pair]:
    """The pairs of ``--impl`` and ``--base`` given in the same order. Raises ValueError when counts differ."""
    if len(impls) != len(bases) or not impls:
        raise ValueError(
            f"A/B mode pairs each --impl with the --base given in the same position: got "
            f"{len(impls)} --impl ({', '.join(impls) or 'none'}) and {len(bases)} --base "
            f"({', '.join(bases) or 'none'})"
        )
    return [Pair(n, b) for n, b in zip(impls, bases)]


def load_one(spec: str) -> Any:
    """The one linear+CE impl named by ``spec``. Raises ValueError saying why it cannot be used as a side."""
    from numcheck.impls.registry import BrokenImpl, discover

    entries = discover([spec])
    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    if broken:
        raise ValueError(f"{spec}: {broken[0].error}")
    lin = [e for e in entries if e.kind == LINEAR_CE_KIND]
    if len(lin) != 1:
        raise ValueError(
            f"{spec} names {len(lin)} linear+CE impls ({', '.join(e.name for e in lin) or 'none'}); an "
            f"A/B side is exactly one"
        )
    reason = lin[0].impl.support.unavailable_reason()
    if reason:
        raise ValueError(f"{spec} ({lin[0].name}) cannot run here: {reason}")
    return lin[0].impl


# -- environment ------------------------------------------------------------------------------------------
def environment(device: str) -> dict[str, Any]:
    """What a claim's ``device`` and ``torch`` are matched against, and how the run is named."""
    import torch

    from numcheck.reports.report.schema import device_name

    return {
        "device": torch.device(device).type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cuda_available": bool(torch.cuda.is_available()),
        "python": sys.executable,
        "python_version": sys.version.split()[0],
    }


# -- accuracy ---------------------------------------------------------------------------------------------
def split_cases(new: Any, base: Any, cases: list[Any]) -> tuple[list[Any], list[dict], list[dict]]:
    """(cases both declare, cases only NEW declares, cases only BASE declares); one-sided ones as
    ``{"case", "label", "why"}`` with the other side's refusal."""
    from numcheck.properties.linear_ce.strategies import refusal
    from numcheck.reports.report.schema import case_text

    both, only_new, only_base = [], [], []
    for gc in cases:
        rn, rb = refusal(new.support, gc.case), refusal(base.support, gc.case)
        if not rn and not rb:
            both.append(gc)
        elif not rn:
            only_new.append({"case": case_text(gc.case), "label": gc.case.short(), "why": f"BASE: {rb}"})
        elif not rb:
            only_base.append({"case": case_text(gc.case), "label": gc.case.short(), "why": f"NEW: {rn}"})
    return both, only_new, only_base


def _worst(records: list[dict]) -> dict[str, dict[str, Any]]:
    """Per output, the largest hard error/bound over ``records`` (:func:`reports.report.run.run_case`'s) and the
    case it was on; NaN ratios (an output not computed) are skipped."""
    worst: dict[str, dict[str, Any]] = {}
    for rec in records:
        for name, o in rec.get("outputs", {}).items():
            r = o.get("ratio_hard", math.nan)
            if not math.isnan(r) and r >= worst.get(name, {"ratio": -1.0})["ratio"]:
                worst[name] = {"ratio": r, "case": rec["case"]}
    return worst


def growth(new: float, base: float) -> float:
    """NEW's worst error/bound over BASE's (inf when BASE is exact and NEW is not; 1 when both are exact)."""
    if base > 0:
        return new / base
    return math.inf if new > 0 else 1.0


def headroom_taken(new: float, base: float) -> float:
    """The share of BASE's headroom below its bound that NEW uses up: ``(NEW − BASE) / (1 − BASE)`` of the worst
    error/bounds (0: no worse; 1: NEW at its bound; negative: NEW better). NaN when BASE is at or past its bound
    (BASE itself fails: there is no headroom to take)."""
    if base >= 1.0:
        return math.nan
    return (new - base) / (1.0 - base)


def threshold_for(output: str, headroom: float | None) -> float:
    """The headroom share above which ``output`` is flagged: ``headroom`` when given (``--headroom``), else its
    default (:data:`DEFAULT_HEADROOM`; the smallest default for an output not in the table)."""
    if headroom is not None:
        return headroom
    return DEFAULT_HEADROOM.get(output, min(DEFAULT_HEADROOM.values()))


def compare_output(name: str, wn: dict[str, Any], wb: dict[str, Any], headroom: float | None) -> dict[str, Any]:
    """One output's row: both worsts, growth NEW/BASE, headroom taken, its threshold, and the verdict: flagged when
    NEW takes more of BASE's headroom than the threshold; not judged when BASE itself is at or past its bound."""
    h, k = headroom_taken(wn["ratio"], wb["ratio"]), threshold_for(name, headroom)
    return {
        "output": name,
        "base": wb["ratio"],
        "base_case": wb["case"],
        "new": wn["ratio"],
        "new_case": wn["case"],
        "growth": growth(wn["ratio"], wb["ratio"]),
        "headroom": h,
        "threshold": k,
        "base_fails": wb["ratio"] >= 1.0,
        "flagged": bool(not math.isnan(h) and h > k),
    }


def accuracy_ab(new: Any, base: Any, grid: str, device: str, headroom: float | None, floor: float) -> dict[str, Any]:
    """Both impls on the grid's cases both declare; per output the worst error/bound of each side, growth, headroom
    taken, flags (:func:`compare_output`)."""
    from numcheck.reports.report.families.linear_ce import linear_ce_cases
    from numcheck.reports.report.grid import GRIDS
    from numcheck.reports.report.run import one_thread, run_case

    t0 = time.monotonic()
    both, only_new, only_base = split_cases(new, base, linear_ce_cases(GRIDS[grid], device))
    with one_thread():
        recs = [(run_case(new, gc), run_case(base, gc)) for gc in both]
    new_recs, base_recs = [r[0] for r in recs], [r[1] for r in recs]
    wn, wb = _worst(new_recs), _worst(base_recs)
    outputs = [compare_output(name, wn[name], wb[name], headroom) for name in wn if name in wb]

    def fails(records: list[dict]) -> list[dict]:
        return [
            {
                "case": r["case"],
                "label": r["label"],
                "detail": (r.get("error") or "; ".join(r.get("failures", [])[:1]))[:300],
                "repro": r.get("repro", ""),
            }
            for r in records
            if r["status"] != "pass"
        ]

    return {
        "grid": grid,
        "headroom": headroom,
        "floor": floor,
        "n_both": len(both),
        "only_new": only_new,
        "only_base": only_base,
        "new_pass": sum(r["status"] == "pass" for r in new_recs),
        "base_pass": sum(r["status"] == "pass" for r in base_recs),
        "new_failures": fails(new_recs),
        "base_failures": fails(base_recs),
        "outputs": outputs,
        "seconds": round(time.monotonic() - t0, 1),
    }


def accuracy_ok(acc: dict[str, Any]) -> bool:
    """NEW passes every case both declare, none of its outputs is flagged, and at least one case ran."""
    return acc["n_both"] > 0 and not acc["new_failures"] and not any(o["flagged"] for o in acc["outputs"])


# -- one pair, all environments -----------------------------------------------------------------------------
def metrics_of(pair: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """The claim metrics of a measured pair (:data:`reports.premerge.claims.METRICS`), and why any is missing."""
    m: dict[str, float] = {}
    missing: dict[str, str] = {}
    mem = pair.get("memory", {})
    nb, bb = mem.get("new", {}), mem.get("base", {})
    if "peak_mib" in nb and "peak_mib" in bb:
        m.update(peak_change_mib=nb["peak_mib"] - bb["peak_mib"], held_change_mib=nb["held_mib"] - bb["held_mib"])
    if "peak_mib" in nb:
        m.update(new_peak_mib=nb["peak_mib"], new_held_mib=nb["held_mib"])
    for k in ("peak_change_mib", "held_change_mib", "new_peak_mib", "new_held_mib"):
        if k not in m:
            missing[k] = f"memory not measured: {nb.get('error') or bb.get('error') or mem.get('error', '?')}"
    st = pair.get("step", {})
    sn, sb = st.get("new", {}), st.get("base", {})
    if "extra_mib" in sn:
        m["step_extra_mib"] = sn["extra_mib"]
        if "extra_mib" in sb:
            m["step_change_mib"] = sn["extra_mib"] - sb["extra_mib"]
    for k in ("step_extra_mib", "step_change_mib"):
        if k not in m:
            missing[k] = (
                f"step not measured: NEW {sn.get('error')}"
                if "error" in sn
                else f"step not measured: BASE {sb.get('error')}"
                if "error" in sb
                else f"step not measured: {st.get('error', '?')}"
            )
    t = pair.get("time", {})
    if t.get("measured"):
        m["time_ratio"] = t["ratio"]
    else:
        missing["time_ratio"] = t.get("reason", "time not measured")
    outs = [o["growth"] for o in pair.get("accuracy", {}).get("outputs", []) if o["new"] >= pair["accuracy"]["floor"]]
    if outs:
        m["error_growth"] = max(outs)
    else:
        missing["error_growth"] = "no output of NEW reaches the growth floor on the problems both declare"
    return m, missing


def measure_pair(
    pair: Pair, device: str, grid: str, headroom: float | None, floor: float, repeats: int
) -> dict[str, Any]:
    """Everything the A/B section shows for one pair (module docstring), JSON-ready."""
    out: dict[str, Any] = {"new": pair.new, "base": pair.base}
    try:
        new, base = load_one(pair.new), load_one(pair.base)
    except ValueError as exc:
        out["error"] = str(exc)
        out["metrics"], out["unmeasured"] = {}, {}
        return out
    out.update(new_name=new.name, base_name=base.name)
    out["accuracy"] = accuracy_ab(new, base, grid, device, headroom, floor)
    for key, fn in (
        ("memory", lambda: memory_ab(new, base, device)),
        ("step", lambda: step_ab(new, base, device)),
        ("time", lambda: time_ab(new, base, device, repeats)),
        ("paths", lambda: paths_ab(new, base, device)),
    ):
        try:
            out[key] = fn()
        except Exception as exc:  # noqa: BLE001 - a measurement that breaks is shown with its error
            out[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out["metrics"], out["unmeasured"] = metrics_of(out)
    return out


def measure(
    pairs: list[Pair],
    device: str,
    grid: str = "quick",
    headroom: float | None = None,
    floor: float = DEFAULT_GROWTH_FLOOR,
    repeats: int = DEFAULT_REPEATS,
) -> dict[str, Any]:
    """``{"env", "pairs"}``: every pair measured in this environment (what :func:`reports.premerge.claims.judge` reads)."""
    return {
        "env": environment(device),
        "pairs": [measure_pair(p, device, grid, headroom, floor, repeats) for p in pairs],
    }


def measure_elsewhere(
    python: str, pairs: list[Pair], device: str, grid: str, headroom: float | None, floor: float, repeats: int
) -> dict[str, Any]:
    """:func:`measure` run by another interpreter (``--python``: another venv, another torch), from the current
    directory with this process's environment. Raises RuntimeError with its output when it fails."""
    import os
    import subprocess

    cmd = [
        python,
        "-m",
        "numcheck.reports.premerge.ab",
        "--device",
        device,
        "--grid",
        grid,
        "--growth-floor",
        str(floor),
        "--repeats",
        str(repeats),
    ]
    if headroom is not None:
        cmd += ["--headroom", str(headroom)]
    for p in pairs:
        cmd += ["--impl", p.new, "--base", p.base]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"{' '.join(cmd)} printed no JSON:\n{proc.stdout[-1000:]}\n{proc.stderr[-1000:]}") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m numcheck.reports.premerge.ab``: :func:`measure` as JSON on stdout (for ``premerge --python``)."""
    from numcheck.impls import interpreter

    interpreter.arrange()
    p = argparse.ArgumentParser(prog="python -m numcheck.reports.premerge.ab", description=main.__doc__)
    add_impl_arguments(p, impls="the change of each pair", default="")
    p.add_argument("--base", action="append", default=[], type=ImplSpec(), metavar="SPEC")
    p.add_argument("--grid", default="quick")
    p.add_argument("--headroom", type=float, default=None)
    p.add_argument("--growth-floor", type=float, default=DEFAULT_GROWTH_FLOOR)
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    a = p.parse_args(argv)
    import os

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    res = measure(pairs_from(a.impl, a.base), a.device, a.grid, a.headroom, a.growth_floor, a.repeats)
    print(json.dumps(res, default=_json_default))
    return 0


def _json_default(v: Any) -> str:
    """What ``json.dumps`` cannot write (a dtype, a path) as its ``str``."""
    return str(v)


if __name__ == "__main__":
    sys.exit(main())
