"""Evidence that the suite's ``strided_inputs`` property catches Liger-Kernel's transposed-weight bug on every
release that has it and passes on the release that fixed it.

The bug: with the weight stored transposed (an lm_head kept as [H, V], passed as its ``.t()``) and an upstream
gradient other than 1, grad_weight comes back wrong (0.2.1 through 0.8.2; fixed in 0.8.5). For each release the
script runs, in a fresh process with that release first on ``PYTHONPATH`` (after this checkout), the suite's
``strided_inputs`` property (:func:`numcheck.properties.linear_ce.props.strided_inputs`) on one problem with a scalar
upstream gradient, and on the same problem with upstream 1 as the control, for every Liger variant the release
offers, and prints the verdict with the worst error/bound. ``liger_releases.txt`` beside this file is its output
on CPU (Triton interpreter, torch 2.13).

Usage: python docs/evidence/liger_releases.py [DIR ...]
  each DIR a folder holding one release (``pip install --no-deps --target DIR liger_kernel-X.whl``); the
  literal ``installed`` runs the release installed in this environment. liger-kernel 0.2.1's wheel has no
  liger_kernel/__init__.py (a namespace package), which a regular package later on the path shadows: give its
  folder an empty liger_kernel/__init__.py to run it (the adapter names the release whose files it imported).

The first line printed names the numcheck code the rows are judged by: the content hash of the adapter's module and
its known-divergence module (:data:`ADAPTER_CODE`; contents only, so a move leaves it alone). A CI test
(``tests/self/test_ci_evidence.py``) fails when the committed table's hash differs from the checkout's: rerun this
script then and commit its output as ``liger_releases.txt``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _releases import adapter_code_hash, per_release_main  # noqa: E402 - the release tables' shared mechanics

#: The numcheck code a row is judged by: the adapter, the known-divergence module keyed on Liger's release, and the
#: emulation of a kernel's store its z-loss predicate uses (``kernel_store``).
ADAPTER_CODE = ("impls/adapters/liger.py", "properties/linear_ce/known_liger.py", "properties/core/tensors.py")
PROBLEM = "Problem(N=11, H=16, V=37, upstream={!r}, seed=4)"


def header(folders: list[str]) -> str:
    """The table's first line: the folders judged and the numcheck code the rows are judged by."""
    return (
        f"# python docs/evidence/liger_releases.py {' '.join(folders)}   (adapter code "
        f"{adapter_code_hash(ADAPTER_CODE)}: {', '.join(ADAPTER_CODE)})"
    )


def release_line() -> str:
    """The release the adapter imported, and its note when other releases are on the path."""
    from numcheck.impls.adapters import liger

    info = liger.load()
    if isinstance(info, str):
        return f"liger unusable here: {info}"
    return f"liger-kernel {info.version}" + (f" ({info.release_note})" if info.release_note else "")


def verdict(check, impl, p) -> str:
    """``PASS (error/bound r)`` or ``FAIL (worst error/bound r, output)`` of one property on one problem."""
    try:
        metrics = check(impl, p)
    except AssertionError as exc:
        ratios = [
            (float(r), out)
            for out, r in re.findall(r"\(a\) analytic bound: (\w+).*?error/bound ([\d.e+-]+)\)", str(exc))
        ]
        worst = max(ratios, default=(float("nan"), "?"))
        return f"FAIL (worst error/bound {worst[0]:.3g}, {worst[1]})"
    return f"PASS (error/bound {metrics.get('error/bound', float('nan')):.3g})"


def here() -> None:
    from numcheck.impls import interpreter

    interpreter.arrange()
    from numcheck.impls.adapters import liger
    from numcheck.impls.registry import builtin
    from numcheck.properties.linear_ce import props
    from numcheck.properties.linear_ce.cases import Problem

    print(release_line())
    for name in liger.VARIANTS:
        impl = builtin(name)
        if why := impl.support.unavailable_reason():
            print(f"  {name}: unavailable ({why})")
            continue
        for upstream in ("scalar", "one"):
            p = eval(PROBLEM.format(upstream), {"Problem": Problem})  # noqa: S307 - our own literal
            print(
                f"  {name} strided_inputs {PROBLEM.format(upstream)}: {verdict(props.strided_inputs, impl, p)}",
                flush=True,
            )


if __name__ == "__main__":
    per_release_main(__file__, here, header)
