"""Names renamed in numcheck 0.2.0 (issue 45 item 6; CHANGELOG.md) still work until 0.3.0 and warn once per process
naming the new one: ``numcheck.<old>`` attributes, hand-built impls' and old reports' kind names, the plugin's old
fixtures; an old and a new name given together are one error naming both.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import numcheck
from numcheck import errors
from numcheck.impls.protocols.kinds import KINDS, NAMES
from numcheck.impls.registry import BrokenImpl, ImplEntry, validate
from numcheck.reports.report import schema
from numcheck.tests import plugin


@pytest.fixture
def fresh_warnings(monkeypatch):
    """A process in which no old name has warned yet."""
    monkeypatch.setattr(errors, "_WARNED", set(), raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


def _renamed_messages(seen) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, errors.RenamedWarning)]


def test_no_kind_is_a_module_fixture_or_builtin_name():
    """A kind's name is never a Python identifier (so never a module, fixture or attribute name), nor a built-in
    impl's name."""
    from numcheck.impls.registry import discover

    builtins = {e.name for e in discover([]) if isinstance(e, ImplEntry)}
    for name in NAMES:
        assert not name.isidentifier() and name not in builtins, name


def test_old_public_names_resolve_and_warn_once(fresh_warnings):
    """Every public name renamed in 0.2.0 is the new object under its old name, with one warning per name naming
    both, and is not listed by ``dir(numcheck)``."""
    renamed = {**numcheck._RENAMED, **{o: n for k in KINDS for o, n in k.renamed}}
    assert {"quant_linear_impl", "QuantLinearSupport", "assert_quant_linear", "QuantCase"} <= set(renamed)
    for old, new in renamed.items():
        assert getattr(numcheck, old) is getattr(numcheck, new), old
        assert getattr(numcheck, old) is getattr(numcheck, new), old
        assert old not in dir(numcheck) and new in numcheck.__all__
    msgs = _renamed_messages(fresh_warnings)
    assert len(msgs) == len(renamed), msgs
    assert "'quant_linear_impl' was renamed 'fp8_linear_impl'" in "\n".join(msgs)


def test_hand_built_impl_with_an_old_kind_loads_and_warns(fresh_warnings):
    """An impl object written against 0.1 (``kind = "quant_linear"``) validates as today's kind, warning once."""
    good = numcheck.fp8_linear_impl(name="renamed_probe", recipes=("current",))(lambda x, w, b=None, **k: x @ w.T)
    old = type(
        "Old",
        (),
        {
            "name": "old_probe",
            "kind": "quant_linear",
            "support": good.support,
            "__call__": lambda self, x, w, b=None, **k: x @ w.T,
        },
    )()
    validate(old, "--impl old")
    assert old.kind == "fp8-linear"
    assert _renamed_messages(fresh_warnings) == [
        "numcheck: the impl kind 'quant_linear' was renamed 'fp8-linear' in numcheck 0.2.0; the old name works "
        "until 0.3.0"
    ]
    assert not isinstance(old, BrokenImpl)


def _old_report(tmp_path: Path, version: str) -> Path:
    case = "QuantCase(Fp8Recipe('current'), M=4, K=8, N=8, dtype='bfloat16', bias=True, seed=1)"
    data = {
        "schema": f"numcheck-report/{version}",
        "environment": {},
        "impls": [{"name": "q", "kind": "quant_linear", "status": "ran"}],
        "cases": [
            {
                "impl": "q",
                "kind": "quant_linear",
                "case": case,
                "label": "l",
                "status": "pass",
                "verdicts": {},
                "repro": f'numcheck repro --impl q --problem "{case}"',
            },
            {
                "impl": "q",
                "kind": "tp_quant_linear",
                "case": "TPQuantCase(1)",
                "label": "t",
                "status": "pass",
                "verdicts": {},
            },
        ],
    }
    path = tmp_path / f"report-{version}.json"
    path.write_text(json.dumps(data))
    return path


