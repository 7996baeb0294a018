"""The distributed (vocabulary-parallel) impls numcheck knows, built-in and third-party adapters, listed apart from
:mod:`numcheck.impls.registry` (whose protocol check knows the single-device kinds): the distributed suite
(numcheck/tests/suite/test_distributed.py), ``numcheck list`` and the repro command read this list. Megatron's fused variant is not listed: on CPU its float32 grad_x differs from the oracle by
~1e-3 relative even without options (seen at P = 1, 2, 4), which is not yet explained (adapter or release)."""

from __future__ import annotations

from typing import Any

from numcheck.impls.megatron import megatron_impls
from numcheck.impls.vocab_parallel import vocab_parallel_impls


def dist_impls() -> list[Any]:
    """Every distributed impl, built-in first."""
    return [*vocab_parallel_impls(), *(m for m in megatron_impls() if not m.fused)]
