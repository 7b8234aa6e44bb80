"""Whether an evidence string is in a context: the same text after NFKC and case folding; Chinese
ignores whitespace, English matches whole words only ("Ann" is not in "Annual")."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable

_CJK = re.compile(r"[\u3400-\u9fff]")
_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """NFKC (full-width digits and letters become ASCII) and case folding."""
    return unicodedata.normalize("NFKC", text).casefold()


class Haystack:
    """One context, normalized once and searched for many evidence strings."""

    def __init__(self, text: str) -> None:
        self._text = normalize(text)
        self._squeezed = _SPACES.sub("", self._text)

    def contains(self, evidence: str) -> bool:
        needle = normalize(evidence).strip()
        if not needle:
            return False
        if _CJK.search(needle):
            return _SPACES.sub("", needle) in self._squeezed
        return word_pattern(needle).search(self._text) is not None

    def count(self, evidence: str) -> int:
        """How many times `evidence` occurs, by the same rules as `contains` (non-overlapping)."""
        needle = normalize(evidence).strip()
        if not needle:
            return 0
        if _CJK.search(needle):
            return self._squeezed.count(_SPACES.sub("", needle))
        return len(word_pattern(needle).findall(self._text))

    def contains_all(self, evidence: Iterable[str]) -> bool:
        return all(self.contains(e) for e in evidence)


@functools.lru_cache(maxsize=8192)  # re's own cache (512) is too small for an importer's evidence
def word_pattern(words: str, flags: int = 0) -> re.Pattern[str]:
    """`words` as whole words, any whitespace between them."""
    return re.compile(r"(?<!\w)" + r"\s+".join(re.escape(w) for w in words.split()) + r"(?!\w)", flags)
