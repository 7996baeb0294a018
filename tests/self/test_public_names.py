"""``numcheck/__init__.py``'s two hand lists, ``__all__`` and the ``TYPE_CHECKING`` imports, say exactly the names
``import numcheck`` gives at run time: each kind's public names (its descriptor in
:data:`numcheck.impls.protocols.kinds.KINDS`) and ``_PUBLIC``'s, each from the module it comes from at run time. A
family registered with its ``KIND`` but left out of either list (or a name dropped from a kind) fails here, naming
the list to fix."""

from __future__ import annotations

import ast
from pathlib import Path

import numcheck

INIT = Path(numcheck.__file__)


def hand_lists(source: str) -> tuple[list[str], dict[str, str]]:
    """``__all__``'s entries, and each name imported under ``if TYPE_CHECKING:`` → its module, read from the
    source of a package ``__init__``."""
    tree = ast.parse(source)
    exported: list[str] = []
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            exported = [ast.literal_eval(e) for e in node.value.elts]
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    typed.update({a.asname or a.name: imp.module for a in imp.names})
    return exported, typed


def runtime_names() -> dict[str, str]:
    """Every public name ``numcheck`` resolves at run time → the module it comes from: the kinds' (one entry per
    kind of the registry) and ``_PUBLIC``'s."""
    return {**numcheck._PUBLIC, **numcheck._kind_public()}


def differences(exported: list[str], typed: dict[str, str], wanted: dict[str, str]) -> list[str]:
    """What each hand list lacks or has beyond ``wanted`` (name → module), one line per fix."""
    out = [f"__all__ lacks {n!r}" for n in sorted(set(wanted) - set(exported))]
    out += [f"__all__ names {n!r}, which is no public name" for n in sorted(set(exported) - set(wanted))]
    out += [f"__all__ names {n!r} twice" for n in sorted({n for n in exported if exported.count(n) > 1})]
    out += [f"TYPE_CHECKING lacks `from {m} import {n}`" for n, m in sorted(wanted.items()) if n not in typed]
    out += [f"TYPE_CHECKING imports {n!r}, which is no public name" for n in sorted(set(typed) - set(wanted))]
    out += [
        f"TYPE_CHECKING imports {n!r} from {typed[n]}; at run time it comes from {m}"
        for n, m in sorted(wanted.items())
        if n in typed and typed[n] != m
    ]
    return out


def test_hand_lists_agree_with_the_registries():
    """``__all__`` and the ``TYPE_CHECKING`` imports name exactly the run-time public names, each from its module,
    (the run-time names resolve by construction: ``numcheck.__getattr__`` reads the same tables)."""
    exported, typed = hand_lists(INIT.read_text())
    wanted = runtime_names()
    assert not differences(exported, typed, wanted), "numcheck/__init__.py: " + "; ".join(
        differences(exported, typed, wanted)
    )


def test_a_kind_left_out_of_the_hand_lists_is_named():
    """A kind's name missing from both lists (a family registered with one KIND line only), an extra name and a
    name imported from another module are each one line naming the fix."""
    exported, typed = hand_lists(INIT.read_text())
    wanted = {**runtime_names(), "distill_impl": "numcheck.impls.protocols.distill"}
    typed = {**typed, "Problem": "numcheck.properties.fp8.cases", "Stale": "numcheck.errors"}
    got = differences([*exported, "Stale"], typed, wanted)
    assert got == [
        "__all__ lacks 'distill_impl'",
        "__all__ names 'Stale', which is no public name",
        "TYPE_CHECKING lacks `from numcheck.impls.protocols.distill import distill_impl`",
        "TYPE_CHECKING imports 'Stale', which is no public name",
        "TYPE_CHECKING imports 'Problem' from numcheck.properties.fp8.cases; at run time it comes from "
        "numcheck.properties.linear_ce.cases",
    ], got
