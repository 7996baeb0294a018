"""The ``numcheck`` command line. Each subcommand lives in its own module under :mod:`reports`;
this file only lists them. A subcommand module defines ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status)."""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand name -> module. Add a line here for a new subcommand.
COMMANDS: dict[str, str] = {
    "memory": "numcheck.reports.memory_cmd",
    "list": "numcheck.reports.list_impls",
    "report": "numcheck.reports.report",
    "repro": "numcheck.reports.repro",
    "premerge": "numcheck.reports.premerge",
    "bench": "numcheck.reports.bench",
    "versions": "numcheck.reports.versions",
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``numcheck`` console script."""
    parser = argparse.ArgumentParser(prog="numcheck", description="Verify linear+CE and FP8 linear kernels against float64 oracles.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)
        modules[name] = mod
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
