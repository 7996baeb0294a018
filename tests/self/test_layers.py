"""The package reads as its architecture: ``errors → reference → impls → properties → tests → reports``, imports
only go down, no module takes part in an import cycle, inside properties/ each feature family imports only the
core and the families it is built on (:data:`FAMILY_BASES`), and the judge imports nothing it judges: properties/
never imports the built-in impls, nor the adapters except through a family's declared adapter registry
(:data:`JUDGED`, :data:`ADAPTER_REGISTRY`).

A module name given as a string (``python -m numcheck...`` command lines, preload lists, ``module:attr`` specs)
counts as an import of that module, and must name one that exists.

Every import of every module is read from its source (:mod:`ast`, function-level and ``TYPE_CHECKING`` imports
included: an import moved into a function still ties the two modules together). ``numcheck/__init__.py`` (the
public API) may import any layer. numcheck's own test modules (``test_*.py``, ``conftest.py`` and everything under
``numcheck.tests.self`` / ``numcheck.tests.adapters``) sit above the layers: they may import any of them, and
nothing may import them. The shipped suite (``numcheck.tests.suite``) is part of the ``tests`` layer.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numcheck
from numcheck.reports.common import package_folders

#: The layers, lowest first: a module may import its own layer and the ones before it.
LAYERS: tuple[str, ...] = ("errors", "reference", "impls", "properties", "tests", "reports")
#: The feature families of numcheck.properties and the families each may import (its bases). ``assertions`` and
#: ``check`` (the public front of the property library), ``libraries`` (the registry of the adapters' libraries,
#: one line per family's vendor module) and ``suites`` (the registry of the families' suites, one line per family)
#: may import every family.
FAMILY_BASES: dict[str, tuple[str, ...]] = {
    "core": (),
    "linear_ce": ("core",),
    "fp8": ("core",),
    "distributed.pool": ("core",),
    "distributed.linear_ce": ("core", "linear_ce", "distributed.pool"),
    "distributed.tp_fp8": ("core", "distributed.pool", "fp8"),
    "convergence": ("core", "linear_ce"),
    "production": ("core", "linear_ce"),
    "linear_distill": ("core", "linear_ce"),
    "linear_preference": ("core", "linear_ce"),
}
#: The implementations numcheck judges: properties/ imports none of them (a bug in a helper both sides shared would be
#: reproduced on both sides of the comparison); what the judge and the built-ins both need is in
#: numcheck.reference.numerics, and the names of impl modules are the registry's (numcheck.impls.registry).
JUDGED: tuple[str, ...] = ("numcheck.impls.builtin", "numcheck.impls.adapters")
#: A family's declared adapter registry, the one way from properties/ into numcheck.impls.adapters: its known-divergence
#: modules (``known`` or ``known_<vendor>``), which read the release of the adapter whose divergences they record.
ADAPTER_REGISTRY = re.compile(r"^numcheck\.properties\.([a-z0-9_]+\.)*known(_[a-z0-9_]+)?$")
#: The modules of numcheck.properties outside the families that may import every family.
EVERY_FAMILY: tuple[str, ...] = ("assertions", "check", "libraries", "suites")
#: Packages no module of ``properties/core`` (the machinery every family shares) may import: what is judged (the
#: third-party adapters) is named by the families beside their own entries, never by the core.
CORE_FORBIDDEN: tuple[str, ...] = ("numcheck.impls.adapters",)
#: A string naming a numcheck module, optionally with ``:attr`` (a spec) — counted as an import of that module.
MODULE_STRING = re.compile(r"^numcheck(\.[A-Za-z_][A-Za-z0-9_]*)+(:[^\s]+)?$")
#: Subpackages of numcheck.tests that hold numcheck's own tests (never imported by the product).
OWN_TEST_PACKAGES: tuple[str, ...] = ("numcheck.tests.self", "numcheck.tests.adapters")


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} ({self.path}:{self.line})"


def package_modules(root: Path, package: str = "numcheck") -> dict[str, Path]:
    """Every module of ``package`` below ``root`` (its folder), by dotted name. Folders without an ``__init__.py``
    are not packages and are skipped, with everything under them."""
    modules: dict[str, Path] = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        if "__init__.py" not in files:
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        prefix = ".".join((package, *here.relative_to(root).parts))
        for name in sorted(files):
            if name.endswith(".py"):
                modules[prefix if name == "__init__.py" else f"{prefix}.{name[:-3]}"] = here / name
    return modules


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module named by a relative ``from`` import of ``level`` dots inside ``module``."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*base, name] if name else base)


def imports_of(module: str, path: Path, source: str, known: set[str]) -> list[Edge]:
    """The imports of ``module`` (source text ``source``) that name a module of ``known``, anywhere in the file.

    ``from a.b import c`` is an import of ``a.b.c`` when that is a module, else of ``a.b``; ``import a.b.c`` is an
    import of ``a.b.c``. Imports of modules outside ``known`` (torch, the standard library) are left out."""
    tree = ast.parse(source, filename=str(path))
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []

    def add(target: str, node: ast.stmt) -> None:
        while target and target not in known:  # `import numcheck.x.y` where y is an attribute: its module
            target = target.rpartition(".")[0]
        if target and target != module:
            edges.append(Edge(module, target, str(path), node.lineno))

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.match(node.value):
            target = node.value.partition(":")[0]
            while target not in known and "." in target:  # numcheck.x.y.attr: an attribute of module numcheck.x.y
                target = target.rpartition(".")[0]
            if target != module:
                edges.append(Edge(module, target, str(path), node.lineno))
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "numcheck":
                    add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module) if node.level else (node.module or "")
            if base.split(".")[0] != "numcheck":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node)
    return edges


def tree_modules() -> dict[str, Path]:
    """Every module of the imported numcheck, by dotted name, from each folder that holds a part of it (in a checkout
    numcheck/ and the top-level folders: :func:`numcheck.reports.common.package_folders`)."""
    modules: dict[str, Path] = {}
    for package, folder in package_folders().items():
        for name, path in package_modules(folder, package).items():
            modules.setdefault(name, path)  # a wheel's numcheck/ holds its subpackages' folders too
    return modules


def import_graph(modules: dict[str, Path]) -> list[Edge]:
    """Every import between ``modules`` (dotted name: file)."""
    known = set(modules)
    edges: list[Edge] = []
    for name, path in modules.items():
        edges.extend(imports_of(name, path, path.read_text(encoding="utf-8"), known))
    return edges


def layer(module: str) -> int | None:
    """The index of ``module``'s layer in :data:`LAYERS`; ``None`` for the public API (``numcheck`` itself);
    ``len(LAYERS)`` for numcheck's own tests, above every layer."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    if parts[1] == "tests" and (
        parts[-1].startswith("test_")
        or parts[-1] == "conftest"
        or any(module == p or module.startswith(p + ".") for p in OWN_TEST_PACKAGES)
    ):
        return len(LAYERS)
    return LAYERS.index(parts[1])


