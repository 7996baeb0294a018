"""``numcheck repro``: the one-line command every failure prints reruns exactly that property on that case,
prints PASS or the failure, and exits 0 / 1 (2 for bad arguments)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from numcheck.errors import PropertyFailure
from numcheck.reports import cli
from numcheck.reports.repro import parse_case

PLAIN = "Problem(N=5, H=4, V=7, dtype='float32', seed=3)"

MUTANT = '''
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import linear_ce_impl

@linear_ce_impl(name="repro_loss_off", dtypes=("float32",), autocast=(), options=("bias", "ignore_index"),
                logits_dtype="float32")
def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    """Correct except that the loss is 0.1% too large."""
    loss = F.cross_entropy(F.linear(x, weight, bias).float(), target, reduction=reduction, ignore_index=ignore_index)
    return loss * 1.001
'''


@pytest.fixture
def mutant(tmp_path, monkeypatch) -> str:
    (tmp_path / "repro_mutant.py").write_text(MUTANT)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "repro_mutant:impl"


def test_passing_case_prints_pass(capsys):
    """A property that holds prints PASS and exits 0."""
    assert cli.main(["repro", "--impl", "eager", "--property", "accuracy", "--problem", PLAIN]) == 0
    assert capsys.readouterr().out.startswith("PASS")


def test_failing_case_prints_the_failure_and_exits_1(mutant, monkeypatch, capsys):
    """An outside impl with a 0.1% loss error fails accuracy: FAIL, the failure text, exit 1 (by spec or by name)."""
    assert cli.main(["repro", "--impl", mutant, "--property", "accuracy", "--problem", PLAIN]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "repro_loss_off" in out and "loss" in out and "bound" in out
    monkeypatch.setenv("NUMCHECK_IMPLS", mutant)
    assert cli.main(["repro", "--impl", "repro_loss_off", "--property", "accuracy", "--problem", PLAIN]) == 1


def test_printed_repro_command_round_trips(mutant, monkeypatch, capsys):
    """The command in a property failure, run as printed (env prefix included), reproduces the failure."""
    from numcheck.impls.registry import discover
    from numcheck.properties.linear_ce import props
    from numcheck.properties.linear_ce.cases import Problem

    impl = [e.impl for e in discover([mutant])][0]
    with pytest.raises(PropertyFailure) as info:
        props.accuracy(impl, Problem(N=6, H=3, V=5, seed=11))
    line = str(info.value).split("reproduce: ", 1)[1].strip()
    words = shlex.split(line)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    argv = words
    assert argv[:2] == ["numcheck", "repro"], f"unexpected repro command {line!r}"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(argv[1:]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_raising_impl_is_a_failure(tmp_path, monkeypatch, capsys):
    """An impl that raises on a declared case fails the property (exit 1), with the exception named."""
    (tmp_path / "repro_raiser.py").write_text(
        "from numcheck.impls.protocols.linear_ce import linear_ce_impl\n"
        "@linear_ce_impl(name='repro_raiser', dtypes=('float32',), autocast=(), options=())\n"
        "def impl(x, w, t, b=None, **kw):\n    raise RuntimeError('kernel launch failed')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["repro", "--impl", "repro_raiser:impl", "--property", "accuracy", "--problem", PLAIN]) == 1
    assert "raised RuntimeError: kernel launch failed" in capsys.readouterr().out


def test_property_suffix_is_stripped():
    """``option_identities[softcap]`` as printed for a sub-check runs the option_identities property."""
    problem = "Problem(N=6, H=4, V=5, dtype='float32', seed=2)"
    assert cli.main(["repro", "--impl", "eager", "--property", "option_identities[softcap]", "--problem", problem]) == 0


def test_quant_case_reruns_an_fp8_property(capsys):
    """A Fp8Case(...) problem runs the FP8 property table."""
    case = "Fp8Case(Fp8Recipe('current'), 8, 40, 16, dtype='bfloat16', bias=True, seed=1)"
    assert cli.main(["repro", "--impl", "fp8_linear[current]", "--property", "accuracy", "--problem", case]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--impl", "eager", "--property", "accuracy", "--problem", "__import__('os').getcwd()"],
            "could not be evaluated",
        ),
        (["--impl", "eager", "--property", "accuracy", "--problem", "Problem(N=0, H=1, V=1)"], "Problem.N"),
        (["--impl", "eager", "--property", "accuracy", "--problem", "(1, 2)"], "must evaluate to a Problem"),
        (["--impl", "eager", "--property", "nonsense", "--problem", PLAIN], "unknown property 'nonsense'"),
        (["--impl", "fp8_linear[current]", "--property", "accuracy", "--problem", PLAIN], "is a fp8-linear impl"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(argv, needle, capsys):
    """Bad expressions (no builtins reachable), unknown impls or properties, or a kind mismatch exit 2 and say why."""
    assert cli.main(["repro", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_an_impl_name_nothing_loads_is_refused_as_the_arguments_are_read(capsys):
    """An --impl that names no loaded impl (built-in, NUMCHECK_IMPLS, entry point) and is no module:attr spec is the
    argument error every command gives (tests/self/reports/test_impl_args.py), naming the spec and the names."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["repro", "--impl", "no_such_impl", "--property", "accuracy", "--problem", PLAIN])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --impl: 'no_such_impl' is neither the name of an impl numcheck" in err
    assert "eager" in err and "package.module:attr" in err


