"""The SQL side of a user's memory across sessions: the profile (merged inside the transaction that
writes a summary, `merge_profile`), a user's sessions page by page, what a new session carries
over, and a user's erasure in small transactions.

A user is a user_id inside a tenant ('' for none). The profile and the erasure are keyed by
users.user_key; the sessions by tenant and user_id, compared exactly (`same_user`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.model import SessionInfo, SessionKey, Summary
from tiered_memory.prompt.users import Profile, dump_profile, load_profile, merged, user_key
from tiered_memory.tiers.sql.outbox import add_event, new_event_id
from tiered_memory.tiers.sql.rows import row_to_session, row_to_summary, sessions_with_summaries
from tiered_memory.tiers.sql.schema import conversation_summaries as cs
from tiered_memory.tiers.sql.schema import messages as msgs
from tiered_memory.tiers.sql.schema import (
    outbox_events,
    session_state,
    sessions,
    summary_slices,
    summary_versions,
    user_erasures,
    user_profiles,
)
from tiered_memory.webhooks import USER_ERASED, Event

if TYPE_CHECKING:
    # Only for its type: the store imports merge_profile from here.
    from tiered_memory.tiers.sql.store import SqlStore

InsertIfAbsent = Callable[[sa.Table, dict[str, Any]], sa.Executable]
# The summaries a profile is made again from when one of its user's sessions is deleted: the
# user's newest (a profile keeps the last 32 sessions it counted; older ones count by number only).
PROFILE_REBUILD_SESSIONS = 1000


def same_user(column: sa.ColumnElement[Any], user_id: str) -> sa.ColumnElement[bool]:
    """`column` equals `user_id` exactly. MySQL/MariaDB collations pad with spaces, so 'u1' = 'u1 '
    there: equal lengths (measured by the same function on both sides) make the match exact, and
    the equality still uses an index on the column."""
    return sa.and_(column == user_id, sa.func.length(column) == sa.func.length(sa.literal(user_id)))


async def merge_profile(
    conn: AsyncConnection,
    insert_if_absent: InsertIfAbsent,
    *,
    tenant: str,
    user_id: str,
    session_key: SessionKey,
    summary: Summary,
    now: float,
) -> None:
    """Merge `summary` into its user's profile, in the caller's transaction (the one writing the
    summary, so the two never disagree). The row is created empty first, then locked: two
    summaries of one user's sessions merge one after the other."""
    key = user_key(tenant, user_id)
    empty = json.dumps(dump_profile(Profile()))
    await conn.execute(
        insert_if_absent(
            user_profiles, {"user_key": key, "tenant": tenant, "user_id": user_id, "profile": empty, "updated_at": now}
        )
    )
    stored = (
        await conn.execute(sa.select(user_profiles.c.profile).where(user_profiles.c.user_key == key).with_for_update())
    ).scalar_one()
    profile = merged(load_profile(json.loads(stored)), summary, session=session_key, now=now)
    await conn.execute(
        user_profiles.update()
        .where(user_profiles.c.user_key == key)
        .values(profile=json.dumps(dump_profile(profile), ensure_ascii=False), updated_at=now)
    )


async def rebuild_profile(conn: AsyncConnection, *, tenant: str, user_id: str, now: float) -> None:
    """Make the user's profile again from the summaries of the user's sessions still stored (the
    newest PROFILE_REBUILD_SESSIONS, merged oldest first), in the caller's transaction: after a
    session is deleted, nothing only it said stays in the profile. A profile with no session
    left is removed; a user without a profile gets none."""
    key = user_key(tenant, user_id)
    locked = sa.select(user_profiles.c.user_key).where(user_profiles.c.user_key == key).with_for_update()
    if (await conn.execute(locked)).scalar_one_or_none() is None:
        return
    rows = (await conn.execute(user_summaries_query(user_id, tenant=tenant, limit=PROFILE_REBUILD_SESSIONS))).all()
    if not rows:
        await conn.execute(user_profiles.delete().where(user_profiles.c.user_key == key))
        return
    profile = Profile()
    for row in reversed(rows):
        summary = row_to_summary(row)
        profile = merged(profile, summary, session=row.session_id, now=summary.updated_at)
    await conn.execute(
        user_profiles.update()
        .where(user_profiles.c.user_key == key)
        .values(profile=json.dumps(dump_profile(profile), ensure_ascii=False), updated_at=now)
    )


