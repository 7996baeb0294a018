"""The public exceptions live in one module, :mod:`numcheck.errors`, under one base class, and every module imports
them from there: a module that imports one through another (``properties.core.failures``, ``impls.protocols.
declaration``, ``reports.common``, ``numcheck`` itself) hides where it is defined and keeps a second name alive.

Read with :mod:`ast`, every import in the file (function-level ones too), in every module of the imported numcheck
(:func:`numcheck.reports.common.package_folders`) and, in a checkout, the Python files of tools/, docs/ and
examples/.
"""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path

import numcheck.errors as errors
from numcheck.reports.baselines import checkout_root
from numcheck.reports.common import package_folders

#: Folders of a checkout outside the package whose Python files import numcheck too.
CHECKOUT_FOLDERS: tuple[str, ...] = ("tools", "docs", "examples")


def public_exceptions() -> dict[str, type]:
    """Every exception class :mod:`numcheck.errors` defines, by name."""
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }


def python_files() -> list[Path]:
    """The Python files of the imported numcheck and, in a checkout, of :data:`CHECKOUT_FOLDERS`."""
    folders = list(package_folders().values())
    root = checkout_root()
    folders += [root / name for name in CHECKOUT_FOLDERS] if root is not None else []
    files: set[Path] = set()
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            files.update(Path(dirpath, f).resolve() for f in filenames if f.endswith(".py"))
    return sorted(files)


def bypassing_imports(source: str, path: str, names: set[str]) -> list[str]:
    """``path:line: from X import NAME`` for each import of one of ``names`` from a module other than
    ``numcheck.errors`` (relative imports included: only the absolute name of the module counts)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.ImportFrom) and (node.level or node.module != errors.__name__):
            found += [
                f"{path}:{node.lineno}: from {'.' * node.level}{node.module or ''} import {a.name}"
                for a in node.names
                if a.name in names
            ]
    return found


def test_public_exceptions_are_imported_only_from_numcheck_errors() -> None:
    names = set(public_exceptions())
    found = [
        line
        for path in python_files()
        for line in bypassing_imports(path.read_text(encoding="utf-8"), str(path), names)
    ]
    assert not found, "import these from numcheck.errors, where they are defined:\n" + "\n".join(found)


def test_the_check_sees_a_bypassing_import() -> None:
    source = (
        "from numcheck.errors import BadInput\n"
        "def f():\n    from numcheck.properties.core.failures import PropertyFailure\n"
        "from numcheck import InvalidDeclaration, Problem\n"
    )
    assert sorted(s.split(": ", 1)[1] for s in bypassing_imports(source, "m.py", set(public_exceptions()))) == [
        "from numcheck import InvalidDeclaration",
        "from numcheck.properties.core.failures import PropertyFailure",
    ]


def test_every_public_exception_derives_from_one_base() -> None:
    classes = public_exceptions()
    base = errors.NumcheckError
    assert [n for n, c in classes.items() if not issubclass(c, base)] == []
    assert base.__bases__ == (Exception,)
