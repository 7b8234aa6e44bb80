"""Operator queries on the SQL tiers: the retention purge in small transactions, and the sessions
whose summary lags, page by page. The daemon's request path never runs these.

A purge never holds locks for long: each transaction removes at most `batch` rows of one session,
under that session's row lock, and first checks that the session is still inactive. A session
that comes back to life part-way (an append between two batches) keeps what is left of it; a purge
that stops part-way (a crash, an outage) leaves a session that the next purge finds again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.model import SessionKey
from tiered_memory.tiers.sql.schema import conversation_summaries as cs
from tiered_memory.tiers.sql.schema import messages as msgs
from tiered_memory.tiers.sql.schema import outbox_events, session_state, sessions, summary_slices
from tiered_memory.tiers.sql.store import SqlStore, summary_due
from tiered_memory.tiers.sql.versions import forget_versions


@dataclass(frozen=True, slots=True)
class Purged:
    """What one session's purge removed; `complete` is False when the session became active
    again part-way, and keeps its session row, summary and remaining messages."""

    key: SessionKey
    messages: int
    slices: int
    complete: bool


class SqlMaintenance:
    """Maintenance queries, run through a SqlStore (its timeouts, error mapping and writer queue)."""

    def __init__(self, store: SqlStore, *, batch: int = 500) -> None:
        if batch < 1:
            raise ValueError("batch: expected at least 1")
        self._store = store
        self._batch = batch

    async def count_inactive(self, *, before: float) -> tuple[int, int]:
        """Sessions with no activity since `before` (epoch seconds), and their stored messages."""

        async def op(conn: AsyncConnection) -> tuple[int, int]:
            stale = sessions.c.last_activity < before
            n_sessions = (await conn.execute(sa.select(sa.func.count()).where(stale))).scalar()
            n_messages = (
                await conn.execute(sa.select(sa.func.coalesce(sa.func.sum(sessions.c.message_count), 0)).where(stale))
            ).scalar()
            return int(n_sessions or 0), int(n_messages or 0)

        return await self._store.read(op)

    async def inactive_sessions(self, *, before: float, limit: int) -> list[SessionKey]:
        """Up to `limit` sessions inactive since `before`, the longest inactive first (served by
        the index on last_activity). Purged sessions drop out, so the next call returns the next."""

        async def op(conn: AsyncConnection) -> list[SessionKey]:
            q = (
                sa.select(sessions.c.session_id)
                .where(sessions.c.last_activity < before)
                .order_by(sessions.c.last_activity, sessions.c.session_id)
                .limit(limit)
            )
            return [SessionKey(r.session_id) for r in (await conn.execute(q)).all()]

        return await self._store.read(op)

    async def purge_session(self, key: SessionKey, *, before: float) -> Purged:
        """Delete a session inactive since `before`: its messages and slices `batch` rows per
        transaction (oldest first), then its summary and session row. Every transaction rechecks,
        under the session-row lock, that the session is still inactive; raises SqlUnavailable."""
        removed = {"messages": 0, "slices": 0}
        self._store.changed(key, deleted=True)
        for name, table in (("messages", msgs), ("slices", summary_slices)):
            batch = functools.partial(self._delete_batch, table=table, key=key, before=before)
            while True:
                n = await self._store.transaction(batch)
                if n < 0:
                    return Purged(key, removed["messages"], removed["slices"], complete=False)
                removed[name] += n
                if n < self._batch:
                    break

        async def last(conn: AsyncConnection) -> bool:
            if not await _still_inactive(conn, key, before):
                return False
            await conn.execute(cs.delete().where(cs.c.session_id == key))
            await forget_versions(conn, key)
            await conn.execute(session_state.delete().where(session_state.c.session_id == key))
            await conn.execute(sessions.delete().where(sessions.c.session_id == key))
            # Its events not delivered yet hold its summary: retention keeps none of it.
            await conn.execute(outbox_events.delete().where(outbox_events.c.subject == key))
            return True

        done = await self._store.transaction(last)
        return Purged(key, removed["messages"], removed["slices"], complete=done)

    async def _delete_batch(self, conn: AsyncConnection, *, table: sa.Table, key: SessionKey, before: float) -> int:
        """Delete up to `batch` rows of the session from `table`; -1 when it is active again."""
        if not await _still_inactive(conn, key, before):
            return -1
        ids = [
            r.id
            for r in (
                await conn.execute(
                    sa.select(table.c.id).where(table.c.session_id == key).order_by(table.c.id).limit(self._batch)
                )
            ).all()
        ]
        if ids:
            await conn.execute(table.delete().where(table.c.id.in_(ids)))
        return len(ids)

    async def count_lagging(self, *, every_n: int, min_turns_to_persist: int, start_turns: int = 0) -> int:
        """Sessions whose summary is behind (the sweeper's rule: see store.summary_due)."""

        async def op(conn: AsyncConnection) -> int:
            q = (
                sa.select(sa.func.count())
                .select_from(sessions.outerjoin(cs, cs.c.session_id == sessions.c.session_id))
                .where(summary_due(every_n=every_n, min_turns_to_persist=min_turns_to_persist, start_turns=start_turns))
            )
            return int((await conn.execute(q)).scalar() or 0)

        return await self._store.read(op)

    async def lagging_sessions(
        self, *, every_n: int, min_turns_to_persist: int, after: str, limit: int, start_turns: int = 0
    ) -> list[SessionKey]:
        """The next `limit` lagging sessions in session-id order after `after` (keyset paging: a
        session that stays behind, say while another process holds its lock, is not returned twice)."""

        async def op(conn: AsyncConnection) -> list[SessionKey]:
            q = (
                sa.select(sessions.c.session_id)
                .select_from(sessions.outerjoin(cs, cs.c.session_id == sessions.c.session_id))
                .where(
                    summary_due(every_n=every_n, min_turns_to_persist=min_turns_to_persist, start_turns=start_turns),
                    sessions.c.session_id > after,
                )
                .order_by(sessions.c.session_id)
                .limit(limit)
            )
            return [SessionKey(r.session_id) for r in (await conn.execute(q)).all()]

        return await self._store.read(op)


async def _still_inactive(conn: AsyncConnection, key: SessionKey, before: float) -> bool:
    # Appends lock this row too and move last_activity: once one commits, the purge stops.
    row = (
        await conn.execute(
            sa.select(sessions.c.session_id)
            .where(sessions.c.session_id == key, sessions.c.last_activity < before)
            .with_for_update()
        )
    ).one_or_none()
    return row is not None
