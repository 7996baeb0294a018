"""Every Liger-Kernel release with the fused linear JSD judged by the linear-distill suite's properties.

For each release the script runs, in a fresh process with that release first on ``PYTHONPATH`` (after this
checkout), a fixed set of (property, case) pairs of :mod:`numcheck.properties.linear_distill.props` — accuracy at
β inside (0, 1) and at both endpoints in fp32, bf16 and fp16, with T ≠ 1 and ignored rows, chunk invariance, ignored
rows changing nothing, the temperature's scaling and the frozen teacher — on both adapters
(:mod:`numcheck.impls.adapters.liger_distill`), and prints each verdict with its error/bound. A release the adapter
cannot use here (no such loss, a signature it cannot fill, an import that fails under the CPU's Triton) is a row
with its reason. ``liger_distill_releases.txt`` beside this file is its output on CPU (Triton interpreter, torch
2.13). Liger added ``LigerFusedLinearJSD`` in 0.4 and the chunked ``LigerFusedLinearJSDLoss`` in 0.5; the table
takes the last release of each minor series (0.4.2, 0.5.8, 0.6.4, 0.7.0, 0.8.2) and the installed one (0.8.5).

Usage: python docs/evidence/liger_distill_releases.py [DIR ...]
  each DIR a folder holding one release (``pip install --no-deps --target DIR liger-kernel==X``); the literal
  ``installed`` runs the release installed in this environment. liger-kernel 0.4.2's wheel has no
  liger_kernel/__init__.py (a namespace package), which the installed regular package shadows: its folder gets an
  empty liger_kernel/__init__.py (the first line of each row names the release the adapter imported).

The first line printed names the numcheck code the rows are judged by: the content hash of the adapter's module
and its known divergences (:data:`ADAPTER_CODE`); ``tests/self/test_ci_evidence.py`` fails when the committed table's hash differs from the
checkout's: rerun this script then and commit its output as ``liger_distill_releases.txt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _releases import adapter_code_hash, failure_figures, per_release_main  # noqa: E402 - the release tables' shared mechanics

#: The numcheck code a row is judged by: the adapter and its known-divergence module.
ADAPTER_CODE = ("impls/adapters/liger_distill.py", "properties/linear_distill/known_liger.py")
#: (property, case) pairs, the cases as ``DistillCase`` keyword arguments.
CHECKS: tuple[tuple[str, dict], ...] = (
    ("accuracy", dict(N=19, H=16, V=48, beta=0.5, temperature=2.0, ignored=5, seed=1)),
    ("accuracy", dict(N=19, H=16, V=48, dtype="bfloat16", beta=0.0, seed=2)),  # an endpoint: where declared
    ("accuracy", dict(N=19, H=16, V=48, dtype="float16", beta=1.0, temperature=0.7, ignored=3, seed=3)),
    ("chunk_invariance", dict(N=33, H=4, V=40, beta=0.25, ignored=4, seed=4)),
    ("ignored_rows_change_nothing", dict(N=12, H=8, V=24, ignored=5, seed=5)),
    ("temperature_scaling", dict(N=12, H=8, V=24, beta=0.7, seed=6)),
    ("teacher_frozen", dict(N=12, H=8, V=24, seed=7)),
)


def header(folders: list[str]) -> str:
    """The table's first line: the release folders judged (by name), the numcheck code the rows are judged by and
    the installed release."""
    from importlib import metadata

    names = " ".join(Path(f).name for f in folders)
    return (
        f"# python docs/evidence/liger_distill_releases.py {names}   (adapter code "
        f"{adapter_code_hash(ADAPTER_CODE)}: {', '.join(ADAPTER_CODE)}; run from DIR, each release folder "
        f"made by pip install --no-deps --target DIR/X liger-kernel==X; CPU, Triton interpreter; 'installed' = "
        f"{metadata.version('liger-kernel')})\n"
        "# A FAIL row's error/bound is the largest of its outputs', named, then each failing output's own and worst "
        "element; where the oracle is exactly 0 (an ignored row's gradient) the bound is only the dtype's underflow "
        "floor (fp32 2^-126, fp16 2^-25), so error/bound there is |error| over that floor (1e+35 for an fp32 error "
        "of 2e-3): the row says so, and the other outputs' figures count bounds."
    )


def verdict(check, impl, case) -> str:
    """``PASS (worst error/bound r)``, ``FAIL (error/bound r of <output>: each failing output's figure)``
    (:func:`failure_figures`) or ``RAISED (...)`` of one pair."""
    from numcheck.errors import PropertyFailure

    try:
        metrics = check(impl, case) or {}
    except PropertyFailure as exc:
        return f"FAIL ({failure_figures(exc, exc.ratio)})"
    except Exception as exc:  # noqa: BLE001 - a row says what the release raised
        return f"RAISED ({type(exc).__name__}: {str(exc)[:160]})"
    worst = max(metrics.values(), default=float("nan"))
    return f"PASS (worst error/bound {worst:.3g})" if metrics else "PASS"


def here() -> None:
    from numcheck.impls import interpreter

    interpreter.arrange()
    import torch

    from numcheck.impls.adapters import liger, liger_distill
    from numcheck.properties.linear_distill.cases import DistillCase
    from numcheck.properties.linear_distill.known_liger import known
    from numcheck.properties.linear_distill.props import PROPERTIES

    torch.set_num_threads(1)
    info = liger.load()
    print(f"liger-kernel {info.version}" if not isinstance(info, str) else f"liger unusable here: {info}")
    for impl in liger_distill.liger_distill_impls():
        if why := impl.support.unavailable_reason():
            print(f"  {impl.name}: unavailable ({why})")
            continue
        for prop, fields in CHECKS:
            case = DistillCase(**fields)
            if why := impl.support.refuses(dtype=case.torch_dtype, device="cpu", options=case.options, beta=case.beta):
                print(f"  {impl.name} {prop} {case.short()} {case.dtype}: not declared ({why})", flush=True)
                continue
            line = verdict(PROPERTIES[prop], impl, case)
            entry = known(impl.name, prop, case)
            if entry is not None and line.startswith("FAIL"):
                line += f" — known divergence of {entry.releases.describe()}: {entry.summary}"
            print(f"  {impl.name} {prop} {case.short()} {case.dtype}: {line}", flush=True)


if __name__ == "__main__":
    per_release_main(__file__, here, header)
