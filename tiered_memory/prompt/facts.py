"""The deterministic summarizer's stored facts (`Extraction.structured`): their state, how it is
kept bounded, and how it is rendered for any budget. Pure and cheap (no jieba): a context reads
them on every request (`FactBook`), while extractive.py, which finds the facts, writes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiered_memory.lru import Lru
from tiered_memory.model import Role
from tiered_memory.text.quoting import quoted

_VERSION = 1
_MAX_ENTITIES = 64
# Part of an item's JSON framing (["fact", "assistant", 1, 123, "", 45] is ~30 characters) counted
# against the stored budget: enough to bound the count of short items, not so much that the dense
# clauses the context re-renders from are pruned away (measured in docs/QUALITY.md).
_ITEM_OVERHEAD = 4
# Salience per mention above which a stored entity is a name: names score 3x their information
# (about 25-55), keywords 1x (about 5-18).
_NAME_SCORE = 20.0  # jieba tags frequent words such as 谢谢 or 明白 `nr`; real names are rare words
EARLIER, PROFILE, FACT, EVENT, QUESTION = "earlier", "profile", "fact", "event", "question"
_KINDS = (EARLIER, PROFILE, FACT, EVENT, QUESTION)
_LABELS = {  # per language: the labels of _KINDS, in order, then of the topics
    "zh": ("早前摘要：", "用户信息/偏好：", "关键信息：", "事件：", "用户问过：", "提到："),
    "en": ("Earlier summary: ", "User info/preferences: ", "Key facts: ", "Events: ", "User asked: ", "Mentioned: "),
}
# Per language: the separator of items, of topics, and the prefix of the assistant's statements.
_PUNCTUATION = {"zh": ("；", "、", "助手："), "en": ("; ", ", ", "assistant: ")}
NOT_WORD = re.compile(r"[\W_]+")
CJK = re.compile(r"[\u3400-\u9fff]")
LATIN = re.compile(r"[A-Za-z]")


def events_line(events: Sequence[str], lang: str) -> str:
    """The gateway's `events` as a summary lists them: `Events: a; b` (`事件：a；b`)."""
    return _LABELS[lang][_KINDS.index(EVENT)] + _PUNCTUATION[lang][0].join(events)


@dataclass(slots=True)
class Item:
    kind: str
    speaker: str
    rank: int  # 0 is kept first; within a rank the earliest `order` wins
    order: int
    text: str
    turn: int = 0  # the turn that said it; 0 when unknown (items stored before turns were kept)


