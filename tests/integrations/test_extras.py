"""The integrations are extras: the daemon neither depends on their frameworks nor imports them."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("pipecat", "livekit", "langchain_core", "agents", "mcp")


def test_the_daemons_dependencies_name_no_framework() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    for name in ("pipecat", "livekit", "langchain", "openai-agents", "mcp"):
        assert name not in core, name
        assert name in project["optional-dependencies"], f"no extra {name!r}"


def test_only_the_integrations_import_the_frameworks() -> None:
    """Outside tiered_memory/integrations no module imports a framework or an adapter, so the
    daemon and the Python client run without any extra installed (cli's `mcp` subcommand imports
    its server inside the function that runs it)."""
    package = ROOT / "tiered_memory"
    for path in package.rglob("*.py"):
        if "integrations" in path.relative_to(package).parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:  # module level only: an import inside a function runs on demand
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FRAMEWORKS, f"{path}: imports {name}"
                assert not name.startswith("tiered_memory.integrations"), f"{path}: imports {name}"


def test_the_daemon_starts_its_imports_without_a_framework() -> None:
    code = (
        "import sys, tiered_memory.cli, tiered_memory.app, tiered_memory.client; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
