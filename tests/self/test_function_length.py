"""No function in the package is longer than :data:`MAX_LINES` lines (from its ``def`` to its last line, nested
functions counted in the function that holds them and on their own), so each reads as one step whose pieces have
names. Triton kernels (decorated with ``triton.jit``) are exempt: a kernel is compiled as one unit, and splitting it
into ``@triton.jit`` helpers only moves its body around.

The walk covers every folder of the package (numcheck/ and, in a checkout, the top-level folders it maps).
"""

from __future__ import annotations

import ast

from numcheck.reports.common import package_files

#: The most lines a function may span, ``def`` line to last line.
MAX_LINES = 60
#: The decorator that marks a Triton kernel (its dotted name, any call stripped, imports followed): ``triton.jit``,
#: also when ``triton`` comes re-exported from another module (``from numcheck.impls.triton_lang import triton``).
KERNEL_DECORATOR = "triton.jit"


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for a decorator expression (a call's callee), "" for anything that is not a dotted name."""
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return node.id if isinstance(node, ast.Name) else ""


def _aliases(tree: ast.Module) -> dict[str, str]:
    """The module's import bindings, local name to dotted origin (``import triton as tr``: tr → triton;
    ``from triton import jit``: jit → triton.jit), so a kernel decorator is known however it is spelled."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _is_kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef, aliases: dict[str, str]) -> bool:
    for dec in fn.decorator_list:
        head, _, rest = _dotted(dec).partition(".")
        resolved = ".".join(filter(None, (aliases.get(head, head), rest)))
        if resolved == KERNEL_DECORATOR or resolved.endswith("." + KERNEL_DECORATOR):
            return True
    return False


def long_functions(source: str, path: str, max_lines: int = MAX_LINES) -> list[str]:
    """``path:line name (n lines)`` for each function of ``source`` longer than ``max_lines``, kernels exempt."""
    tree = ast.parse(source, filename=path)
    aliases = _aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_kernel(node, aliases):
            n = node.end_lineno - node.lineno + 1
            if n > max_lines:
                out.append(f"{path}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_is_longer_than_max_lines() -> None:
    """Each function of the package, Triton kernels aside, spans at most :data:`MAX_LINES` lines."""
    files = package_files()
    assert any(rel.startswith("impls/builtin/") for rel in files), "the walk missed the top-level folders"
    found = [hit for rel, f in files.items() for hit in long_functions(f.read_text(encoding="utf-8"), str(f))]
    assert not found, (
        f"{len(found)} function(s) longer than {MAX_LINES} lines; split each into named steps:\n"
        + "\n".join(f"  {h}" for h in found)
    )


def test_long_functions_are_found_and_kernels_exempt() -> None:
    """A long function, method and nested function are named; a ``triton.jit`` kernel, however spelled, is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    source = (
        "import triton\nimport triton as tr\nfrom triton import jit\nfrom pkg.triton_lang import triton as tt\n\n"
        f"def long():\n{body}\n"
        f"def short():\n{body[: -len('    x59 = 59')]}\n"
        f"class C:\n    def method(self):\n    {body.replace(chr(10) + '    ', chr(10) + '        ')}\n"
        f"def outer():\n    def inner():\n    {body.replace(chr(10) + '    ', chr(10) + '        ')}\n"
        f"@triton.jit\ndef k1():\n{body}\n"
        f"@tr.jit(debug=True)\ndef k2():\n{body}\n"
        f"@jit\ndef k3():\n{body}\n"
        f"@tt.jit\ndef k4():\n{body}\n"
        f"@other.jit\ndef not_a_kernel():\n{body}\n"
    )
    found = [h.split(" ")[1] for h in long_functions(source, "m.py")]
    assert sorted(found) == ["inner", "long", "method", "not_a_kernel", "outer"]
