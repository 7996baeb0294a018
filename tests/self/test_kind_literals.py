"""A kind's name is spelled once, in its protocol module (:class:`numcheck.impls.protocols.kind.Kind`), and imported
everywhere else: no product module holds a string constant equal to a kind's name outside the kind's slice (its
protocol module and its report family, :mod:`numcheck.reports.report.families`) and the registries that list the
kinds (issue 45, item 1).

Read from the source (:mod:`ast`) of every product file (the package less numcheck's own tests, ``tests/self`` and
``tests/adapters``); docstrings are prose, and the entries of ``__all__`` are attribute names (``reference.linear_ce``
is a function), so neither counts. :data:`PENDING` lists the modules not yet moved onto the registries, each with
the number of literals it still holds: the count may only go down (a lower count fails until the table says so, so
the table cannot go stale), and a module not in it may hold none.
"""

from __future__ import annotations

import ast

from numcheck.impls.protocols.kinds import KINDS, NAMES
from numcheck.reports.common import package_files

#: numcheck's own tests (above the product; they spell kinds to test them).
OWN_TESTS: tuple[str, ...] = ("tests/self/", "tests/adapters/")
#: The modules that list the kinds (each entry imported from its kind's slice, never spelled).
REGISTRIES: frozenset[str] = frozenset({"impls/protocols/kinds.py", "reports/report/families/__init__.py"})
#: Modules still switching on kind literals, and how many each holds (issue 45 item 1, left to do); only shrinks.
PENDING: dict[str, int] = {}


def _slices() -> dict[str, str]:
    """Each kind's own modules, by package path: its protocol module (where its name is defined)."""
    out = {}
    for kind in KINDS:
        out["/".join(kind.module.split(".")[1:]) + ".py"] = kind.name
    return out


def _prose(tree: ast.Module) -> set[int]:
    """The ids of the constants that are docstrings or ``__all__`` entries."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip.update(id(e) for e in ast.walk(node.value))
    return skip


def kind_literals(source: str, path: str, names: tuple[str, ...] = NAMES) -> list[tuple[int, str]]:
    """``(line, name)`` for each string constant of ``source`` equal to one of ``names`` (prose excepted)."""
    tree = ast.parse(source, filename=path)
    skip = _prose(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in skip
    ]


def product_literals() -> dict[str, list[tuple[int, str]]]:
    """Every product file's kind literals, by package path (files without any left out)."""
    out = {}
    for rel, path in package_files().items():
        if rel.startswith(OWN_TESTS):
            continue
        found = kind_literals(path.read_text(encoding="utf-8"), rel)
        if found:
            out[rel] = found
    return out


def test_kind_literal_finder_sees_code_not_prose():
    """The finder counts a kind's name in code (a comparison, a default, a dict key) and not in a docstring or an
    ``__all__`` entry."""
    name = NAMES[0]
    source = f'"""{name}"""\n__all__ = ["{name}"]\nx = "{name}"\nif kind == "{name}":\n    y = {{"{name}": 1}}\n'
    assert [line for line, _ in kind_literals(source, "m.py")] == [3, 4, 5]


def test_no_kind_literal_outside_its_slice_and_the_registries():
    """No product module spells a kind's name except its own slice and the registries; the modules of
    :data:`PENDING` hold exactly their count (fix the table when one goes down)."""
    slices = _slices()
    foreign = {
        rel: [(line, name) for line, name in found if slices.get(rel) != name]
        for rel, found in product_literals().items()
        if rel not in REGISTRIES
    }
    foreign = {rel: found for rel, found in foreign.items() if found}
    wrong = [
        f"{rel}: " + ", ".join(f"line {line} {name!r}" for line, name in sorted(found))
        for rel, found in foreign.items()
        if len(found) > PENDING.get(rel, 0)
    ]
    stale = [f"{rel}: {len(foreign.get(rel, ()))} left, PENDING says {n}" for rel, n in PENDING.items()]
    stale = [line for line, (rel, n) in zip(stale, PENDING.items()) if len(foreign.get(rel, ())) < n]
    assert not wrong, "kind names spelled outside their slice (import the name from its protocol module):\n" + (
        "\n".join(wrong)
    )
    assert not stale, "PENDING is out of date (lower or drop these entries):\n" + "\n".join(stale)


#: The kinds numcheck had before 0.2.0 renamed them (each has a former name).
KINDS_BEFORE_0_2 = 5


def test_former_kind_names_only_in_their_own_descriptor():
    """A kind's name before 0.2.0 (``Kind.former``, read from old reports and hand-built impls through
    :func:`numcheck.impls.protocols.kinds.current_name`) is spelled once, in its own protocol module's descriptor:
    no product module switches on an old name."""
    formers = tuple(k.former for k in KINDS if k.former)
    own = {"/".join(k.module.split(".")[1:]) + ".py": k.former for k in KINDS}
    found = {}
    for rel, path in package_files().items():
        if rel.startswith(OWN_TESTS):
            continue
        source = path.read_text(encoding="utf-8")
        hits = [(line, name) for line, name in kind_literals(source, rel, formers) if own.get(rel) != name]
        if hits:
            found[rel] = hits
    assert not found, f"old kind names spelled outside their descriptor: {found}"
    # Each former name distinct; the kinds of 0.2.0 had one each, a kind added since has none.
    assert sorted(formers) == sorted({*formers}) and len(formers) == KINDS_BEFORE_0_2
