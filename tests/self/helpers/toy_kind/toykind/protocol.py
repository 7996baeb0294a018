"""The toy kind's protocol: ``impl(x) -> x.sum()`` for a 1-D tensor ``x`` in a declared dtype.

Its kind's name is defined here once (:data:`TOY_KIND`) with its descriptor :data:`KIND`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from numcheck.impls.protocols.kind import Kind

TOY_KIND = "toy_total"


@dataclass(frozen=True)
class ToySupport:
    """What a toy impl declares: the dtypes it sums in, the devices it runs on."""

    dtypes: tuple[str, ...] = ("float32",)
    devices: frozenset[str] = frozenset({"cpu"})

    def unavailable_reason(self) -> str | None:
        """Why it cannot run here (never: it is plain torch)."""
        return None

    def describe(self) -> str:
        """Its declaration, one line per field (``numcheck list``)."""
        return f"dtypes: {','.join(self.dtypes)}\ndevices: {','.join(sorted(self.devices))}"


@dataclass(frozen=True)
class ToyImpl:
    """A toy impl: ``fn(x)`` returns the sum of ``x``'s elements."""

    name: str
    fn: Callable[[Any], Any]
    support: ToySupport = field(default_factory=ToySupport)
    description: str = ""
    kind: str = TOY_KIND

    def __call__(self, x: Any) -> Any:
        return self.fn(x)


def toy_impl(*, name: str, dtypes: tuple[str, ...] = ("float32",)) -> Callable[[Callable[[Any], Any]], ToyImpl]:
    """Declare ``fn`` a toy impl named ``name`` summing in ``dtypes``."""

    def wrap(fn: Callable[[Any], Any]) -> ToyImpl:
        return ToyImpl(name, fn, ToySupport(tuple(dtypes)), description=fn.__doc__ or "")

    return wrap


def validate_toy_impl(impl: Any, origin: str) -> None:
    """``TypeError`` naming ``origin`` when ``impl`` is not a toy impl."""
    if not isinstance(impl, ToyImpl) or not callable(impl.fn):
        raise TypeError(f"{origin}: {impl!r} is not a toy impl (make one with toy_impl)")


KIND = Kind(
    name=TOY_KIND,
    protocol=ToyImpl,
    decorator=toy_impl,
    validate=validate_toy_impl,
    public=("ToyImpl", "ToySupport", "toy_impl"),
    fixture="toy_impl",
)