class State:
    """The facts so far; `dump` and `load` convert it to and from `Extraction.structured`:
    {"version": 1, "items": [[kind, speaker, rank, order, text, turn]...], "entities": [[term, score,
    first order, count]...], "script": [CJK chars, Latin letters], "next": next order}."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.keys: set[str] = set()
        self.entities: dict[str, list[float]] = {}  # term -> [score, first order, count]
        self.script = [0, 0]  # CJK characters, Latin letters: which language the labels speak
        self.next = 0
        self.subject = ""  # the user's first clause that names something: what the session is about

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> State | None:
        """None when `data` is not ours (e.g. written by another summarizer): the caller starts over."""
        state = cls()
        try:
            if data.get("version") != _VERSION:
                return None
            for kind, speaker, rank, order, text, *turn in data["items"]:
                # Items written before the turn was recorded have five fields: turn 0, "long ago".
                state.add(str(kind), str(speaker), int(rank), str(text), int(turn[0]) if turn else 0)
                state.items[-1].order = int(order)
            for term, score, first, count in data["entities"]:
                state.entities[str(term)] = [float(score), float(first), float(count)]
            cjk, latin = data["script"]
            state.script = [int(cjk), int(latin)]
            state.next = int(data["next"])
            state.subject = str(data.get("subject", ""))
        except (KeyError, TypeError, ValueError):
            return None
        return state

    def dump(self) -> dict[str, Any]:
        return {
            "version": _VERSION,
            "items": [[i.kind, i.speaker, i.rank, i.order, i.text, i.turn] for i in self.items],
            "entities": [[term, round(v[0], 3), int(v[1]), int(v[2])] for term, v in self.entities.items()],
            "script": list(self.script),
            "next": self.next,
            "subject": self.subject,
        }

    def add(self, kind: str, speaker: str, rank: int, text: str, turn: int = 0) -> None:
        """Append unless the same text (ignoring case, spaces and punctuation) is already kept."""
        key = NOT_WORD.sub("", text.lower())
        if key and key not in self.keys:
            self.keys.add(key)
            self.items.append(Item(kind, speaker, rank, self.next, text, turn))
            self.next += 1

    def replace_earlier(self, text: str) -> None:
        self.items = [i for i in self.items if i.kind != EARLIER]
        self.keys = {NOT_WORD.sub("", i.text.lower()) for i in self.items}
        self.add(EARLIER, "", 0, text)

    def count_script(self, text: str) -> None:
        self.script[0] += len(CJK.findall(text))
        self.script[1] += len(LATIN.findall(text))

    def mention(self, term: str, score: float) -> None:
        entry = self.entities.setdefault(term, [0.0, float(self.next), 0.0])
        entry[0] += score
        entry[2] += 1

    def topics(self, limit: int) -> tuple[str, ...]:
        chosen: list[str] = []
        for term, (_, _, count) in sorted(self.entities.items(), key=_salience):
            if len(chosen) >= limit:
                break
            if term.isascii() and term.islower() and count < 2:
                continue  # an untagged English word is a topic only when it recurs
            if not any(term in c or c in term for c in chosen):
                chosen.append(term)
        return tuple(chosen)

    def prune(self, budget: int) -> None:
        """Bound what is stored: half the budget by the rendering priority (the early facts that
        nothing else remembers), the other half the newest items (what continues the raw turns a
        context shows backwards), so that a long session keeps both ends."""
        kept: set[int] = set()
        for order_key, share in ((lambda i: (i.rank, i.order), budget // 2), (lambda i: -i.order, budget)):
            used = sum(len(i.text) + _ITEM_OVERHEAD for i in self.items if i.order in kept)
            limit = share if share == budget // 2 else budget
            for item in sorted(self.items, key=order_key):
                # Each item costs a little JSON framing too, so that many short items stay bounded.
                cost = len(item.text) + _ITEM_OVERHEAD
                if item.order in kept:
                    continue
                if used + cost <= limit or item.kind == EARLIER:
                    kept.add(item.order)
                    used += cost
        self.items = [i for i in self.items if i.order in kept]
        if len(self.entities) > _MAX_ENTITIES:
            top = sorted(self.entities.items(), key=_salience)[:_MAX_ENTITIES]
            self.entities = dict(sorted(top, key=lambda kv: (kv[1][1], kv[0])))


def _salience(entry: tuple[str, list[float]]) -> tuple[float, float, str]:
    term, (score, first, _) = entry
    return (-score, first, term)


def lead(text: str, limit: int) -> str:
    """The first sentences of `text` that fit in `limit` (>= 1) chars: the early part of a summary
    is the part nothing else remembers."""
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 1, 0)]
    stop = max(cut.rfind(mark) for mark in "。！？；.!?;")
    return cut[: stop + 1] if stop >= limit // 2 else cut + "…"


def _by_rank(item: Item) -> tuple[int, int]:
    return (item.rank, item.order)


def _newest_first(item: Item) -> tuple[int, int]:
    """By rank, then newest first: beside raw recent turns, the summary continues them backwards.
    (Measured: ranking first keeps more than pure recency; docs/QUALITY.md.)"""
    return (item.rank, -item.order)


def render_items(
    items: Sequence[Item], lang: str, topics: Sequence[str], max_chars: int, *, newest_first: bool = False
) -> str:
    """One line per kind. Items are admitted by (rank, order) while they fit (newest first with
    `newest_first`, see _newest_first), then shown in conversation order; leftover room lists the
    topics not already named."""
    *kind_labels, label = _LABELS[lang]
    labels = dict(zip(_KINDS, kind_labels, strict=True))
    separator, joiner, assistant = _PUNCTUATION[lang]
    chosen: dict[str, list[tuple[int, str]]] = {kind: [] for kind in _KINDS}
    used = 0
    for item in sorted(items, key=_newest_first if newest_first else _by_rank):
        # Quoted before the speaker is named: the fact is what someone said, the label is ours.
        text = quoted(item.text)
        piece = assistant + text if item.speaker == Role.ASSISTANT.value else text
        if item.kind == EARLIER:
            piece = lead(piece, max(max_chars // 2 - len(labels[EARLIER]), 1))
        bucket = chosen[item.kind]
        cost = len(piece) + (len(separator) if bucket else len(labels[item.kind]) + (1 if used else 0))
        if used + cost <= max_chars:
            bucket.append((item.order, piece))
            used += cost
    lines = [labels[kind] + separator.join(p for _, p in sorted(chosen[kind])) for kind in _KINDS if chosen[kind]]
    body = "\n".join(lines)
    extra: list[str] = []
    for topic in (t for t in topics if t.lower() not in body.lower()):
        if used + (1 if used else 0) + len(label + joiner.join([*extra, topic])) > max_chars:
            break
        extra.append(topic)
    if extra:
        body += ("\n" if body else "") + label + joiner.join(extra)
    return body[:max_chars]


class FactBook:
    """A summary's stored facts (`Extraction.structured`), loaded once, rendered at any budget:
    a context tries several layouts, each asking for the facts in another room. It remembers
    its renders, so it belongs to one thread (the reads keep one per summary, on the event loop)."""

    def __init__(self, state: State) -> None:
        self._state = state
        cjk, latin = state.script
        self._lang = "zh" if cjk > 0 and cjk * 3 >= latin else "en"
        self._terms: tuple[frozenset[str], frozenset[str]] | None = None
        # A session's contexts ask for the same few rooms until its next summary: rendered once.
        self._rendered: Lru[tuple[int, int | None, tuple[str, ...], bool], str] = Lru(64)

    @classmethod
    def load(cls, structured: Mapping[str, Any]) -> FactBook | None:
        """None when `structured` is not this extractor's."""
        state = State.load(structured)
        return None if state is None else cls(state)

    @property
    def subject(self) -> str:
        return self._state.subject

    def terms(self) -> tuple[frozenset[str], frozenset[str]]:
        """The session's salient terms, case-folded: (names, other keywords). A name scored
        three times a keyword's information per mention (see `_terms`): that tells them apart
        where there are no capitals to go by (Chinese)."""
        if self._terms is None:
            names: set[str] = set()
            others: set[str] = set()
            for term, (score, _, count) in self._state.entities.items():
                (names if score / max(count, 1.0) >= _NAME_SCORE else others).add(term.casefold())
            self._terms = frozenset(names), frozenset(others)
        return self._terms

    def render(
        self,
        max_chars: int,
        *,
        before_turn: int | None = None,
        topics: Sequence[str] = (),
        newest_first: bool = False,
    ) -> str:
        """The facts said before `before_turn` only (the turns from there on are shown beside
        them), whole facts chosen by priority, in at most `max_chars`. Pure and cheap: no jieba."""
        if max_chars <= 0:
            return ""
        key = (max_chars, before_turn, tuple(topics), newest_first)
        found = self._rendered.get(key)
        if found is None:
            items = [i for i in self._state.items if before_turn is None or i.turn < before_turn]
            found = self._rendered.put(
                key, render_items(items, self._lang, topics, max_chars, newest_first=newest_first)
            )
        return found


def render(
    structured: Mapping[str, Any],
    max_chars: int,
    *,
    before_turn: int | None = None,
    topics: Sequence[str] = (),
    newest_first: bool = False,
) -> str | None:
    """The summary text of stored facts (`Extraction.structured`) at another budget, from the
    facts said before `before_turn` only (the turns from there on are shown raw beside it), so
    that a small budget holds whole facts chosen by priority rather than the cut-off start of a
    longer text. None when `structured` is not this extractor's. Pure and cheap: no jieba."""
    book = FactBook.load(structured)
    if book is None or max_chars <= 0:
        return None
    return book.render(max_chars, before_turn=before_turn, topics=topics, newest_first=newest_first)
