"""The README, docs/ and the example env file stay true to the code: every setting and metric is listed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from prometheus_client import CollectorRegistry

from tiered_memory.metrics import Metrics
from tiered_memory.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _setting_names() -> set[str]:
    return {f.alias for f in Settings.model_fields.values() if f.alias}


def test_docs_document_every_variable() -> None:
    """docs/CONFIGURATION.md's environment table lists exactly the variables the daemon reads."""
    text = (ROOT / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    table = set(re.findall(r"^\| `([A-Z_]+)` \|", text, flags=re.MULTILINE))
    assert table == _setting_names()


def test_example_env_lists_every_variable() -> None:
    """config/tiered-memory.env.example sets every variable, and nothing else."""
    text = (ROOT / "config" / "tiered-memory.env.example").read_text(encoding="utf-8")
    names = set(re.findall(r"^([A-Z_]+)=", text, flags=re.MULTILINE))
    assert names == _setting_names()
    defaults = dict(re.findall(r"^([A-Z_]+)=(.+)$", text, flags=re.MULTILINE))
    effective = Settings.from_env({}).masked()
    for name, quoted in defaults.items():
        value = quoted.removeprefix('"').removesuffix('"')
        assert effective[name] in (value, f"{value}.0"), name


def test_docs_document_every_metric() -> None:
    """docs/DEPLOY.md's metrics table names every metric the daemon exports."""
    text = (ROOT / "docs" / "DEPLOY.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(tiered_memory_[a-z_]+)` \|", text, flags=re.MULTILINE))
    registry = CollectorRegistry()
    Metrics(registry)
    exported = {m.name for m in registry.collect()}
    # prometheus_client drops the _total suffix from counter family names.
    assert {d.removesuffix("_total") for d in documented} == exported


def test_every_install_line_names_this_distribution() -> None:
    """Every `pip install` of the package in README, docs/ and the integrations' docstrings names the
    distribution pyproject.toml builds (the index's `tiered-memory` is another project's: a user
    following an old line installed a stranger's code)."""
    name = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]
    assert name != "tiered-memory"
    texts = [ROOT / "README.md", *DOCS, *sorted((ROOT / "tiered_memory").rglob("*.py"))]
    installs = [
        found
        for path in texts
        for found in re.findall(r"pip install '?(tiered[-_]memory[\w-]*)", path.read_text(encoding="utf-8"))
    ]
    assert installs
    assert set(installs) == {name}
