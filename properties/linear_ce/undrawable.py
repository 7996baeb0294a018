"""Why the problem strategies can draw no case for an impl: the real reason behind an ``Unsatisfiable``.

:func:`~numcheck.properties.linear_ce.strategies.problems` rejects every draw its support refuses. When a test's pinned
fields (``force``), required options (``require``) or reductions leave nothing the impl declares — or the run's
device is not one it declares — hypothesis ends with ``Unsatisfiable``, which says nothing of why.
:func:`undrawable_reason` finds that reason without drawing: it builds the least demanding problem the same
arguments allow and asks the declaration (:func:`~numcheck.properties.linear_ce.strategies.refusal`) why it is refused,
so the words are the declaration's own. ``None`` means some draws are declared: an ``Unsatisfiable`` then comes
from a data-dependent filter (a known divergence decided by the data, a loss scale whose gradients do not fit).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.linear_ce import LinearCESupport
from numcheck.properties.core.device import DEVICE, undeclared_device
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.strategies import refusal

#: Keys of ``problems(force=...)`` that name an option rather than a :class:`Problem` field.
_FORCE_FIELD = {"z_loss": "z_loss_scale"}
#: A value turning each option on, for ``require`` (as ``problems`` draws one).
_ON: dict[str, tuple[str, Any]] = {
    "bias": ("bias", True),
    "ignore_index": ("ignored", 0.5),
    "label_smoothing": ("label_smoothing", 0.1),
    "class_weights": ("class_weights", True),
    "softcap": ("softcap", 5.0),
    "z_loss": ("z_loss_scale", 1e-2),
}


def _witness_fields(
    support: LinearCESupport,
    dev_type: str,
    force: dict[str, Any],
    require: Iterable[str],
    reductions: Iterable[str] | None,
) -> tuple[dict[str, Any], str | None]:
    """The :class:`Problem` fields of the smallest case :func:`undrawable_reason` tries: the pinned ones, the first
    drawable reduction, the smallest declared dtype, the required options on; with why no case can be drawn
    when that shows before any problem is made (``None`` otherwise)."""
    fields: dict[str, Any] = {_FORCE_FIELD.get(k, k): v for k, v in force.items()}
    reds = [r for r in (reductions or ("mean", "sum", "none")) if r in support.reductions]
    if "reduction" not in fields:
        if not reds:
            return fields, (
                f"this test draws reductions {sorted(reductions or ())} and the impl declares "
                f"{sorted(support.reductions)}"
            )
        fields["reduction"] = reds[0]
    if "dtype" not in fields and "autocast" not in fields:
        fields["dtype"] = str(min(support.dtypes, key=str)).removeprefix("torch.")
    elif fields.get("autocast"):
        fields.setdefault("dtype", "float32")
        amp = getattr(torch, fields["autocast"])
        if not capabilities.autocast_dtype(dev_type, amp):
            return (
                fields,
                f"this test draws autocast {fields['autocast']!r}, which torch does not run on {dev_type!r} here",
            )
    for option in sorted(set(require) & set(support.options)):
        name, value = _ON[option]
        fields.setdefault(name, value)
    fields.setdefault("N", 2)
    fields.setdefault("H", 1)
    fields.setdefault("V", 2)
    if fields["reduction"] == "none":
        fields.setdefault("upstream", "per_row")
    return fields, None


def undrawable_reason(
    support: LinearCESupport,
    device: str | None = None,
    *,
    force: Mapping[str, Any] | None = None,
    require: Iterable[str] = frozenset(),
    reductions: Iterable[str] | None = None,
    **_ignored: Any,
) -> str | None:
    """Why ``problems(support, device, force=..., require=..., reductions=...)`` can draw no declared case, or
    ``None`` when it can draw some. Other keywords of ``problems`` (``regimes``, ``allow_all_ignored``) never
    empty the draws and are accepted and ignored, so a caller can pass the same keywords it drew with.

    >>> from numcheck.impls.protocols.linear_ce import make_support
    >>> undrawable_reason(make_support(devices=("cuda",)), "cpu")
    "the impl declares devices ['cuda'] and this run draws problems on 'cpu' (NUMCHECK_DEVICE); run it where it is declared, e.g. NUMCHECK_DEVICE=cuda"
    >>> undrawable_reason(make_support(dtypes=("bfloat16",)), "cpu", force={"dtype": "float32", "autocast": None})
    "this test draws only dtype='float32', autocast=None, and the impl refuses that: dtype torch.float32 not declared (declares ['torch.bfloat16'])"
    >>> undrawable_reason(make_support(), "cpu") is None
    True
    """
    device = device or DEVICE
    dev_type = torch.device(device).type
    if why := undeclared_device(support.devices, device=device):
        return why
    force = dict(force or {})
    fields, why = _witness_fields(support, dev_type, force, require, reductions)
    if why is not None:
        return why
    pinned = ", ".join(f"{k}={v!r}" for k, v in force.items())
    try:
        p = Problem(**{k: v for k, v in fields.items() if k in Problem.__dataclass_fields__}, device=device)
    except ValueError as exc:
        return f"this test's pinned fields ({pinned}) make no valid problem: {exc}"
    why = refusal(support, p)
    if why is None:
        return None
    what = f"draws only {pinned}" if pinned else "draws"
    if require:
        what += f" with every declared option of {sorted(require)} on"
    return f"this test {what}, and the impl refuses that: {why}"
