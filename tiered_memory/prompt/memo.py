"""What the budget policy reads of a message: its features (what a question may ask for), its
condensed clauses and its key points, worked out once per message and kept in a bounded memo
(`MemoCache`) by whoever reads contexts, so a long session's context read does not redo it."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from tiered_memory.lru import Lru
from tiered_memory.model import Message, Role
from tiered_memory.text.condense import condensed_clauses, keys, words
from tiered_memory.text.quoting import quoted, remembered


def features(text: str, terms: frozenset[str] = frozenset(), names: frozenset[str] = frozenset()) -> frozenset[str]:
    """What a question may ask for in `text`, tagged by class: keys (numbers, names, and the
    session's `names` found in it) bare, the session's other salient terms behind "\x01", other
    content words behind "\x00"."""
    folded = text.casefold()
    found = keys(text) | {n for n in names if n in folded}
    tagged = set(found)
    tagged.update("\x01" + t for t in terms if t in folded and t not in found)
    tagged.update("\x00" + w for w in words(text) - found)
    return frozenset(tagged)


@dataclass(frozen=True, slots=True)
class Clause:
    """One clause of a message, condensed: whether it holds a key (a number or a capitalised
    name), and its features (see `features`, without the session's terms)."""

    text: str
    key: bool
    features: frozenset[str]


@dataclass(frozen=True, slots=True)
class MessageMemo:
    """What the policy reads of one message whatever the session's summary says, worked out once:
    its condensed clauses, its features, and its text case-folded (to find the session's terms)."""

    clauses: tuple[Clause, ...]
    features: frozenset[str]
    folded: str


def memo_of(content: str) -> MessageMemo:
    """The notes of a message's `content`."""
    return MessageMemo(
        clauses=tuple(Clause(text, bool(keys(text)), features(text)) for text in condensed_clauses(content)),
        features=features(content),
        folded=content.casefold(),
    )


@dataclass(frozen=True, slots=True)
class View:
    """A message's notes read with the session's terms and names: its condensed form, its key
    points, and the features of the message and of each form."""

    condensed: str
    salient: str
    features: frozenset[str]
    condensed_features: frozenset[str]
    salient_features: frozenset[str]


def view_of(n: MessageMemo, terms: frozenset[str], names: frozenset[str]) -> View:
    """The notes read with the session's salient `terms` and `names`."""
    present = {t for t in names if t in n.folded}
    tagged = present | {"\x01" + t for t in terms if t in n.folded and t not in n.features}
    chosen = [c for c in n.clauses if c.key or any(name in c.text.casefold() for name in present)]
    salient = " ".join(c.text for c in chosen)
    folded = salient.casefold()
    # Quoted again once condensed: dropping punctuation and small words may rebuild a label
    # (`SYSTEM, PROMPT: x` → `SYSTEM PROMPT: x`) from text quoted whole (quoting.py).
    return View(
        condensed=quoted(" ".join(c.text for c in n.clauses)),
        salient=quoted(salient),
        features=n.features | tagged,
        condensed_features=frozenset().union(*(c.features for c in n.clauses)) | tagged,
        salient_features=frozenset().union(*(c.features for c in chosen))
        | {f for f in tagged if f.lstrip("\x01") in folded},
    )


# What a message's notes are made from: its role, content, tool calls and name (dialogue.readable).
_Source = tuple[Role, str, str, str | None]


class MemoCache:
    """A bounded memo of what the policy reads: each message's `MessageMemo` and its latest `View` by
    (session, seq), and the features of a text the summary renders by (session, summary, text).
    `summary` is any value that changes whenever the session's terms may (its version and write
    time), so a summary never reads with another's terms.

    A view is kept with the terms and names it was read with and answers only for the same ones:
    a new summary that brings no new terms (most do not) reads every message from the memo, so a
    long session's context does not redo its views each time the summary moves. A message entry
    is checked against what it was made from (role, content, tool calls, name): a session deleted
    and started again under its id reuses its seqs, and a new message must never read as an old
    one. Owned by whoever reads contexts; the least recently used entries go first."""

    def __init__(self, max_entries: int = 16_384) -> None:
        self._notes: Lru[tuple[str, int], tuple[_Source, MessageMemo]] = Lru(max_entries)
        self._views: Lru[tuple[str, int], tuple[_Source, frozenset[str], frozenset[str], View]] = Lru(max_entries)
        self._texts: Lru[tuple[str, Hashable, str], frozenset[str]] = Lru(max_entries // 16)

    def view(self, session: str, m: Message, terms: frozenset[str], names: frozenset[str]) -> View:
        """The view of message `m` of `session` read with the session's `terms` and `names`."""
        key = (session, m.seq)
        source = (m.role, m.content, m.tool_calls, m.name)
        found = self._views.get(key)
        # The session's terms are the same sets from one read to the next (the fact book's):
        # `is` first, since comparing two sets compares their members even when they are one.
        if (
            found is not None
            and found[0] == source
            and (found[1] is terms or found[1] == terms)
            and (found[2] is names or found[2] == names)
        ):
            return found[3]
        notes = self._notes.get(key)
        if notes is None or notes[0] != source:
            notes = self._notes.put(key, (source, memo_of(remembered(m))))
        return self._views.put(key, (source, terms, names, view_of(notes[1], terms, names)))[3]

    def features(
        self, key: tuple[str, Hashable], text: str, terms: frozenset[str], names: frozenset[str]
    ) -> frozenset[str]:
        """The features of a text rendered from the summary `key[1]` of session `key[0]`."""
        memo = (key[0], key[1], text)
        found = self._texts.get(memo)
        return found if found is not None else self._texts.put(memo, features(text, terms, names))
