"""The warm tier: a session's summary row with its kept versions and slices, and a user's most
recent summaries.

Each method is one bounded read or one write transaction through the store's own plumbing (its
timeout, breaker and error mapping, deadlock retries, the replica's bookkeeping). Mixed into
SqlStore, as MessageReads is, so callers keep one store for every SQL tier.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tiered_memory.model import Caller, Message, SessionInfo, SessionKey, SessionState, Slice, Summary
from tiered_memory.tiers.sql.messages import opening_and_end
from tiered_memory.tiers.sql.outbox import add_event, new_event_id, release_final
from tiered_memory.tiers.sql.rows import (
    KEY,
    row_to_session,
    row_to_slice,
    row_to_state,
    row_to_summary,
    session_and_summary,
    slice_values,
)
from tiered_memory.tiers.sql.schema import conversation_summaries as cs
from tiered_memory.tiers.sql.schema import sessions, summary_slices
from tiered_memory.tiers.sql.users import merge_profile, user_summaries_query
from tiered_memory.tiers.sql.versions import SummaryVersion, forget_versions, record_version, versions
from tiered_memory.webhooks import SUMMARY_UPDATED, Event, summary_payload

T = TypeVar("T")

# The store's own callers (the summary job, the sweeper, tests) act for nobody in particular.
ANYONE = Caller()


class _Store(Protocol):
    """What the summaries need of SqlStore: its engine, settings and plumbing."""

    sinks: tuple[str, ...]
    _engine: AsyncEngine
    _summary_history: int

    async def session_read(
        self,
        key: SessionKey,
        op: Callable[[AsyncConnection], Awaitable[T]],
        *,
        replica: bool = False,
        known_seq: int = 0,
        trust: Callable[[T], bool] = ...,
    ) -> T: ...

    async def _bounded(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        timeout_s: float | None = None,
        named_after: Callable[..., Any] | None = None,
    ) -> T: ...

    async def _transaction(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T: ...

    async def _session_write(
        self, key: SessionKey, body: Callable[[AsyncConnection], Awaitable[T]], *, deleted: bool = False
    ) -> T: ...

    def _insert_if_absent(self, table: sa.Table, values: dict[str, Any]) -> sa.Executable: ...

    async def _lock_accessible(self, conn: AsyncConnection, key: SessionKey, caller: Caller) -> bool: ...


_Found = tuple[Summary | None, SessionInfo | None, SessionState | None]
# A session's opening messages and its newest, each oldest first.
Ends = tuple[list[Message], list[Message]]
_FoundOrEnds = tuple[Summary | None, SessionInfo | None, SessionState | None, Ends | None]


def _summary_and_state(key: SessionKey) -> Callable[[AsyncConnection], Awaitable[_Found]]:
    """The read of a session's summary, row and gateway state (None, None, None: no session)."""

    async def op(conn: AsyncConnection) -> _Found:
        row = (await conn.execute(session_and_summary(), {KEY: key})).one_or_none()
        if row is None:
            return None, None, None
        summary = row_to_summary(row) if row.summary is not None else None
        info = row_to_session(row, summary.covered_turns if summary else 0)
        return summary, info, row_to_state(row.gateway_state, row.state_version)

    return op


def _known(found: _Found) -> bool:
    return found[1] is not None


