"""Which declared behaviours of an impl the report's grid reached: the behaviours the suite would draw for it
(each declared option, reduction, dtype, autocast dtype, an all-ignored batch, more than one declared chunk; for a
distributed impl each declared world size and uneven shards; for FP8 linears each recipe, parallel mode and the
declared flags) that no case the grid runs for it has. ``report.json`` records them per impl (``unreached``),
``report.md`` lists them, and premerge names them when the suite fails where the report passed.

A behaviour counts as reached when a case having it was run for the impl, whatever its verdict. Each family names
its kind's behaviours (``behaviours`` of its :class:`~reports.report.families.family.ReportFamily`, one of the
functions here or its own).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from numcheck.impls.protocols.linear_ce import LINEAR_CE_OPTIONS, REDUCTIONS

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _dtypes(dtypes: Iterable[torch.dtype]) -> list[str]:
    return [name for d, name in _DTYPE_NAMES.items() if d in set(dtypes)]


Behaviour = tuple[str, Callable[[Any], bool]]


def linear_ce_behaviours(impl: Any) -> list[Behaviour]:
    """A linear+CE impl's declared behaviours."""
    support = impl.support
    out: list[Behaviour] = [
        (f"option {o}", lambda p, o=o: o in p.features) for o in LINEAR_CE_OPTIONS if o in support.options
    ]
    out += [(f"reduction {r}", lambda p, r=r: p.reduction == r) for r in REDUCTIONS if r in support.reductions]
    out += [(f"dtype {d}", lambda p, d=d: p.dtype == d and p.autocast is None) for d in _dtypes(support.dtypes)]
    out += [(f"autocast {d}", lambda p, d=d: p.autocast == d) for d in _dtypes(support.autocast)]
    if support.all_ignored is not None and "ignore_index" in support.options:
        out.append(("an all-ignored batch", lambda p: p.all_ignored))
    if getattr(support, "chunk_rows", None):
        out.append((f"more than one chunk of chunk_rows={support.chunk_rows} rows", lambda p: p.N > support.chunk_rows))
    if getattr(support, "chunk_cols", None):
        out.append(
            (f"more than one chunk of chunk_cols={support.chunk_cols} classes", lambda p: p.V > support.chunk_cols)
        )
    return out


def dist_behaviours(impl: Any) -> list[Behaviour]:
    """A distributed linear+CE impl's declared behaviours."""
    s, d = impl.support, impl.dist
    out: list[Behaviour] = [
        (f"option {o}", lambda c, o=o: o in c.problem.features) for o in LINEAR_CE_OPTIONS if o in s.options
    ]
    out += [(f"reduction {r}", lambda c, r=r: c.problem.reduction == r) for r in REDUCTIONS if r in s.reductions]
    out += [(f"dtype {n}", lambda c, n=n: c.problem.dtype == n) for n in _dtypes(s.dtypes)]
    out += [(f"world size {P}", lambda c, P=P: c.world_size == P) for P in d.world_sizes]
    if d.uneven_vocab:
        out += [
            (f"uneven vocabulary shards at world size {P}", lambda c, P=P: c.world_size == P and c.problem.V % P != 0)
            for P in d.world_sizes
            if P > 1
        ]
    return out


def _quant(support: Any, tp: bool) -> list[Behaviour]:
    out: list[Behaviour] = [(f"recipe {r.name}", lambda c, r=r: c.recipe == r) for r in support.recipes]
    out += [(f"dtype {n}", lambda c, n=n: c.dtype == n) for n in _dtypes(support.dtypes)]
    if support.bias:
        out.append(("bias", lambda c: bool(c.bias)))
    if True in support.save_original_input:
        out.append(("save_original_input=True", lambda c: bool(c.save_original_input)))
    if tp:
        out += [(f"{m}-parallel", lambda c, m=m: c.parallel == m) for m in sorted(support.parallel)]
        if True in support.sequence_parallel:
            out.append(("sequence parallel", lambda c: bool(c.sequence_parallel)))
        out += [(f"world size {P}", lambda c, P=P: c.world == P) for P in support.world_sizes]
    return out


def fp8_behaviours(impl: Any) -> list[Behaviour]:
    """A single-device FP8 linear's declared behaviours (single or grouped)."""
    return _quant(impl.support, tp=False)


def tp_fp8_behaviours(impl: Any) -> list[Behaviour]:
    """A tensor-parallel FP8 linear's declared behaviours."""
    return _quant(impl.support, tp=True)


def unreached(behaviours: list[Behaviour], cases: Iterable[Any]) -> list[str]:
    """The declared ``behaviours`` of an impl (description, predicate on a case of its kind; its family's
    ``behaviours``) that none of ``cases`` (the grid cases run for it) has, in declaration order."""
    cases = list(cases)
    return [name for name, has in behaviours if not any(_holds(has, c) for c in cases)]


def _holds(has: Any, case: Any) -> bool:
    """``has(case)``; False for a case of another shape than the kind's own (a property case of the quantizer's
    :class:`~properties.fp8.cases.QuantizerCase`, which has no layer fields)."""
    try:
        return bool(has(case))
    except AttributeError:
        return False
