"""Every command that takes ``--impl`` and ``--device`` takes them from one block
(:func:`numcheck.reports.common.add_impl_arguments`) and checks them the same way as it parses them: a spec that can
name no impl (empty, malformed, no built-in's name) and a string that is no torch device are one error naming the
value and what to give instead, exit 2, before the command runs anything. Parsing only: nothing is run."""

from __future__ import annotations

import argparse
import importlib

import pytest

from numcheck.reports import cli


def numcheck_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``numcheck`` parser as :func:`numcheck.reports.cli.main` builds it, and each command's subparser."""
    parser = argparse.ArgumentParser(prog="numcheck")
    sub = parser.add_subparsers(dest="command", required=True)
    subparsers = {}
    for name, modname in cli.COMMANDS.items():
        subparsers[name] = sub.add_parser(name)
        importlib.import_module(modname).add_arguments(subparsers[name])
    return parser, subparsers


PARSER, SUBPARSERS = numcheck_parser()
#: The commands that take --impl; the arguments each needs besides it.
TAKE_IMPL = sorted(name for name, p in SUBPARSERS.items() if "--impl" in p._option_string_actions)
REQUIRED: dict[str, list[str]] = {"repro": ["--property", "accuracy", "--problem", "Problem(N=2, H=3, V=5)"]}
BAD_SPECS = [
    ("", "is empty; give a built-in name (numcheck list) or package.module:attr"),
    ("my impl", "package.module:attr (dotted Python names around one ':')"),
    ("mypkg.flce:", "package.module:attr (dotted Python names around one ':')"),
    ("no_such_impl_xyz", "package.module:attr (dotted Python names around one ':')"),
]


def test_every_command_that_runs_impls_takes_impl() -> None:
    """The commands that run impls (all but ``versions``, which reads reports) take --impl."""
    assert TAKE_IMPL == sorted(set(cli.COMMANDS) - {"versions"})


@pytest.mark.parametrize("command", TAKE_IMPL)
@pytest.mark.parametrize("spec, fix", BAD_SPECS, ids=["empty", "space", "no-attr", "unknown-name"])
def test_a_bad_impl_spec_is_one_error_naming_it(command, spec, fix, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        PARSER.parse_args([command, *REQUIRED.get(command, []), "--impl", spec])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --impl: {spec!r} " in err and fix in err, err
    assert err.count("error:") == 1, err


@pytest.mark.parametrize("command", TAKE_IMPL)
def test_a_well_formed_spec_is_taken_as_given(command) -> None:
    args = PARSER.parse_args([command, *REQUIRED.get(command, []), "--impl", "mypkg.flce:impl"])
    assert args.impl in (["mypkg.flce:impl"], "mypkg.flce:impl")


@pytest.mark.parametrize("command", TAKE_IMPL)
def test_impl_help_is_the_same_everywhere(command) -> None:
    from numcheck.reports.common import IMPL_SPEC_HELP

    assert IMPL_SPEC_HELP in SUBPARSERS[command]._option_string_actions["--impl"].help


@pytest.mark.parametrize("command", [c for c in TAKE_IMPL if "--device" in SUBPARSERS[c]._option_string_actions])
def test_a_bad_device_is_one_error_naming_it(command, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        PARSER.parse_args([command, *REQUIRED.get(command, []), "--device", "gpu0"])
    assert exc.value.code == 2
    assert "argument --device: 'gpu0' is not a torch device; give cpu, cuda, cuda:N or meta" in (
        capsys.readouterr().err
    )
    given = [command, *REQUIRED.get(command, []), "--impl", "mypkg.flce:impl", "--device", "cuda:1"]
    assert PARSER.parse_args(given).device == "cuda:1"


def test_a_builtin_name_is_taken_and_repro_takes_a_distributed_module_name() -> None:
    assert PARSER.parse_args(["report", "--impl", "eager"]).impl == ["eager"]
    spec = "numcheck.impls.registry:vocab_parallel[nan]"  # as a distributed failure's repro line names its impl
    assert PARSER.parse_args(["repro", *REQUIRED["repro"], "--impl", spec]).impl == spec
