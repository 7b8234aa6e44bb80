"""Plain-text helpers shared by the hybrid baselines and the Topical-Chat importer: clause and
sentence splitting, and a fixed list of English function words (what `hybrid-compressed` drops
and what the importer never takes for a name)."""

from __future__ import annotations

import re

# About a hundred common English function words, fixed so that a baseline and a probe set never
# depend on a library's version.
_FUNCTION_WORDS = {
    "articles": "a an the",
    "pronouns": "i me my mine myself we us our ours you your yours he him his she her hers it its they them "
    "their theirs this that these those who whom whose which what",
    "auxiliaries": "am is are was were be been being have has had having do does did will would shall should "
    "can could may might must",
    "prepositions": "of in on at to for with by from about into onto over under after before between through "
    "during up down out off as than upon within without against toward towards",
    "conjunctions": "and or but so if because while although though nor then yet whether",
    "adverbs": "there here also just very too",
}
STOPWORDS = frozenset(w for words in _FUNCTION_WORDS.values() for w in words.split())

_CLAUSE_END = re.compile(r"[.!?;,\n。！？；，]")
# A sentence ends at . ! ? followed by a space, so "3.5" and "U.S.A" stay whole.
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])|\n+")
_FUNCTION_WORD = re.compile(
    r"(?<![\w'’])(?:" + "|".join(sorted(STOPWORDS, key=len, reverse=True)) + r")(?![\w'’])", re.IGNORECASE
)
_SPACES = re.compile(r"[ \t]{2,}")
_SPACE_BEFORE_PUNCT = re.compile(r"[ \t]+(?=[,.!?;:])")


def clauses(text: str) -> list[str]:
    """`text` split at . ! ? ; , and newlines (and 。！？；，), each clause stripped, empty ones dropped."""
    return [c.strip() for c in _CLAUSE_END.split(text) if c.strip()]


def sentences(text: str) -> list[str]:
    """`text` split after . ! ? followed by whitespace (and after 。！？) and at newlines."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def drop_function_words(text: str) -> str:
    """`text` without the STOPWORDS (whole words, any case; "it's" and "I'm" are other words and
    stay), spaces squeezed. Text in other languages passes through unchanged."""
    out = _FUNCTION_WORD.sub("", text)
    return _SPACE_BEFORE_PUNCT.sub("", _SPACES.sub(" ", out)).strip()
