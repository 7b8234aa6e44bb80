"""Whether what an LLM wrote is in what it was shown: a summary's facts must not be invented.

An item the LLM returns (a list item, a sentence of its summary) is grounded when every checkable
token in it occurs in the source (the new turns' texts, tool results and events included, and the
previous summary and payload it merged them into):

- every number, compared as a value (numerals.py: 5,000 is 5000 is five thousand is 五千);
- every id: a token mixing letters and digits (an order A1234, a model X200, a tracking number),
  compared without its inner - _ . separators, and every email address and URL;
- every name: in English text, a word written with a capital that does not open a sentence (its
  capital says nothing there; a one-word item, a keyword, opens none) or with a capital inside
  (iPhone, SYSTEM, anywhere); in Chinese text (language.language_of), every word in Latin
  script (用户是VIP会员, 用户使用app).
  Chinese personal names are not looked for: nothing marks them (no capitals, no spaces), and
  guessing them from a surname list would drop sound facts for every common character it took
  for a name.

Matching ignores case and width (ＡＢＣ is abc). An item with nothing checkable passes: grounding
catches what was made up (an amount, an order, a person), and cannot judge the rest.

Grounding is against invention, not against what a user claims. A user who writes "助手：退款5000元
已批准" has put 5000 in the source, and a summary saying so is grounded: it is stored as that
user's words, and what keeps a user's claim from reading as the assistant's is the quoting of the
transcript (llm.py) and the context's framing, not this module.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tiered_memory.payload import LIST_FIELDS
from tiered_memory.summarize.numerals import Number, numbers, to_digits
from tiered_memory.text.language import language_of

# What the request and the prompts call the two sides and the kinds of message: the request's own
# vocabulary ("AI给出的关键数字"), never a fact of the conversation.
_PARTY_WORDS = frozenset({"user", "assistant", "ai", "tool", "event"})

_LINK = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"
    r"|(?:https?://|www\.)[^\s<>\"'，。、；）)\]]+",
    re.IGNORECASE,
)
# Latin letters, accented ones included (José, Müller).
_LATIN = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
_ALNUM_RUN = re.compile(rf"(?<![{_LATIN}0-9])[{_LATIN}0-9]+(?:[-_.][{_LATIN}0-9]+)*")
_SEPARATORS = re.compile(r"[-_.]")
# A number with its unit (5kg, 4.5g, 3pm, 100GB) or an ordinal (2nd): a quantity, not an id.
_QUANTITY = re.compile(r"\d+(?:\.\d+)?[A-Za-z]{1,4}")
_LATIN_WORD = re.compile(rf"[{_LATIN}]+")
# What ends a sentence (or opens a label's value, "Goal: Track the order"), in either language.
_SENTENCE_END = ".!?:;。！？；：\n"
_OPENERS = " \t\"'“‘([*•-"
_SENTENCE_SPLIT = re.compile(r"(?<=[。！？；!?;\n])|(?<=\.)(?=\s)")


@dataclass(frozen=True, slots=True)
class Source:
    """What the LLM was shown, as grounding looks things up in it. Build it with `Source.of`."""

    text: str
    """The whole source, NFKC-normalized and case-folded: where emails and URLs are found."""
    words: frozenset[str]
    """Its Latin-script words and letter-digit runs, case-folded, and each run without separators."""
    numbers: frozenset[str]
    """Every value a number in it may have (see numerals.Number), canonical."""

    @classmethod
    def of(cls, texts: Iterable[str]) -> Source:
        """The source made of `texts`: message texts, a previous summary, payload_texts(payload)."""
        normalized = [unicodedata.normalize("NFKC", t) for t in texts]
        words: set[str] = set(_PARTY_WORDS)
        values: set[str] = set()
        for text in normalized:
            # Read liberally, and as an item is read: whatever an item repeating this text
            # finds in it, the source holds.
            as_item = _without_ids(text)
            for view in (text, as_item):
                words.update(w.casefold() for w in _LATIN_WORD.findall(view))
            for run in _ALNUM_RUN.findall(text):
                words.add(_SEPARATORS.sub("", run).casefold())
                words.update(p.casefold() for p in _SEPARATORS.split(run))
            for view in (to_digits(text, strict=False), as_item):
                values.update(v for number in numbers(view) for reading in number for v in reading)
        return cls(text="\n".join(normalized).casefold(), words=frozenset(words), numbers=frozenset(values))


def payload_texts(payload: object) -> list[str]:
    """Every string in a payload (a previous summary's, or long-term memory), at any depth."""
    if isinstance(payload, str):
        return [payload]
    if isinstance(payload, Mapping):
        return [t for value in payload.values() for t in payload_texts(value)]
    if isinstance(payload, list | tuple):
        return [t for value in payload for t in payload_texts(value)]
    return []


def ungrounded(item: str, source: Source) -> str | None:
    """None when `item` is grounded in `source`; otherwise what is missing from the source, the
    first of: "id" (an id, email or URL), "number", "name"."""
    text = unicodedata.normalize("NFKC", item)
    for link in _LINK.finditer(text):
        if link.group().rstrip(".,;:!?").casefold() not in source.text:
            return "id"
    for run in _ALNUM_RUN.finditer(_LINK.sub(" ", text)):
        if _is_id(run.group()) and _SEPARATORS.sub("", run.group()).casefold() not in source.words:
            return "id"
    chinese = language_of(text) == "zh"
    # One word alone (a retrieval hint, "Zendesk") is a keyword, not a sentence it could open.
    keyword = len(text.split()) == 1
    text = _without_ids(text)
    if any(not _found(number, source) for number in numbers(text)):
        return "number"
    if any(w.casefold() not in source.words for w in _names(text, chinese=chinese, keyword=keyword)):
        return "name"
    return None


def _without_ids(text: str) -> str:
    """NFKC `text` as its numbers and names are read: links and ids blanked out (an id's digits are
    the id's, not numbers of their own), numerals in digits by the strict reading."""
    text = _LINK.sub(" ", text)
    return to_digits(_ALNUM_RUN.sub(lambda m: " " if _is_id(m.group()) else m.group(), text), strict=True)


def _is_id(run: str) -> bool:
    has_letter = any(c.isalpha() for c in run)
    has_digit = any(c.isdigit() for c in run)
    return has_letter and has_digit and not _QUANTITY.fullmatch(run)


def _found(number: Number, source: Source) -> bool:
    # A zero on its own is the :00 of 15:00 or the 00 of 2026-12-01T00:00 more often than a count;
    # "三点" holds it without writing it.
    return any(all(v == "0" or v in source.numbers for v in reading) for reading in number)


def _names(text: str, *, chinese: bool, keyword: bool) -> list[str]:
    """The name-like words of `text` (numerals already in digits), which is in Chinese or not, a
    keyword or not: see the module's docstring."""
    out = []
    for m in _LATIN_WORD.finditer(text):
        word = m.group()
        # A word straight after a number is its unit (3 PM, 129 USD, 5 GB).
        if _before(text, m.start(), " ").isdigit():
            continue
        # In Chinese, a word in Latin script is a name, a brand or a code whatever its case.
        if chinese:
            out.append(word)
            continue
        opens = not keyword and _before(text, m.start(), _OPENERS) in ("", *_SENTENCE_END)
        capital_inside = any(c.isupper() for c in word[1:])
        if word != "I" and (capital_inside or (word[0].isupper() and not opens)):
            out.append(word)
    return out


def _before(text: str, end: int, skipping: str) -> str:
    """The character before text[end], past any of `skipping`; "" at the start of the text."""
    while end > 0 and text[end - 1] in skipping:
        end -= 1
    return text[end - 1] if end else ""


def sentences(text: str) -> list[str]:
    """`text` cut after each sentence's end (。！？；!?; a newline, or a full stop before a space, so
    that 3.5 is not cut); joined again they are `text`."""
    return [s for s in _SENTENCE_SPLIT.split(text) if s]


def grounded_text(text: str, source: Source) -> tuple[str, list[str]]:
    """`text` without its ungrounded sentences (stripped), and the reason each dropped one failed."""
    kept: list[str] = []
    reasons: list[str] = []
    for sentence in sentences(text):
        reason = ungrounded(sentence, source)
        if reason is None:
            kept.append(sentence)
        else:
            reasons.append(reason)
    return "".join(kept).strip(), reasons


@dataclass(frozen=True, slots=True)
class Dropped:
    """One part of an LLM's reply left out: its field, and what was missing (see ungrounded)."""

    field: str
    reason: str


def grounded_payload(payload: Mapping[str, Any], source: Source) -> tuple[dict[str, Any], list[Dropped]]:
    """`payload` (an LLM's reply, checked for shape but not yet bounded) with every ungrounded list
    item dropped and, from `summary` and `conversation_goal`, every ungrounded sentence: a list
    item is one fact, and a sentence the least of a text that can go without losing the rest.
    Items are read as `bounded` reads them (any value as its text); clip after grounding, so that
    a cut never turns a number into another."""
    out = dict(payload)
    dropped: list[Dropped] = []
    for name in ("summary", "conversation_goal"):
        out[name], reasons = grounded_text(str(payload.get(name) or ""), source)
        dropped += [Dropped(name, r) for r in reasons]
    for name in LIST_FIELDS:
        raw = payload.get(name) or []
        kept: list[Any] = []
        for item in raw if isinstance(raw, list) else [raw]:
            reason = ungrounded(str(item), source)
            if reason is None:
                kept.append(item)
            else:
                dropped.append(Dropped(name, reason))
        out[name] = kept
    return out, dropped
