"""What one kind of implementation is, to every layer that iterates over kinds: :class:`Kind`.

Each protocol module (:mod:`impls.protocols.linear_ce`, :mod:`~impls.protocols.fp8_linear`,
:mod:`~impls.protocols.grouped_fp8_linear`, :mod:`~impls.protocols.dist_linear_ce`,
:mod:`~impls.protocols.tp_fp8_linear`) defines its kind's name once, as a constant, and its descriptor ``KIND``
built from it; :mod:`impls.protocols.kinds` lists the descriptors (the only list of kinds), and everything else —
the registry's validation, ``import numcheck``, the plugin's fixtures, the report — iterates that list or imports
the name constant.

>>> from numcheck.impls.protocols.kinds import KINDS
>>> [k.name for k in KINDS][:2]
['linear_ce', 'quant_linear']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Kind:
    """One kind of implementation: the ``kind`` string its impls carry, and where the rest of it lives.

    Attributes:
        name: the ``kind`` attribute of its impls (in report.json, listings and repro commands).
        protocol: the impl class its decorator builds (users may bring any object following the protocol).
        decorator: the public decorator that declares one (``numcheck.<decorator.__name__>``).
        validate: ``validate(impl, origin)`` raises ``TypeError`` naming ``origin`` when ``impl`` breaks the protocol.
        public: the names ``import numcheck`` exports from the protocol module.
        fixture: the pytest fixture of :mod:`numcheck.tests.plugin` parametrized over the loaded impls of this kind
            (its name ends in ``_impl``: the plugin looks for a kind's fixture among the arguments named so).
        generic: whether the plugin's ``numcheck_impl`` fixture (one test over several kinds) also covers it.
    """

    name: str
    protocol: type
    decorator: Callable[..., Any]
    validate: Callable[[Any, str], None]
    public: tuple[str, ...]
    fixture: str
    generic: bool = False

    def __post_init__(self) -> None:
        if not self.fixture.endswith("_impl"):
            raise ValueError(f"kind {self.name!r}: its fixture's name must end in '_impl', got {self.fixture!r}")

    @property
    def module(self) -> str:
        """The protocol module's dotted name (where :attr:`name` is defined)."""
        return self.protocol.__module__