def upward(edges: list[Edge]) -> list[Edge]:
    """The imports of a higher layer (or of numcheck's own tests) by a lower one; the public API is exempt."""
    out = []
    for e in edges:
        a, b = layer(e.importer), layer(e.imported)
        if a is not None and b is not None and b > a:
            out.append(e)
    return out


def cycles(edges: list[Edge]) -> list[tuple[list[str], list[Edge]]]:
    """Each strongly connected group of modules (Tarjan: every one reaches every other through imports), sorted,
    with one shortest cycle through it as the edges that close it; empty when the imports form a directed
    acyclic graph."""
    succ: dict[str, list[Edge]] = {}
    for e in edges:
        succ.setdefault(e.importer, []).append(e)
        succ.setdefault(e.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # recursion depth is bounded by the number of modules (~100)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in succ[v]:
            w = e.imported
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(succ):
        if v not in index:
            connect(v)
    return [(sorted(group), _cycle_in(group, succ)) for group in groups]


def _cycle_in(group: set[str], succ: dict[str, list[Edge]]) -> list[Edge]:
    """A shortest cycle through the smallest-named module of a strongly connected ``group`` (breadth first)."""
    start = min(group)
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in succ[v]:
                if e.imported not in group:
                    continue
                if e.imported == start:
                    path = [e]
                    while path[0].importer != start:
                        path.insert(0, came[path[0].importer])
                    return path
                if e.imported not in came:
                    came[e.imported] = e
                    nxt.append(e.imported)
        frontier = nxt
    raise AssertionError(f"{sorted(group)} is not strongly connected")  # pragma: no cover - Tarjan's groups are


def _tree_edges() -> list[Edge]:
    return import_graph(tree_modules())


def test_no_import_cycles() -> None:
    """No two numcheck modules import each other, directly or through others (function-level imports count)."""
    found = cycles(_tree_edges())
    assert not found, (
        f"{len(found)} group(s) of modules that import each other; break each cycle by moving what both sides need "
        "into a module below them (an import inside a function does not break a cycle):\n"
        + "\n".join(
            f"  {len(group)} modules: {', '.join(group)}\n  one cycle:\n    " + "\n    ".join(map(str, cyc))
            for group, cyc in found
        )
    )


def test_imports_only_go_down() -> None:
    """No module imports a layer above its own (reference → impls → properties → tests → reports)."""
    bad = upward(_tree_edges())
    assert not bad, (
        f"{len(bad)} upward import(s); a module may import only its own layer and those before it in "
        f"{' → '.join(LAYERS)} (numcheck's own tests and the public API may import any):\n"
        + "\n".join(
            f"  {e}  [{LAYERS[layer(e.importer)] if layer(e.importer) < len(LAYERS) else 'own tests'} imports "
            f"{LAYERS[layer(e.imported)] if layer(e.imported) < len(LAYERS) else 'own tests'}]"
            for e in bad
        )
    )


def family(module: str) -> str | None:
    """The properties family of ``module`` (a key of :data:`FAMILY_BASES`, or one of :data:`EVERY_FAMILY`), or None
    outside numcheck.properties."""
    parts = module.split(".")
    if parts[:2] != ["numcheck", "properties"] or len(parts) < 3:
        return None
    return ".".join(parts[2:4]) if parts[2] == "distributed" and len(parts) > 3 else parts[2]


def across_families(edges: list[Edge]) -> list[Edge]:
    """Imports from one properties family into another that is not among its :data:`FAMILY_BASES`."""
    out = []
    for e in edges:
        a, b = family(e.importer), family(e.imported)
        if a is None or b is None or a == b or a in EVERY_FAMILY:
            continue
        if b not in FAMILY_BASES.get(a, ()):
            out.append(e)
    return out


def test_families_import_only_their_bases() -> None:
    """Inside numcheck.properties a family imports only the core and the families it is built on."""
    bad = across_families(_tree_edges())
    assert not bad, (
        f"{len(bad)} import(s) across properties families outside {FAMILY_BASES}; move what both need "
        "into properties/core or name the base in FAMILY_BASES:\n" + "\n".join(f"  {e}" for e in bad)
    )


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def judge_imports_judged(edges: list[Edge]) -> list[Edge]:
    """Imports (module names in strings included) of :data:`JUDGED` packages by numcheck.properties, but for
    an adapter import by a family's declared adapter registry (:data:`ADAPTER_REGISTRY`)."""
    out = []
    for e in edges:
        if not _under(e.importer, "numcheck.properties"):
            continue
        if _under(e.imported, "numcheck.impls.builtin"):
            out.append(e)
        elif _under(e.imported, "numcheck.impls.adapters") and not ADAPTER_REGISTRY.match(e.importer):
            out.append(e)
    return out


def test_judge_imports_nothing_it_judges() -> None:
    """properties/ imports no built-in impl and no adapter (but through a family's declared adapter registry)."""
    bad = judge_imports_judged(_tree_edges())
    assert not bad, (
        f"{len(bad)} import(s) of judged code by the judge; take shared numerics from numcheck.reference.numerics, "
        "impl modules from numcheck.impls.registry, and an adapter's release only in a family's known module "
        "(known.py or known_<vendor>.py):\n" + "\n".join(f"  {e}" for e in bad)
    )


def core_imports_forbidden(edges: list[Edge]) -> list[Edge]:
    """Imports by a module of ``numcheck.properties.core`` of a package of :data:`CORE_FORBIDDEN` (or a module in
    it)."""
    return [
        e
        for e in edges
        if e.importer.startswith("numcheck.properties.core.")
        and any(e.imported == p or e.imported.startswith(p + ".") for p in CORE_FORBIDDEN)
    ]


def test_core_imports_no_adapter() -> None:
    """properties/core (the machinery every family shares) imports no third-party adapter: each vendor's known
    divergences, which read its adapter, live beside their family (``properties/linear_ce/known_te.py``, ...)."""
    bad = core_imports_forbidden(_tree_edges())
    assert not bad, (
        f"{len(bad)} import(s) of {CORE_FORBIDDEN} by properties/core; move the vendor's code into a module beside "
        "its family (properties/<family>/known_<vendor>.py):\n" + "\n".join(f"  {e}" for e in bad)
    )


def test_module_strings_name_modules() -> None:
    """Every module or ``module:attr`` named in a string (``-m`` command lines, preload lists, specs) exists."""
    tree = tree_modules()
    modules = set(tree)
    dangling = []
    for name, path in tree.items():
        if layer(name) == len(LAYERS):  # numcheck's own tests name made-up modules in their fixtures
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.match(node.value):
                named, _, attr = node.value.partition(":")
                target, rest = named, []
                while target not in modules and "." in target:
                    target, _, last = target.rpartition(".")
                    rest.insert(0, last)
                obj = importlib.import_module(target)
                for part in [*rest, *([attr] if attr and "[" not in attr else [])]:
                    obj = getattr(obj, part, None)
                if obj is None:
                    dangling.append(f"{path}:{node.lineno}: {node.value!r}")
    assert not dangling, "strings naming no numcheck module or attribute:\n" + "\n".join(f"  {d}" for d in dangling)


def bare_imports(modules: dict[str, Path]) -> list[str]:
    """``path:line: name`` of each import of a top-level folder by its bare name (``import impls.registry``, ``from
    tests.self import x``). The folders are numcheck's subpackages (numcheck.impls is impls/), so such an import
    works wherever a checkout's root is on ``sys.path`` (``python -m`` run from it, ``PYTHONPATH``) and gives a
    second copy of every module it reaches: a second impl registry, a second set of exception classes."""
    bare = set(numcheck._SUBPACKAGES)
    out = []
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            out += [f"{path}:{node.lineno}: {name}" for name in names if name.split(".")[0] in bare]
    return out


def test_no_top_level_folder_is_imported_by_its_bare_name() -> None:
    """Every import of numcheck's folders names them through numcheck (``numcheck.impls``, never ``impls``)."""
    found = bare_imports(tree_modules())
    assert not found, (
        f"{len(found)} import(s) of a top-level folder by its bare name; write numcheck.<folder>... (the folders "
        "are numcheck's subpackages):\n" + "\n".join(f"  {f}" for f in found)
    )


def test_package_is_one_tree() -> None:
    """numcheck and its subpackages come from one tree: numcheck/<folder>/ of a wheel, or the folders beside
    numcheck/ of one checkout. A checkout's numcheck/ put on ``PYTHONPATH`` in an environment with another
    checkout installed editable would take every subpackage from that other checkout."""
    folders = package_folders()
    top = folders.pop("numcheck")
    strays = {n: str(f) for n, f in folders.items() if f not in (top / n.split(".")[1], top.parent / n.split(".")[1])}
    assert not strays, f"numcheck is {top}, but its subpackages come from elsewhere: {strays}"


def test_one_copy_of_every_module() -> None:
    """pytest imports numcheck's test modules by their numcheck names (the plugin's ``NumcheckModule``), not by
    their folders (``tests.self.test_layers``): no file of the package is loaded as two modules."""
    assert __name__ == "numcheck.tests.self.test_layers", __name__
    ours = {path.resolve() for path in tree_modules().values()}
    names: dict[Path, list[str]] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve() in ours:
            names.setdefault(Path(file).resolve(), []).append(name)
    twice = {str(f): sorted(n) for f, n in names.items() if len(n) > 1}
    assert not twice, f"files of numcheck loaded as two modules: {twice}"


def test_function_level_import_closes_a_cycle(tmp_path: Path) -> None:
    """A cycle closed by an import inside a function, and an upward import, are found (the checks can fail)."""
    pkg = tmp_path / "numcheck"
    for sub in ("", "impls", "properties"):
        (pkg / sub).mkdir(exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "impls" / "a.py").write_text("from numcheck.impls import b\n")
    (pkg / "impls" / "b.py").write_text("def f():\n    from numcheck.impls.a import g\n")
    (pkg / "impls" / "c.py").write_text("from . import a\nfrom ..properties.p import h\n")
    (pkg / "properties" / "p.py").write_text("import numcheck.impls.c\n")
    (pkg / "impls" / "d.py").write_text('SPEC = "numcheck.properties.p:thing"\n')
    (pkg / "impls" / "e.py").write_text("import impls.a\nfrom properties import p\nfrom .a import g\n")
    (pkg / "properties" / "fp8").mkdir()
    (pkg / "properties" / "fp8" / "__init__.py").write_text("")
    (pkg / "properties" / "fp8" / "f.py").write_text("CMD = ['-m', 'numcheck.properties.convergence.run']\n")
    (pkg / "properties" / "convergence").mkdir()
    (pkg / "properties" / "convergence" / "__init__.py").write_text("")
    (pkg / "properties" / "convergence" / "run.py").write_text("")
    (pkg / "impls" / "adapters").mkdir()
    (pkg / "impls" / "adapters" / "__init__.py").write_text("")
    (pkg / "impls" / "adapters" / "te.py").write_text("")
    (pkg / "properties" / "core").mkdir()
    (pkg / "properties" / "core" / "__init__.py").write_text("")
    (pkg / "properties" / "core" / "k.py").write_text("def f():\n    from numcheck.impls.adapters import te\n")
    edges = import_graph(package_modules(pkg))
    found = cycles(edges)
    assert sorted(group for group, _ in found) == [
        ["numcheck.impls.a", "numcheck.impls.b"],
        ["numcheck.impls.c", "numcheck.properties.p"],
    ]
    assert sorted((e.importer, e.imported) for e in upward(edges)) == [
        ("numcheck.impls.c", "numcheck.properties.p"),
        ("numcheck.impls.d", "numcheck.properties.p"),
    ]
    assert [(e.importer, e.imported) for e in across_families(edges)] == [
        ("numcheck.properties.fp8.f", "numcheck.properties.convergence.run")
    ]
    assert [f.split(": ")[1] for f in bare_imports(package_modules(pkg))] == ["impls.a", "properties"]
    assert [(e.importer, e.imported) for e in core_imports_forbidden(edges)] == [
        ("numcheck.properties.core.k", "numcheck.impls.adapters.te")
    ]


def test_judge_importing_judged_code_is_found(tmp_path: Path) -> None:
    """A property module importing a built-in (also inside a function, or named in a string) or an adapter is
    found; a family's known module reading an adapter is not."""
    pkg = tmp_path / "numcheck"
    for sub in ("", "impls", "impls/builtin", "impls/adapters", "properties", "properties/fam"):
        (pkg / sub).mkdir(exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "impls" / "builtin" / "b.py").write_text("")
    (pkg / "impls" / "adapters" / "v.py").write_text("")
    (pkg / "properties" / "p.py").write_text("def f():\n    from numcheck.impls.builtin import b\n")
    (pkg / "properties" / "q.py").write_text('WARM = ("numcheck.impls.adapters.v",)\n')
    (pkg / "properties" / "fam" / "known_v.py").write_text("from numcheck.impls.adapters import v\n")
    (pkg / "properties" / "fam" / "props.py").write_text('SPEC = "numcheck.impls.builtin.b:impl"\n')
    edges = import_graph(package_modules(pkg))
    assert sorted((e.importer, e.imported) for e in judge_imports_judged(edges)) == [
        ("numcheck.properties.fam.props", "numcheck.impls.builtin.b"),
        ("numcheck.properties.p", "numcheck.impls.builtin.b"),
        ("numcheck.properties.q", "numcheck.impls.adapters.v"),
    ]