class SummaryRows:
    """The summary reads and writes of SqlStore (which provides the plumbing `_Store` names)."""

    async def get_summary(
        self: _Store, key: SessionKey, *, replica: bool = False, known_seq: int = 0
    ) -> tuple[Summary | None, SessionInfo | None]:
        """The stored summary and the session's current bookkeeping, in one query (a replica that
        does not know the session is not trusted: the primary is asked)."""
        summary, info, _ = await self.session_read(
            key, _summary_and_state(key), replica=replica, known_seq=known_seq, trust=_known
        )
        return summary, info

    async def summary_state_or_ends(
        self: _Store,
        key: SessionKey,
        *,
        head: int,
        tail: int,
        read_ends: Callable[[SessionInfo], bool],
        replica: bool = False,
    ) -> _FoundOrEnds:
        """`get_summary` with the gateway's state (None when there is no such session), in the
        same query; and, when the session has no summary and `read_ends` takes its row (a caller
        allowed to read it, that wants a cold answer), its first `head` messages and last `tail`
        (messages.opening_and_end) on the same connection: a cold read's two statements pay one
        pool checkout, pre-ping and rollback (about 0.4 ms of 5 after an idle spell), and a warm
        read still pays one statement. A failure of either statement fails the read whole."""
        found = _summary_and_state(key)

        async def op(conn: AsyncConnection) -> _FoundOrEnds:
            summary, info, state = await found(conn)
            if summary is not None or info is None or not read_ends(info):
                return summary, info, state, None
            return summary, info, state, await opening_and_end(conn, key, head, tail)

        return await self.session_read(key, op, replica=replica, trust=lambda read: read[1] is not None)

    async def put_summary(
        self: _Store,
        key: SessionKey,
        summary: Summary,
        *,
        user_id: str | None,
        turn_count: int,
        slices: Sequence[Slice] = (),
        replace_slices: bool = False,
    ) -> bool:
        """Write `summary` if the stored row is still at version summary.version - 1.

        False means another writer got there first: the caller's summary is stale and is dropped,
        so an older summarization can never overwrite a newer one.
        """
        values = {
            "summary": summary.text,
            "user_id": user_id,
            "turn_count": turn_count,
            "covered_turns": summary.covered_turns,
            "topics": list(summary.topics),
            "structured": summary.structured,
            "source": summary.source.value,
            "compressions": summary.compressions,
            "version": summary.version,
            "updated_at": summary.updated_at,
        }

        async def body(conn: AsyncConnection) -> bool:
            # Lock the session row: a session deleted while its summary was being made gets no
            # summary row back (and a reused session id does not inherit it).
            alive = (
                await conn.execute(
                    sa.select(sessions.c.tenant, sessions.c.user_id, sessions.c.turn_count, sessions.c.closed_at)
                    .where(sessions.c.session_id == key)
                    .with_for_update()
                )
            ).one_or_none()
            if alive is None:
                return False
            if summary.version == 1:
                try:
                    async with conn.begin_nested():
                        await conn.execute(cs.insert().values(session_id=key, created_at=summary.created_at, **values))
                except sa.exc.IntegrityError:
                    return False
            else:
                result = await conn.execute(
                    cs.update().where(cs.c.session_id == key, cs.c.version == summary.version - 1).values(**values)
                )
                if not result.rowcount:
                    return False
            await record_version(conn, key, summary, keep=self._summary_history)
            # The slices go with the summary they produced, in the same transaction.
            if replace_slices:
                await conn.execute(summary_slices.delete().where(summary_slices.c.session_id == key))
            if slices:
                await conn.execute(summary_slices.insert(), [slice_values(key, s) for s in slices])
            if alive.user_id is not None:
                # The user's profile takes what this summary says, in the same transaction.
                await merge_profile(
                    conn,
                    self._insert_if_absent,
                    tenant=alive.tenant,
                    user_id=alive.user_id,
                    session_key=key,
                    summary=summary,
                    now=summary.updated_at,
                )
            if self.sinks:
                await _summary_events(conn, self.sinks, key, summary, alive)
            return True

        return await self._session_write(key, body)

    async def release_final(self: _Store, key: SessionKey, *, now: float) -> int:
        """Release the session's held `summary.final` with the summary stored now (its last pass
        wrote nothing: the LLM failed, or there was nothing left to cover); the rows released."""
        if not self.sinks:
            return 0
        return await self._transaction(lambda conn: release_final(conn, key, now=now))

    async def user_summaries(
        self: _Store, user_id: str, *, limit: int, tenant: str | None = None
    ) -> list[tuple[SessionKey, int, Summary]]:
        """The user's most recently updated session summaries, newest first, as
        (session_id, turn_count at the summary, summary); served by the (user_id, updated_at) index.
        With `tenant`, only sessions of that tenant."""

        async def op() -> list[tuple[SessionKey, int, Summary]]:
            async with self._engine.connect() as conn:
                rows = (await conn.execute(user_summaries_query(user_id, tenant=tenant, limit=limit))).all()
            return [(SessionKey(r.session_id), int(r.turn_count), row_to_summary(r)) for r in rows]

        return await self._bounded(op)

    async def delete_summary(self: _Store, key: SessionKey, *, caller: Caller = ANYONE) -> bool:
        """Drop the warm row and its slices; the messages stay. False when the session does not
        exist; raises Forbidden, dropping nothing, when the caller may not access it."""

        async def body(conn: AsyncConnection) -> bool:
            found = await self._lock_accessible(conn, key, caller)
            await conn.execute(summary_slices.delete().where(summary_slices.c.session_id == key))
            await conn.execute(cs.delete().where(cs.c.session_id == key))
            await forget_versions(conn, key)
            return found

        return await self._session_write(key, body)

    async def slices(
        self: _Store, key: SessionKey, *, from_turn: int = 1, limit: int | None = None, replica: bool = False
    ) -> list[Slice]:
        """The session's slices that end at `from_turn` or later (at most `limit`), oldest first."""

        async def op(conn: AsyncConnection) -> list[Slice]:
            q = (
                sa.select(summary_slices)
                .where(summary_slices.c.session_id == key, summary_slices.c.to_turn >= from_turn)
                .order_by(summary_slices.c.to_turn, summary_slices.c.id)
                .limit(limit)
            )
            return [row_to_slice(r) for r in (await conn.execute(q)).all()]

        return await self.session_read(key, op, replica=replica)

    async def summary_versions(self: _Store, key: SessionKey, *, limit: int = 100) -> list[SummaryVersion]:
        """The summary's kept versions (SUMMARY_HISTORY), newest first."""

        async def op() -> list[SummaryVersion]:
            async with self._engine.connect() as conn:
                return await versions(conn, key, limit=limit)

        return await self._bounded(op)


async def _summary_events(
    conn: AsyncConnection, sinks: Sequence[str], key: SessionKey, summary: Summary, alive: sa.Row[*tuple[Any, ...]]
) -> None:
    """`summary.updated`, and for a closed session's last pass (it covers every turn) the
    release of its held `summary.final`, in the transaction that writes the summary."""
    payload = summary_payload(summary, turn_count=int(alive.turn_count))
    event = Event(new_event_id(), SUMMARY_UPDATED, alive.tenant, key, alive.user_id, payload, summary.updated_at)
    await add_event(conn, sinks, event)
    if alive.closed_at is not None and summary.covered_turns >= int(alive.turn_count):
        await release_final(conn, key, now=summary.updated_at)
