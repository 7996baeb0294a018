"""Liger-Kernel's chunked losses as Liger runs them by default (``compiled=True``: ``torch.compile`` of each chunk's
forward and backward), judged on CUDA on a few fixed cases each, with what torch.compile did for them.

For every ``_compiled`` twin registered (``liger_preference[<loss>_compiled]``, ``liger_jsd[chunked_compiled]``) it
runs the family's ``accuracy`` property on the cases below (their shapes differ, so the twin compiles more than
once), and prints per case the verdict, the worst error/bound and the seconds, then per twin torch._dynamo's
counters over its cases: frames compiled, graphs, graph breaks and the reasons of any, so a twin that ran eager
(no graph compiled, or a frame dynamo gave up on, e.g. at its recompile limit, after which that function runs eager
in the process) is named as such. The suite's drawn tests (tools/gpu/families.sh) judge the twins over many more
cases; this gives a verdict for each twin even when the suite's time cap cuts its run short.

No reset between twins: every call of a twin runs through :mod:`numcheck.impls.adapters.compiled_run`, which
raises dynamo's recompile limits for the call (Liger's paired losses share one compiled function, whose default limit
of 8 the earlier twins used up in an H100 run, so ORPO's later cases and all of CPO's and SimPO's ran eager there
while their counters read nothing: results/gpu/h100-torch2.11-torchao-families/fam/twins.txt) and raises where a
chunk ran eagerly anyway; such a case prints RAISED with the reason. Per twin the script prints compiled_run's count
(calls, graphs dynamo compiled during them, calls refused). Last, the two error paths are checked on the first
paired twin: a variant past a recompile limit lowered to 1 must raise naming the limit, and a call with
torch.compile disabled must raise naming the eager chunks.

Usage (repo root, on the device, numcheck installed): NUMCHECK_DEVICE=cuda python3 tools/gpu/compiled_twins.py
CPU check of the measurement (no CUDA): python3 tools/gpu/compiled_twins.py --cpu: the preference twins declared on
the CPU too and torch.compile with the ``eager`` backend (dynamo traces, guards and counts as with inductor; no C++
compile), ~30 s.
"""

from __future__ import annotations

import sys
import time

import torch
from torch._dynamo.utils import counters

from numcheck.properties.core.device import DEVICE

PREFERENCE_CASES = (
    dict(P=4, T=5, H=16, V=40, bias=True, beta=1.5, chunk_pairs=2, ignored=0.3, seed=1),
    dict(P=3, T=6, H=32, V=64, dtype="bfloat16", beta=0.5, ignored=0.3, logit_scale=4.0, seed=2),
    dict(P=2, T=4, H=16, V=24, dtype="float16", beta=2.5, seed=3),
)
DISTILL_CASES = (
    dict(N=19, H=16, V=48, beta=0.5, temperature=2.0, ignored=5, seed=1),
    dict(N=33, H=32, V=64, dtype="bfloat16", beta=0.25, ignored=4, seed=2),
)


def _options(support, fields: dict) -> dict:
    """The preference case's options set where the twin declares them (γ, ε, α, κ)."""
    out = dict(fields)
    for flag, name, value in (
        ("margin", "gamma", 0.7),
        ("label_smoothing", "label_smoothing", 0.2),
        ("nll", "nll_weight", 0.5),
        ("reference_point", "kl", 0.7),
    ):
        if getattr(support, flag):
            out[name] = value
    if not support.chunking:
        out.pop("chunk_pairs", None)
    return out


def _cases(impl):
    """The twin's cases on the suite's device (``NUMCHECK_DEVICE``: cuda on the device), and its family's accuracy
    property."""
    if impl.name.startswith("liger_jsd"):
        from numcheck.properties.linear_distill.cases import DistillCase
        from numcheck.properties.linear_distill.props import PROPERTIES

        return [DistillCase(**f, device=DEVICE) for f in DISTILL_CASES], PROPERTIES["accuracy"]
    from numcheck.properties.linear_preference.cases import PreferenceCase
    from numcheck.properties.linear_preference.props import PROPERTIES

    s = impl.support
    cases = [
        PreferenceCase(**_options(s, f), average_log_prob=max(s.average_log_prob), device=DEVICE)
        for f in PREFERENCE_CASES
    ]
    return cases, PROPERTIES["accuracy"]


