"""Chunked linear+CE impls declared as the README tells a user to (``numcheck.linear_ce_impl`` on module-level
functions), each declaring ``grad_accumulation="per_chunk_rounding"`` at 7 or 64 rows per chunk: the honest ones run
the chunked built-in's per-chunk path (each chunk's grad_W product rounded to the operands' dtype, then added in
fp32); the defective ones keep grad_W's running sum in the parameter dtype, rounded after every chunk (the built-in
``lowp_accum`` step), which the declaration does not allow. The self tests of judgement (b)'s declared-path
yardstick run them."""

from __future__ import annotations

import numcheck
from numcheck.impls.builtin.chunked import ChunkedLinearCE
from numcheck.impls.protocols.linear_ce import LinearCESupport

_INNER = {
    (path, rows): ChunkedLinearCE(
        f"inner[{path},{rows}]",
        path=path,
        chunk_rows=rows,
        support=LinearCESupport(returns_z_loss=False, all_ignored="nan"),
    )
    for path in ("fallback", "lowp_accum")
    for rows in (7, 64)
}

_DECLARED = dict(
    dtypes=("float32", "bfloat16", "float16"),
    autocast=(),
    all_ignored="nan",
    options=("bias", "ignore_index", "label_smoothing", "class_weights", "softcap", "z_loss"),
    grad_accumulation="per_chunk_rounding",
)


def _call(path: str, rows: int, x, weight, target, bias, options):  # noqa: ANN001 - the protocol's tensors
    loss, _ = _INNER[(path, rows)](x, weight, target, bias, **options)
    return loss


@numcheck.linear_ce_impl(name="per_chunk_7", chunk_rows=7, **_DECLARED)
def per_chunk_7(x, weight, target, bias=None, **options):
    """Each 7-row chunk's grad_W product rounded once, added in fp32 (what it declares)."""
    return _call("fallback", 7, x, weight, target, bias, options)


@numcheck.linear_ce_impl(name="per_chunk_64", chunk_rows=64, **_DECLARED)
def per_chunk_64(x, weight, target, bias=None, **options):
    """Each 64-row chunk's grad_W product rounded once, added in fp32 (what it declares)."""
    return _call("fallback", 64, x, weight, target, bias, options)


@numcheck.linear_ce_impl(name="running_sum_7_declared_per_chunk", chunk_rows=7, **_DECLARED)
def running_sum_7(x, weight, target, bias=None, **options):
    """grad_W's running sum rounded to the parameter dtype after every 7-row chunk (declares per-chunk rounding)."""
    return _call("lowp_accum", 7, x, weight, target, bias, options)


@numcheck.linear_ce_impl(name="running_sum_64_declared_per_chunk", chunk_rows=64, **_DECLARED)
def running_sum_64(x, weight, target, bias=None, **options):
    """grad_W's running sum rounded to the parameter dtype after every 64-row chunk (declares per-chunk rounding)."""
    return _call("lowp_accum", 64, x, weight, target, bias, options)
