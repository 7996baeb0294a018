"""Re-judge the CUDA false alarms  for numcheck's three Triton impls, printing error/bound per output.

Run from the repository root: ``PYTHONPATH=. python docs/evidence/cuda_false_alarms.py``. On a CUDA machine the
kernels run compiled (the cases of the issue: H200, torch 2.11, triton 3.6); without CUDA they run under
Triton's interpreter on CPU, where the cases show what the CPU declaration gives. Exit status 1 when any
judgement fails.
"""

from __future__ import annotations

import sys

from numcheck.impls.interpreter import arrange

arrange()  # before anything imports triton: the interpreter on a machine without CUDA

import torch  # noqa: E402

from numcheck.impls.registry import builtin  # noqa: E402
from numcheck.properties.linear_ce.accuracy import check_accuracy  # noqa: E402
from numcheck.properties.linear_ce.cases import Problem  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = ("chunked_triton", "chunked_triton[split_fp32]", "recompute_triton[split_fp32]")
#: (a) grad_weight/grad_bias at error/bound 1.02; (b) judgement (b) RMSE 5.5e-09 against 5.49e-09.
CASES = (
    Problem(N=7, H=1, V=129, dtype="float32", bias=True, softcap=1.0, regime="confident", seed=73, device=DEVICE),
    Problem(N=1, H=1, V=1025, dtype="float32", softcap=5.0, regime="large", seed=0, device=DEVICE),
)


def main() -> int:
    """Print one line per (case, impl, output): analytic error/bound and judgement (b)."""
    print(
        f"device: {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu (Triton interpreter)'}; "
        f"torch {torch.__version__}"
    )
    failed = 0
    for p in CASES:
        for name in IMPLS:
            impl = builtin(name)
            print(f"\n{p!r}\n  {name}: elementary_error {impl.support.elementary_error}")
            res = check_accuracy(impl, p)
            for out, c in res.analytic.items():
                rel = res.relative.get(out)
                b = (
                    (
                        f"(b) RMSE {rel.rmse_impl:.3g} / allowed {rel.allowed:.3g} = "
                        f"{rel.rmse_impl / rel.allowed if rel.allowed else float('nan'):.3g}"
                        f"{'' if rel.judged else ' (not judged)'}"
                    )
                    if rel is not None
                    else "(b) -"
                )
                print(
                    f"    {out:12s} (a) error/bound {c.ratio:.4g}   {b}   {'ok' if c.ok and (rel is None or rel.ok) else 'FAIL'}"
                )
            failed += not res.ok
    print(f"\n{failed} failing (case, impl) pairs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