async def _has_anything(conn: AsyncConnection, tenant: str, user_id: str) -> bool:
    """Whether the user has a session or a profile."""
    session = sa.select(sessions.c.session_id).where(
        sessions.c.tenant == tenant, same_user(sessions.c.user_id, user_id)
    )
    profile = sa.select(user_profiles.c.user_key).where(user_profiles.c.user_key == user_key(tenant, user_id))
    for q in (session.limit(1), profile):
        if (await conn.execute(q)).first() is not None:
            return True
    return False


def user_summaries_query(user_id: str, *, tenant: str | None, limit: int) -> sa.Select[Any]:
    """The user's most recently updated session summaries, newest first (served by the
    (user_id, updated_at) index); with `tenant`, of that tenant's sessions only."""
    q = (
        sa.select(cs, cs.c.created_at.label("summary_created_at"))
        .where(same_user(cs.c.user_id, user_id))
        .order_by(cs.c.updated_at.desc())
        .limit(limit)
    )
    if tenant is not None:
        q = q.join(sessions, sessions.c.session_id == cs.c.session_id).where(sessions.c.tenant == tenant)
    return q


@dataclass(frozen=True, slots=True)
class ErasureStatus:
    """A user's erasure: when it was asked for, when it finished (None: not yet), and what it removed."""

    requested_at: float
    finished_at: float | None
    sessions: int
    messages: int


@dataclass(frozen=True, slots=True)
class UserSessionsPage:
    """One page of a user's sessions, newest first, each with its summary (None: not summarized)."""

    sessions: list[tuple[SessionInfo, Summary | None]]
    more: bool


