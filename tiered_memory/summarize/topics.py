"""Topic tags for summaries: an operator's keyword groups first, then automatic keywords.

Gateways index and route on these tags (which product, which service a conversation was about),
so names an operator cares about must win over whatever a statistical extractor finds salient.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

MAX_TOPICS = 10


def load_keyword_groups(path: Path) -> dict[str, tuple[str, ...]]:
    """Keyword groups from a file: a JSON object {"group": ["keyword", …]}, or lines of
    `group: keyword, keyword` (`#` starts a comment). Raises ValueError naming the problem."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("{"):
        raw = json.loads(text)
        if not isinstance(raw, dict) or not all(
            isinstance(v, list) and all(isinstance(k, str) for k in v) for v in raw.values()
        ):
            raise ValueError("expected a JSON object of lists of strings")
        return {str(g): tuple(k.strip() for k in v if k.strip()) for g, v in raw.items()}
    groups: dict[str, tuple[str, ...]] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        group, sep, words = line.partition(":")
        if not sep:
            raise ValueError(f"line {n}: expected 'group: keyword, keyword'")
        groups[group.strip()] = tuple(w.strip() for w in words.replace("，", ",").split(",") if w.strip())
    return groups


class TopicTagger:
    """Configured keywords found in the texts (in order of first appearance), then the automatic
    tags, without duplicates, at most MAX_TOPICS. Matching is case-insensitive."""

    def __init__(self, groups: dict[str, tuple[str, ...]] | None = None) -> None:
        # Longer keywords first, so "活力健Plus" is found before "活力健" claims its text.
        self._keywords = sorted({k for ks in (groups or {}).values() for k in ks}, key=len, reverse=True)

    def tags(self, texts: Iterable[str], automatic: Sequence[str]) -> tuple[str, ...]:
        found: list[tuple[int, str]] = []
        if self._keywords:
            haystack = "\n".join(texts).lower()
            for keyword in self._keywords:
                at = haystack.find(keyword.lower())
                if at >= 0 and not any(keyword.lower() in f.lower() for _, f in found):
                    found.append((at, keyword))
        out: list[str] = [k for _, k in sorted(found)]
        for tag in automatic:
            if tag not in out:
                out.append(tag)
        return tuple(out[:MAX_TOPICS])
