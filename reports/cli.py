"""The ``numcheck`` command line. Each subcommand lives in its own module under :mod:`reports`;
this file only lists them. A subcommand module defines ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status).

Every command works from any directory: before a subcommand is imported, :func:`numcheck.reports.common.prepare`
arranges Triton's interpreter where there is no CUDA and puts the current directory at the end of ``sys.path``."""

from __future__ import annotations

import argparse
import importlib
import sys

from numcheck.reports import common

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
    common.prepare()  # before any subcommand can import triton
    parser = argparse.ArgumentParser(
        prog="numcheck", description="Verify linear+CE and FP8 linear kernels against float64 oracles."
    )
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
    for name, olds in ALIASES.items():
        if args.command in olds:
            from numcheck.errors import warn_renamed

            warn_renamed("numcheck command", args.command, name, stacklevel=2)
    return common.execute(modules[args.command], args, measuring=args.command in MEASURING)


if __name__ == "__main__":
    sys.exit(main())