class SqlUsers:
    """A user's profile, sessions and erasure, run through a SqlStore (its timeouts, error mapping
    and writer queue). `batch` bounds the rows one erasure transaction deletes."""

    def __init__(self, store: SqlStore, *, batch: int = 500) -> None:
        if batch < 1:
            raise ValueError("batch: expected at least 1")
        self._store = store
        self._batch = batch

    async def profile(self, tenant: str, user_id: str) -> tuple[Profile, float] | None:
        """The user's profile and when it last changed; None when no summary of the user was merged."""

        async def op(conn: AsyncConnection) -> tuple[Profile, float] | None:
            q = sa.select(user_profiles.c.profile, user_profiles.c.updated_at).where(
                user_profiles.c.user_key == user_key(tenant, user_id)
            )
            row = (await conn.execute(q)).one_or_none()
            return None if row is None else (load_profile(json.loads(row.profile)), float(row.updated_at))

        return await self._store.read(op)

    async def carried(
        self, tenant: str, user_id: str, *, exclude: str, profile: bool, earlier: int
    ) -> tuple[Profile | None, list[tuple[SessionKey, Summary]]]:
        """What a session (`exclude`) of the user may carry over, in one connection: the profile
        (when `profile`) and up to `earlier` of the user's other sessions' summaries, the most
        recently updated first, as (session key, summary)."""

        async def op(conn: AsyncConnection) -> tuple[Profile | None, list[tuple[SessionKey, Summary]]]:
            found: Profile | None = None
            if profile:
                q = sa.select(user_profiles.c.profile).where(user_profiles.c.user_key == user_key(tenant, user_id))
                stored = (await conn.execute(q)).scalar_one_or_none()
                found = None if stored is None else load_profile(json.loads(stored))
            others: list[tuple[SessionKey, Summary]] = []
            if earlier:
                rows = (await conn.execute(user_summaries_query(user_id, tenant=tenant, limit=earlier + 1))).all()
                kept = [r for r in rows if r.session_id != exclude][:earlier]
                others = [(SessionKey(r.session_id), row_to_summary(r)) for r in kept]
            return found, others

        return await self._store.read(op)

    async def sessions(
        self, tenant: str, user_id: str, *, before: tuple[float, str] | None, limit: int
    ) -> UserSessionsPage:
        """The user's sessions created before `before` (created_at, session key: where the last
        page ended), newest first, at most `limit`; keyset paging on the (tenant, user_id,
        created_at) index, so a page costs the same however far into the list it is."""

        async def op(conn: AsyncConnection) -> UserSessionsPage:
            q = (
                sessions_with_summaries()
                .where(sessions.c.tenant == tenant, same_user(sessions.c.user_id, user_id))
                .order_by(sessions.c.created_at.desc(), sessions.c.session_id.desc())
                .limit(limit + 1)
            )
            if before is not None:
                at, key = before
                q = q.where(
                    sa.or_(
                        sessions.c.created_at < at,
                        sa.and_(sessions.c.created_at == at, sessions.c.session_id < key),
                    )
                )
            rows = (await conn.execute(q)).all()
            out = []
            for r in rows[:limit]:
                summary = row_to_summary(r) if r.summary is not None else None
                out.append((row_to_session(r, summary.covered_turns if summary else 0), summary))
            return UserSessionsPage(out, more=len(rows) > limit)

        return await self._store.read(op)

    # --- erasure ----------------------------------------------------------------------------

    async def request_erasure(self, tenant: str, user_id: str, *, now: float) -> bool:
        """Record that the user is to be erased (again, when an earlier erasure finished): the
        record stays until `finish_erasure`, so that an erasure a crash stopped is resumed. False,
        recording nothing, when there is nothing of the user to erase (no session, no profile, no
        erasure under way): an id nobody used leaves no trace and announces nothing."""
        key = user_key(tenant, user_id)

        async def body(conn: AsyncConnection) -> bool:
            found = (
                await conn.execute(
                    sa.select(user_erasures.c.finished_at).where(user_erasures.c.user_key == key).with_for_update()
                )
            ).one_or_none()
            if found is not None and found.finished_at is None:
                return True  # under way: it is resumed
            if not await _has_anything(conn, tenant, user_id):
                return False
            values = {"tenant": tenant, "user_id": user_id, "requested_at": now}
            if found is None:
                await conn.execute(user_erasures.insert().values(user_key=key, **values))
            else:
                await conn.execute(
                    user_erasures.update()
                    .where(user_erasures.c.user_key == key)
                    .values(**values, finished_at=None, sessions=0, messages=0)
                )
            return True

        return bool(await self._store.transaction(body))

    async def forget_erasures(self, *, finished_before: float) -> int:
        """Delete the records of erasures finished before `finished_before` (the status is
        answered until then), and the user ids records finished by an older version kept; how
        many were deleted."""

        async def body(conn: AsyncConnection) -> int:
            finished = user_erasures.c.finished_at.is_not(None)
            named = sa.func.length(user_erasures.c.user_id) > 0
            await conn.execute(user_erasures.update().where(finished, named).values(user_id=""))
            done = finished & (user_erasures.c.finished_at < finished_before)
            return int((await conn.execute(user_erasures.delete().where(done))).rowcount or 0)

        return int(await self._store.transaction(body))

    async def erasure(self, tenant: str, user_id: str) -> ErasureStatus | None:
        async def op(conn: AsyncConnection) -> ErasureStatus | None:
            q = sa.select(user_erasures).where(user_erasures.c.user_key == user_key(tenant, user_id))
            r = (await conn.execute(q)).one_or_none()
            if r is None:
                return None
            finished = None if r.finished_at is None else float(r.finished_at)
            return ErasureStatus(float(r.requested_at), finished, int(r.sessions), int(r.messages))

        return await self._store.read(op)

    async def unfinished_erasures(self, *, limit: int) -> list[tuple[str, str]]:
        """(tenant, user_id) of erasures asked for and not finished, the oldest request first."""

        async def op(conn: AsyncConnection) -> list[tuple[str, str]]:
            q = (
                sa.select(user_erasures.c.tenant, user_erasures.c.user_id)
                .where(user_erasures.c.finished_at.is_(None))
                .order_by(user_erasures.c.requested_at)
                .limit(limit)
            )
            return [(r.tenant, r.user_id) for r in (await conn.execute(q)).all()]

        return await self._store.read(op)

    async def count_sessions(self, tenant: str, user_id: str) -> int:
        async def op(conn: AsyncConnection) -> int:
            q = sa.select(sa.func.count()).where(sessions.c.tenant == tenant, same_user(sessions.c.user_id, user_id))
            return int((await conn.execute(q)).scalar() or 0)

        return int(await self._store.read(op))

    async def session_keys(self, tenant: str, user_id: str, *, limit: int) -> list[SessionKey]:
        """Up to `limit` of the user's sessions (erased ones drop out, so the next call returns the next)."""

        async def op(conn: AsyncConnection) -> list[SessionKey]:
            q = (
                sa.select(sessions.c.session_id)
                .where(sessions.c.tenant == tenant, same_user(sessions.c.user_id, user_id))
                .order_by(sessions.c.created_at, sessions.c.session_id)
                .limit(limit)
            )
            return [SessionKey(r.session_id) for r in (await conn.execute(q)).all()]

        return await self._store.read(op)

    async def erase_content(self, session_key: SessionKey) -> int:
        """Delete a session's messages, slices and summary versions, `batch` rows a transaction;
        the messages deleted. The session row stays (and keeps the session on the list of the user's) until
        `erase_session`, which the hot keys' removal comes before."""
        removed = 0
        self._store.changed(session_key, deleted=True)
        for table in (msgs, summary_slices, summary_versions):
            while True:
                n = await self._store.transaction(
                    functools.partial(self._delete_batch, table=table, session_key=session_key)
                )
                removed += n if table is msgs else 0
                if n < self._batch:
                    break
        return removed

    async def _delete_batch(self, conn: AsyncConnection, *, table: sa.Table, session_key: SessionKey) -> int:
        q = sa.select(table.c.id).where(table.c.session_id == session_key).order_by(table.c.id).limit(self._batch)
        ids = [r.id for r in (await conn.execute(q)).all()]
        if ids:
            await conn.execute(table.delete().where(table.c.id.in_(ids)))
        return len(ids)

    async def erase_session(self, session_key: SessionKey) -> tuple[bool, int]:
        """Delete what is left of a session (messages appended since `erase_content`, its summary,
        state and row) in one transaction under its row lock: whether the row was there (another
        run may have got there first), and the messages deleted."""

        async def body(conn: AsyncConnection) -> tuple[bool, int]:
            lock = sa.select(sessions.c.session_id).where(sessions.c.session_id == session_key).with_for_update()
            if (await conn.execute(lock)).one_or_none() is None:
                return False, 0
            left = await conn.execute(msgs.delete().where(msgs.c.session_id == session_key))
            for table in (summary_slices, summary_versions, cs, session_state, sessions):
                await conn.execute(table.delete().where(table.c.session_id == session_key))
            # Its events not delivered yet would tell a receiver what is erased now.
            await conn.execute(outbox_events.delete().where(outbox_events.c.subject == session_key))
            return True, int(left.rowcount or 0)

        try:
            return await self._store.transaction(body)
        finally:
            self._store.changed(session_key, deleted=True)

    async def finish_erasure(
        self, tenant: str, user_id: str, *, sessions_erased: int, messages: int, now: float
    ) -> bool:
        """Delete the user's profile and mark the erasure finished, adding what this run removed;
        False (changing nothing) while a session of the user is left (one created meanwhile)."""
        key = user_key(tenant, user_id)

        async def body(conn: AsyncConnection) -> bool:
            left = (
                await conn.execute(
                    sa.select(sessions.c.session_id)
                    .where(sessions.c.tenant == tenant, same_user(sessions.c.user_id, user_id))
                    .limit(1)
                )
            ).one_or_none()
            if left is not None:
                return False
            await conn.execute(user_profiles.delete().where(user_profiles.c.user_key == key))
            # Finished, the record keeps the user's digest (its key) and no longer its id: the
            # id was needed only to find what was left to erase.
            await conn.execute(
                user_erasures.update()
                .where(user_erasures.c.user_key == key)
                .values(
                    user_id="",
                    finished_at=now,
                    sessions=user_erasures.c.sessions + sessions_erased,
                    messages=user_erasures.c.messages + messages,
                )
            )
            said = {"sessions": sessions_erased, "messages": messages}
            await add_event(
                conn, self._store.sinks, Event(new_event_id(), USER_ERASED, tenant, None, user_id, said, now)
            )
            return True

        return bool(await self._store.transaction(body))
