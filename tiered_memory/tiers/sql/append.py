"""How a batch of appends is stored in one transaction, in a fixed number of statements whatever
its size: lock the batch's session rows (creating the new ones), read the message_ids already
stored (and, for a batch with a retry, or any batch on PostgreSQL, those stored messages in one
more statement), number every message in Python, insert them all, update all their sessions in
one statement.

Round trips to the server and statements through the driver are what an append costs (the
commit aside, which group_commit.py shares); numbering a message is cheap arithmetic on the
locked rows. The rules are those of one append at a time, applied in order: a message sees the
ones before it in the batch as stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.errors import Conflict, Forbidden
from tiered_memory.model import AppendResult, Caller, Message, NewMessage, Owner, SessionKey, next_turn, stored_bytes
from tiered_memory.tiers.codec import dumps_text, loads
from tiered_memory.tiers.sql.group_commit import Settled
from tiered_memory.tiers.sql.quota import TenantQuotas
from tiered_memory.tiers.sql.rows import append_result_of, message_row, row_to_message
from tiered_memory.tiers.sql.schema import messages as msgs
from tiered_memory.tiers.sql.schema import sessions


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """What one session may hold (0: no bound): past it an append is refused with 409
    `session_full`, so that one caller cannot grow a session, and what every read of it costs,
    without end; the gateway closes it and opens another."""

    messages: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class Append:
    """One queued append: the message, when it arrived, and who sent it."""

    new: NewMessage
    now: float
    caller: Caller
    # The caller's span context (tracing.py), which the batch's span links to; None untraced.
    trace: Any = None


@dataclass(slots=True)
class _Session:
    """A locked session row as the batch changes it."""

    tenant: str
    user_id: str | None
    turn_count: int
    message_count: int
    pending_user: bool
    content_chars: int
    content_bytes: int
    open_calls: list[str]  # the tool calls waiting for their result, oldest first
    first_uid: str | None = None  # the first user_id a stored message of this batch brought
    added_chars: int = 0
    added_bytes: int = 0
    last_at: float = 0.0
    changed: bool = False


class AppendStatements:
    """The statements of a batch append, built once with bound parameters (building a statement
    and its cache key per call cost more CPU than the driver did: docs/BENCHMARKS.md)."""

    def __init__(self) -> None:
        # The sessions' rows, locked in id order, each outer-joined to the message_ids of its
        # messages stored under the batch's ids (other pairs the IN list matches are dropped in
        # Python): one round trip finds both what to number from and whether any is a retry.
        # Only the columns the numbering needs: the driver parses a descriptor per column of
        # every result, pure Python on the append's path (a third of the lock's time with every
        # column of both tables); a retry, rare, reads its stored messages whole (`retried`).
        on = sa.and_(
            msgs.c.session_id == sessions.c.session_id,
            msgs.c.message_id.in_(sa.bindparam("mids", expanding=True)),
        )
        c = sessions.c
        self.lock = (
            sa.select(
                *(c.session_id, c.tenant, c.user_id, c.turn_count, c.message_count, c.pending_user),
                *(c.content_chars, c.content_bytes, c.open_tool_calls),
                msgs.c.message_id.label("m_message_id"),
            )
            .select_from(sessions.outerjoin(msgs, on))
            .where(c.session_id.in_(sa.bindparam("sids", expanding=True)))
            .order_by(c.session_id)
            # OF: PostgreSQL cannot lock an outer join's nullable side (MariaDB and SQLite
            # ignore it; the messages found are unchanging rows anyway).
            .with_for_update(of=sessions)
        )
        # A stored message is never changed by an append, and under READ COMMITTED (engine.py)
        # this statement, run after the lock was granted, sees every one committed before: no
        # lock needed.
        self.retried = sa.select(msgs).where(
            msgs.c.session_id.in_(sa.bindparam("sids", expanding=True)),
            msgs.c.message_id.in_(sa.bindparam("mids", expanding=True)),
        )
        self.insert_message = msgs.insert()
        # UPDATE statements by the number of rows they change (at most a batch's sessions).
        self._updates: dict[int, sa.Update] = {}

    def update_sessions(self, n: int) -> sa.Update:
        """One UPDATE of `n` session rows, each column a CASE on the session id, bound as
        `{name}_{i}` for row i (`_update`'s names): one round trip per batch, where an
        executemany of a one-row UPDATE costs one per session (drivers batch only INSERTs), and
        those were more than half of an append's statements at c=64 (docs/BENCHMARKS.md)."""
        found = self._updates.get(n)
        if found is not None:
            return found
        c = sessions.c

        def per_row(name: str, column: sa.Column[Any]) -> sa.Case[Any]:
            whens = [
                (sa.bindparam(f"sid_{i}", type_=c.session_id.type), sa.bindparam(f"{name}_{i}", type_=column.type))
                for i in range(n)
            ]
            return sa.case(*whens, value=c.session_id)

        statement = (
            sessions.update()
            .where(c.session_id.in_([sa.bindparam(f"sid_{i}", type_=c.session_id.type) for i in range(n)]))
            .values(
                turn_count=per_row("turns", c.turn_count),
                message_count=per_row("seq", c.message_count),
                pending_user=per_row("pending", c.pending_user),
                content_chars=c.content_chars + per_row("chars", c.content_chars),
                content_bytes=c.content_bytes + per_row("bytes", c.content_bytes),
                last_activity=per_row("now", c.last_activity),
                # A gateway that reconnects to a closed session reopens it.
                closed_at=None,
                close_reason=None,
                user_id=sa.func.coalesce(c.user_id, per_row("uid", c.user_id)),
                open_tool_calls=per_row("calls", c.open_tool_calls),
            )
        )
        self._updates[n] = statement
        return statement


async def store_batch(
    conn: AsyncConnection,
    st: AppendStatements,
    batch: Sequence[Append],
    insert_if_absent: Callable[[sa.Table, dict[str, Any]], sa.Executable],
    limits: SessionLimits = SessionLimits(),
    quotas: TenantQuotas | None = None,
) -> list[Settled[AppendResult]]:
    """Store `batch` in the transaction `conn`; one outcome per append, in order: its result, or
    Forbidden / Conflict for a message refused (which writes nothing). `insert_if_absent(table,
    values)` builds the dialect's insert-or-nothing. Messages of one session are numbered in batch
    order; sessions are locked in id order, so that batches lock rows in one global order.
    `quotas` bound what each caller's tenant stores (tiers/sql/quota.py)."""
    if quotas is not None:
        await quotas.load(conn, {a.caller.tenant for a in batch if a.caller.tenant is not None})
    sids = sorted({a.new.key for a in batch})
    mids = sorted({a.new.message_id for a in batch})
    state, stored = await _lock(conn, st, sids, mids)
    missing = [sid for sid in sids if sid not in state]
    if missing:
        for sid in missing:
            first = next(a for a in batch if a.new.key == sid)
            values = {
                "session_id": sid,
                "user_id": first.new.user_id,
                "tenant": first.caller.tenant or "",
                "turn_count": 0,
                "message_count": 0,
                "created_at": first.now,
                "last_activity": first.now,
            }
            await conn.execute(insert_if_absent(sessions, values))
        more_state, more_stored = await _lock(conn, st, missing, mids)
        state.update(more_state)
        stored.update(more_stored)
    outcomes: list[Settled[AppendResult]] = []
    inserts: list[dict[str, Any]] = []
    for a in batch:
        s = state[a.new.key]
        try:
            result = _one(a, s, stored.get((a.new.key, a.new.message_id)), limits, quotas)
        except (Forbidden, Conflict) as exc:
            outcomes.append(exc)
            continue
        outcomes.append(result)
        if not result.duplicate:
            m = result.message
            stored[(m.key, m.message_id)] = (m, result.completed_turn)
            inserts.append(message_row(m, result.completed_turn))
    if inserts:
        await conn.execute(st.insert_message, inserts)
        updates = [_update(sid, s) for sid, s in state.items() if s.changed]
        bound = {f"{name}_{i}": value for i, row in enumerate(updates) for name, value in row.items()}
        await conn.execute(st.update_sessions(len(updates)), bound)
    # A session this batch created for messages all refused (a tool result for no open call)
    # is removed again: a refused append changes nothing, not even which session ids exist.
    empty = [sid for sid in missing if not state[sid].changed and state[sid].message_count == 0]
    if empty:
        await conn.execute(sessions.delete().where(sessions.c.session_id.in_(empty)))
    return outcomes


async def _lock(
    conn: AsyncConnection, st: AppendStatements, sids: list[SessionKey], mids: list[str]
) -> tuple[dict[str, _Session], dict[tuple[str, str], tuple[Message, bool]]]:
    """The sessions `sids` that exist, locked, and their messages stored under `mids`."""
    state: dict[str, _Session] = {}
    found: set[tuple[str, str]] = set()
    for r in (await conn.execute(st.lock, {"sids": sids, "mids": mids})).all():
        if r.session_id not in state:
            state[r.session_id] = _Session(
                tenant=r.tenant,
                user_id=r.user_id,
                turn_count=int(r.turn_count),
                message_count=int(r.message_count),
                pending_user=bool(r.pending_user),
                content_chars=int(r.content_chars),
                content_bytes=int(r.content_bytes),
                open_calls=_call_ids(r.open_tool_calls),
            )
        if r.m_message_id is not None:
            found.add((r.session_id, r.m_message_id))
    stored: dict[tuple[str, str], tuple[Message, bool]] = {}
    # PostgreSQL's FOR UPDATE, having waited for a session's row, reads that row again but not
    # the messages joined to it, which stay as the statement's snapshot held them before the
    # wait: a retry that waited for the batch holding its original would not see it there, and
    # would hit the unique key. So there the stored messages are always read after the lock.
    # MariaDB's locking read takes the joined rows as they are once the lock is granted, and
    # SQLite's writers take turns.
    always = conn.dialect.name == "postgresql"
    if found or always:
        if always:
            asked = {"sids": sids, "mids": mids}
        else:
            asked = {"sids": sorted({sid for sid, _ in found}), "mids": sorted({mid for _, mid in found})}
        # The IN lists may match pairs no append of the batch names: stored messages all the
        # same, never looked up.
        for r in (await conn.execute(st.retried, asked)).all():
            stored[(r.session_id, r.message_id)] = (row_to_message(r), bool(r.completes_turn))
    return state, stored


def _one(
    a: Append, s: _Session, stored: tuple[Message, bool] | None, limits: SessionLimits, quotas: TenantQuotas | None
) -> AppendResult:
    """One append against its session's state, which it advances when it stores a message."""
    new = a.new
    if (s.user_id is not None and new.user_id is not None and s.user_id != new.user_id) or (
        not a.caller.may_access(Owner(s.tenant, s.user_id))
    ):
        raise Forbidden
    if stored is not None:
        message, completes = stored
        if _fields(message) != _fields(new):
            raise Conflict(f"message_id {new.message_id!r} was already used for a different message")
        return dataclasses.replace(
            append_result_of(message, completed_turn=completes, duplicate=True),
            content_chars=s.content_chars,
            owner=Owner(s.tenant, s.user_id),
        )
    size = _admitted(new, s, limits)
    if quotas is not None and a.caller.tenant is not None:
        # A session no message was stored in yet is the tenant's new one (an empty row this batch
        # created is removed again when nothing goes in).
        quotas.admit(a.caller.tenant, new_session=s.message_count == 0, size=size)
    owner = Owner(s.tenant, s.user_id or new.user_id)
    seq = s.message_count + 1
    place = next_turn(new, completed=s.turn_count, pending=s.pending_user)
    message = Message(
        key=new.key,
        seq=seq,
        turn=place.turn,
        role=new.role,
        content=new.content,
        message_id=new.message_id,
        created_at=a.now,
        user_id=new.user_id or s.user_id,
        channel=new.channel,
        status=new.status,
        tool_calls=new.tool_calls,
        tool_call_id=new.tool_call_id,
        name=new.name,
        thinking_content=new.thinking_content,
        thinking_duration=new.thinking_duration,
    )
    s.message_count, s.turn_count, s.pending_user = seq, place.completed_after, place.pending_after
    if new.tool_calls:
        s.open_calls = [*s.open_calls, *_call_ids(new.tool_calls, key="id")][-OPEN_CALLS_MAX:]
    elif new.tool_call_id is not None:
        s.open_calls.remove(new.tool_call_id)  # the oldest call of that id: a gateway may reuse ids
    s.content_chars += message.size
    s.added_chars += message.size
    s.content_bytes += size
    s.added_bytes += size
    s.first_uid = s.first_uid or new.user_id
    s.user_id = s.user_id or new.user_id
    s.last_at = a.now
    s.changed = True
    return AppendResult(
        message=message,
        turn_count=place.completed_after,
        message_count=seq,
        duplicate=False,
        completed_turn=place.completes,
        content_chars=s.content_chars,
        owner=owner,
    )


def _admitted(new: NewMessage, s: _Session, limits: SessionLimits) -> int:
    """The bytes `new` adds to its session; Conflict when it answers no open tool call
    (`unknown_tool_call_id`) or the session has no room for it (`session_full`)."""
    if new.tool_call_id is not None and new.tool_call_id not in s.open_calls:
        raise Conflict(
            f"tool_call_id {new.tool_call_id!r} answers no tool call of this session that is waiting for its result",
            code="unknown_tool_call_id",
        )
    size = stored_bytes(new)
    if (limits.messages and s.message_count >= limits.messages) or (
        limits.bytes and s.content_bytes + size > limits.bytes
    ):
        raise Conflict(
            f"the session holds {s.message_count} messages, {s.content_bytes} bytes: this one would pass"
            f" MAX_SESSION_MESSAGES ({limits.messages or 'none'}) or MAX_SESSION_BYTES ({limits.bytes or 'none'});"
            " close it and go on in a new session",
            code="session_full",
        )
    return size


def _update(sid: str, s: _Session) -> dict[str, Any]:
    return {
        "sid": sid,
        "turns": s.turn_count,
        "seq": s.message_count,
        "pending": int(s.pending_user),
        "chars": s.added_chars,
        "bytes": s.added_bytes,
        "now": s.last_at,
        "uid": s.first_uid,
        "calls": dumps_text(s.open_calls) if s.open_calls else None,
    }


# Tool calls a session keeps waiting for their result at most: a gateway that never reports
# some results cannot grow its session row without bound (the oldest are forgotten first).
OPEN_CALLS_MAX = 256


def _call_ids(text: str | None, *, key: str | None = None) -> list[str]:
    """The call ids of a JSON array: of ids (the session's open calls), or of tool calls (`key`)."""
    if not text:
        return []
    items = loads(text)
    assert isinstance(items, list)
    return [str(item[key]) if key else str(item) for item in items]


def _fields(m: Message | NewMessage) -> tuple[object, ...]:
    """What a retry must repeat for the same message_id to be the same message."""
    return (
        m.role,
        m.content,
        m.status,
        m.tool_calls,
        m.tool_call_id,
        m.name,
        m.thinking_content,
        m.thinking_duration,
    )