def test_old_report_gets_todays_kind_and_case_names(tmp_path, fresh_warnings):
    """A ``/2`` report (before 0.2.0) loads with today's kind names and case types, so ``--compare`` keys its cases
    as today's report; a ``/3`` report is read as written."""
    rep = schema.load(_old_report(tmp_path, "2"))
    assert [c["kind"] for c in rep["cases"]] == ["fp8-linear", "tp-fp8-linear"] and rep["impls"][0][
        "kind"
    ] == "fp8-linear"
    assert rep["cases"][0]["case"].startswith("Fp8Case(Fp8Recipe('current')") and "Fp8Case(" in rep["cases"][0]["repro"]
    assert rep["cases"][1]["case"] == "TPFp8Case(1)"
    assert len(_renamed_messages(fresh_warnings)) == 2  # one per old kind name, not per record
    assert schema.SCHEMA == "numcheck-report/3"
    new = schema.load(_old_report(tmp_path, "3"))
    assert new["cases"][0]["kind"] == "quant_linear"  # unknown to /3: left as written


def test_plugin_former_fixtures_match_the_kinds():
    """The plugin's table of old fixture names (spelled there: it imports no torch) is the kinds' descriptors'."""
    from numcheck.impls.protocols.kinds import FORMER

    assert plugin._FORMER_FIXTURES == {k.former_fixture: k.fixture for k in KINDS if k.former_fixture}
    # Every renamed kind is a kind; a kind added after 0.2.0 (linear-distill, linear-preference) has no former name.
    assert set(FORMER.values()) <= set(NAMES) and len(FORMER) == 5


OLD_FIXTURE_TEST = """
def test_old(quant_impl):
    assert quant_impl.kind == "fp8-linear"
"""
BOTH_FIXTURES_TEST = """
def test_both(quant_impl, fp8_linear_impl):
    pass
"""


