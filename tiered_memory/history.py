"""What the context reads beyond the hot window: raw turns from before it, and the earlier turns
that match a question (through the per-session recall indexes of recall.py).

Both read SQL, bounded: older turns in one read sized by the room and the session's mean message
length; a recall index catches up with only the messages it lacks, in the background: a question
waits for it QUESTION_WAIT_S at most. A failed read is counted (`sql_error`) and costs the context
only what it would have added; `matches` (the recall endpoint's answer) raises instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Callable, Sequence

import structlog

from tiered_memory.context import OLDER_MAX_MESSAGES
from tiered_memory.errors import SqlUnavailable
from tiered_memory.model import Message
from tiered_memory.recall import RecallIndex, RecallMatch, SessionIndex
from tiered_memory.tiers.sql_store import SqlStore

log = structlog.get_logger("tiered_memory.history")

# Messages read from SQL per step when a recall index is built or catches up.
_INDEX_BATCH = 1000
# How long a question waits for its session's recall index to be built or caught up. A session
# of thousands of turns takes seconds to index the first time a process is asked about it; past
# this the context goes without the question's earlier turns, and the build goes on in the
# background for the next question.
QUESTION_WAIT_S = 0.1
# Earlier turns considered for a question's snippets.
_SNIPPET_TURNS = 8


class History:
    def __init__(
        self,
        store: SqlStore,
        index: RecallIndex,
        *,
        sql_error: Callable[[str], None],
        question_unindexed: Callable[[], None] = lambda: None,
        question_wait_s: float = QUESTION_WAIT_S,
    ) -> None:
        """`question_unindexed` is called for each question answered without its earlier turns
        because the session's index was still being built."""
        self._store = store
        self._index = index
        self._sql_error = sql_error
        self._question_unindexed = question_unindexed
        self._question_wait_s = question_wait_s
        self._pending: list[Message] = []
        self._indexer: asyncio.Task[None] | None = None
        # The index builds in progress, by session: a question and the recall endpoint join the
        # one under way rather than start another.
        self._builds: dict[str, asyncio.Task[SessionIndex]] = {}

    def appended(self, message: Message) -> None:
        """Index an appended message of an indexed session, off the event loop (jieba takes a
        fraction of a millisecond per message, and holds the loop meanwhile): queued, tokenized
        in a worker thread in arrival order, then added. A question before that catches up from
        SQL with what the index lacks, as after a restart."""
        if not self._index.indexed(message.session_id):
            return
        self._pending.append(message)
        if self._indexer is None or self._indexer.done():
            self._indexer = asyncio.create_task(self._index_pending(), name="recall-indexer")

    async def _index_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            terms = await asyncio.to_thread(_tokenize_all, self._index.tokenize, batch)
            for m, t in zip(batch, terms, strict=True):
                self._index.appended(m, t)

    async def aclose(self) -> None:
        """Stop indexing appends and building indexes (what is left is caught up from SQL by the
        next process)."""
        self._pending = []
        tasks = [t for t in (self._indexer, *self._builds.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, SqlUnavailable):
                await task

    def forget(self, session_id: str) -> None:
        """Drop the session's index, and any build of it under way (it would put the deleted
        session's index back)."""
        build = self._builds.pop(session_id, None)
        if build is not None:
            build.cancel()
        self._index.forget(session_id)

    async def older(
        self,
        session_id: str,
        recent: Sequence[Message],
        available: Sequence[Message],
        room: int,
        *,
        message_count: int | None,
        content_chars: int | None,
    ) -> list[Message]:
        """Raw messages from before the window, newest last: the newest that hold `room`
        characters, at most OLDER_MAX_MESSAGES (a budget the summary and the window leave unused
        is better spent on the turns themselves). The hot list is used first; SQL is asked (one
        bounded read) only for what it lacks, so that both give the same messages."""
        if room <= 0 or not recent or recent[0].seq <= 1:
            return []
        first = recent[0].seq
        older = [m for m in available if m.seq < first]
        if (older and older[-1].seq != first - 1) or any(b.seq != a.seq + 1 for a, b in itertools.pairwise(older)):
            older = []  # not contiguous with the window: SQL answers instead
        older = _newest_holding(older[-OLDER_MAX_MESSAGES:], room)
        lacking = room - sum(len(m.content) for m in older)
        start = older[0].seq if older else first
        most = OLDER_MAX_MESSAGES - len(older)
        if lacking <= 0 or start <= 1 or most <= 0:
            return older
        # The session's mean message length sizes the read; a little over, since the newest
        # messages may be shorter than the mean, and what is over is dropped.
        mean = max(8.0, (content_chars or 0) / message_count) if message_count else 40.0
        want = min(most, start - 1, math.ceil(1.25 * lacking / mean) + 2)
        try:
            rows = await self._store.messages_by_seq(session_id, first_seq=start - want, last_seq=start - 1, limit=want)
        except SqlUnavailable:
            self._sql_error("read_older")
            return older
        return _newest_holding([*rows, *older], room)

    async def snippets(
        self, session_id: str, question: str, message_count: int, *, before_seq: int, seen: Sequence[Message]
    ) -> tuple[list[str], list[list[Message]]]:
        """The question's search terms and the turns before `before_seq` that best match it, best
        first (no turns when SQL is needed and unavailable: a question never fails a context)."""
        terms = await asyncio.to_thread(self._index.tokenize, question)
        if not terms:
            return terms, []
        index = self._ready(session_id, message_count, seen)
        if index is None:
            build = self._build(session_id, message_count, seen)
            try:
                index = await asyncio.wait_for(asyncio.shield(build), self._question_wait_s)
            except TimeoutError:
                self._question_unindexed()
                return terms, []
            except SqlUnavailable:
                return terms, []  # counted by _built
            except asyncio.CancelledError:
                if _cancelling():
                    raise
                return terms, []  # the session was deleted meanwhile (forget)
        turns: list[list[Message]] = []
        done: set[int] = set()
        for seq, _score in index.search(terms, k=2 * _SNIPPET_TURNS, before_seq=before_seq):
            docs = index.turn_of(seq)
            if docs[0].turn in done:
                continue
            done.add(docs[0].turn)
            turns.append([d.as_message(session_id) for d in docs])
            if len(turns) == _SNIPPET_TURNS:
                break
        return terms, turns

    async def matches(self, session_id: str, query: str, message_count: int, k: int) -> list[RecallMatch]:
        """The k messages that best match `query` (BM25), best first, each with the raw messages
        of its turn and the slice that covers it. Raises SqlUnavailable."""
        terms = await asyncio.to_thread(self._index.tokenize, query)
        if not terms:
            return []
        index = self._ready(session_id, message_count, ())
        if index is None:
            # A build under way may stop short of message_count (the second call catches up the
            # rest) or reach past it (a question read a newer count): either serves.
            try:
                index = await asyncio.shield(self._build(session_id, message_count, ()))
            except asyncio.CancelledError:
                if _cancelling():
                    raise
                return []  # the session was deleted meanwhile (forget)
            if index.last_seq < message_count:
                index = await self._caught_up(session_id, message_count, ())
        hits = index.search(terms, k=k)
        if not hits:
            return []
        slices = await self._store.slices(session_id)
        out = []
        for seq, score in hits:
            docs = index.turn_of(seq)
            rows = await self._store.messages_by_seq(
                session_id, first_seq=docs[0].seq, last_seq=docs[-1].seq, limit=len(docs) + 8
            )
            covering = next((s for s in slices if s.first_seq <= seq <= s.last_seq), None)
            out.append(RecallMatch(seq=seq, turn=docs[0].turn, score=score, slice=covering, messages=rows))
        return out

    def _ready(self, session_id: str, message_count: int, seen: Sequence[Message]) -> SessionIndex | None:
        """The session's recall index when it has every message up to `message_count`."""
        index = self._index.get(session_id)
        if index is None or index.last_seq != message_count or not index.consistent_with(seen):
            return None
        return index

    def _build(self, session_id: str, message_count: int, seen: Sequence[Message]) -> asyncio.Task[SessionIndex]:
        """The build (or catch-up) of the session's index under way, else a new one."""
        build = self._builds.get(session_id)
        if build is None:
            build = asyncio.create_task(self._caught_up(session_id, message_count, seen), name="recall-index")
            self._builds[session_id] = build
            build.add_done_callback(lambda done: self._built(session_id, done))
        return build

    def _built(self, session_id: str, build: asyncio.Task[SessionIndex]) -> None:
        if self._builds.get(session_id) is build:
            del self._builds[session_id]
        # Counted here, once, whether or not anybody still waits for it (a question goes on
        # without it); an SqlUnavailable reaches whoever waits as well.
        error = None if build.cancelled() else build.exception()
        if isinstance(error, SqlUnavailable):
            self._sql_error("recall_index")
        elif error is not None:
            log.error("recall_index_failed", session_id=session_id, exc_info=error)

    async def _caught_up(self, session_id: str, message_count: int, seen: Sequence[Message]) -> SessionIndex:
        """The session's recall index, caught up to `message_count` with only the messages it
        lacks (built from SQL when this process has none). Raises SqlUnavailable."""
        index = self._index.get(session_id)
        if index is None or index.last_seq > message_count or not index.consistent_with(seen):
            index = SessionIndex()
        while index.last_seq < message_count:
            rows = await self._store.messages_by_seq(
                session_id, first_seq=index.last_seq + 1, last_seq=message_count, limit=_INDEX_BATCH
            )
            if not rows:
                break
            terms = await asyncio.to_thread(_tokenize_all, self._index.tokenize, rows)
            before = index.last_seq
            for m, t in zip(rows, terms, strict=True):
                index.add(m, t)
            if index.last_seq == before:
                break  # a gap in seq (not expected): what the index has is still right
        self._index.put(session_id, index)
        return index


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not only a build it waited for)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _newest_holding(messages: Sequence[Message], chars: int) -> list[Message]:
    """The newest of `messages` (oldest first) whose content reaches `chars` characters, or all."""
    total = 0
    for i in range(len(messages) - 1, -1, -1):
        total += len(messages[i].content)
        if total >= chars:
            return list(messages[i:])
    return list(messages)


def _tokenize_all(tokenize: Callable[[str], list[str]], rows: Sequence[Message]) -> list[list[str]]:
    return [tokenize(m.content) for m in rows]
