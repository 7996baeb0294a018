"""What one kind of implementation is, to every layer that iterates over kinds: :class:`Kind`.

Each protocol module (:mod:`impls.protocols.linear_ce`, :mod:`~impls.protocols.fp8_linear`,
:mod:`~impls.protocols.grouped_fp8_linear`, :mod:`~impls.protocols.dist_linear_ce`,
:mod:`~impls.protocols.tp_fp8_linear`) defines its kind's name once, as a constant, and its descriptor ``KIND``
built from it; :mod:`impls.protocols.kinds` lists the descriptors (the only list of kinds), and everything else —
the registry's validation, ``import numcheck``, the plugin's fixtures, the report — iterates that list or imports
the name constant.

A kind's name is its family's words joined by hyphens (``linear-ce``, ``fp8-linear``, ``grouped-fp8-linear``,
``dist-linear-ce``, ``tp-fp8-linear``): the same words as its modules, fixtures and decorators, never a Python
identifier, so no kind is also a module, package, fixture or attribute name, nor a built-in impl name
(``fp8_linear[current]``, ``eager``). Names before 0.2.0 are each descriptor's :attr:`Kind.former`.

>>> from numcheck.impls.protocols.kinds import KINDS
>>> [k.name for k in KINDS][:2]
['linear-ce', 'fp8-linear']
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
        former: the kind's name before numcheck 0.2.0 (read in older reports and from hand-built impls, with a
            :class:`~numcheck.errors.RenamedWarning`); ``""`` when it kept its name.
        former_fixture: the fixture's name before 0.2.0 (still parametrized, with a warning); ``""`` when unchanged.
        renamed: ``(old, new)`` for each public name (:attr:`public`) renamed in 0.2.0: ``numcheck.<old>`` still
            resolves to ``numcheck.<new>``, with a warning, until 0.3.0.
        describe: ``describe(impl)``, its declaration in a few lines (``numcheck list``); ``None``: its support's
            ``describe()``.
    """

    name: str
    protocol: type
    decorator: Callable[..., Any]
    validate: Callable[[Any, str], None]
    public: tuple[str, ...]
    fixture: str
    generic: bool = False
    former: str = ""
    former_fixture: str = ""
    renamed: tuple[tuple[str, str], ...] = ()
    describe: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        if not self.fixture.endswith("_impl"):
            raise ValueError(f"kind {self.name!r}: its fixture's name must end in '_impl', got {self.fixture!r}")

    def describe_impl(self, impl: Any) -> str:
        """``impl``'s declaration in a few lines: :attr:`describe`'s, else its support's ``describe()``."""
        return self.describe(impl) if self.describe is not None else impl.support.describe()

    @property
    def module(self) -> str:
        """The protocol module's dotted name (where :attr:`name` is defined)."""
        return self.protocol.__module__


def renamed_attributes(module: str, renamed: tuple[tuple[str, str], ...]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a protocol module: each old public name of ``renamed`` (``(old, new)``, a kind's
    :attr:`Kind.renamed`) gives the new object, warning once per process (:func:`numcheck.errors.warn_renamed`), so
    ``from numcheck.impls.protocols.fp8_linear import QuantLinearSupport`` works until 0.3.0."""
    import sys

    from numcheck.errors import warn_renamed

    table = dict(renamed)

    def __getattr__(name: str) -> Any:
        if name in table:
            warn_renamed(f"{module} attribute", name, table[name])
            return getattr(sys.modules[module], table[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
