"""Pairwise covering designs for small example budgets: the rows a property runs before its random draws.

A slow impl gets a handful of random examples per property in the ci profile; three random draws over upstream ×
reduction × dtype × options leave most pairs of values untried (a transposed weight with a scalar upstream
gradient, Liger 0.2.1–0.8.2's grad_weight bug, never came in three draws on 0.5.8 and 0.7.0). So each property
names the dimensions it varies (:data:`DIMENSIONS`), and :func:`covering_rows` builds, per impl, a pairwise
covering design (allpairspy) over the values its declaration admits: every pair of values of any two dimensions
appears in some row, under the constraints of :class:`~numcheck.properties.linear_ce.cases.Problem` (``per_row`` only
with ``none``, a loss scale only under AMP fp16 ``mean`` without a softcap, excluded option pairs). A row pins
some :class:`Problem` fields (``force``) and turns some options on (``require``); every other field (shapes,
seed, option values, the regime unless the property names ``regime``) is drawn as usual, from hypothesis' engine seeded per (property, impl, row)
(:func:`numcheck.properties.core.rows.seeded_data`). The design is a function of the declaration and the device only: the same rows in every
scope, process and xdist worker.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from allpairspy import AllPairs

from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.linear_ce import LINEAR_CE_OPTIONS
from numcheck.properties.core.rows import Row
from numcheck.properties.linear_ce.cases import HEAD_REGIME, REGIMES

_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# -- the dimensions: values a support admits, and the fields each value pins ------------------------------
def _precisions(support: Any, device: str) -> list[str]:
    """The plain dtypes and AMP modes the support declares and the device runs (as ``problems`` draws them)."""
    dev = torch.device(device).type
    plain = [_NAMES[d] for d in (torch.float32, torch.bfloat16, torch.float16) if d in support.dtypes]
    amp = [
        f"amp:{_NAMES[d]}"
        for d in (torch.bfloat16, torch.float16)
        if d in support.autocast and torch.float32 in support.dtypes and capabilities.autocast_dtype(dev, d)
    ]
    return plain + amp


def _plain_dtypes(support: Any, device: str) -> list[str]:
    """The plain dtypes the support declares (no AMP mode)."""
    return [_NAMES[d] for d in (torch.float32, torch.bfloat16, torch.float16) if d in support.dtypes]


def _low_precisions(support: Any, device: str) -> list[str]:
    """The precisions whose compute dtype is bf16 or fp16 (plain or AMP) that the support declares and the device
    runs: where a sum kept in the compute dtype rounds."""
    return [v for v in _precisions(support, device) if v != "float32"]


def _precision_fields(value: str) -> tuple[dict[str, Any], frozenset[str]]:
    if value.startswith("amp:"):
        return {"dtype": "float32", "autocast": value[4:]}, frozenset()
    return {"dtype": value, "autocast": None}, frozenset()


def _upstreams(support: Any, device: str) -> list[str]:
    ups = ["one"]
    if {"mean", "sum"} & set(support.reductions):
        ups.append("scalar")
    if "none" in support.reductions:
        ups.append("per_row")
    if "amp:float16" in _precisions(support, device) and "mean" in support.reductions:
        ups.append("loss_scale")
    return ups


#: Off values of each option, as ``problems(force=...)`` pins them.
_OFF: dict[str, dict[str, Any]] = {
    "bias": {"bias": False},
    "ignore_index": {"ignored": 0.0},
    "label_smoothing": {"label_smoothing": 0.0},
    "class_weights": {"class_weights": False},
    "softcap": {"softcap": None},
    "z_loss": {"z_loss_scale": 0.0},
}
assert set(_OFF) == set(LINEAR_CE_OPTIONS), "every linear+CE option needs its off value here"


def _option_fields(option: str) -> Callable[[str], tuple[dict[str, Any], frozenset[str]]]:
    def fields(value: str) -> tuple[dict[str, Any], frozenset[str]]:
        return ({}, frozenset({option})) if value == "on" else (dict(_OFF[option]), frozenset())

    return fields


#: The precisions of the ``head`` dimension's rows, where declared: a bf16 running sum over a tokenizer's
#: vocabulary (≥ 1000 blocks of 128 classes) stagnates after ~2/u = 256–512 of them; an fp16 one only after
#: 2048–4096 (V past 2^18–2^19), an fp32 one never, and under AMP a vocabulary-chunked grad_x may round each chunk's
#: partial by its declaration (tolerance.error_model). A head row elsewhere would cost a V ≈ 10^5 example and
#: show no narrow sum.
HEAD_PRECISIONS: tuple[str, ...] = ("bfloat16",)


def _head_values(support: Any, device: str) -> list[str]:
    """``off`` (a plain draw: a dimension of one value is left out of a design) and each declared precision
    of :data:`HEAD_PRECISIONS`."""
    return ["off", *(v for v in _precisions(support, device) if v in HEAD_PRECISIONS)]


def _head_fields(value: str) -> tuple[dict[str, Any], frozenset[str]]:
    """``off``: nothing pinned; a precision: that precision with the :data:`HEAD_REGIME` regime."""
    if value == "off":
        return {}, frozenset()
    force, require = _precision_fields(value)
    return {**force, "regime": HEAD_REGIME}, require


@dataclass(frozen=True)
class Dimension:
    """A dimension of a design: its values for a support on a device, and the fields one value pins."""

    values: Callable[[Any, str], list[str]]
    fields: Callable[[str], tuple[dict[str, Any], frozenset[str]]]


#: Every dimension a property can name: ``precision`` (plain dtype or AMP mode), ``reduction``, ``upstream``
#: and each option of :data:`LINEAR_CE_OPTIONS` (on/off where declared).
DIMENSIONS: dict[str, Dimension] = {
    "precision": Dimension(_precisions, _precision_fields),
    # Parts of ``precision``: the plain dtypes (for draws that keep autocast off: many_chunks), and the modes
    # whose compute dtype is bf16 or fp16 (long_batch: a sum kept in the compute dtype).
    "dtype": Dimension(_plain_dtypes, _precision_fields),
    "low_precision": Dimension(_low_precisions, _precision_fields),
    "reduction": Dimension(
        lambda s, d: [r for r in ("mean", "sum", "none") if r in s.reductions],
        lambda v: ({"reduction": v}, frozenset()),
    ),
    "upstream": Dimension(_upstreams, lambda v: ({"upstream": v}, frozenset())),
    **{
        o: Dimension(lambda s, d, o=o: ["off", "on"] if o in s.options else [], _option_fields(o))
        for o in LINEAR_CE_OPTIONS
    },
    # The inputs' regime (properties.linear_ce.cases.REGIMES): a property whose bug shows only on some inputs (partial
    # sums that grow on post-norm activations) names it to meet each regime once.
    "regime": Dimension(lambda s, d: list(REGIMES), lambda v: ({"regime": v}, frozenset())),
    # A trained head's shape (large_vocab): bf16, where declared, with the anisotropic head (HEAD_PRECISIONS),
    # and one row without it ("off", a plain draw: a dimension of one value would be left out of the design).
    "head": Dimension(_head_values, _head_fields),
}
#: Every dimension of the declaration: a property that varies every declared field of the default draw (the
#: regime, a property of the inputs rather than of the declaration, is drawn at random there).
EVERY_DIMENSION: tuple[str, ...] = tuple(d for d in DIMENSIONS if d not in ("regime", "head", "dtype", "low_precision"))


def _valid(names: Sequence[str], support: Any) -> Callable[[Sequence[str]], bool]:
    """allpairspy's filter: whether a (partial) row, its values in ``names`` order, can be one Problem."""
    excluded = [tuple(pair) for pair in support.option_combinations_excluded]

    def ok(values: Sequence[str]) -> bool:
        v = dict(zip(names, values))
        red, up, prec = v.get("reduction"), v.get("upstream"), v.get("precision")
        if up == "per_row" and red not in (None, "none"):
            return False
        if up in ("scalar", "loss_scale") and red == "none":
            return False
        if up == "loss_scale" and (
            red not in (None, "mean") or prec not in (None, "amp:float16") or v.get("softcap") == "on"
        ):
            return False
        return not any(v.get(a) == "on" and v.get(b) == "on" for a, b in excluded)

    return ok


