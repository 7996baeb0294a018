"""Probe: Triton's frontend drops a loop-carried name whose in-loop value is another carried name's entry value.

In ``prev = s; for i in range(n): store(prev); prev = s; s += 1`` Python gives 0, 0, 1, 2, ..., and so does
``TRITON_INTERPRET=1``. The compiled kernel stores 0 every time: the frontend finds a loop's carried names by
comparing each name's value after a dry run of the body with its value before, and after ``prev = s`` the two are
the same value (``s`` on entry), so ``prev`` is not carried and every use reads its value before the loop.

This is what hung the ping-pong kernel of split_gluon.py (runs Y, Z, AB): its consumer freed ring slots through
``prev_slot = slot``, so every free went to the tile's first slot and the producer waited forever on the others.
The suite's CPU tier runs Triton kernels under the interpreter, which cannot show this class of bug; only a
compiled run can (the GPU tier).

    python -m reports.probes.triton_carry      # on CPU: the compiled IR for sm_90; on CUDA: also the values
"""
from __future__ import annotations

import os
import subprocess
import sys

import torch
import triton
import triton.language as tl

N = 6


@triton.jit
def carry_kernel(out, n: tl.constexpr):  # constexpr: Triton 3.6's interpreter cannot range() over an i32 arg
    """Stores, at step i, the value ``s`` had at step i-1 (0 at step 0)."""
    s = 0
    prev = s
    for i in range(n):
        tl.store(out + i, prev)
        prev = s
        s += 1


def python_values(n: int = N) -> list[int]:
    """What Python (and the interpreter) give."""
    return [max(i - 1, 0) for i in range(n)]


def run_values(device: str) -> list[int]:
    """The kernel's stores on ``device`` (on CPU only under ``TRITON_INTERPRET=1``)."""
    out = torch.full((N,), -1, dtype=torch.int32, device=device)
    carry_kernel[(1,)](out, N)
    return out.tolist()


def compiled_store_operands() -> list[str]:
    """The value each ``tt.store`` of the kernel compiled for sm_90 stores (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = triton.compile(ASTSource(carry_kernel, {"out": "*i32", "n": "constexpr"}, {"n": N}), target=GPUTarget("cuda", 90, 32))
    return [line.split("tt.store")[1].split(":")[0].strip() for line in k.asm["ttir"].splitlines() if "tt.store" in line]


def main() -> int:
    """Print Python's values, the interpreter's, the compiled IR's stored operand and, on CUDA, the compiled values.
    Exit 1 when the compiled values differ from Python's (the miscompile is present)."""
    if "--interpreted" in sys.argv:
        print(run_values("cpu"))
        return 0
    print(f"triton {triton.__version__}, torch {torch.__version__}")
    print(f"python:      {python_values()}")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "reports.probes.triton_carry", "--interpreted"], env=env,
                         capture_output=True, text=True)
    tail = (out.stdout if out.returncode == 0 else out.stderr).strip().splitlines()[-1:]
    print(f"interpreter: {tail[0] if out.returncode == 0 else f'did not run (exit {out.returncode}: {tail})'}")
    print(f"compiled (sm_90) stores: {compiled_store_operands()}  (a constant: the value before the loop)")
    if torch.cuda.is_available():
        got = run_values("cuda")
        print(f"compiled on {torch.cuda.get_device_name()}: {got}")
        return int(got != python_values())
    return 0


if __name__ == "__main__":
    sys.exit(main())
