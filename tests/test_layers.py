"""The package's rooms and the one direction their imports go.

Each folder of `tiered_memory` is a layer (its `__init__` docstring says what it may import), and
the top level's modules sit in the layer their concern puts them. A module may import from its own
room and from rooms below it, never above: so a call, which follows an import, only ever goes
down, and a request (the context read above all) passes each room once. Read from the source with
`ast`: nothing of the package runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tiered_memory"

# Top to bottom. A room is a folder (or `tiers/sql`, `tiers/redis`) or one top-level module; rooms
# on one line are peers that must not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("ops",),
    ("app",),
    ("startup",),
    ("http",),
    ("core",),
    ("summarize",),
    ("migrations",),
    ("tiers/sql", "tiers/redis"),
    ("tiers",),
    ("webhooks",),
    ("prompt",),
    ("text",),
    ("metrics", "tracing", "reasoning", "logging", "progress", "settings", "payload"),
    ("breaker", "errors", "model", "lru"),
    ("__init__",),
)
# Apart from the daemon, each with what it may import: what a gateway installs (the client imports
# nothing of the daemon, the adapters only the client), the test kit for a user's own tests, and
# the quality evaluation, which drives a daemon through the test kit.
APART = {
    "client": {"client", "__init__"},
    "integrations": {"integrations", "client", "__init__"},
    "testing": {"__init__"},
    "eval": {"eval", "testing", "__init__"},
}
# The command line reaches everything, the apart rooms included (`tiered-memory eval`, `… mcp`).
ENTRY = {"__main__", "cli"}


def room_of(module: str) -> str:
    """`tiered_memory.tiers.sql.store` → `tiers/sql`; `tiered_memory.app` → `app`."""
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] == "tiers" and len(parts) > 2 and parts[1] in {"sql", "redis"}:
        return f"tiers/{parts[1]}"
    return parts[0]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path) -> set[str]:
    """The package's modules (or packages) `name` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("tiered_memory"):
                out.update(f"{base}.{alias.name}" for alias in node.names)
                out.add(base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name.startswith("tiered_memory"))
    return out


def rank() -> dict[str, int]:
    return {room: depth for depth, rooms in enumerate(LAYERS) for room in rooms}


def test_every_room_has_a_layer() -> None:
    ranks = rank()
    rooms = {room_of(name) for name in modules()}
    assert sorted(rooms - ranks.keys() - APART.keys()) == []


def test_imports_go_down_only() -> None:
    """Every import of the package stays in its room or goes to a room below; peers on one layer
    do not import each other."""
    ranks = rank()
    known = modules()
    wrong = []
    for name, path in sorted(known.items()):
        room = room_of(name)
        for target in imports_of(name, path):
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            there = room_of(target)
            if there == room:
                continue
            if room in APART:
                ok = there in APART[room]
            elif room in ENTRY:
                ok = there in APART or ranks[there] > ranks[room]
            elif there in APART:
                ok = False
            else:
                ok = ranks[there] > ranks[room]
            if not ok:
                wrong.append(f"{name} ({room}) imports {target} ({there})")
    assert wrong == []


def test_each_folder_says_what_lives_there_and_what_it_may_import() -> None:
    for init in sorted(PACKAGE.glob("**/__init__.py")):
        if init.parent.name in {"versions", "migrations", "data"}:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc, f"{init.relative_to(PACKAGE.parent)} has no docstring"


@pytest.mark.parametrize(
    ("module", "room"),
    [("tiered_memory.tiers.sql.store", "tiers/sql"), ("tiered_memory.app", "app"), ("tiered_memory", "__init__")],
)
def test_room_of(module: str, room: str) -> None:
    assert room_of(module) == room
