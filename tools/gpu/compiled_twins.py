"""Liger-Kernel's chunked losses as Liger runs them by default (``compiled=True``: ``torch.compile`` of each chunk's
forward and backward), judged on CUDA on a few fixed cases each, with what torch.compile did for them.

For every ``_compiled`` twin registered (``liger_preference[<loss>_compiled]``, ``liger_jsd[chunked_compiled]``) it
runs the family's ``accuracy`` property on the cases below (their shapes differ, so the twin compiles more than
once), and prints per case the verdict, the worst error/bound and the seconds, then per twin torch._dynamo's
counters over its cases: frames compiled, graphs, graph breaks and the reasons of any, so a twin that ran eager
(no graph compiled, or a frame dynamo gave up on, e.g. at its recompile limit, after which that function runs eager
in the process) is named as such. The suite's drawn tests (tools/gpu/families.sh) judge the twins over many more
cases; this gives a verdict for each twin even when the suite's time cap cuts its run short.

Each twin starts from a reset dynamo (``torch._dynamo.reset()``), as in a process of its own: Liger's paired losses
(DPO, robust DPO, ORPO, CPO, SimPO) share one code object (``fused_fwd_bwd`` of
``chunked_loss/fused_linear_preference.py``), whose recompile limit (8) the earlier twins used up in an H100 run
without it, so ORPO's later cases and all of CPO's and SimPO's ran eager there, while their counters read nothing
(results/gpu/h100-torch2.11-torchao-families/fam/twins.txt).

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

    torch._dynamo.reset()  # a process of its own: no graphs, guards or recompile counts of an earlier twin
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
    print(
        f"{len(twins) - len(failed)} of {len(twins)} compiled twins passed every case"
        + (f"; not: {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
