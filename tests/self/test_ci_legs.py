"""Each check runs once: CI's newest-torch leg runs the whole tree, its oldest-torch leg only the tests marked
``torch_versions`` (``.ci/run``: ``-m torch_versions``), set in the test modules — whole modules
(``pytestmark = pytest.mark.torch_versions(reason=...)``), single tests (the same as a decorator), or the shipped
suite's modules on the impls their ``torch_versions_impls(*names, reason=...)`` names (numcheck's plugin marks
those impls' parametrizations). ``.ci/oldest-leg.md`` lists every test module with what of it the oldest leg runs
and why the rest left that leg; this test keeps the list and the markers in step, so a selection cannot drift
silently (a new module must be listed; a marker added or dropped must be listed so).

The markers are read from the modules' source (module-level ``pytestmark``, decorators of test functions and
classes), the way pytest applies them; a whole-tree collection would cost minutes on CI's two cores.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
LIST = ROOT / ".ci" / "oldest-leg.md"
RUN = ROOT / ".ci" / "run"
MARK, IMPLS_MARK = "torch_versions", "torch_versions_impls"

pytestmark = pytest.mark.skipif(not LIST.is_file(), reason=".ci/ is in the checkout, not in the wheel")


def _marks(node: ast.AST) -> list[ast.Call | ast.Attribute]:
    """The ``pytest.mark.torch_versions[_impls]`` expressions (called or not) inside ``node``."""
    names = (MARK, IMPLS_MARK)
    calls = [s for s in ast.walk(node) if isinstance(s, ast.Call) and getattr(s.func, "attr", None) in names]
    called = {id(c.func) for c in calls}
    bare = [s for s in ast.walk(node) if isinstance(s, ast.Attribute) and s.attr in names and id(s) not in called]
    return [*calls, *bare]


def _name(mark: ast.Call | ast.Attribute) -> str:
    return (mark.func if isinstance(mark, ast.Call) else mark).attr


def _reason(mark: ast.Call | ast.Attribute) -> str:
    kw = {k.arg: k.value for k in mark.keywords} if isinstance(mark, ast.Call) else {}
    value = kw.get("reason")
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else ""


def marked(path: Path) -> tuple[str, list[str]]:
    """What of a test module the oldest leg runs, from its markers: ``("all", [])``, ``("impls", names)``,
    ``("some", test names)`` or ``("none", [])``. A marker without a ``reason=`` is an error."""
    tree = ast.parse(path.read_text(), str(path))
    module, tests = [], []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            module += _marks(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if any(_marks(d) for d in node.decorator_list):
                tests.append(node.name)
                own = [m for d in node.decorator_list for m in _marks(d)]
                assert all(_reason(m) for m in own), f"{path.name}::{node.name}: a {MARK} mark needs reason="
    assert all(_reason(m) for m in module), f"{path.name}: its {MARK}/{IMPLS_MARK} pytestmark needs reason="
    if any(_name(m) == MARK for m in module):
        return "all", []
    impls = [m for m in module if _name(m) == IMPLS_MARK]
    if impls:
        return "impls", [a.value for m in impls if isinstance(m, ast.Call) for a in m.args]
    return ("some", tests) if tests else ("none", [])


def listed() -> dict[str, tuple[str, str, str]]:
    """``.ci/oldest-leg.md``'s rows: module → (what runs in the oldest leg, its detail, why the rest left)."""
    rows = {}
    for line in LIST.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("test_"):
            what, _, detail = cells[1].partition(":")
            assert cells[0] not in rows, f".ci/oldest-leg.md lists {cells[0]} twice"
            rows[cells[0]] = (what.strip(), detail.strip(), cells[2])
    return rows


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for p in sorted(TESTS.rglob("test_*.py")):
        assert p.stem not in found, f"two test modules named {p.stem}: {found[p.stem]} and {p}"
        found[p.stem] = p
    return found


def test_every_module_is_listed_with_what_the_oldest_leg_runs() -> None:
    modules, rows = _modules(), listed()
    assert not (missing := sorted(set(modules) - set(rows))), (
        f"{missing}: not in .ci/oldest-leg.md; add each with what CI's oldest-torch leg runs of it (its "
        f"{MARK} markers) and why the rest runs on the newest torch only"
    )
    assert not (gone := sorted(set(rows) - set(modules))), f".ci/oldest-leg.md lists {gone}, which no longer exist"
    wrong = []
    for stem, path in modules.items():
        what, names = marked(path)
        row_what, row_detail, why = rows[stem]
        row_names = [n.strip() for n in row_detail.split(",")] if row_detail else []
        if (what, sorted(names)) != (row_what, sorted(row_names)):
            wrong.append(
                f"{stem}: markers say {what}{': ' + ', '.join(names) if names else ''}; the list says "
                f"{row_what}{': ' + row_detail if row_detail else ''}"
            )
        elif what != "all" and not why:
            wrong.append(f"{stem}: the list gives no reason why its tests left the oldest leg")
    assert not wrong, "markers and .ci/oldest-leg.md disagree:\n" + "\n".join(wrong)


def test_legs_select_by_the_marker_and_the_newest_runs_everything() -> None:
    """The newest leg deselects nothing (every mutant and strict known-divergence check runs there); the oldest
    leg runs ``-m torch_versions``, never a list of paths."""
    text = RUN.read_text()
    newest = re.search(r'^leg "\$TORCH_NEWEST" (.*)$', text, re.M)
    oldest = re.search(r'^leg "\$TORCH_OLDEST" (.*)$', text, re.M)
    assert newest and oldest, ".ci/run: no leg line for TORCH_NEWEST or TORCH_OLDEST"
    assert newest.group(1).split() == [".venv", '"$LEG_LIMIT_NEWEST"'], f"newest leg deselects: {newest.group(0)}"
    assert oldest.group(1).split()[2:] == ["-m", MARK], f"oldest leg is not -m {MARK}: {oldest.group(0)}"


def test_a_module_without_markers_reads_as_none(tmp_path: Path) -> None:
    """The reader itself: module-level, per-test and per-impl markers each read as such."""
    cases = {
        "none": "import pytest\n\ndef test_a():\n    pass\n",
        "all": 'import pytest\npytestmark = [pytest.mark.x, pytest.mark.torch_versions(reason="r")]\n',
        "some": 'import pytest\n\n@pytest.mark.torch_versions(reason="r")\ndef test_a():\n    pass\n',
        "impls": 'import pytest\npytestmark = pytest.mark.torch_versions_impls("a[b]", reason="r")\n',
    }
    for want, src in cases.items():
        (tmp_path / "test_m.py").write_text(src)
        assert marked(tmp_path / "test_m.py")[0] == want, (want, marked(tmp_path / "test_m.py"))
    (tmp_path / "test_m.py").write_text("import pytest\npytestmark = pytest.mark.torch_versions\n")
    with pytest.raises(AssertionError, match="needs reason="):
        marked(tmp_path / "test_m.py")
