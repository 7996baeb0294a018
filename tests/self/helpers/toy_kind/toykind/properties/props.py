"""The toy family's properties (:data:`PROPERTIES`): ``accuracy`` (within :mod:`~toykind.properties.tolerance`'s
bound of the float64 sum) and ``determinism`` (two calls bitwise equal). :func:`measure` judges one case for the
report without raising."""

from __future__ import annotations

from typing import Any, Callable

import torch

from numcheck.properties.core.compare import Comparison, compare
from numcheck.properties.core.failures import fail
from toykind.properties.cases import ToyCase, build
from toykind.properties.tolerance import bound


def measure(impl: Any, case: ToyCase) -> Comparison:
    """The impl's sum on ``case`` against the float64 sum, under the bound."""
    x = build(case)
    got = torch.as_tensor(impl(x))
    return compare("total", got.reshape(()), x.to(torch.float64).sum(), bound(x))


def accuracy(impl: Any, case: ToyCase) -> dict[str, float]:
    """The sum within its bound of the exact one."""
    c = measure(impl, case)
    if not c.ok:
        fail(impl, "accuracy", case, c.describe(), ratio=c.ratio)
    return {"total error/bound": c.ratio}


def determinism(impl: Any, case: ToyCase) -> dict[str, float]:
    """Two calls on one input return the same bits."""
    x = build(case)
    a, b = torch.as_tensor(impl(x)), torch.as_tensor(impl(x))
    if not torch.equal(a, b):
        fail(impl, "determinism", case, f"two calls differ: {a.item()!r} then {b.item()!r}")
    return {}


PROPERTIES: dict[str, Callable[[Any, ToyCase], Any]] = {"accuracy": accuracy, "determinism": determinism}
