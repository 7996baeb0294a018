"""``numcheck versions``: reports of different torch releases compared per device — probes that differ, impl
status, cases whose verdicts differ — and every committed report says which torch made it.

Synthetic reports carry only the fields the comparison reads. Cost: well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numcheck.reports import versions
from numcheck.reports.cli import main
from numcheck.reports.report.schema import REPO, SCHEMA, load


def _report(
    torch_v: str,
    *,
    device: str = "cpu",
    caps: dict | None = None,
    impls: list | None = None,
    cases: list | None = None,
    commit: str = "abc",
) -> dict:
    return {
        "schema": SCHEMA,
        "environment": {
            "device": device,
            "device_name": f"{device}-box",
            "torch": torch_v,
            "git_commit": commit,
            "capabilities": caps if caps is not None else {"linear_cross_entropy": True},
        },
        "grid": {"name": "quick"},
        "impls": impls if impls is not None else [{"name": "a", "status": "ran"}],
        "cases": cases if cases is not None else [],
    }


def _case(impl: str, case: str, ok: bool, status: str | None = None) -> dict:
    return {
        "impl": impl,
        "case": case,
        "label": case,
        "status": status or ("pass" if ok else "fail"),
        "verdicts": {"analytic": ok, "relative": True},
        "ratio_hard": 0.5 if ok else 3.0,
    }


def _write(tmp_path: Path, name: str, report: dict) -> Path:
    p = tmp_path / name / "report.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(report))
    return p


def test_verdict_flip_is_listed_and_check_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A case that passes under one release and fails under another is listed with both verdicts, and
    --check exits 1; with equal verdicts it exits 0."""
    old = _write(tmp_path, "old", _report("2.6.0+cu124", cases=[_case("a", "P(1)", True), _case("a", "P(2)", True)]))
    new = _write(tmp_path, "new", _report("2.13.0+cpu", cases=[_case("a", "P(1)", True), _case("a", "P(2)", False)]))
    (cmp,) = versions.compare_paths([new, old])
    assert [r.torch for r in cmp.releases] == ["2.6.0+cu124", "2.13.0+cpu"], "releases must be ordered numerically"
    assert [(i, c) for i, c, _ in cmp.verdict_diffs] == [("a", "P(2)")]
    assert cmp.verdict_diffs[0][2][0].startswith("pass") and cmp.verdict_diffs[0][2][1].startswith("fail (analytic)")
    assert main(["versions", "--check", str(old), str(new)]) == 1
    assert "`P(2)`" in capsys.readouterr().out
    same = _write(tmp_path, "same", _report("2.13.0+cpu", cases=[_case("a", "P(1)", True), _case("a", "P(2)", True)]))
    assert main(["versions", "--check", str(old), str(same)]) == 0


def test_capabilities_impls_and_coverage(tmp_path: Path) -> None:
    """Only probes whose answers differ are listed; an impl unavailable under one release shows its reason
    there and its pass count elsewhere; cases run under one release only are counted, not compared."""
    old = _report(
        "2.6.0",
        caps={"linear_cross_entropy": False, "autocast": True},
        impls=[{"name": "a", "status": "ran"}, {"name": "n", "status": "unavailable", "reason": "needs F.lce"}],
        cases=[_case("a", "P(1)", True)],
    )
    new = _report(
        "2.13.0",
        caps={"linear_cross_entropy": True, "autocast": True},
        impls=[{"name": "a", "status": "ran"}, {"name": "n", "status": "ran"}],
        cases=[_case("a", "P(1)", True), _case("n", "P(1)", False)],
    )
    cmp = versions.compare([versions.Release(Path("new"), "2.13.0", new), versions.Release(Path("old"), "2.6.0", old)])
    assert cmp.capabilities == {"linear_cross_entropy": [False, True]}
    assert cmp.impls["n"] == ["unavailable: needs F.lce", "ran: 0/1 pass"]
    assert cmp.impls["a"] == ["ran: 1/1 pass", "ran: 1/1 pass"]
    assert cmp.verdict_diffs == [] and cmp.only_in == [0, 1]


def test_devices_are_not_mixed(tmp_path: Path) -> None:
    """A CPU report and a CUDA report are compared within their own device only."""
    a = _write(tmp_path, "cpu", _report("2.6.0", cases=[_case("a", "P(1)", True)]))
    b = _write(tmp_path, "gpu", _report("2.13.0", device="cuda", cases=[_case("a", "P(1)", False)]))
    cmps = versions.compare_paths([a, b])
    assert len(cmps) == 2 and all(c.verdict_diffs == [] for c in cmps)


def test_report_without_torch_is_an_error(tmp_path: Path) -> None:
    """A report whose environment does not name its torch is rejected with a ValueError naming the file."""
    r = _report("2.6.0")
    del r["environment"]["torch"]
    p = _write(tmp_path, "x", r)
    with pytest.raises(ValueError, match=r"x/report.json.*environment.torch"):
        versions.compare_paths([p])
    with pytest.raises(ValueError, match="torch_version"):
        versions.release_key("")


def test_committed_reports_record_their_torch() -> None:
    """Every committed report.json names the torch that made it, and a reports/<device>-torch<X>/ directory
    holds a report made by torch X (X may name only the leading components: torch2.11 holds 2.11.0)."""
    paths = versions.committed_reports()
    if not paths:
        pytest.skip("no committed report.json in this checkout")
    for p in paths:
        env = load(p)["environment"]
        assert env.get("torch"), f"{p.relative_to(REPO)} does not record its torch release"
        m = p.parent.name.rsplit("-torch", 1)
        if len(m) == 2:
            want = m[1].split(".")
            assert env["torch"].split("+", 1)[0].split(".")[: len(want)] == want, (
                f"{p.relative_to(REPO)} sits in a torch{m[1]} directory but was made by torch {env['torch']}"
            )
