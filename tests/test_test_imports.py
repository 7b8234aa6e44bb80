"""How the tests are put together: a test module imports what it shares with others from
tests/helpers/, never from a conftest.py (pytest's, for fixtures alone) nor from another test
module (whose import would collect, and couple, one module's tests into another's); and nothing
under tests/ does work when it is imported."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """Each module an import names (`from a.b import c` names a.b and a.b.c), with its line, at
    any depth: an import inside a function counts too."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def _forbidden(module: str) -> bool:
    """A conftest or a test module, by dotted name; relative imports are refused as well (the
    project imports absolutely)."""
    if module.startswith("."):
        return True
    parts = module.split(".")
    return parts[0] == "tests" and any(p == "conftest" or p.startswith("test_") for p in parts[1:])


def test_no_test_module_imports_a_conftest_or_another_test_module() -> None:
    """Every .py file under tests/ is read with ast: none imports tests.conftest,
    tests.integrations.conftest or a tests.…test_* module."""
    offences = [
        f"{path.relative_to(TESTS.parent)}:{line}: {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, module in _imported(ast.parse(path.read_text(encoding="utf-8")))
        if _forbidden(module)
    ]
    assert not offences, "\n".join(offences)


# What conftest.py and tests/helpers/ may call when imported: values, not resources (none of these
# starts a process, opens a pool, a socket, a client or a file).
_VALUES = {"frozenset", "TypeVar", "Path", "re.compile", "RecentBound"}


def test_conftest_and_the_helpers_do_no_work_at_import() -> None:
    """conftest.py and tests/helpers/ build no pool, process, client or dictionary at import (a
    top-level statement calls only what makes a value): each is made by the fixture of the first
    test that asks, the text workers by `text_workers`."""
    calls = []
    for path in [TESTS / "conftest.py", *sorted((TESTS / "helpers").glob("*.py"))]:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign | ast.Expr) else None
            if isinstance(value, ast.Call) and ast.unparse(value.func) not in _VALUES:
                calls.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}: {ast.unparse(value)}")
    assert not calls, "\n".join(calls)
