"""The README, docs/ and the example env file stay true to the code: every setting and metric is
listed, the README stays short, and every relative link lands on a file and heading that exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from prometheus_client import CollectorRegistry

from tiered_memory.cli import masked
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
    effective = masked(Settings.from_env({}))
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


def test_readme_stays_short() -> None:
    """README.md is what a newcomer reads through: at most 300 lines, the reference in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, len(lines)


_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and code spans, where a link is a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file; a repeated one gets -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = _slug(heading.group(1))
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_slug_is_githubs() -> None:
    assert _slug("SQL past one machine: Galera and read replicas") == "sql-past-one-machine-galera-and-read-replicas"
    assert _slug("Production: Redis and MySQL/MariaDB") == "production-redis-and-mysqlmariadb"
    assert _slug("Several processes on one port: `WORKERS`") == "several-processes-on-one-port-workers"
    assert _slug("Traces: what they cost (2026-12-03)") == "traces-what-they-cost-2026-12-03"


def test_docs_relative_links_point_at_files_and_headings_that_exist() -> None:
    """Every relative link in README.md and docs/*.md names a file that exists, and a
    `file.md#anchor` (or `#anchor`) link a heading of that file."""
    broken = []
    checked = 0
    for source in [ROOT / "README.md", *DOCS]:
        for target in _LINK.findall(_prose(source.read_text(encoding="utf-8"))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            checked += 1
            path_part, _, anchor = target.partition("#")
            path = (source.parent / path_part).resolve() if path_part else source
            where = f"{source.relative_to(ROOT)}: {target}"
            if not path.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{where} (no such heading)")
    assert checked
    assert not broken, "\n".join(broken)
