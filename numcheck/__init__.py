"""numcheck: correctness and numerics verification for linear + cross-entropy and FP8 quantized linear kernels.

``import numcheck`` is the public API; it changes nothing in the importing process (no environment variables,
no hypothesis profile loaded). Subpackages: :mod:`numcheck.reference` (float64 oracles), :mod:`numcheck.impls`
(the protocol and the implementations under test), :mod:`numcheck.properties` (strategies, tolerances,
properties), :mod:`numcheck.tests` (the suite, a pytest plugin) and :mod:`numcheck.reports` (the command line).

>>> import numcheck
>>> @numcheck.linear_ce_impl(name="doc_eager", dtypes=("float32",), options=(), autocast=())
... def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
...     import torch.nn.functional as F
...     return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)
>>> impl.name
'doc_eager'
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers; at run time each is imported on first use (__getattr__)
    from numcheck.errors import (
        BadInput,
        ClaimsError,
        InvalidAssertion,
        InvalidDeclaration,
        NumcheckError,
        PropertyFailure,
        ProtocolViolation,
        RenamedWarning,
    )
    from numcheck.impls.protocols.dist_linear_ce import DistFunctionImpl, DistSupport, dist_linear_ce_impl
    from numcheck.impls.protocols.fp8_linear import (
        Fp8FunctionImpl,
        Fp8LinearSupport,
        fp8_linear_impl,
        make_fp8_support,
    )
    from numcheck.impls.protocols.grouped_fp8_linear import (
        GroupedFp8Support,
        GroupedFunctionImpl,
        grouped_fp8_linear_impl,
    )
    from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport, linear_ce_impl, make_support
    from numcheck.impls.protocols.linear_distill import DistillFunctionImpl, LinearDistillSupport, linear_distill_impl
    from numcheck.impls.protocols.linear_preference import (
        PreferenceFunctionImpl,
        PreferenceParams,
        PreferenceSupport,
        linear_preference_impl,
    )
    from numcheck.impls.protocols.tp_fp8_linear import TPFp8FunctionImpl, TPFp8Support, tp_fp8_linear_impl
    from numcheck.properties.assertions import assert_fp8_linear, assert_linear_ce
    from numcheck.properties.check import CheckResult, Verdict, check
    from numcheck.properties.convergence.run import ConvergenceResult, assert_converges
    from numcheck.properties.fp8.cases import Fp8Case
    from numcheck.properties.fp8.grouped.cases import GroupedCase
    from numcheck.properties.linear_ce.cases import Problem
    from numcheck.reference.fp8_recipes import Fp8Recipe

#: Each public name outside the kinds' protocol modules and the module it is defined in. Imported when first used,
#: not with ``numcheck``: the modules import torch and scipy (seconds), and ``numcheck.tests.plugin``, which pytest
#: loads in every run of an environment where numcheck is installed, imports this package first. The protocol
#: modules' public names come from each kind's descriptor (:func:`_kind_public`).
_PUBLIC: dict[str, str] = {
    **dict.fromkeys(
        (
            "BadInput",
            "ClaimsError",
            "InvalidAssertion",
            "InvalidDeclaration",
            "NumcheckError",
            "PropertyFailure",
            "ProtocolViolation",
            "RenamedWarning",
        ),
        "numcheck.errors",
    ),
    **dict.fromkeys(("assert_linear_ce", "assert_fp8_linear"), "numcheck.properties.assertions"),
    **dict.fromkeys(("ConvergenceResult", "assert_converges"), "numcheck.properties.convergence.run"),
    "Fp8Case": "numcheck.properties.fp8.cases",
    "GroupedCase": "numcheck.properties.fp8.grouped.cases",
    "Problem": "numcheck.properties.linear_ce.cases",
    **dict.fromkeys(("CheckResult", "Verdict", "check"), "numcheck.properties.check"),
    "Fp8Recipe": "numcheck.reference.fp8_recipes",
}
#: Public names renamed in numcheck 0.2.0 outside the kinds' protocol modules, old → new (each kind's own are its
#: descriptor's :attr:`~numcheck.impls.protocols.kind.Kind.renamed`). ``numcheck.<old>`` still gives the new one,
#: with a :class:`~numcheck.errors.RenamedWarning` once per process, until 0.3.0 (CHANGELOG.md).
_RENAMED: dict[str, str] = {"assert_quant_linear": "assert_fp8_linear", "QuantCase": "Fp8Case"}
#: The subpackages, reachable as attributes (``numcheck.impls``) after a plain ``import numcheck``.
_SUBPACKAGES: tuple[str, ...] = ("impls", "properties", "reference", "reports", "tests")


def _kind_public() -> dict[str, str]:
    """Each kind's public names (:attr:`~numcheck.impls.protocols.kind.Kind.public`) and its protocol module, one
    entry per kind of :data:`numcheck.impls.protocols.kinds.KINDS` (imported on the first use of one: torch)."""
    from numcheck.impls.protocols.kinds import KINDS

    return {name: kind.module for kind in KINDS for name in kind.public}


def _renamed() -> dict[str, str]:
    """Every public name renamed in 0.2.0, old → new: :data:`_RENAMED` and each kind's (imports torch)."""
    from numcheck.impls.protocols.kinds import KINDS

    return {**_RENAMED, **{old: new for kind in KINDS for old, new in kind.renamed}}


def __getattr__(name: str) -> Any:
    """A public name (or subpackage), imported on first use and kept as a module attribute; a name renamed in
    0.2.0 gives the new one, warning once per process (not kept: ``dir(numcheck)`` lists today's names only)."""
    if not name.startswith("_") and name not in _PUBLIC and name not in __all__ and name not in _SUBPACKAGES:
        new = _renamed().get(name)
        if new is not None:
            from numcheck.errors import warn_renamed

            warn_renamed("numcheck attribute", name, new)
            return getattr(sys.modules[__name__], new)
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in __all__ and name in (kinds := _kind_public()):
        value = getattr(importlib.import_module(kinds[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"numcheck.{name}")
    else:
        raise AttributeError(f"module 'numcheck' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *__all__, *_SUBPACKAGES})


__version__ = "0.2.0"

__all__ = [
    "BadInput",
    "CheckResult",
    "ClaimsError",
    "ConvergenceResult",
    "DistFunctionImpl",
    "DistSupport",
    "DistillFunctionImpl",
    "Fp8Case",
    "Fp8FunctionImpl",
    "Fp8LinearSupport",
    "Fp8Recipe",
    "FunctionImpl",
    "GroupedCase",
    "GroupedFp8Support",
    "GroupedFunctionImpl",
    "InvalidAssertion",
    "InvalidDeclaration",
    "LinearCESupport",
    "LinearDistillSupport",
    "NumcheckError",
    "PreferenceFunctionImpl",
    "PreferenceParams",
    "PreferenceSupport",
    "Problem",
    "PropertyFailure",
    "ProtocolViolation",
    "RenamedWarning",
    "TPFp8FunctionImpl",
    "TPFp8Support",
    "Verdict",
    "assert_converges",
    "assert_fp8_linear",
    "assert_linear_ce",
    "check",
    "dist_linear_ce_impl",
    "fp8_linear_impl",
    "grouped_fp8_linear_impl",
    "linear_ce_impl",
    "linear_distill_impl",
    "linear_preference_impl",
    "make_fp8_support",
    "make_support",
    "tp_fp8_linear_impl",
]