def _params(dimensions: Sequence[str], support: Any, device: str) -> OrderedDict[str, list[str]]:
    """Each dimension's values with more than one value. A loss scale needs AMP fp16, so it is a value of
    ``upstream`` only where ``precision`` is a dimension too (a property that pins the precision cannot take it)."""
    params = OrderedDict((d, DIMENSIONS[d].values(support, device)) for d in dimensions)
    if "upstream" in params and "precision" not in params:
        params["upstream"] = [u for u in params["upstream"] if u != "loss_scale"]
    return OrderedDict((d, v) for d, v in params.items() if len(v) > 1)


def covering_rows(dimensions: Sequence[str], support: Any, device: str) -> tuple[Row, ...]:
    """A pairwise covering design over ``dimensions`` (names of :data:`DIMENSIONS`) as ``support`` declares them
    on ``device``: every valid pair of values of two dimensions in some row. Dimensions with one value or none
    (an option not declared) are left out; one dimension left gives one row per value; none gives no rows."""
    unknown = sorted(set(dimensions) - set(DIMENSIONS))
    if unknown:
        raise ValueError(f"covering_rows: unknown dimension(s) {unknown} (known: {', '.join(DIMENSIONS)})")
    params = _params(dimensions, support, device)
    names = list(params)
    if not names:
        return ()
    ok = _valid(names, support)
    if len(names) == 1:
        return tuple(_row(names, [v]) for v in params[names[0]])
    combos = [tuple(c) for c in AllPairs(params, filter_func=ok) if ok(list(c))]
    return tuple(_row(names, list(c)) for c in _complete(names, params, ok, combos))


