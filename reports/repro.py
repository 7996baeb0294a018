"""``numcheck repro``: rerun one property on one case for one impl — the command every failure message prints.

``--problem`` is the ``repr`` of a case of a registered family (:data:`reports.report.families.FAMILIES`): a
linear+CE :class:`~properties.linear_ce.cases.Problem`, an :class:`~properties.fp8.cases.Fp8Case` (a quantizer
failure's :class:`~properties.fp8.cases.QuantizerCase`, its tensor by the values it was drawn from), a
:class:`~properties.fp8.grouped.cases.GroupedCase`, a distributed family's case (run on that case's ranks), ... It
is evaluated with only the families' case types and the constructors their ``repr`` uses in scope and no builtins.
The family whose case type it is names the rest (:class:`~reports.report.families.family.ReportFamily`): the
property table the property is looked up in, how ``--impl`` is found (its ``find_impl``, else any loaded impl by
name or ``module:attr`` spec: :func:`reports.common.find_impl`) and which cases its declarations exclude
(``undeclared``). A property label with a ``[...]`` suffix, as failure messages print for sub-checks
(``option_identities[softcap]``), runs the whole property.

Exit status: 0 PASS, 1 the property fails (its message is printed) or the impl raises (with the traceback),
2 bad arguments or an impl that cannot be loaded or run here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from numcheck.reports.common import add_impl_arguments, find_impl

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
        help="run a case the impl's declaration excludes (the suite never draws it; by default repro names the "
        "reason and exits 2)",
    )


def parse_case(text: str) -> Any:
    """Evaluate a ``Problem(...)`` / ``Fp8Case(...)`` expression with only the case types of the registered families
    (:data:`reports.report.families.FAMILIES`, in the kinds' order) and the names their ``repr`` uses (each
    family's ``repr_names``) in scope."""
    import math

    from numcheck.impls.protocols.kinds import NAMES
    from numcheck.reports.report.families import FAMILIES

    families = [FAMILIES[kind] for kind in NAMES if kind in FAMILIES]
    types = tuple(t for f in families for t in f.case_types())
    names = {t.__name__: t for t in types}
    for f in families:
        names.update(f.repr_names() if f.repr_names else {})
    names.update(inf=math.inf, nan=math.nan)
    listed = [t.__name__ for t in types]
    try:
        case = eval(text, {"__builtins__": {}}, names)  # noqa: S307
    except Exception as exc:  # noqa: BLE001 - reported as a bad argument
        raise ValueError(
            f"--problem could not be evaluated ({type(exc).__name__}: {exc}); expected one of "
            f"{', '.join(f'{name}(...)' for name in listed)} as printed in a failure message"
        ) from None
    if not isinstance(case, types):
        raise ValueError(
            f"--problem must evaluate to a {', '.join(listed[:-1])} or {listed[-1]}, got {type(case).__name__}"
        )
    return case


def family_of(case: Any) -> Any:
    """The report family (:data:`reports.report.families.FAMILIES`) whose case types ``case`` is an instance of
    (:func:`parse_case` gives only such cases): its kind, its property table, how its impls are found
    (``find_impl``) and what its declarations exclude (``undeclared``)."""
    from numcheck.reports.report.families import FAMILIES

    return next(f for f in FAMILIES.values() if isinstance(case, f.case_types()))


def run(args: argparse.Namespace) -> int:
    from numcheck.errors import PropertyFailure

    prop = args.property.split("[", 1)[0]
    try:
        case = parse_case(args.problem)
        family = family_of(case)
        impl = (family.find_impl or find_impl)(args.impl)
    except ValueError as exc:
        print(f"numcheck repro: {exc}", file=sys.stderr)
        return 2
    want, table = family.kind, family.properties()
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
    excluded = family.undeclared(impl, case) if family.undeclared else None
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
