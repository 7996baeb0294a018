"""Calling a third-party ``torch.autograd.Function`` across its releases.

``Function.apply`` takes its arguments by position only, and the libraries the adapters wrap (Liger-Kernel,
TransformerEngine) add, drop and reorder ``forward``'s parameters between releases. An adapter therefore reads the
installed ``forward``'s signature once (:func:`forward_parameters`) and lays out each call in that order
(:func:`positional_args`), falling back to the release's own defaults for what it does not pass.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping


def forward_parameters(function: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """``(names, defaults)`` of ``function.forward``'s parameters after ``ctx``: the names in order, and the
    default of each parameter that has one."""
    sig = inspect.signature(function.forward)
    names = tuple(sig.parameters)[1:]  # drop ctx
    defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    return names, defaults


def positional_args(
    params: tuple[str, ...], defaults: Mapping[str, Any], given: Mapping[str, Any], callee: str
) -> list[Any]:
    """The arguments for ``apply`` in the order of ``params``: the ``given`` value of each, else its default.
    Raises ValueError naming ``callee`` for a parameter with neither (the adapter cannot supply it)."""
    args = []
    for name in params:
        if name in given:
            args.append(given[name])
        elif name in defaults:
            args.append(defaults[name])
        else:
            raise ValueError(f"{callee} needs {name!r}, which the adapter cannot supply")
    return args