def test_undeclared_case_names_the_reason_and_runs_only_on_request(mutant, capsys):
    """A case outside the impl's declaration exits 2 naming why (the suite never draws it); --undeclared runs it."""
    bf16 = "Problem(N=5, H=4, V=7, dtype='bfloat16', seed=3)"  # the mutant declares float32 only
    assert cli.main(["repro", "--impl", mutant, "--property", "accuracy", "--problem", bf16]) == 2
    err = capsys.readouterr().err
    assert "does not declare this case: dtype torch.bfloat16 not declared" in err and "--undeclared" in err
    assert cli.main(["repro", "--impl", mutant, "--property", "accuracy", "--problem", bf16, "--undeclared"]) in (0, 1)
    assert capsys.readouterr().out.startswith(("PASS", "FAIL"))


def test_repro_reruns_an_impl_given_by_spec_from_the_users_directory(tmp_path):
    """`numcheck repro --impl mymod:impl` run in the user's directory (no checkout, the console script's sys.path:
    the current directory not on it) finds mymod and reproduces the failure (exit 1); so does the printed form
    NUMCHECK_IMPLS=mymod:impl numcheck repro --impl NAME."""
    (tmp_path / "cwd_mutant.py").write_text(MUTANT)
    tree = Path(str(resources.files("numcheck"))).parent
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("NUMCHECK_IMPLS", None)
    problem = "Problem(N=5, H=4, V=7, dtype='float32', seed=3)"
    # -P: the current directory is not put on sys.path, as for an installed console script.
    base = [
        sys.executable,
        "-P",
        "-c",
        "import sys; from numcheck.reports.cli import main; sys.exit(main())",
        "repro",
        "--property",
        "accuracy",
        "--problem",
        problem,
    ]
    proc = subprocess.run(
        base + ["--impl", "cwd_mutant:impl"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("FAIL") and "repro_loss_off" in proc.stdout
    proc = subprocess.run(
        base + ["--impl", "repro_loss_off"],
        cwd=tmp_path,
        env=dict(env, NUMCHECK_IMPLS="cwd_mutant:impl"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr


FP8_SHAPED = '''
import torch.nn.functional as F
from numcheck.impls.protocols.fp8_linear import fp8_linear_impl
from numcheck.impls.protocols.grouped_fp8_linear import grouped_fp8_linear_impl

@fp8_linear_impl(name="repro_fp8_shaped", recipes=("current",), dtypes=("float32",), dim_multiple={"K": 16, "N": 16})
def impl(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
    """Takes only K and N multiples of 16 (unquantized: the property's verdict is not what is tested)."""
    return F.linear(x, weight, bias)


@grouped_fp8_linear_impl(name="repro_grouped_aligned", recipes=("current",), dtypes=("bfloat16",), split_alignment=16)
def grouped(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None, main_grad=None):
    """Takes only expert sizes multiples of 16 (never called here)."""
    raise AssertionError("a refused case must not run")
'''


def test_an_fp8_case_outside_dim_multiple_is_refused_naming_the_field_and_the_fix(tmp_path, monkeypatch, capsys):
    """A pasted Fp8Case outside the impl's dim_multiple exits 2 naming dim_multiple and the case moved into the
    declared shapes (which repro then runs); --undeclared runs the pasted one; a grouped case outside the split rules
    is refused alike."""
    (tmp_path / "repro_fp8_shaped.py").write_text(FP8_SHAPED)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec, case = "repro_fp8_shaped:impl", "Fp8Case(Fp8Recipe('current'), 8, 40, 24, dtype='float32', seed=1)"
    assert cli.main(["repro", "--impl", spec, "--property", "saved_tensors", "--problem", case]) == 2
    err = capsys.readouterr().err
    assert "does not declare this case: K=40, N=24 not a multiple of the declared dim_multiple" in err, err
    fixed = shlex.split(err.split("in the declared shapes the case is --problem ", 1)[1].split(". The suite", 1)[0])[0]
    assert parse_case(fixed) == parse_case(case).replace(K=48, N=32), fixed
    assert cli.main(["repro", "--impl", spec, "--property", "saved_tensors", "--problem", fixed]) in (0, 1)
    assert cli.main(["repro", "--impl", spec, "--property", "saved_tensors", "--problem", case, "--undeclared"]) in (
        0,
        1,
    )
    capsys.readouterr()
    grouped = "GroupedCase(Fp8Recipe('current'), (5, 11), 40, 24, dtype='bfloat16', seed=1)"
    argv = ["repro", "--impl", "repro_fp8_shaped:grouped", "--property", "accuracy", "--problem", grouped]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "sizes [5, 11] are not multiples of split_alignment=16" in err and "(16, 16)" in err, err


def test_dist_case_reruns_a_distributed_property_as_printed(capsys):
    """A distributed mutant's failure (grad_x not all-reduced, P = 2) gives impl spec and DistCase; ``numcheck repro``
    with them prints FAIL and the same failure (exit 1), and on the built-in it replaces, PASS (exit 0)."""
    from numcheck.properties.distributed.linear_ce.cases import DistCase
    from numcheck.properties.distributed.linear_ce.props import dist_accuracy
    from numcheck.properties.linear_ce.cases import Problem
    from numcheck.tests.self.helpers.dist_mutants import dist_impls

    (mutant,) = [m for m in dist_impls() if "NoGradXAllReduce" in m.name]
    with pytest.raises(PropertyFailure) as info:
        dist_accuracy(mutant, DistCase(Problem(N=6, H=5, V=9, dtype="float32", seed=4), world_size=2))
    printed = str(info.value)
    spec = re.search(r'--impl "([^"]+)"', printed).group(1)
    case = re.search(r"^  case: (DistCase\(.*\))$", printed, re.M).group(1)
    assert cli.main(["repro", "--impl", spec, "--property", "dist_accuracy", "--problem", case]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL\n") and f"property 'dist_accuracy' fails for impl {mutant.name!r}" in out
    assert "grad_x" in out and f"case: {case}" in out
    assert cli.main(["repro", "--impl", "vocab_parallel[nan]", "--property", "dist_accuracy", "--problem", case]) == 0
    assert capsys.readouterr().out.startswith("PASS: property 'dist_accuracy' holds for impl 'vocab_parallel[nan]'")


def test_a_tensor_parallel_fp8_case_outside_the_declaration_is_refused(capsys):
    """A pasted TPFp8Case whose recipe or world size the impl does not declare exits 2 naming the field and what is
    declared (the suite never draws it); a case the constructor refuses names every case type repro takes."""
    case = "TPFp8Case(Fp8Recipe('{}'), 8, 16, 8, 'float32', world={}, parallel='row')"
    argv = ["repro", "--impl", "tp_fp8_linear[delayed]", "--property", "dist_accuracy", "--problem"]
    assert cli.main([*argv, case.format("current", 2)]) == 2
    err = capsys.readouterr().err
    assert "does not declare this case: recipe current-hybrid is not declared (recipes: delayed-hybrid" in err, err
    assert "--undeclared" in err
    assert cli.main([*argv, case.format("delayed", 8)]) == 2
    err = capsys.readouterr().err
    assert "does not declare this case: world size 8 not declared" in err, err
    assert cli.main([*argv, case.format("delayed", 3)]) == 2
    err = capsys.readouterr().err
    assert "is not a multiple of world" in err and "TPFp8Case(...)" in err and "Problem(...)" in err, err
