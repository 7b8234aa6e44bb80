"""Reads of the cold tier's messages: a session's first, latest, by turn range, by seq range.

Each is one bounded read through the store's `read` (its timeout, breaker and error mapping).
Mixed into SqlStore, so callers read messages from the store they write them with.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.model import Message, SessionKey
from tiered_memory.tiers.sql.dialect import OctetLength, in_index_order
from tiered_memory.tiers.sql.rows import KEY, MEMORY_COLUMNS, row_to_message
from tiered_memory.tiers.sql.schema import MESSAGES_BY_SEQ, MESSAGES_BY_SESSION
from tiered_memory.tiers.sql.schema import messages as msgs

T = TypeVar("T")

# messages_in_turns reads the session's tail in pages: the first one holds a summary batch's
# new turns (a few messages each) with room to spare; later ones grow, to catch up a long lag.
_TAIL_PAGE = 64
_TAIL_PAGE_MAX = 4096


@functools.cache
def _end_of(*, newest: bool, limit: int) -> sa.Select[Any]:
    """A session's first (or, `newest`, last) `limit` messages, through its (session_id, id) index.
    Built once: SQLAlchemy's construction of a statement and of its cache key cost about
    0.5 ms a read, on reads made on the request path."""
    q = sa.select(*MEMORY_COLUMNS).where(msgs.c.session_id == sa.bindparam(KEY))
    q = q.order_by(msgs.c.id.desc() if newest else msgs.c.id).limit(limit)
    return in_index_order(q, msgs, MESSAGES_BY_SESSION)


@functools.cache
def _both_ends(head: int, tail: int, *, derived: bool) -> sa.CompoundSelect[*tuple[Any, ...]]:
    """A session's first `head` messages and its last `tail`, in one statement, each row saying
    which end it is of (`newest`). `(SELECT … LIMIT) UNION ALL (SELECT … LIMIT)` unless `derived`:
    MariaDB materializes a derived table of the TEXT column in a temporary table (0.5 ms of a
    1.9 ms read), but SQLite takes no parenthesized SELECT in a compound."""
    opening, end = (
        _end_of(newest=n, limit=k).add_columns(sa.literal(n).label("newest")) for n, k in ((False, head), (True, tail))
    )
    if derived:
        return sa.union_all(sa.select(opening.subquery()), sa.select(end.subquery()))
    return sa.union_all(opening, end)


@functools.cache
def _forward_page(page: int) -> sa.Select[Any]:
    """A page of a session's messages after the seq bound `after_seq`, oldest first, through its
    (session_id, seq) index."""
    q = sa.select(*MEMORY_COLUMNS).where(msgs.c.session_id == sa.bindparam(KEY), msgs.c.seq > sa.bindparam("after_seq"))
    return in_index_order(q.order_by(msgs.c.seq).limit(page), msgs, MESSAGES_BY_SEQ)


@functools.cache
def _tail_page(page: int, *, before: bool) -> sa.Select[Any]:
    """A page of a session's messages, newest first (`before`: older than the id bound `before_id`)."""
    q = sa.select(*MEMORY_COLUMNS).where(msgs.c.session_id == sa.bindparam(KEY))
    if before:
        q = q.where(msgs.c.id < sa.bindparam("before_id"))
    return in_index_order(q.order_by(msgs.c.id.desc()).limit(page), msgs, MESSAGES_BY_SESSION)


async def opening_and_end(
    conn: AsyncConnection, key: SessionKey, head: int, tail: int
) -> tuple[list[Message], list[Message]]:
    """The first `head` messages of a session and its last `tail`, each oldest first, in one
    statement on `conn` (a cold read is on the request path: one round trip, not two). A session
    of fewer than `head + tail` messages has some in both."""
    rows = (await conn.execute(_both_ends(head, tail, derived=conn.dialect.name == "sqlite"), {KEY: key})).all()
    first = sorted((r for r in rows if not r.newest), key=lambda r: int(r.seq))
    last = sorted((r for r in rows if r.newest), key=lambda r: int(r.seq))
    return [row_to_message(r) for r in first], [row_to_message(r) for r in last]


