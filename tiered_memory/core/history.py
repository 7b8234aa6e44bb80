"""What the context reads beyond the hot window: raw turns from before it, and the earlier turns
that match a question (BM25 over the session's recall postings, recall.py).

Older turns come from the hot list, or SQL in one read sized by the room and the session's mean
message length. The postings live in the hot tier, shared by every replica (tiers/postings.py):
each append is tokenized by a text worker (summarize/lane.py) and added in the background; postings that lack
messages (lost with the hot tier, or never added because the appending process died) catch up
from SQL with only what they lack, in the background: a question waits for that QUESTION_WAIT_S
at most. While the hot tier is down, a process keeps postings of its own, caught up the same way.
A failed read is counted and costs the context only what it would have added; `matches` (the
recall endpoint's answer) raises SqlUnavailable instead.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import contextvars
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures.process import BrokenProcessPool

import structlog

from tiered_memory.core.recall import RecallMatch, around, asked_kind, boosted, search, with_neighbours
from tiered_memory.errors import HotUnavailable, Overloaded, SqlUnavailable
from tiered_memory.model import Message, MessageStatus, SessionKey, key_tenant
from tiered_memory.prompt.context import OLDER_MAX_MESSAGES
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.lane import TextLane, TextQueueFull, Ticket, text_bytes
from tiered_memory.tiers.postings import (
    STALE,
    MemoryPostings,
    PostingsBatch,
    PostingsRead,
    PostingsStore,
    merged,
    packed,
    packed_each,
)
from tiered_memory.tiers.sql.store import SqlStore

log = structlog.get_logger("tiered_memory.core.history")

# Text of appended messages tokenized in one call of a text worker (at least one message): what
# other tenants' work may wait behind, about 40 ms of jieba.
_CALL_BYTES = 32 * 1024
# Messages read from SQL and added per step when postings catch up.
_INDEX_BATCH = 500
# How long a question waits for its session's postings to catch up. A session of thousands of
# turns takes seconds to index after its postings were lost; past this the context goes without
# the question's earlier turns, and the catch-up goes on in the background for the next question.
QUESTION_WAIT_S = 0.1
# A gap this small between the postings and an appended message is appends indexed out of order
# (caught up at once); a larger one, postings that were lost (caught up at the next question).
_REORDERED = 8
# Message text read from SQL per batch of a catch-up, in bytes (the postings take two to three
# times that): a batch never passes a session's bound alone, and the event loop takes each batch's
# rows and postings in steps short enough for the other tenants' requests to come between (at
# 128 KB a 3.2 MB catch-up still moved the others' p99 in the tenant soak; docs/SECURITY.md).
_INDEX_BATCH_BYTES = 32 * 1024
# A question's matching messages read per character of the context's budget, and at most: enough
# to fill the room they may take (with their neighbours), bounded whatever the budget.
_MATCHES_PER_CHAR = 1 / 50
_MATCHES_MAX = 80
# The postings a process keeps of its own while the hot tier is down, in bytes (as the bound
# counts them), the least recently asked session dropped first.
_LOCAL_BYTES = 32 * 2**20


class History:
    def __init__(
        self,
        store: SqlStore,
        postings: PostingsStore,
        text: TextLane,
        *,
        sql_error: Callable[[str], None],
        hot_error: Callable[[str], None] = lambda op: None,
        question_unindexed: Callable[[], None] = lambda: None,
        question_wait_s: float = QUESTION_WAIT_S,
        session_max_bytes: int = _LOCAL_BYTES,
        pending_max_bytes: int = _LOCAL_BYTES,
        index_dropped: Callable[[], None] = lambda: None,
    ) -> None:
        """`text` turns messages and questions into search terms, off the event loop.
        `question_unindexed` is called for each question answered without its earlier turns
        because the session's postings were still catching up. A tenant's appends waiting to be
        tokenized are bounded by `pending_max_bytes`: past it, `index_dropped` is called and the
        message waits for the catch-up at the next question."""
        self._store = store
        self._postings = postings
        self._local = MemoryPostings(max_bytes=_LOCAL_BYTES, session_max_bytes=min(session_max_bytes, _LOCAL_BYTES))
        self._text = text
        self._pending_max_bytes = pending_max_bytes
        self._index_dropped = index_dropped
        self._sql_error = sql_error
        self._hot_error = hot_error
        self._question_unindexed = question_unindexed
        self._question_wait_s = question_wait_s
        # By tenant, each with its own indexer: the text lane serves tenants in turn.
        self._pending: dict[str, list[Message]] = {}
        self._pending_bytes: dict[str, int] = {}
        self._indexers: dict[str, asyncio.Task[None]] = {}
        # The catch-ups in progress, by store and session: a question and the recall endpoint
        # join the one under way rather than start another.
        self._builds: dict[tuple[int, str], asyncio.Task[None]] = {}

    def appended(self, message: Message) -> None:
        """Add an appended message to its session's postings, off the event loop (jieba takes
        40 ms for a 32 KB message): queued by tenant, tokenized by a text worker in arrival order,
        then added. Postings that do not end just before it (lost, behind, or a message dropped
        past the tenant's bound) are left as they are: the next question catches them up from SQL.

        A reply still streaming is not added (the messages after it then find a gap, and a
        catch-up reads them from SQL with it): a gateway finalizes it by a patch, which drops
        postings that hold it, and the next question would read the whole session back from SQL,
        every turn. Postings that end before it are kept by the patch."""
        if message.status is MessageStatus.STREAMING:
            return
        tenant = key_tenant(message.key)
        size = text_bytes((message,))
        held = self._pending_bytes.get(tenant, 0)
        if held and held + size > self._pending_max_bytes:
            self._index_dropped()
            return
        self._pending.setdefault(tenant, []).append(message)
        self._pending_bytes[tenant] = held + size
        indexer = self._indexers.get(tenant)
        if indexer is None or indexer.done():
            # In a context of its own: the indexer goes on past the request whose append started
            # it, and must not log as that request or stretch its trace.
            self._indexers[tenant] = asyncio.create_task(
                self._index_pending(tenant), name="recall-indexer", context=contextvars.Context()
            )

    async def _index_pending(self, tenant: str) -> None:
        while batch := self._pending.pop(tenant, None):
            del self._pending_bytes[tenant]
            try:
                packs = await self._packs(batch, tenant)
                runs: dict[SessionKey, list[PostingsBatch]] = {}
                for m, b in sorted(zip(batch, packs, strict=True), key=lambda mb: (mb[0].key, mb[0].seq)):
                    runs.setdefault(m.key, []).append(b)
                await asyncio.gather(*(self._add_run(sid, run) for sid, run in runs.items()))
            except TextQueueFull:
                continue  # counted by the lane; the next question catches up
            except Exception:
                # A text worker that failed twice (summarize/lane.py), or a store's surprise: the
                # indexer goes on with the next appends, and the next question catches up.
                log.exception("recall_index_failed", tenant=tenant, messages=len(batch))

    async def _add_run(self, key: SessionKey, run: list[PostingsBatch]) -> None:
        """Add a session's appended messages (a batch each, in seq order), a batch per stretch
        of consecutive seqs. Each was read when committed: a delete or a patch after that makes
        the batch stale."""
        start = 0
        for i in range(1, len(run) + 1):
            if i < len(run) and run[i].first_seq == run[i - 1].last_seq + 1:
                continue
            batch = merged(run[start:i])
            start = i
            try:
                last = await self._postings.add(key, batch)
            except HotUnavailable:
                self._hot_error("recall_add")
                return
            if 0 <= last < batch.first_seq - 1 <= last + _REORDERED:
                # Appends of one session that reached this queue out of order: the ones between
                # are committed, and a catch-up reads them now rather than at the next question.
                self._build(self._postings, key, batch.last_seq)

    async def aclose(self) -> None:
        """Stop adding appends and catching up (what is left is caught up from SQL by the next
        question)."""
        self._pending.clear()
        self._pending_bytes.clear()
        tasks = [*self._indexers.values(), *self._builds.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, SqlUnavailable, HotUnavailable):
                await task

    def forget(self, session: SessionKey, *, changed_seq: int = 0) -> None:
        """Stop any catch-up of a deleted session (it would put the deleted session's postings
        back) and drop this process's own postings of it; the hot tier's go with its entry. With
        `changed_seq` (a message patched or taken back), this process's postings go only when they
        reach that message, as the hot tier's do (HotTier.invalidate), and the catch-ups and
        appends under way go on: the floor refuses what they read before the change, and a
        question waiting on a catch-up is not answered as if the session were gone."""
        self._local.drop(session, changed_seq=changed_seq)
        if changed_seq:
            return
        for build in [k for k in self._builds if k[1] == session]:
            self._builds.pop(build).cancel()
        tenant = key_tenant(session)
        if tenant in self._pending:
            kept = [m for m in self._pending[tenant] if m.key != session]
            self._pending[tenant] = kept
            self._pending_bytes[tenant] = text_bytes(kept)

    async def older(
        self,
        key: SessionKey,
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
        # `available` is in seq order (the hot list as read, or SQL's rows): what is older than
        # the window is a prefix of it. A read of a long session runs this on every request, over
        # hundreds of messages: one pass over their seqs, one over those it keeps.
        older = list(available[: bisect.bisect_left(available, first, key=_seq)])
        if older and (older[-1].seq != first - 1 or not _contiguous(older)):
            older = []  # not contiguous with the window: SQL answers instead
        older, size = _newest_holding(older[-OLDER_MAX_MESSAGES:], room)
        lacking = room - size
        start = older[0].seq if older else first
        most = OLDER_MAX_MESSAGES - len(older)
        if lacking <= 0 or start <= 1 or most <= 0:
            return older
        # The session's mean message length sizes the read; a little over, since the newest
        # messages may be shorter than the mean, and what is over is dropped.
        mean = max(8.0, (content_chars or 0) / message_count) if message_count else 40.0
        want = min(most, start - 1, math.ceil(1.25 * lacking / mean) + 2)
        try:
            rows = await self._store.messages_by_seq(
                key, first_seq=start - want, last_seq=start - 1, limit=want, replica=True
            )
        except SqlUnavailable:
            self._sql_error("read_older")
            return older
        return _newest_holding([*rows, *older], room)[0]

    async def snippets(
        self,
        key: SessionKey,
        question: str,
        message_count: int,
        *,
        before_seq: int,
        seen: Sequence[Message],
        max_chars: int,
    ) -> list[tuple[Message, float]]:
        """The answered messages before `before_seq` that best match the question (BM25 over the
        postings), with their neighbours and weighed by what the question asks for
        (recall.with_neighbours, recall.boosted), each with its score, best first: as many as a
        context of `max_chars` could show; none when the postings are not caught up in time or
        cannot be read: a question never fails a context."""
        try:
            terms = await self._question_terms(question, key)
        except (Overloaded, BrokenProcessPool) as exc:
            log.warning("question_terms_failed", session_key=key, error=str(exc))
            return []
        if not terms:
            return []
        # The newest answered message seen is read with the postings: postings that hold another
        # message under its seq are a deleted session's, left by a catch-up that raced the delete.
        check = next((m for m in reversed(seen) if m.answered), None)
        try:
            found = await self._searchable(
                key, terms, message_count, wait_s=self._question_wait_s, check=check, enough=before_seq - 1
            )
        except SqlUnavailable:
            return []  # counted by _built
        except Overloaded:
            # The tenant's catch-ups are at their bound (summarize/lane.py): this question goes without.
            self._question_unindexed()
            return []
        if found is None:
            self._question_unindexed()
            return []
        store, read = found
        k = min(_MATCHES_MAX, max(8, int(max_chars * _MATCHES_PER_CHAR)))
        scored = with_neighbours(search(read, terms, k=k, before_seq=before_seq), before_seq=before_seq)
        if not scored:
            return []
        # The messages from the hot list when it holds them, else from the postings' messages.
        messages = {m.seq: m for m in seen if m.answered}
        lacking = [seq for seq, _ in scored if seq not in messages]
        if lacking:
            try:
                messages |= await store.messages(key, lacking)
            except HotUnavailable:
                self._hot_error("recall_read")
                return []
        matched = [(messages[seq], score) for seq, score in scored if seq in messages]
        return boosted(matched, asked_kind(question))

    async def matches(self, key: SessionKey, query: str, message_count: int, k: int) -> list[RecallMatch]:
        """The k messages that best match `query` (BM25), best first, each with the raw messages
        of its turn and the slice that covers it. Raises SqlUnavailable."""
        terms = await self._question_terms(query, key)
        if not terms:
            return []
        found = await self._searchable(key, terms, message_count, wait_s=None)
        if found is None:
            return []  # the session was deleted meanwhile
        store, read = found
        hits = search(read, terms, k=k)
        if not hits:
            return []
        try:
            messages = await store.messages(key, around(hits))
        except HotUnavailable:
            self._hot_error("recall_read")
            messages = {}
        slices = await self._store.slices(key, replica=True)
        out = []
        for seq, score in hits:
            turn = [m for m in messages.values() if m.turn == messages[seq].turn] if seq in messages else []
            if not turn:
                turn = await self._store.messages_by_seq(key, first_seq=seq, last_seq=seq, limit=1, replica=True)
            covering = next((s for s in slices if s.first_seq <= seq <= s.last_seq), None)
            out.append(
                RecallMatch(
                    seq=seq,
                    turn=turn[0].turn if turn else 0,
                    score=score,
                    slice=covering,
                    messages=sorted(turn, key=lambda m: m.seq),
                )
            )
        return out

    async def _searchable(
        self,
        key: SessionKey,
        terms: Sequence[str],
        message_count: int,
        *,
        wait_s: float | None,
        check: Message | None = None,
        enough: int | None = None,
    ) -> tuple[PostingsStore, PostingsRead] | None:
        """The store that answers and its read of `terms`, caught up to `message_count` (waiting
        `wait_s` at most for that; None: for ever), or as they are when they hold every message
        up to `enough`: a context searches the turns before its window only, and the window's
        newest messages are being indexed as they were appended (a question that waited for
        them waited behind every tenant's background text work). None when the wait ran out, or
        the session was deleted meanwhile. The hot tier's postings first, this process's own
        while it is down. Postings that keep another message than `check` under its seq are
        dropped and caught up anew. Raises SqlUnavailable when a catch-up needed SQL."""
        needed = message_count if enough is None else min(enough, message_count)
        for store in (self._postings, self._local):
            try:
                read = await store.read(key, terms, doc=check.seq if check is not None else None)
                if store is self._postings and key in self._local:
                    # Postings of its own, kept while the hot tier was down, would be stale by the
                    # next outage (no delete or patch reaches them).
                    self._local.drop(key)
                if check is not None and read.doc is not None and read.doc.message_id != check.message_id:
                    await self._drop(store, key)
                    read = PostingsRead(0, 0, 0, False)
                if read.last_seq >= needed or read.full:
                    if not read.last_seq and message_count:
                        # None at all (lost, or dropped just now): appends are added only to
                        # postings that end just before them, so they are caught up meanwhile.
                        self._build(store, key, message_count)
                    return store, read
                build = asyncio.shield(self._build(store, key, message_count))
                try:
                    await (build if wait_s is None else asyncio.wait_for(build, wait_s))
                except TimeoutError:
                    return None
                except asyncio.CancelledError:
                    if _cancelling():
                        raise
                    return None  # the session was deleted meanwhile (forget)
                return store, await store.read(key, terms)
            except HotUnavailable:
                self._hot_error("recall_read")
        return None

    async def _question_terms(self, question: str, key: SessionKey) -> list[str]:
        # Urgent: a request waits on it alone (a trip to a worker costs about 0.3 ms; the serving
        # process keeps no dictionary of its own).
        ticket = Ticket(key_tenant(key), len(question.encode("utf-8")), urgent=True)
        return await self._text.call(ticket, Extractor.search_terms, question)

    async def _packs(self, messages: Sequence[Message], tenant: str) -> list[PostingsBatch]:
        """Appended `messages` packed, a batch each, by a text worker: a call per _CALL_BYTES of
        them (so that another tenant's call waits behind one such at most), one after the other.
        The next question waits on them (its postings caught up), a summary does not: first in
        the tenant's turn, but bounded with its background work. Raises TextQueueFull."""
        out: list[PostingsBatch] = []
        for part in _parts(messages, _CALL_BYTES):
            ticket = Ticket(tenant, text_bytes(part), first=True)
            out += await self._text.call(ticket, packed_each, part)
        return out

    async def _packed(self, rows: list[Message], tenant: str, *, read_at: float) -> PostingsBatch:
        """A catch-up's batch of `rows` (consecutive), tokenized and packed by text workers, a call
        per _CALL_BYTES of them. A question may wait on it: the calls are queued together, first
        in the tenant's turn, so that the tenant's other work comes between two batches, not
        between two calls. Raises TextQueueFull."""

        def call(part: list[Message]) -> Awaitable[PostingsBatch]:
            ticket = Ticket(tenant, text_bytes(part), waited=True)
            return self._text.call(ticket, packed, part, read_at)

        return merged(await asyncio.gather(*map(call, _parts(rows, _CALL_BYTES))))

    async def _drop(self, store: PostingsStore, key: SessionKey) -> None:
        with contextlib.suppress(HotUnavailable):
            await store.forget(key)

    def _build(self, store: PostingsStore, session: SessionKey, message_count: int) -> asyncio.Task[None]:
        """The catch-up of the session's postings in `store` under way, else a new one."""
        key = (id(store), session)
        build = self._builds.get(key)
        if build is None:
            build = asyncio.create_task(self._caught_up(store, session, message_count), name="recall-index")
            self._builds[key] = build
            build.add_done_callback(lambda done: self._built(key, done))
        return build

    def _built(self, key: tuple[int, str], build: asyncio.Task[None]) -> None:
        if self._builds.get(key) is build:
            del self._builds[key]
        # Counted here, once, whether or not anybody still waits for it (a question goes on
        # without it); the error reaches whoever waits as well.
        error = None if build.cancelled() else build.exception()
        if isinstance(error, SqlUnavailable):
            self._sql_error("recall_index")
        elif isinstance(error, HotUnavailable):
            self._hot_error("recall_add")
        elif isinstance(error, TextQueueFull):
            pass  # counted by the text lane; the next question tries again
        elif error is not None:
            log.error("recall_index_failed", session_key=key[1], exc_info=error)

    async def _caught_up(self, store: PostingsStore, key: SessionKey, message_count: int) -> None:
        """Add to the session's postings in `store` the messages up to `message_count` they lack,
        read from SQL. Another replica catching up the same session at once adds each batch once
        (the store takes only the batch that continues the postings): this one goes on from
        wherever the postings are. Raises SqlUnavailable, HotUnavailable."""
        read = await store.read(key, ())
        last = read.last_seq
        while last < message_count and not read.full:
            read_at = time.time()
            rows = await self._store.messages_by_seq(
                key,
                first_seq=last + 1,
                last_seq=message_count,
                limit=_INDEX_BATCH,
                max_bytes=_INDEX_BATCH_BYTES,
            )
            rows = _holding_bytes(rows, _INDEX_BATCH_BYTES)
            if rows and rows[-1].seq == message_count and rows[-1].status is MessageStatus.STREAMING:
                # The newest message, a reply still streaming: left out, as `appended` leaves it,
                # so that the patch finalizing it keeps these postings.
                rows.pop()
            if not rows or rows[0].seq != last + 1:
                break  # deleted meanwhile, or a gap in seq (not expected): what is there is right
            added = await store.add(key, await self._packed(rows, key_tenant(key), read_at=read_at))
            if added == STALE:
                break  # forgotten (deleted, or changed) after the read: the next question reads again
            if added == rows[-1].seq:
                last = added
                continue
            read = await store.read(key, ())
            if read.last_seq <= last and not read.full:
                break  # the store took nothing, and nobody else moved it on
            last = read.last_seq


def _holding_bytes(rows: list[Message], max_bytes: int) -> list[Message]:
    """The first of `rows` whose content stays within `max_bytes` of UTF-8 (at least one)."""
    total = 0
    for i, m in enumerate(rows):
        total += len(m.content.encode("utf-8"))
        if total > max_bytes and i:
            return rows[:i]
    return rows


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not only a build it waited for)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _seq(m: Message) -> int:
    return m.seq


def _contiguous(messages: Sequence[Message]) -> bool:
    """Whether `messages` (non-empty) are seq n, n+1, n+2… with none missing or repeated."""
    start = messages[0].seq
    return [m.seq for m in messages] == list(range(start, start + len(messages)))


def _newest_holding(messages: Sequence[Message], chars: int) -> tuple[list[Message], int]:
    """The newest of `messages` (oldest first) whose content reaches `chars` characters, or all;
    with what they cost a prompt (their sizes, counted in the same pass)."""
    total = size = 0
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        total += len(m.content)
        size += m.size
        if total >= chars:
            return list(messages[i:]), size
    return list(messages), size


def _parts(messages: Sequence[Message], max_bytes: int) -> list[list[Message]]:
    """`messages` in runs of at most `max_bytes` of content (a longer message alone)."""
    parts: list[list[Message]] = []
    rest = list(messages)
    while rest:
        part = _holding_bytes(rest, max_bytes)
        parts.append(part)
        rest = rest[len(part) :]
    return parts