def _pytest(tmp_path: Path, source: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_user.py").write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "test_user.py",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-q",
            "--impl",
            "fp8_linear[current]",
            "-W",
            "always::FutureWarning",
            *extra,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_old_fixture_is_parametrized_and_warns(tmp_path):
    """A user's test taking ``quant_impl`` runs on the FP8 impls as ``fp8_linear_impl`` does, with the warning."""
    r = _pytest(tmp_path, OLD_FIXTURE_TEST)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "1 passed" in out, out
    assert "'quant_impl' was renamed 'fp8_linear_impl'" in out, out


def test_old_and_new_fixture_together_is_one_error(tmp_path):
    """A test taking the same impl fixture by both names is one collection error naming both."""
    r = _pytest(tmp_path, BOTH_FIXTURES_TEST)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "1 error" in out, out
    # one collection error naming both (pytest's short summary, with -r, repeats that error's line: not a second cause)
    assert out.count("ERROR collecting") == 1, out
    assert "both the pytest fixture 'fp8_linear_impl' and its old name 'quant_impl' are given" in out, out


PRODUCTION_MARKED_TEST = """
import pytest


@pytest.mark.numcheck_production
def test_tier():
    pass


def test_other():
    pass
"""


def test_old_production_marker_selects_the_tier_and_warns(tmp_path):
    """``-m numcheck_scale`` (the marker before 0.2.0) selects the production tests, not nothing, with the warning;
    naming it with its new name is one usage error naming both."""
    r = _pytest(tmp_path, PRODUCTION_MARKED_TEST, "-m", "numcheck_scale")
    out = r.stdout + r.stderr
    assert "1 deselected" in out and "1 skipped" in out, out  # test_tier kept (skipped: no --numcheck-production)
    assert "'numcheck_scale' was renamed 'numcheck_production'" in out, out
    r = _pytest(tmp_path, PRODUCTION_MARKED_TEST, "-m", "numcheck_scale or numcheck_production")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "both the pytest marker 'numcheck_production' and its old name 'numcheck_scale' are given" in out, out


def test_production_shapes_env_old_name_warns_and_both_is_one_error(fresh_warnings):
    """``NUMCHECK_SCALE_SHAPES`` (before 0.2.0) still picks the tier's shapes, warning; with
    ``NUMCHECK_PRODUCTION_SHAPES`` too it is one error naming both."""
    from numcheck.properties.production.tier import env_shapes

    assert env_shapes({}) == "production" and env_shapes({"NUMCHECK_PRODUCTION_SHAPES": "smoke"}) == "smoke"
    assert env_shapes({"NUMCHECK_SCALE_SHAPES": "smoke"}) == "smoke"
    assert _renamed_messages(fresh_warnings) == [
        "numcheck: the environment variable 'NUMCHECK_SCALE_SHAPES' was renamed 'NUMCHECK_PRODUCTION_SHAPES' in "
        "numcheck 0.2.0; the old name works until 0.3.0"
    ]
    with pytest.raises(errors.BadInput, match="'NUMCHECK_PRODUCTION_SHAPES' and its old name 'NUMCHECK_SCALE_SHAPES'"):
        env_shapes({"NUMCHECK_SCALE_SHAPES": "smoke", "NUMCHECK_PRODUCTION_SHAPES": "smoke"})


def _production_json(path: Path) -> Path:
    path.write_text(json.dumps({"meta": {}, "cases": [], "records": []}))
    return path


def test_include_scale_and_scale_json_still_read(tmp_path, fresh_warnings):
    """``numcheck report --include-scale scale.json`` (0.1's option and output name) includes the tier as
    ``--include-production production.json`` does, warning for each old name; both options is one error."""
    import argparse

    from numcheck.reports.report.command import _production_section

    new = _production_section(argparse.Namespace(include_production=_production_json(tmp_path / "production.json")))
    old = _production_section(
        argparse.Namespace(include_production=None, include_scale=_production_json(tmp_path / "scale.json"))
    )
    assert new == old and "Totals" in new
    msgs = "\n".join(_renamed_messages(fresh_warnings))
    assert "'--include-scale' was renamed '--include-production'" in msgs and "'scale.json' was renamed" in msgs
    both = argparse.Namespace(include_production=tmp_path / "production.json", include_scale=tmp_path / "scale.json")
    with pytest.raises(errors.BadInput, match="'--include-production' and its old name '--include-scale'"):
        _production_section(both)


def test_scale_command_warns(monkeypatch, fresh_warnings):
    """The ``scale`` command (the tier's name before ``production``) runs the tier, warning."""
    from numcheck.reports import cli

    ran = []
    monkeypatch.setattr(cli.common, "execute", lambda mod, args, measuring: ran.append(mod.__name__) or 0)
    assert cli.main(["scale", "--shapes", "smoke"]) == 0 and ran == ["numcheck.reports.production.command"]
    assert "'scale' was renamed 'production'" in "\n".join(_renamed_messages(fresh_warnings))


OPTION_TEST = """
def test_option(request):
    assert request.config.getoption("--numcheck-production")
"""


def test_numcheck_scale_option_sets_production_and_warns(tmp_path):
    """``--numcheck-scale`` (before 0.2.0) turns the production tier on, warning; with ``--numcheck-production`` it
    is one usage error naming both."""
    (tmp_path / "test_opt.py").write_text(OPTION_TEST)
    base = [sys.executable, "-m", "pytest", "test_opt.py", "-p", "no:cacheprovider", "-n", "0", "-q"]
    r = subprocess.run([*base, "--numcheck-scale"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "1 passed" in out and "'--numcheck-scale' was renamed" in out, out
    both = [*base, "--numcheck-scale", "--numcheck-production"]
    r = subprocess.run(both, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 4 and out.count("'--numcheck-production' and its old name '--numcheck-scale'") == 1, out


def test_shipped_baselines_read_through_the_renames_without_a_warning(fresh_warnings):
    """numcheck's own baselines (``/2``, made before 0.2.0, not regenerated) load with today's kind names and case
    types, and without a warning: nothing a user could rename."""
    from numcheck.reports.baselines import shipped_baselines

    for path in shipped_baselines():
        rep = schema.load(path)
        assert {c["kind"] for c in rep["cases"]} <= set(NAMES), path
        assert not any(c["case"].startswith(("QuantCase(", "TPQuantCase(")) for c in rep["cases"]), path
    assert _renamed_messages(fresh_warnings) == []


def test_old_names_import_from_their_protocol_module(fresh_warnings):
    """``from numcheck.impls.protocols.fp8_linear import QuantLinearSupport`` (0.1's import) gives the new class,
    warning once; a name that never existed is still an ImportError."""
    from numcheck.impls.protocols import fp8_linear, grouped_fp8_linear, tp_fp8_linear
    from numcheck.impls.protocols.fp8_linear import QuantLinearSupport

    assert QuantLinearSupport is fp8_linear.Fp8LinearSupport
    assert grouped_fp8_linear.grouped_quant_linear_impl is grouped_fp8_linear.grouped_fp8_linear_impl
    assert tp_fp8_linear.TPQuantSupport is tp_fp8_linear.TPFp8Support
    assert len(_renamed_messages(fresh_warnings)) == 3
    with pytest.raises(ImportError):
        from numcheck.impls.protocols.fp8_linear import NoSuchName  # noqa: F401
