"""The every-release tables of the third-party adapters (``docs/evidence/te_releases.txt``,
``docs/evidence/liger_releases.txt``) name the numcheck code their rows were judged by: the content hash of the
adapter's module and its known-divergence module(s), on the table's first line. When that code changes the table
is stale, and this test says which tool to rerun. The hash is of the files' contents only (a move leaves it alone).

CI judges one pinned release of each library; Liger's pin is pyproject.toml's (its extras), and the release its
table's ``installed`` rows ran on is that pin; torchao's pin is pyproject.toml's too, and its table has that
release's row, judged with no failure.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence"
#: Each release table and the tool that writes it (with how to rerun it).
TABLES = {
    "te_releases": "python docs/evidence/te_releases.py DIR --out docs/evidence/te_releases.txt (see its docstring)",
    "liger_releases": "python docs/evidence/liger_releases.py DIR ... installed > docs/evidence/liger_releases.txt",
    "liger_distill_releases": (
        "python docs/evidence/liger_distill_releases.py DIR ... installed > docs/evidence/liger_distill_releases.txt"
    ),
    "liger_preference_releases": (
        "python docs/evidence/liger_preference_releases.py DIR/0.5.0 ... DIR/0.8.4 installed "
        "> docs/evidence/liger_preference_releases.txt (see its docstring)"
    ),
    "torchao_releases": "python docs/evidence/torchao_releases.py DIR > docs/evidence/torchao_releases.txt (see its docstring)",
}

pytestmark = pytest.mark.skipif(not EVIDENCE.is_dir(), reason="docs/evidence/ is in the checkout, not in the wheel")


def _tool(name: str) -> ModuleType:
    """The evidence script ``docs/evidence/<name>.py``, imported from its file (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location(f"_evidence_{name}", EVIDENCE / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _recorded(name: str) -> str:
    first = (EVIDENCE / f"{name}.txt").read_text().splitlines()[0]
    m = re.search(r"adapter code ([0-9a-f]{16})", first)
    assert m, f"docs/evidence/{name}.txt: its first line names no 'adapter code <hash>': rerun {TABLES[name]}"
    return m.group(1)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_release_table_judged_on_the_checkouts_adapter_code(name: str) -> None:
    tool = _tool(name)
    now = tool.adapter_code_hash(tool.ADAPTER_CODE)
    recorded = _recorded(name)
    assert recorded == now, (
        f"docs/evidence/{name}.txt was judged on adapter code {recorded}; the checkout's "
        f"({', '.join(tool.ADAPTER_CODE)}) hashes to {now}: the adapter or its known divergences changed, so the "
        f"table is stale. Rerun {TABLES[name]} and commit the table."
    )


def test_adapter_code_hash_is_of_contents_only(tmp_path: Path) -> None:
    """Moved files hash alike; one changed byte does not."""
    tool = _tool("te_releases")
    moved = []
    for i, rel in enumerate(tool.ADAPTER_CODE):
        dest = tmp_path / f"elsewhere{i}" / f"renamed{i}.py"
        dest.parent.mkdir()
        shutil.copyfile(ROOT / rel, dest)
        moved.append(dest.relative_to(tmp_path).as_posix())
    assert tool.adapter_code_hash(tuple(moved), tmp_path) == tool.adapter_code_hash(tool.ADAPTER_CODE)
    edited = tmp_path / moved[0]
    edited.write_bytes(edited.read_bytes() + b"\n")
    assert tool.adapter_code_hash(tuple(moved), tmp_path) != tool.adapter_code_hash(tool.ADAPTER_CODE)


def test_liger_is_pinned_to_the_release_its_table_judged() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    pins = re.findall(r'"liger-kernel([^"]*)"', text)
    assert pins and all(p.startswith("==") for p in pins), (
        f"pyproject.toml: every liger-kernel requirement must pin one release (==X), found {pins}; CI judges one "
        f"release, and moving the pin regenerates docs/evidence/liger_releases.txt"
    )
    (pin,) = {p[2:] for p in pins}
    table = (EVIDENCE / "liger_releases.txt").read_text()
    assert f"'installed' = {pin}" in table, (
        f"pyproject.toml pins liger-kernel {pin} but docs/evidence/liger_releases.txt's 'installed' rows ran on "
        f"another release: rerun {TABLES['liger_releases']}"
    )


def test_torchao_is_pinned_to_a_release_its_table_judged() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    pins = re.findall(r'"torchao([^"]*)"', text)
    assert pins and all(p.startswith("==") for p in pins), (
        f"pyproject.toml: every torchao requirement must pin one release (==X), found {pins}; CI judges one release"
    )
    (pin,) = {p[2:] for p in pins}
    rows = [ln for ln in (EVIDENCE / "torchao_releases.txt").read_text().splitlines() if ln.startswith(f"| {pin} |")]
    assert rows, (
        f"pyproject.toml pins torchao {pin}, a release docs/evidence/torchao_releases.txt has no row of: rerun {TABLES['torchao_releases']}"
    )
    assert "unavailable" not in rows[0] and "/0/" in rows[0] and "range wrong" not in rows[0], (
        f"docs/evidence/torchao_releases.txt's row of the pinned torchao {pin} is not a clean verdict: {rows[0]}"
    )
