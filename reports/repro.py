"""``numcheck repro``: rerun one property on one case for one impl — the command every failure message prints.

``--problem`` is the ``repr`` of a :class:`~properties.linear_ce.cases.Problem` (linear+CE; the property is looked up
in :data:`properties.linear_ce.props.PROPERTIES`) or of a :class:`~properties.fp8.cases.Fp8Case` (quantized linear;
:data:`properties.fp8.props.FP8_PROPERTIES`; a quantizer failure's case is a
:class:`~properties.fp8.cases.QuantizerCase`, its tensor by the values it was drawn from) or a
:class:`~properties.fp8.grouped.cases.GroupedCase` (grouped FP8 linear;
:data:`properties.fp8.grouped.props.GROUPED_PROPERTIES`). It is evaluated with only those constructors (and
``Fp8Recipe``) in scope and no builtins. A :class:`~properties.distributed.tp_fp8.cases.TPFp8Case` runs a
tensor-parallel FP8 property (:data:`properties.distributed.tp_fp8.props.DIST_FP8_PROPERTIES`), a
:class:`~properties.distributed.linear_ce.cases.DistCase` a distributed linear+CE one
(:data:`properties.distributed.linear_ce.props.PROPERTIES`) on that case's ranks. A property label with a ``[...]``
suffix, as failure messages print for sub-checks (``option_identities[softcap]``), runs the whole property.

Exit status: 0 PASS, 1 the property fails (its message is printed) or the impl raises (with the traceback),
2 bad arguments or an impl that cannot be loaded or run here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from numcheck.reports.common import add_impl_arguments

HELP = (
    "rerun one property on one case for one impl: numcheck repro --impl NAME --property PROP --problem 'Problem(...)'"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_impl_arguments(
        p,
        impls="the impl (package.module:attr is imported with the current directory on the path; a name may be "
        "any impl loaded, through NUMCHECK_IMPLS or entry points too)",
        default="",
        repeatable=False,
        required=True,
        loaded=True,
        device_help=None,
    )
    p.add_argument(
        "--property",
        required=True,
        metavar="PROP",
        help="property name as printed in the failure, e.g. accuracy or option_identities[softcap]",
    )
    p.add_argument(
        "--problem", required=True, metavar="EXPR", help="Problem(...) or Fp8Case(...) as printed in the failure"
    )
    p.add_argument(
        "--undeclared",
        action="store_true",
        help="run a linear+CE case the impl's declaration excludes (the suite never draws it; by default "
        "repro names the reason and exits 2)",
    )


def parse_case(text: str) -> Any:
    """Evaluate a ``Problem(...)`` / ``Fp8Case(...)`` expression with only the case types of the registered families
    (:data:`reports.report.families.FAMILIES`, in the kinds' order) and the constructors their ``repr`` uses in scope."""
    import math

    from numcheck.impls.protocols.kinds import NAMES
    from numcheck.properties.fp8.cases import DrawnTensor, FormatCodes
    from numcheck.reference.fp8_recipes import Fp8Recipe
    from numcheck.reports.report.families import FAMILIES

    types = tuple(t for kind in NAMES if kind in FAMILIES for t in FAMILIES[kind].case_types())
    names = {
        **{t.__name__: t for t in types},
        "Fp8Recipe": Fp8Recipe,
        "DrawnTensor": DrawnTensor,
        "FormatCodes": FormatCodes,
        "inf": math.inf,
        "nan": math.nan,
    }
    try:
        case = eval(text, {"__builtins__": {}}, names)  # noqa: S307
    except Exception as exc:  # noqa: BLE001 - reported as a bad argument
        raise ValueError(
            f"--problem could not be evaluated ({type(exc).__name__}: {exc}); expected Problem(...) or "
            f"Fp8Case(...) as printed in a failure message"
        ) from None
    if not isinstance(case, types):
        listed = [t.__name__ for t in types]
        raise ValueError(
            f"--problem must evaluate to a {', '.join(listed[:-1])} or {listed[-1]}, got {type(case).__name__}"
        )
    return case


def find_impl(name: str) -> Any:
    """The impl named ``name``: a ``module:attr`` spec (loaded as ``--impl`` loads it, the current directory on
    the path), a built-in, or one loaded through ``NUMCHECK_IMPLS`` / entry points. ValueError saying what was
    found otherwise, including why a ``NUMCHECK_IMPLS`` spec that should have provided it failed to load."""
    from numcheck.impls.registry import BrokenImpl, discover

    if ":" in name:
        loaded = discover([name])
        good = [e for e in loaded if not isinstance(e, BrokenImpl)]
        bad = [e for e in loaded if isinstance(e, BrokenImpl)]
        if bad:
            raise ValueError(f"impl spec {name!r} could not be loaded: {bad[0].error}")
        if len(good) == 1:
            return good[0].impl
        raise ValueError(
            f"impl spec {name!r} yields {len(good)} impls ({[e.name for e in good]}); rerun with "
            f"NUMCHECK_IMPLS={name} and --impl NAME, one of them"
        )
    entries = discover()
    for e in entries:
        if e.name == name:
            if isinstance(e, BrokenImpl):
                raise ValueError(f"impl {name!r} could not be loaded ({e.origin}): {e.error}")
            return e.impl
    names = sorted(e.name for e in entries if not isinstance(e, BrokenImpl))
    broken = [f"{e.spec!r} ({e.origin}): {e.error}" for e in entries if isinstance(e, BrokenImpl)]
    hint = (
        f"; these specs failed to load, one may be it: {'; '.join(broken)}"
        if broken
        else " (an outside impl: --impl module:attr, or NUMCHECK_IMPLS=module:attr)"
    )
    raise ValueError(f"no impl named {name!r}; loaded: {names}{hint}")


def find_tp_impl(name: str) -> Any:
    """A tensor-parallel FP8 impl (:mod:`impls.builtin.tp_fp8_linear`): a built-in by name, ``module:attr``
    naming one impl, or the name of one loaded through ``NUMCHECK_IMPLS`` / entry points. ValueError naming the
    built-ins otherwise."""
    import importlib

    from numcheck.impls.builtin.tp_fp8_linear import tp_fp8_linear_impls

    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"impl spec {name!r} could not be loaded: {exc}") from None
        return obj
    for impl in tp_fp8_linear_impls():
        if impl.name == name:
            return impl
    try:  # one loaded through NUMCHECK_IMPLS or an entry point (the repro line of a spec naming several impls)
        impl = find_impl(name)
    except ValueError as exc:
        raise ValueError(
            f"no tensor-parallel impl named {name!r}; built-ins: {[i.name for i in tp_fp8_linear_impls()]}; {exc}"
        ) from None
    from numcheck.impls.protocols.tp_fp8_linear import TP_KIND

    if impl.kind != TP_KIND:
        raise ValueError(f"impl {name!r} is a {impl.kind} impl but --problem is a TPFp8Case")
    return impl


