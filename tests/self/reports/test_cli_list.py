"""``numcheck list``: every impl found, where it comes from, what it supports here and why not."""

from __future__ import annotations

import sys
import textwrap
import uuid

import pytest

from numcheck.impls.registry import ENV_VAR, ImplEntry, builtin_impls
from numcheck.reports import cli

CUDA_ONLY_AND_MISSING_PACKAGE = """
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import linear_ce_impl

def _ce(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)

cuda_only = linear_ce_impl(name="cuda_only", devices=("cuda",))(_ce)
needs_pkg = linear_ce_impl(name="needs_pkg", requires=lambda: "package 'fastce' is not installed")(_ce)
plain = linear_ce_impl(name="plain_outside", dtypes=("float32",), options=("bias",), reductions=("mean", "sum"),
                       all_ignored=None, option_combinations_excluded=[("bias", "softcap")])(_ce)
"""


@pytest.fixture
def outside(tmp_path, monkeypatch) -> str:
    """A uniquely named outside module with three impls on sys.path; NUMCHECK_IMPLS cleared."""
    name = f"nc_list_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(CUDA_ONLY_AND_MISSING_PACKAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ENV_VAR, raising=False)
    yield name
    sys.modules.pop(name, None)


def _list(capsys, *args: str) -> tuple[int, str, dict[str, list[str]]]:
    """Run ``numcheck list``; return (exit status, stdout, {impl header name: its indented lines})."""
    rc = cli.main(["list", *args])
    out = capsys.readouterr().out
    blocks: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("# "):  # the Triton mode line
            continue
        if line and not line.startswith(" "):
            current = line.split("  [", 1)[0]
            blocks[current] = [line]
        elif current is not None:
            blocks[current].append(line)
    return rc, out, blocks


def test_lists_every_builtin_with_origin_and_status(capsys, monkeypatch):
    """Without options, every built-in is listed once with 'from built-in' and a 'here:' status line."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    rc, out, blocks = _list(capsys)
    assert rc == 0, out
    for e in builtin_impls():
        assert isinstance(e, ImplEntry)
        assert blocks[e.name][0] == f"{e.name}  [{e.kind}, from built-in]", blocks[e.name]
        assert any(line.startswith("    here: ") for line in blocks[e.name]), blocks[e.name]
    assert "    here: runs" in blocks["eager"]


def test_says_how_triton_kernels_run(capsys):
    """The first line says whether Triton kernels run compiled or under the interpreter (arranged by the CLI)."""
    import torch

    rc, out, _ = _list(capsys, "--impl", "eager")
    first = out.splitlines()[0]
    want = "compiled (CUDA)" if torch.cuda.is_available() else "under Triton's interpreter"
    assert rc == 0 and first.startswith("# Triton kernels") and want in first, out


def test_impl_option_restricts_and_shows_support(capsys, outside):
    """--impl lists only the named impls, with their declared dtypes, options, reductions, convention, exclusions."""
    rc, out, blocks = _list(capsys, "--impl", f"{outside}:plain", "--impl", "eager")
    assert rc == 0, out
    assert list(blocks) == ["plain_outside", "eager"]
    text = "\n".join(blocks["plain_outside"])
    assert "[linear-ce, from --impl]" in text and "here: runs" in text
    assert "dtypes: float32;" in text and "options: bias;" in text and "reductions: mean,sum" in text
    assert "all-ignored mean: None" in text and "excluded combinations: bias+softcap" in text


def test_unsupported_here_gives_the_reason(capsys, outside):
    """An impl that cannot run here says why: an undeclared device, or its requirement check's reason."""
    rc, out, blocks = _list(capsys, "--impl", f"{outside}:cuda_only", "--impl", f"{outside}:needs_pkg")
    assert rc == 0, out
    assert "    here: unsupported — device cpu not declared" in blocks["cuda_only"]
    assert "    here: unsupported — package 'fastce' is not installed" in blocks["needs_pkg"]
    rc, out, blocks = _list(capsys, "--impl", f"{outside}:cuda_only", "--device", "cuda")
    assert "    here: runs" in blocks["cuda_only"]


def test_broken_impl_is_listed_and_fails_the_command(capsys, outside):
    """A spec that does not load is listed as BROKEN with its error; the others are still listed; exit 1."""
    rc, out, blocks = _list(capsys, "--impl", "eager", "--impl", "no_such_module_nc:impl", "--impl", f"{outside}:nope")
    assert rc == 1
    assert blocks["no_such_module_nc:impl"][0] == "no_such_module_nc:impl  [BROKEN, from --impl]"
    assert "error: cannot import module 'no_such_module_nc'" in blocks["no_such_module_nc:impl"][1]
    assert "has no attribute 'nope'" in "\n".join(blocks[f"{outside}:nope"])
    assert "    here: runs" in blocks["eager"]


def test_env_var_impls_are_listed_with_their_origin(capsys, outside, monkeypatch):
    """Impls named in NUMCHECK_IMPLS appear beside the built-ins, marked as coming from the env var."""
    monkeypatch.setenv(ENV_VAR, f"{outside}:plain")
    rc, out, blocks = _list(capsys)
    assert rc == 0, out
    assert blocks["plain_outside"][0] == f"plain_outside  [linear-ce, from ${ENV_VAR}]"
    assert "eager" in blocks


@pytest.mark.torch_versions(reason="the capability probes this torch answers, as `numcheck list --probes` prints them")
def test_probes_are_printed(capsys, monkeypatch):
    """--probes adds every capability probe of the device with yes/no."""
    from numcheck.impls.measure import capabilities

    monkeypatch.delenv(ENV_VAR, raising=False)
    rc, out, _ = _list(capsys, "--impl", "eager", "--probes")
    assert rc == 0 and "capability probes on cpu:" in out
    for name, value in capabilities.summary("cpu").items():
        assert f"    {name}: {'yes' if value else 'no'}" in out


def test_cli_help_and_unknown_command(capsys):
    """`numcheck --help` names the list subcommand; an unknown subcommand is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0 and "list" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        cli.main(["no-such-command"])
    assert info.value.code == 2
