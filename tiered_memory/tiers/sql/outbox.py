"""The transactional outbox of lifecycle events (webhooks.py) in SQL.

`add_event` and `release_final` run inside the store's transactions that make the change an event
tells of (a summary written, a session closed, a user erased), so an event exists exactly when its
change does: a crash loses neither, and a rolled back change sends nothing. `SqlOutbox` is the
delivery side (delivery.py): the oldest undelivered row of each sink and subject, then its outcome.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.tiers.sql.rows import row_to_summary, sessions_with_summaries
from tiered_memory.tiers.sql.schema import outbox_events as ob
from tiered_memory.tiers.sql.schema import sessions
from tiered_memory.webhooks import SUMMARY_FINAL, Event, summary_payload

if TYPE_CHECKING:
    from tiered_memory.tiers.sql.store import SqlStore

HELD, PENDING, DELIVERED, FAILED = "held", "pending", "delivered", "failed"
_ERROR_CHARS = 200


def new_event_id() -> str:
    return uuid.uuid4().hex


async def add_event(conn: AsyncConnection, sinks: Sequence[str], event: Event, *, held: bool = False) -> None:
    """The event, one row per sink, in the caller's transaction; `held` keeps it from delivery
    until `release_final` (a final summary waiting for the session's last pass)."""
    if not sinks:
        return
    state = HELD if held else PENDING
    payload = json.dumps(event.payload, ensure_ascii=False)
    rows = [
        {
            "event_id": event.event_id,
            "sink": sink,
            "type": event.type,
            "tenant": event.tenant,
            "subject": event.subject,
            "session_id": event.session_key,
            "user_id": event.user_id,
            "payload": payload,
            "state": state,
            "created_at": event.created_at,
            "queued_at": event.created_at,
            "next_attempt_at": event.created_at,
        }
        for sink in sinks
    ]
    await conn.execute(ob.insert(), rows)


async def release_final(conn: AsyncConnection, session_key: str, *, now: float) -> int:
    """Let the session's held final-summary event go, saying the summary SQL holds now (in the
    caller's transaction: the one that wrote it, or none when the last pass wrote nothing); the
    rows released. Each is queued anew, behind what the same transaction wrote (the last pass's
    `summary.updated`): a receiver gets a session's final summary last."""
    # The session row's lock first, as every writer of the session's events takes it: a release
    # and a summary's write (whose events it must follow) are one after the other, never both.
    lock = sa.select(sessions.c.session_id).where(sessions.c.session_id == session_key).with_for_update()
    await conn.execute(lock)
    held = (
        await conn.execute(
            sa.select(ob).where(ob.c.subject == session_key, ob.c.type == SUMMARY_FINAL, ob.c.state == HELD)
        )
    ).all()
    if not held:
        return 0
    row = (await conn.execute(sessions_with_summaries().where(sessions.c.session_id == session_key))).one_or_none()
    summary = row_to_summary(row) if row is not None and row.summary is not None else None
    payload = json.dumps(
        summary_payload(summary, turn_count=int(row.turn_count) if row is not None else 0), ensure_ascii=False
    )
    gone = await conn.execute(ob.delete().where(ob.c.id.in_([r.id for r in held]), ob.c.state == HELD))
    if gone.rowcount != len(held):
        return 0  # another release took them (a deleted session's: nothing locked it)
    queued = [
        {
            **{c: r._mapping[c] for c in _COPIED},
            "payload": payload,
            "state": PENDING,
            "queued_at": now,
            "next_attempt_at": now,
        }
        for r in held
    ]
    await conn.execute(ob.insert(), queued)
    return len(queued)


# What a released event keeps of its held row.
_COPIED = ("event_id", "sink", "type", "tenant", "subject", "session_id", "user_id", "created_at")


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One event on its way to one sink."""

    id: int
    event_id: str
    sink: str
    type: str
    tenant: str
    subject: str
    session_key: str | None
    user_id: str | None
    payload: dict[str, Any]
    state: str
    attempts: int
    created_at: float
    queued_at: float
    delivered_at: float | None
    last_error: str | None


def _row(r: sa.Row[*tuple[Any, ...]]) -> OutboxRow:
    return OutboxRow(
        id=int(r.id),
        event_id=r.event_id,
        sink=r.sink,
        type=r.type,
        tenant=r.tenant,
        subject=r.subject,
        session_key=r.session_id,
        user_id=r.user_id,
        payload=json.loads(r.payload),
        state=r.state,
        attempts=int(r.attempts),
        created_at=float(r.created_at),
        queued_at=float(r.queued_at),
        delivered_at=float(r.delivered_at) if r.delivered_at is not None else None,
        last_error=r.last_error,
    )


class SqlOutbox:
    """The outbox's delivery side, run through a SqlStore (its timeouts, error mapping, writer queue)."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store

    async def heads(self, *, now: float, limit: int) -> list[OutboxRow]:
        """The oldest undelivered row of each sink and subject (held rows count: what follows a
        held final summary waits for it), those of them due now, the oldest first."""

        async def op(conn: AsyncConnection) -> list[OutboxRow]:
            first = (
                sa.select(sa.func.min(ob.c.id).label("id"))
                .where(ob.c.state.in_((HELD, PENDING)))
                .group_by(ob.c.sink, ob.c.subject)
                .subquery()
            )
            q = (
                sa.select(ob)
                .join(first, first.c.id == ob.c.id)
                .where(ob.c.state == PENDING, ob.c.next_attempt_at <= now)
                .order_by(ob.c.id)
                .limit(limit)
            )
            return [_row(r) for r in (await conn.execute(q)).all()]

        return await self._store.read(op)

    async def delivered(self, row_id: int, *, now: float) -> None:
        await self._set(row_id, state=DELIVERED, delivered_at=now, attempts=ob.c.attempts + 1)

    async def retry(self, row_id: int, *, error: str, at: float) -> None:
        """A failed attempt; the next one at `at`."""
        await self._set(row_id, attempts=ob.c.attempts + 1, next_attempt_at=at, last_error=error[:_ERROR_CHARS])

    async def park(self, row_id: int, *, error: str) -> None:
        """Given up on (WEBHOOK_MAX_AGE_SECONDS passed): failed until replayed; the subject's
        next event goes on."""
        await self._set(row_id, state=FAILED, attempts=ob.c.attempts + 1, last_error=error[:_ERROR_CHARS])

    async def _set(self, row_id: int, **values: object) -> None:
        async def body(conn: AsyncConnection) -> None:
            await conn.execute(ob.update().where(ob.c.id == row_id, ob.c.state == PENDING).values(**values))

        await self._store.transaction(body)

    async def release_stale(
        self, *, created_before: float, now: float, skip: set[str] | frozenset[str] = frozenset()
    ) -> int:
        """Release final-summary events held since before `created_before` (the process that was
        to release them died, or its last pass never ended), but those of the sessions in `skip`
        (this process's last passes still to run); the rows released."""

        async def op(conn: AsyncConnection) -> list[str]:
            q = (
                sa.select(ob.c.subject)
                .where(ob.c.state == HELD, ob.c.created_at < created_before)
                .group_by(ob.c.subject)
                .limit(100)
            )
            return [r.subject for r in (await conn.execute(q)).all()]

        released = 0
        for subject in await self._store.read(op):
            if subject not in skip:
                done = functools.partial(release_final, session_key=subject, now=now)
                released += await self._store.transaction(done)
        return released

    async def counts(self) -> dict[str, int]:
        """Rows by state (held, pending, failed; delivered ones are cleaned up)."""

        async def op(conn: AsyncConnection) -> dict[str, int]:
            q = sa.select(ob.c.state, sa.func.count()).where(ob.c.state != DELIVERED).group_by(ob.c.state)
            found = {r[0]: int(r[1]) for r in (await conn.execute(q)).all()}
            return {state: found.get(state, 0) for state in (HELD, PENDING, FAILED)}

        return await self._store.read(op)

    async def listed(self, *, state: str, limit: int) -> list[OutboxRow]:
        async def op(conn: AsyncConnection) -> list[OutboxRow]:
            q = sa.select(ob).where(ob.c.state == state).order_by(ob.c.id).limit(limit)
            return [_row(r) for r in (await conn.execute(q)).all()]

        return await self._store.read(op)

    async def replay(self, event_id: str, *, now: float) -> int:
        """Queue a failed or delivered event again, on every sink (its age counts from now); the
        rows queued."""

        async def body(conn: AsyncConnection) -> int:
            done = await conn.execute(
                ob.update()
                .where(ob.c.event_id == event_id, ob.c.state.in_((FAILED, DELIVERED)))
                .values(state=PENDING, attempts=0, queued_at=now, next_attempt_at=now, delivered_at=None)
            )
            return int(done.rowcount or 0)

        return int(await self._store.transaction(body))

    async def forget_done(self, *, delivered_before: float, failed_before: float, limit: int = 1000) -> int:
        """Delete up to `limit` rows delivered before `delivered_before`, or parked and queued
        before `failed_before` (no longer worth a replay); the rows deleted."""

        async def body(conn: AsyncConnection) -> int:
            done = sa.or_(
                sa.and_(ob.c.state == DELIVERED, ob.c.delivered_at < delivered_before),
                sa.and_(ob.c.state == FAILED, ob.c.queued_at < failed_before),
            )
            ids = [r.id for r in (await conn.execute(sa.select(ob.c.id).where(done).limit(limit))).all()]
            if ids:
                await conn.execute(ob.delete().where(ob.c.id.in_(ids)))
            return len(ids)

        return int(await self._store.transaction(body))
