"""Whether ``torch.utils.deterministic.fill_uninitialized_memory`` fills what ``torch.empty`` and its kin return on
this torch and device, under ``torch.use_deterministic_algorithms(True, warn_only=True)`` (numcheck's
:func:`numcheck.properties.core.poison.filled`), and what they hold without it: leftovers for small allocations, and
zeros for a 64 MiB one (glibc maps any request above its mmap threshold, at most 32 MiB, as fresh pages the OS
zeroes). Run: ``PYTHONPATH=. python docs/evidence/poison_probe.py [cpu|cuda]`` (output: ``poison_probe.txt``).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from numcheck.properties.core.poison import filled

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
BIG = (64 << 20) // 4  # float32 elements in 64 MiB


def _allocations() -> dict[str, Callable[[], torch.Tensor]]:
    d = DEVICE
    return {
        "empty float32": lambda: torch.empty(4, 3, device=d),
        "empty bfloat16": lambda: torch.empty(4, 3, dtype=torch.bfloat16, device=d),
        "empty float8_e4m3fn (bytes)": lambda: torch.empty(6, dtype=torch.float8_e4m3fn, device=d).view(torch.uint8),
        "empty int64": lambda: torch.empty(3, dtype=torch.int64, device=d),
        "empty_like": lambda: torch.empty_like(torch.ones(5, device=d)),
        "new_empty": lambda: torch.ones(2, device=d).new_empty(5),
        "empty_strided": lambda: torch.empty_strided((3, 2), (1, 3), device=d),
        "resize_": lambda: torch.zeros(0, device=d).resize_(5),
        "empty 64 MiB float32 (all zero?)": lambda: torch.empty(BIG, device=d),
    }


def _describe(name: str, t: torch.Tensor) -> str:
    if name.endswith("(all zero?)"):
        nan = int(t.isnan().sum())
        return f"all zero: {bool((t == 0).all())}, NaN elements: {nan} of {t.numel()}"
    flat = t.reshape(-1)
    return f"{flat[:5].tolist()}"


def main() -> None:
    print(f"torch {torch.__version__}, device {DEVICE}")
    for label, ctx in (("without poisoning", None), ("inside poison.filled()", filled)):
        print(f"\n{label}:")
        for name, make in _allocations().items():
            if ctx is None:
                t = make()
            else:
                with ctx():
                    t = make()
            print(f"  {name:36s} {_describe(name, t)}")
    print(f"\nafter the block: deterministic algorithms {torch.are_deterministic_algorithms_enabled()}")


if __name__ == "__main__":
    main()