def _pairs(names: Sequence[str], combo: Sequence[str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return set(itertools.combinations(tuple(zip(names, combo)), 2))


def _complete(
    names: Sequence[str],
    params: OrderedDict[str, list[str]],
    ok: Callable[[Sequence[str]], bool],
    combos: list[tuple[str, ...]],
) -> list[tuple[str, ...]]:
    """``combos`` with rows added until every valid pair is covered: allpairspy stops once a row adds no new pair,
    which under constraints can leave valid pairs out (a loss scale with a bias, AMP fp16 with a scalar). Each
    added row is the valid full row, first in product order, that covers the most pairs still missing."""
    valid = [c for c in itertools.product(*params.values()) if ok(c)]
    missing = set().union(*(_pairs(names, c) for c in valid)) - set().union(set(), *(_pairs(names, c) for c in combos))
    out = list(combos)
    while missing:
        best = max(valid, key=lambda c: len(_pairs(names, c) & missing))
        out.append(best)
        missing -= _pairs(names, best)
    return out


def _row(names: Sequence[str], values: Sequence[str]) -> Row:
    """The row of ``values``; a loss scale pins the softcap off where the design does not (Problem excludes them
    together)."""
    force: dict[str, Any] = {}
    require: frozenset[str] = frozenset()
    for d, v in zip(names, values):
        f, r = DIMENSIONS[d].fields(v)
        force.update(f)
        require |= r
    if force.get("upstream") == "loss_scale":
        force.setdefault("softcap", None)
    return Row(tuple(zip(names, values)), force, require)


def uncovered_pairs(
    dimensions: Sequence[str], support: Any, device: str, rows: Sequence[Row]
) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """The pairs of values (of two dimensions) that some valid full row holds but no row of ``rows`` does:
    empty for a covering design (checked by the tests, by enumerating the full product)."""
    params = _params(dimensions, support, device)
    names = list(params)
    ok = _valid(names, support)
    valid_pairs = set()
    for full in itertools.product(*(params[d] for d in names)):
        if ok(full):
            valid_pairs |= set(itertools.combinations(tuple(zip(names, full)), 2))
    have = set()
    for row in rows:
        have |= set(itertools.combinations(row.values, 2))
    return sorted(valid_pairs - have)
