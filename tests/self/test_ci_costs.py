"""The function of every test (one parametrization) over ``COSTLY_S`` seconds in some leg of the committed cost
table (``results/ci-costs.md``, ``.ci/costs.py``'s output for a CI run) carries ``@pytest.mark.costly(reason=...)``,
and no other function does: what a test costs, and why, is said where it is written. Checked against the committed table,
never against a live timing (this machine's load would decide the verdict).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "results" / "ci-costs.md"
COSTS = ROOT / ".ci" / "costs.py"

pytestmark = pytest.mark.skipif(not TABLE.is_file(), reason="results/ is in the checkout, not in the wheel")


def _threshold() -> float:
    """``.ci/costs.py``'s :data:`COSTLY_S` (one number for the table's title and this check)."""
    spec = importlib.util.spec_from_file_location("_ci_costs", COSTS)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return float(mod.COSTLY_S)


def costly_in_table(threshold: float) -> dict[tuple[str, str], float]:
    """(module, test function) → the most seconds one of its tests (one parametrization) took in any leg, for the
    functions with a test over ``threshold``."""
    text = TABLE.read_text()
    head = "## Every test at or over"
    assert head in text, f"{TABLE}: no '{head} ...' section; regenerate it with .ci/costs.py"
    out: dict[tuple[str, str], float] = {}
    for line in text.split(head, 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("test_"):
            continue
        secs = max((float(c.split()[0]) for c in cells[2:] if c[:1].isdigit()), default=0.0)
        key = (cells[0], cells[1].split("[", 1)[0])
        if secs > threshold:
            out[key] = max(secs, out.get(key, 0.0))
    return out


def costly_marked(path: Path) -> dict[str, str]:
    """Test function (``Class.test`` in a class) → its ``costly`` marker's reason ("" without one)."""
    found: dict[str, str] = {}

    def visit(nodes: list[ast.stmt], prefix: str) -> None:
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in node.decorator_list:
                call = dec if isinstance(dec, ast.Call) else None
                target = call.func if call else dec
                if isinstance(target, ast.Attribute) and target.attr == "costly":
                    kw = {k.arg: k.value for k in call.keywords} if call else {}
                    reason = kw.get("reason")
                    found[prefix + node.name] = reason.value if isinstance(reason, ast.Constant) else ""

    visit(ast.parse(path.read_text(), str(path)).body, "")
    return found


def test_costly_markers_match_the_committed_cost_table() -> None:
    threshold = _threshold()
    table = costly_in_table(threshold)
    modules = {p.stem: p for p in (ROOT / "tests").rglob("test_*.py")}
    marked = {(m, f): r for m, p in modules.items() for f, r in costly_marked(p).items()}
    unmarked = [f"{m}::{f} ({s:.0f} s)" for (m, f), s in sorted(table.items()) if (m, f) not in marked]
    no_reason = [f"{m}::{f}" for (m, f), r in sorted(marked.items()) if not r.strip()]
    stale = [f"{m}::{f}" for (m, f) in sorted(marked) if (m, f) not in table]
    problems = []
    if unmarked:
        problems.append(
            f"over {threshold:g} s in {TABLE.relative_to(ROOT)} without @pytest.mark.costly(reason=...): "
            + ", ".join(unmarked)
        )
    if no_reason:
        problems.append("costly without a reason=: " + ", ".join(no_reason))
    if stale:
        problems.append(
            f"marked costly but not over {threshold:g} s in {TABLE.relative_to(ROOT)} (made cheaper? drop the "
            f"marker, or regenerate the table with .ci/costs.py): " + ", ".join(stale)
        )
    assert not problems, "\n".join(problems)
