"""The context read's trip through the package's rooms goes down only: the tier walk
(core/reads.py) enters the pure assembly (prompt/) by one door, `prompt/assemble.py`, and nothing
it reaches there calls back up into the walk, the tiers, the summarizer or the HTTP edge; a
background summary goes service → summarize/ and the pool never calls back into core/.

Read from the source with `ast` (no module is imported), so a shortcut fails here before it runs.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import tiered_memory

PACKAGE = Path(tiered_memory.__file__).parent
# The rooms the assembly must not reach: the walk and the service, the tiers, the edge, the
# operator commands, and the top-level modules that compose or configure them.
_ABOVE_PROMPT = (
    "tiered_memory.core",
    "tiered_memory.tiers",
    "tiered_memory.http",
    "tiered_memory.ops",
    "tiered_memory.summarize",
    "tiered_memory.app",
    "tiered_memory.settings",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_modules()[module].read_text(encoding="utf-8"))


@cache
def _imports(module: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each of `module`'s imports of the package as (module imported, names taken from it); a
    module named in `from package import module` counts as imported itself."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            found += [(a.name, ()) for a in node.names if a.name.startswith("tiered_memory")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tiered_memory"):
            names = tuple(a.name for a in node.names)
            submodules = [f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in _modules()]
            found += [(m, ()) for m in submodules]
            if len(submodules) < len(names):
                found.append((node.module, names))
    return tuple(found)


def _reached(start: str) -> set[str]:
    """The package's modules `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen or module not in _modules():
            continue
        seen.add(module)
        todo += [imported for imported, _ in _imports(module)]
    return seen - {start}


def _classes(module: str) -> set[str]:
    return {node.name for node in _tree(module).body if isinstance(node, ast.ClassDef)}


def _in(module: str, rooms: tuple[str, ...]) -> bool:
    return any(module == room or module.startswith(room + ".") for room in rooms)


def test_the_walk_enters_the_assembly_by_one_door() -> None:
    """core/reads.py takes from prompt/ only prompt/assemble.py (besides classes, the types it
    names), and nothing from text/: the candidates, the rendering, the digest and the shaping
    are the assembly's, made in one call."""
    reads = "tiered_memory.core.reads"
    strays = []
    for imported, names in _imports(reads):
        if _in(imported, ("tiered_memory.text",)):
            strays.append(f"{imported}: {', '.join(names) or '(module)'}")
        elif _in(imported, ("tiered_memory.prompt",)) and imported != "tiered_memory.prompt.assemble":
            helpers = [n for n in names if n not in _classes(imported)] if names else ["(module)"]
            if helpers:
                strays.append(f"{imported}: {', '.join(helpers)}")
    assert strays == [], f"core/reads.py reaches past prompt/assemble.py: {strays}"


def test_the_context_read_assembles_once() -> None:
    """SessionReads.context gathers, then calls `assemble` once: the walk does not bounce back
    into the assembly between its reads."""
    reads = next(
        node
        for node in _tree("tiered_memory.core.reads").body
        if isinstance(node, ast.ClassDef) and node.name == "SessionReads"
    )
    calls = [
        node
        for node in ast.walk(reads)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "assemble"
    ]
    context = next(n for n in reads.body if isinstance(n, ast.AsyncFunctionDef) and n.name == "context")
    assert len(calls) == 1
    assert calls[0] in list(ast.walk(context))


def test_the_assembly_reaches_nothing_above_it() -> None:
    """No module under prompt/, nor anything it imports in turn, is in core/, tiers/, summarize/,
    the HTTP edge, ops/, app.py or settings.py."""
    prompt = [m for m in _modules() if _in(m, ("tiered_memory.prompt",))]
    above = {(module, reached) for module in prompt for reached in _reached(module) if _in(reached, _ABOVE_PROMPT)}
    assert sorted(above) == []


def test_the_summary_pool_never_calls_back_into_core() -> None:
    """The pool a background summary runs on is built in summarize/ and handed the job's pass
    there: no module of core/ builds one (it would hand it a method of the service), and
    summarize/ imports nothing of core/."""
    for module in _modules():
        if _in(module, ("tiered_memory.core",)):
            built = [
                node
                for node in ast.walk(_tree(module))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "SingleFlight"
            ]
            assert built == [], f"{module} builds the summary pool (and hands it its own pass)"
        if _in(module, ("tiered_memory.summarize",)):
            assert not any(_in(m, ("tiered_memory.core",)) for m in _reached(module)), module
