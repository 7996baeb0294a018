"""Output folders numcheck is given are created when missing, or refused with one clear error before any test runs:
``NUMCHECK_DRAWN_LOG=DIR`` (:mod:`numcheck.properties.core.drawn_log`; a missing DIR once failed every drawn test
with FileNotFoundError) and ``--numcheck-record DIR`` (:mod:`numcheck.properties.core.records`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from numcheck.properties.core import drawn_log, records

REPO = Path(__file__).resolve().parents[3]


def test_drawn_log_folder_is_created_when_missing(tmp_path, monkeypatch):
    """A drawn example logged into a folder that does not exist yet creates it (and its parents) and writes its line."""
    folder = tmp_path / "not" / "yet"
    monkeypatch.setenv(drawn_log.DRAWN_LOG_ENV, str(folder))
    drawn_log.log_example("test_x", SimpleNamespace(name="eager"), ["1"])
    (written,) = folder.glob("drawn-*.jsonl")
    assert json.loads(written.read_text()) == {"test": "test_x", "impl": "eager", "drawn": ["1"]}


def test_drawn_log_naming_a_file_is_one_clear_error(tmp_path, monkeypatch):
    """``NUMCHECK_DRAWN_LOG`` naming a file (or a folder under one) is refused naming the variable and the value."""
    afile = tmp_path / "afile"
    afile.write_text("")
    for value in (afile, afile / "sub"):
        monkeypatch.setenv(drawn_log.DRAWN_LOG_ENV, str(value))
        with pytest.raises(drawn_log.DrawnLogError, match=f"NUMCHECK_DRAWN_LOG={value}: cannot create"):
            drawn_log.log_folder()


def test_record_folder_is_created_when_missing_or_refused(tmp_path):
    """``records.start`` creates the record file's folder at once; under a file it raises ValueError naming
    ``--numcheck-record`` and the folder, and records nothing."""
    try:
        records.start(tmp_path / "a" / "b" / "records-main.jsonl")
        assert (tmp_path / "a" / "b").is_dir()
    finally:
        records.stop()
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match="--numcheck-record .*afile.*cannot create"):
        records.start(tmp_path / "afile" / "records-main.jsonl")
    assert not records.recording()


@pytest.mark.parametrize("how", ["env", "option"])
def test_a_bad_output_folder_stops_pytest_before_any_test(tmp_path, how):
    """With ``NUMCHECK_DRAWN_LOG`` or ``--numcheck-record`` under a file, pytest (numcheck's plugin loaded) exits
    with a usage error naming it, once, and runs no test; a missing folder is created and the run passes."""
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    afile = tmp_path / "afile"
    afile.write_text("")

    def run(folder: Path) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop(drawn_log.DRAWN_LOG_ENV, None)
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        if how == "env":
            env[drawn_log.DRAWN_LOG_ENV] = str(folder)
        else:
            args.append(f"--numcheck-record={folder}")
        return subprocess.run(
            [*args, "test_one.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    bad = run(afile / "log")
    text = bad.stdout + bad.stderr
    assert bad.returncode == 4, text
    assert text.count("cannot create that folder") == 1 and str(afile) in text and "1 passed" not in text, text
    good = run(tmp_path / "new" / "log")
    assert good.returncode == 0 and (tmp_path / "new" / "log").is_dir(), good.stdout + good.stderr


def _parsed(module, argv: list[str]):
    """``argv`` parsed by ``module``'s own arguments (the command line as ``numcheck`` would give it)."""
    import argparse

    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return p.parse_args(argv)


def test_command_out_folders_are_created_or_refused_before_running(tmp_path, capsys):
    """``--out`` of ``bench``, ``converge`` and ``sweep``: a missing folder is created at once; one under a file is
    refused (exit 2, or BadInput) naming ``--out`` and the folder, before anything runs (bench would need CUDA,
    converge would load and train every impl first)."""
    from numcheck.errors import BadInput
    from numcheck.reports import bench
    from numcheck.reports.common import prepare_out_dir
    from numcheck.reports.convergence import command as converge
    from numcheck.reports.sweep import command as sweep

    afile = tmp_path / "afile"
    afile.write_text("")
    assert prepare_out_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    for module in (bench, converge):
        assert module.run(_parsed(module, ["--impl", "eager", "--out", str(afile / "x")])) == 2
        said = capsys.readouterr()
        assert f"--out {afile / 'x'}: cannot create that folder" in said.out + said.err, said
    with pytest.raises(BadInput, match=f"--out {afile / 'x'}: cannot create"):
        sweep._out_dir(_parsed(sweep, ["--out", str(afile / "x")]))
    assert sweep._out_dir(_parsed(sweep, ["--out", str(tmp_path / "s" / "t")])).is_dir()
