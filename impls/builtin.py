"""The built-in impls: one factory per module that defines some, in the order they are listed.

A factory is a zero-argument function returning that module's impls; :func:`impls.registry.builtin_impls`
calls each one when the built-ins are asked for. Add a module's factory here when it defines built-in impls:
this list is the only place that names them, and the impl modules import nothing from the registry.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from numcheck.impls.cce import cce_impls
from numcheck.impls.dist_registry import dist_impls
from numcheck.impls.chunked import chunked_impls, recompute_impls
from numcheck.impls.eager import eager_impls
from numcheck.impls.liger import liger_impls
from numcheck.impls.quant_linear import quant_linear_impls
from numcheck.impls.torch_native import torch_native_impls
from numcheck.impls.tp_fp8_linear import tp_fp8_linear_impls
from numcheck.impls.triton_ce import triton_impls

#: Every built-in factory, in listing order (linear+CE impls first, then the quantized linear ones, then the
#: distributed ones: vocabulary-parallel linear+CE and tensor-parallel FP8 linear).
FACTORIES: tuple[Callable[[], Iterable[Any]], ...] = (
    eager_impls, liger_impls, cce_impls, chunked_impls, recompute_impls, torch_native_impls, triton_impls,
    quant_linear_impls, dist_impls, tp_fp8_linear_impls,
)
