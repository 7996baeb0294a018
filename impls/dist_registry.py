"""The distributed (vocabulary-parallel) impls numcheck knows, built-in and third-party adapters, listed apart from
:mod:`numcheck.impls.registry` (whose protocol check knows the single-device kinds): the distributed suite
(numcheck/tests/suite/test_distributed.py), ``numcheck list`` and the repro command read this list. Megatron's
fused variant's bf16 gradient of fp32 logits is a known divergence of the release
(:data:`numcheck.properties.dist_known.OUTPUT_KNOWN`)."""

from __future__ import annotations

from typing import Any

from numcheck.impls.megatron import megatron_impls
from numcheck.impls.vocab_parallel import vocab_parallel_impls


def dist_impls() -> list[Any]:
    """Every distributed impl, built-in first."""
    return [*vocab_parallel_impls(), *megatron_impls()]