class _Reader(Protocol):
    async def read(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T: ...

    async def session_read(
        self,
        key: SessionKey,
        op: Callable[[AsyncConnection], Awaitable[T]],
        *,
        replica: bool = False,
        known_seq: int = 0,
        trust: Callable[[T], bool] = ...,
    ) -> T: ...


class MessageReads:
    """The message reads of SqlStore (which provides `read` and `session_read`). With `replica`,
    a read may be answered by the replica (DATABASE_READ_URL) when it holds the session's newest
    write known (`known_seq`, or this process's own): for the reads that serve a context or the
    API, never for the summary job's, which must see every turn it covers."""

    async def first_messages(
        self: _Reader, key: SessionKey, limit: int, *, replica: bool = False, known_seq: int = 0
    ) -> list[Message]:
        """The first `limit` messages of a session, oldest first."""

        async def op(conn: AsyncConnection) -> list[Message]:
            rows = (await conn.execute(_end_of(newest=False, limit=limit), {KEY: key})).all()
            return [row_to_message(r) for r in rows]

        return await self.session_read(key, op, replica=replica, known_seq=known_seq)

    async def recent_messages(
        self: _Reader, key: SessionKey, limit: int, *, replica: bool = False, known_seq: int = 0
    ) -> list[Message]:
        """The last `limit` messages of a session, oldest first."""

        async def op(conn: AsyncConnection) -> list[Message]:
            rows = (await conn.execute(_end_of(newest=True, limit=limit), {KEY: key})).all()
            return [row_to_message(r) for r in reversed(rows)]

        return await self.session_read(key, op, replica=replica, known_seq=known_seq)

    async def messages_in_turns(
        self: _Reader,
        key: SessionKey,
        *,
        after_turn: int,
        through_turn: int | None = None,
        after_seq: int | None = None,
        replica: bool = False,
        known_seq: int = 0,
    ) -> list[Message]:
        """Messages of turns after_turn+1 … through_turn (all later turns when None), oldest first.

        Read backwards from the session's newest message in growing pages, through the
        (session_id, id) index, until a message of turn after_turn or earlier appears. A message's
        turn never decreases as its id grows (both are assigned under the session-row lock), so
        every older row is earlier still. The cost follows the messages after the watermark, not
        the session's length: a `turn > ?` filter had to visit all 20,000 rows of a 10,000-turn
        session on every summary job.

        A range that ends (`through_turn`) and whose start is known, from the first turn or from
        `after_seq` (the seq of turn after_turn's last message: the previous page's end), is read
        forwards instead, until a message of a later turn appears: the cost follows the range, not
        what lies after it. Read backwards, each page of a summary backlog read every newer
        message again (a 10,000-turn backlog read the session about 40 times over).
        """

        async def op(conn: AsyncConnection) -> list[Message]:
            if through_turn is not None and after_turn < 1:
                # From the session's first message: every message up to the range's end.
                return await _forwards(conn, key, 0, None, through_turn)
            if through_turn is not None and after_seq is not None:
                return await _forwards(conn, key, after_seq, after_turn, through_turn)
            if after_turn < 1:
                # Every turn from the first: one forward read of the whole session.
                q = sa.select(*MEMORY_COLUMNS).where(msgs.c.session_id == key).order_by(msgs.c.id)
                return [row_to_message(r) for r in (await conn.execute(q)).all()]
            newest_first: list[Any] = []
            before_id: int | None = None
            page = _TAIL_PAGE
            while True:
                q = _tail_page(page, before=before_id is not None)
                rows = (await conn.execute(q, {KEY: key, "before_id": before_id})).all()
                older = [r for r in rows if r.turn <= after_turn]
                newest_first.extend(r for r in rows if r.turn > after_turn)
                if older or len(rows) < page:
                    break
                before_id = int(rows[-1].id)
                page = min(page * 4, _TAIL_PAGE_MAX)
            return [row_to_message(r) for r in reversed(newest_first) if through_turn is None or r.turn <= through_turn]

        return await self.session_read(key, op, replica=replica, known_seq=known_seq)

    async def messages_by_seq(
        self: _Reader,
        key: SessionKey,
        *,
        first_seq: int,
        last_seq: int,
        limit: int,
        max_bytes: int | None = None,
        replica: bool = False,
        reasoning: bool = False,
    ) -> list[Message]:
        """Messages first_seq..last_seq (at most `limit`), oldest first: where a slice leads back to.
        With `reasoning`, with their reasoning (only for the client's reads of stored messages:
        reasoning.py).

        With `max_bytes`, the read stops at the first message whose text (content and tool calls,
        and the reasoning it reads) takes the messages read past it, and takes one message more,
        so that a caller cutting a page there can tell whether more follow. The sizes are read
        first, without the text: a page of a thousand 32 KiB messages would otherwise bring 32 MiB
        over the wire, parsed on the event loop, to keep one MiB of it."""

        def in_range(q: sa.Select[Any]) -> sa.Select[Any]:
            return (
                q.where(msgs.c.session_id == key, msgs.c.seq >= first_seq, msgs.c.seq <= last_seq)
                .order_by(msgs.c.id)
                .limit(limit)
            )

        async def op(conn: AsyncConnection) -> list[Message]:
            last = last_seq
            if max_bytes is not None:
                sizes = (await conn.execute(in_range(sa.select(msgs.c.seq, _text_bytes(reasoning))))).all()
                last = _last_within(sizes, max_bytes, last_seq)
            q = in_range(sa.select(*(msgs.c if reasoning else MEMORY_COLUMNS))).where(msgs.c.seq <= last)
            return [row_to_message(r) for r in (await conn.execute(q)).all()]

        return await self.session_read(key, op, replica=replica)

    async def count_messages(self: _Reader, key: SessionKey) -> int:
        async def op(conn: AsyncConnection) -> int:
            q = sa.select(sa.func.count()).select_from(msgs).where(msgs.c.session_id == key)
            return int((await conn.execute(q)).scalar() or 0)

        return await self.read(op)


async def _forwards(
    conn: AsyncConnection, key: SessionKey, after_seq: int, after_turn: int | None, through_turn: int
) -> list[Message]:
    """Messages of turns after_turn+1 … through_turn (None: every turn up to it) among those after
    `after_seq`, oldest first, in growing pages, until a message of a later turn appears (a seq
    never decreases as a turn grows: both are assigned under the session-row lock)."""
    found: list[Any] = []
    page = _TAIL_PAGE
    while True:
        rows = (await conn.execute(_forward_page(page), {KEY: key, "after_seq": after_seq})).all()
        found.extend(r for r in rows if (after_turn is None or after_turn < r.turn) and r.turn <= through_turn)
        if not rows or rows[-1].turn > through_turn or len(rows) < page:
            return [row_to_message(r) for r in found]
        after_seq = int(rows[-1].seq)
        page = min(page * 4, _TAIL_PAGE_MAX)


def _text_bytes(reasoning: bool) -> sa.ColumnElement[Any]:
    """A message's content and tool calls (and `reasoning`) in bytes of UTF-8, computed by the
    database."""
    size = OctetLength(msgs.c.content) + sa.func.coalesce(OctetLength(msgs.c.tool_calls), 0)
    return size + sa.func.coalesce(OctetLength(msgs.c.thinking_content), 0) if reasoning else size


def _last_within(sizes: Sequence[Any], max_bytes: int, last_seq: int) -> int:
    """The seq of the last of `sizes` ((seq, bytes) rows, in order) to read: the first that takes
    the total past `max_bytes`, and one more; `last_seq` when the total stays within it."""
    total = 0
    for i, (_seq, size) in enumerate(sizes):
        total += int(size)
        if total > max_bytes:
            return int(sizes[min(i + 1, len(sizes) - 1)][0])
    return last_seq
