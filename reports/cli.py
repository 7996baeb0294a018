"""The ``numcheck`` command line. Each subcommand lives in its own module under :mod:`reports`;
this file only lists them. A subcommand module defines ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status).

Every command works from any directory: before a subcommand is imported, Triton's interpreter is arranged where
there is no CUDA (:func:`numcheck.impls.interpreter.arrange`), and the current directory is put at the end of
``sys.path`` so that an impl named ``mymod:impl`` in the user's repository imports as it does under
``python -m`` (at the end: an installed package of the same name wins)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from numcheck.impls import interpreter

#: subcommand name -> module. Add a line here for a new subcommand.
COMMANDS: dict[str, str] = {
    "memory": "numcheck.reports.memory_cmd",
    "list": "numcheck.reports.list_impls",
    "report": "numcheck.reports.report.command",
    "repro": "numcheck.reports.repro",
    "premerge": "numcheck.reports.premerge.command",
    "bench": "numcheck.reports.bench",
    "versions": "numcheck.reports.versions",
    "sweep": "numcheck.reports.sweep.command",
    "detection": "numcheck.reports.detection",
    "converge": "numcheck.reports.convergence.command",
    "production": "numcheck.reports.production.command",
}
#: Old names kept working: ``scale`` was the production-shape tier's command before "scale" came to mean only FP8
#: scale factors.
ALIASES: dict[str, tuple[str, ...]] = {"production": ("scale",)}
#: Subcommands that measure speed or memory rather than judge: they run under the caller's GEMM settings (what a
#: user's training gets), not numcheck's pinned precision (:mod:`numcheck.properties.core.matmul_precision`).
MEASURING: frozenset[str] = frozenset({"bench", "memory"})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``numcheck`` console script."""
    interpreter.arrange()  # before any subcommand can import triton
    from numcheck.properties.core import matmul_precision

    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    parser = argparse.ArgumentParser(prog="numcheck", description="Verify linear+CE and FP8 linear kernels against float64 oracles.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)
        modules[name] = mod
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP, aliases=ALIASES.get(name, ()))
        mod.add_arguments(p)
        for alias in ALIASES.get(name, ()):
            modules[alias] = mod
    args = parser.parse_args(argv)
    pin = contextlib.nullcontext() if args.command in MEASURING else matmul_precision.pinned()
    with pin:  # every judging subcommand runs under numcheck's GEMM precision
        return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
