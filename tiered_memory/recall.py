"""Query-aware recall: per-session BM25 indexes over the messages, kept in process and up to date.

Each indexed session holds its messages' terms (jieba words for Chinese, words and numbers for
English) as postings. An index is built once from SQL on the first question about a session, then
grows with every append this process sees, and catches up from SQL with only the messages it lacks
(another replica's appends): never a scan of every message per request. The least recently used
sessions are dropped beyond a bound, so memory stays bounded; a dropped index is rebuilt on demand.
A session deleted (here) drops its index; one whose messages no longer match (deleted and recreated
elsewhere) is rebuilt.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tiered_memory.model import Message, Role, Slice

# BM25's usual constants: term-frequency saturation and length normalisation.
_K1 = 1.2
_B = 0.75


@dataclass(frozen=True, slots=True)
class Doc:
    """An indexed message: enough to show it as a snippet without asking SQL."""

    seq: int
    turn: int
    role: Role
    message_id: str
    content: str
    length: int

    def as_message(self, session_id: str) -> Message:
        """A Message for display (created_at is not kept: 0)."""
        return Message(session_id, self.seq, self.turn, self.role, self.content, self.message_id, 0.0)


@dataclass(slots=True)
class SessionIndex:
    """One session's postings: term -> {seq: term frequency}, and each message's length in terms."""

    last_seq: int = 0
    docs: dict[int, Doc] = field(default_factory=dict)
    postings: dict[str, dict[int, int]] = field(default_factory=dict)
    total_terms: int = 0

    def add(self, message: Message, terms: Sequence[str]) -> None:
        """Index the next message (seq last_seq + 1); anything else is ignored."""
        if message.seq != self.last_seq + 1:
            return
        self.last_seq = message.seq
        if not message.answered:
            return  # a stopped or failed reply is never shown, so never recalled
        self.docs[message.seq] = Doc(
            message.seq, message.turn, message.role, message.message_id, message.content, len(terms)
        )
        self.total_terms += len(terms)
        for term in terms:
            entry = self.postings.setdefault(term, {})
            entry[message.seq] = entry.get(message.seq, 0) + 1

    def turn_of(self, seq: int) -> list[Doc]:
        """The indexed messages of the turn holding `seq` (a question and its answer), in order."""
        doc = self.docs.get(seq)
        if doc is None:
            return []
        out = [doc]
        for other in (seq - 1, seq + 1):
            near = self.docs.get(other)
            if near is not None and near.turn == doc.turn:
                out.append(near)
        return sorted(out, key=lambda d: d.seq)

    def consistent_with(self, messages: Iterable[Message]) -> bool:
        """False when a message the index holds has another id now (the session was recreated)."""
        for m in messages:
            doc = self.docs.get(m.seq)
            if doc is not None and doc.message_id != m.message_id:
                return False
        return True

    def search(self, terms: Sequence[str], *, k: int, before_seq: int | None = None) -> list[tuple[int, float]]:
        """The k best (seq, score) by BM25, best first; only messages before `before_seq` when given.
        Costs the postings of the query's terms, not the session's length."""
        n = len(self.docs)
        if n == 0 or k <= 0:
            return []
        mean = self.total_terms / n or 1.0
        scores: dict[int, float] = {}
        for term in set(terms):
            entry = self.postings.get(term)
            if not entry:
                continue
            idf = math.log(1 + (n - len(entry) + 0.5) / (len(entry) + 0.5))
            for seq, tf in entry.items():
                if before_seq is not None and seq >= before_seq:
                    continue
                norm = tf + _K1 * (1 - _B + _B * self.docs[seq].length / mean)
                scores[seq] = scores.get(seq, 0.0) + idf * tf * (_K1 + 1) / norm
        best = sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))
        return best[:k]


@dataclass(frozen=True, slots=True)
class RecallMatch:
    """One answer of a recall: the matching message, its score, the raw messages of its turn, and
    the summary slice that covers it (None when no summary covers it yet)."""

    seq: int
    turn: int
    score: float
    slice: Slice | None
    messages: list[Message]


class RecallIndex:
    """The indexes of as many sessions as hold `max_messages` indexed messages in all, least
    recently used dropped first. Bounded by messages, not sessions: a daemon serves thousands of
    short sessions at once, and a bound of a few hundred sessions rebuilt an index from SQL on
    nearly every question (docs/BENCHMARKS.md); what an index costs grows with its messages.

    `tokenize` turns text into search terms; it may be called from worker threads."""

    def __init__(self, tokenize: Callable[[str], list[str]], *, max_messages: int = 20_000) -> None:
        self.tokenize = tokenize
        self._max = max_messages
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, SessionIndex] = OrderedDict()
        self._sizes: dict[str, int] = {}  # each index's messages when last counted
        self._messages = 0

    def get(self, session_id: str) -> SessionIndex | None:
        with self._lock:
            index = self._sessions.get(session_id)
            if index is not None:
                self._sessions.move_to_end(session_id)
            return index

    def put(self, session_id: str, index: SessionIndex) -> None:
        with self._lock:
            self._sessions[session_id] = index
            self._sessions.move_to_end(session_id)
            self._count(session_id, index)
            # The newest index stays even alone over the bound: it is the one being asked.
            while self._messages > self._max and len(self._sessions) > 1:
                gone, _ = self._sessions.popitem(last=False)
                self._messages -= self._sizes.pop(gone, 0)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)
            self._messages -= self._sizes.pop(session_id, 0)

    def _count(self, session_id: str, index: SessionIndex) -> None:
        size = len(index.docs)
        self._messages += size - self._sizes.get(session_id, 0)
        self._sizes[session_id] = size

    def indexed(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._sessions

    def appended(self, message: Message, terms: Sequence[str]) -> None:
        """Index an appended message (its search `terms`) if its session is indexed and it is the
        next one; otherwise the next question catches up from SQL."""
        index = self.get(message.session_id)
        if index is not None and message.seq == index.last_seq + 1:
            index.add(message, terms)
            with self._lock:
                if self._sessions.get(message.session_id) is index:
                    self._count(message.session_id, index)

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def messages(self) -> int:
        """Messages indexed in all, as last counted."""
        return self._messages