def judge(impl) -> bool:
    """Print the twin's verdicts and what torch.compile did; whether every case passed."""
    from numcheck.errors import PropertyFailure
    from numcheck.impls.adapters.compiled_run import STATS

    counters.clear()
    ok, ran = True, False
    cases, accuracy = _cases(impl)
    for case in cases:
        start = time.perf_counter()
        try:
            metrics = accuracy(impl, case) or {}
            ran = True
            line = f"PASS (worst error/bound {max(metrics.values(), default=float('nan')):.3g})"
        except PropertyFailure as exc:
            ok, ran, line = False, True, "FAIL " + " | ".join(ln.strip() for ln in str(exc).splitlines()[:4])
        except Exception as exc:  # noqa: BLE001 - the line says what the twin raised
            ok, line = False, f"RAISED {type(exc).__name__}: {str(exc)[:300]}"
        print(f"  {case!r}: {line} [{time.perf_counter() - start:.1f} s]", flush=True)
    frames, stats = dict(counters["frames"]), dict(counters["stats"])
    breaks = dict(counters["graph_break"])
    print(f"  torch.compile: frames {frames}, graphs {stats.get('unique_graphs', 0)}, graph breaks {breaks or 'none'}")
    print(f"  compiled_run: {dict(STATS[impl.name])} (refused: calls that reached a limit or ran a chunk eagerly)")
    if ran and not stats.get("unique_graphs"):
        print("  ⚠ no graph was compiled: the twin ran eager", flush=True)
        ok = False
    if given_up := frames.get("total", 0) - frames.get("ok", 0):
        print(
            f"  ⚠ dynamo gave up on {given_up} frame(s) (a recompile limit or an error: the log above says which); "
            "that function ran eager from then on",
            flush=True,
        )
        ok = False
    return ok


def _on_cpu(impl):
    """``impl`` declared on the CPU too (the compiled twins declare CUDA alone: inductor's C++ compile of every
    drawn shape costs minutes on a CPU), and torch.compile given the ``eager`` backend, for ``--cpu``."""
    import dataclasses
    import functools

    if not isinstance(torch.compile, functools.partial):
        torch.compile = functools.partial(torch.compile, backend="eager")
    support = dataclasses.replace(impl.support, devices=impl.support.devices | {"cpu"}, requires=None)
    return dataclasses.replace(impl, support=support)


def main(argv: list[str]) -> int:
    from numcheck.impls.adapters import liger_distill, liger_preference

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA'}")
    if argv not in ([], ["--cpu"]):
        print(f"usage: compiled_twins.py [--cpu]; got {argv}")
        return 2
    impls = liger_preference.liger_preference_impls()
    if argv:  # the preference twins (Liger's torch code; the distill twin's JSD needs Triton) on the CPU
        impls = [_on_cpu(i) for i in impls if i.name.endswith("_compiled]")]
    else:
        impls = [*impls, *liger_distill.liger_distill_impls()]
    twins = [i for i in impls if i.name.endswith("_compiled]")]
    failed = []
    for impl in twins:
        print(impl.name, flush=True)
        if why := impl.support.unavailable_reason():
            print(f"  unavailable: {why}")
            failed.append(impl.name)
            continue
        if not judge(impl):
            failed.append(impl.name)
    paired = next((i for i in twins if i.name == "liger_preference[dpo_compiled]"), None)
    paths_ok = paired is None or paired.support.unavailable_reason() or error_paths(paired)
    print(
        f"{len(twins) - len(failed)} of {len(twins)} compiled twins passed every case"
        + (f"; not: {failed}" if failed else "")
        + ("" if paths_ok else "; the error paths did not raise as they must")
    )
    return 1 if failed or not paths_ok else 0


def error_paths(impl) -> bool:
    """A new variant (β = 0.123) past a recompile limit of 1 raises naming the limit; a call with torch.compile
    disabled raises naming the eager chunks. Whether both did."""
    from numcheck.impls.adapters import compiled_run

    cases, accuracy = _cases(impl)
    limit = next(n for n in ("recompile_limit", "cache_size_limit") if hasattr(torch._dynamo.config, n))
    checks = (
        ("limit", dict(RECOMPILE_LIMIT=1), {limit: 1}, "torch.compile reached"),
        ("disabled", {}, {"disable": True}, "ran eagerly"),
    )
    ok = True
    for what, module, config, expect in checks:
        saved = {k: getattr(compiled_run, k) for k in module}
        try:
            for k, v in module.items():
                setattr(compiled_run, k, v)
            with torch._dynamo.config.patch(config):
                accuracy(impl, cases[0].replace(beta=0.123))
            line, good = "no error: the twin was judged though it did not run compiled", False
        except RuntimeError as exc:
            line, good = f"raised: {str(exc)[:240]}", str(exc).startswith(f"{impl.name}: ") and expect in str(exc)
        except Exception as exc:  # noqa: BLE001 - the line says what came instead
            line, good = f"raised {type(exc).__name__} instead: {str(exc)[:240]}", expect in str(exc)
        finally:
            for k, v in saved.items():
                setattr(compiled_run, k, v)
        print(f"error path ({what}): {'OK' if good else 'WRONG'}, {line}", flush=True)
        ok &= good
    return ok


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