def find_dist_impl(name: str) -> Any:
    """A distributed linear+CE impl: ``module:NAME`` as its failure's own repro line names it (one of the module's
    ``dist_impls()``, or the attribute), or the name of a built-in or of one loaded through ``NUMCHECK_IMPLS`` /
    entry points. ValueError saying what was found otherwise."""
    from numcheck.impls.protocols.dist_linear_ce import DIST_KIND

    if ":" in name:
        from numcheck.properties.distributed.linear_ce.props import load_impl

        try:
            return load_impl(name)
        except (ImportError, ValueError) as exc:
            raise ValueError(f"impl spec {name!r} could not be loaded: {exc}") from None
    impl = find_impl(name)
    if impl.kind != DIST_KIND:
        raise ValueError(f"impl {name!r} is a {impl.kind} impl but --problem is a DistCase")
    return impl


def _table(case: Any) -> tuple[str, dict[str, Any]]:
    """The impl kind a case is for and its property table: the family whose case types it is an instance of
    (:data:`reports.report.families.FAMILIES`), else linear+CE's."""
    from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
    from numcheck.reports.report.families import FAMILIES

    family = next((f for f in FAMILIES.values() if isinstance(case, f.case_types())), FAMILIES[LINEAR_CE_KIND])
    return family.kind, family.properties()


def _undeclared(impl: Any, case: Any) -> str | None:
    """Why a linear+CE impl's declaration excludes ``case`` (:func:`properties.linear_ce.strategies.refusal`), or ``None``."""
    from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
    from numcheck.properties.linear_ce.cases import Problem
    from numcheck.properties.linear_ce.strategies import refusal

    return refusal(impl.support, case) if isinstance(case, Problem) and impl.kind == LINEAR_CE_KIND else None


def run(args: argparse.Namespace) -> int:
    from numcheck.errors import PropertyFailure
    from numcheck.properties.distributed.linear_ce.cases import DistCase
    from numcheck.properties.distributed.tp_fp8.cases import TPFp8Case

    prop = args.property.split("[", 1)[0]
    try:
        case = parse_case(args.problem)
        finder = (
            find_tp_impl if isinstance(case, TPFp8Case) else find_dist_impl if isinstance(case, DistCase) else find_impl
        )
        impl = finder(args.impl)
    except ValueError as exc:
        print(f"numcheck repro: {exc}", file=sys.stderr)
        return 2
    want, table = _table(case)
    if impl.kind != want:
        print(
            f"numcheck repro: impl {impl.name!r} is a {impl.kind} impl but --problem is a {type(case).__name__}",
            file=sys.stderr,
        )
        return 2
    if prop not in table:
        print(f"numcheck repro: unknown property {args.property!r} for {want}; known: {sorted(table)}", file=sys.stderr)
        return 2
    reason = impl.support.unavailable_reason()
    if reason:
        print(f"numcheck repro: impl {impl.name!r} cannot run here: {reason}", file=sys.stderr)
        return 2
    excluded = _undeclared(impl, case)
    if excluded and not getattr(args, "undeclared", False):
        print(
            f"numcheck repro: impl {impl.name!r} does not declare this case: {excluded}. The suite never draws it; "
            f"pass --undeclared to run it anyway.",
            file=sys.stderr,
        )
        return 2
    from numcheck.properties.core import poison

    try:
        with poison.judging(impl, prop):  # uninitialised memory filled as the suite fills it
            table[prop](impl, case)
    except PropertyFailure as exc:
        print(f"FAIL\n{exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 - an impl that raises on a declared case fails the property
        import traceback

        print(f"FAIL: impl {impl.name!r} raised {type(exc).__name__}: {exc} while checking {prop!r} on {case!r}")
        traceback.print_exc()
        return 1
    print(f"PASS: property {prop!r} holds for impl {impl.name!r} on {case!r}")
    return 0
