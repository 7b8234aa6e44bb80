"""Changing a stored message while no summary covers it: correcting it (`PATCH …/messages/{message_id}`:
a speech recognizer's transcript corrected, a reply's spoken part, a streaming reply finalized, a
reply cut by a barge-in), or removing the session's newest (`DELETE …/messages/{message_id}`: an
agent framework taking back its last item).

The patch rule is pure (`plan`); `patch_message` and `delete_newest` run under the session row's
lock, the lock every append and every summary write takes, with the session's counters kept in step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.errors import Conflict, Forbidden, InvalidInput, NotFound
from tiered_memory.model import (
    Caller,
    Message,
    MessageStatus,
    Owner,
    Patch,
    PatchResult,
    Role,
    SessionKey,
    stored_bytes,
)
from tiered_memory.tiers.codec import dumps_text, loads
from tiered_memory.tiers.sql.append import OPEN_CALLS_MAX
from tiered_memory.tiers.sql.rows import row_to_message
from tiered_memory.tiers.sql.schema import conversation_summaries as cs
from tiered_memory.tiers.sql.schema import messages as msgs
from tiered_memory.tiers.sql.schema import sessions


def plan(
    m: Message, patch: Patch, *, completes: bool, newest: bool, question_waits: bool, covered_turns: int
) -> tuple[Message, bool]:
    """The message as patched and whether it then completes its turn. `completes`: whether it
    does now; `newest`: it is the session's last message; `question_waits`: the session's open
    turn has a question without its answer; `covered_turns`: what the summary covers.

    Raises Conflict (`already_summarized`, or a change the turns cannot follow) or InvalidInput."""
    content = m.content if patch.content is None else patch.content
    status = m.status if patch.status is None else patch.status
    if content == m.content and status is m.status:
        return m, completes  # as asked already: a repeated patch changes nothing, even once summarized
    if m.turn <= covered_turns:
        raise Conflict(
            f"message {m.message_id!r} is in turn {m.turn}, which the summary covers (turns 1-{covered_turns}):"
            " it can no longer be changed",
            code="already_summarized",
        )
    if (m.role is not Role.ASSISTANT or m.tool_calls) and status is not MessageStatus.COMPLETED:
        raise InvalidInput(
            f"status: a {m.role.value} message{' with tool_calls' if m.tool_calls else ''} is always completed"
        )
    if m.status.answers and not status.answers:
        raise Conflict(
            f"message {m.message_id!r} answered its question and completed turn {m.turn}: it cannot be taken"
            " back (send the part that was spoken with status 'interrupted')"
        )
    if status.answers and not m.status.answers:
        # A streaming (or stopped, failed) reply finalized: it completes its turn, which only the
        # newest message can, while its question still waits.
        if not (newest and question_waits):
            raise Conflict(
                f"message {m.message_id!r} can no longer complete its turn: only the newest message, a reply"
                " its question still waits for, can"
            )
        completes = True
    return dataclasses.replace(m, content=content, status=status), completes


async def patch_message(
    conn: AsyncConnection, key: SessionKey, message_id: str, patch: Patch, caller: Caller
) -> PatchResult:
    """Apply `patch` to the stored message, inside the caller's transaction. Raises NotFound,
    Forbidden (changing nothing) and what `plan` raises."""
    s = await _locked_session(conn, key, caller)
    row = await _message_row(conn, key, message_id)
    if row is None:
        raise NotFound(f"the session has no message {message_id!r}")
    stored, completes = row_to_message(row), bool(row.completes_turn)
    patched, completes_after = plan(
        stored,
        patch,
        completes=completes,
        newest=stored.seq == int(s.message_count),
        question_waits=bool(s.pending_user),
        covered_turns=await _covered_turns(conn, key),
    )
    if patched == stored:
        return PatchResult(
            stored, int(s.turn_count), changed=False, completed_turn=False, session_bytes=int(s.content_bytes)
        )
    await conn.execute(
        msgs.update()
        .where(msgs.c.id == row.id)
        .values(content=patched.content, status=patched.status.value, completes_turn=int(completes_after))
    )
    values: dict[str, object] = {
        "content_chars": sessions.c.content_chars + len(patched.content) - len(stored.content),
        "content_bytes": sessions.c.content_bytes + len(patched.content.encode()) - len(stored.content.encode()),
    }
    finished = completes_after and not completes
    turn_count = patched.turn if finished else int(s.turn_count)
    if finished:
        values |= {"turn_count": turn_count, "pending_user": 0}
    await conn.execute(sessions.update().where(sessions.c.session_id == key).values(**values))
    size = int(s.content_bytes) + len(patched.content.encode()) - len(stored.content.encode())
    return PatchResult(patched, turn_count, changed=True, completed_turn=finished, session_bytes=size)


@dataclasses.dataclass(frozen=True, slots=True)
class Deleted:
    """What `delete_newest` did: the message it removed (None: the session has no message of that
    id, or no longer), and the session's text after, in bytes (what the recall postings it makes
    the hot tier drop will read back)."""

    message: Message | None
    session_bytes: int


async def delete_newest(conn: AsyncConnection, key: SessionKey, message_id: str, caller: Caller) -> Deleted:
    """Remove the session's newest message, inside the caller's transaction, and take the
    session's counters back to what they were before it was appended: a turn it completed is open
    again with its question waiting, and the tool calls it made or answered are as they were.
    Its seq is the next append's again. Raises NotFound (the session), Forbidden, and Conflict
    (`already_summarized` once a summary covers its turn; `conflict` when it is not the newest),
    changing nothing."""
    s = await _locked_session(conn, key, caller)
    row = await _message_row(conn, key, message_id)
    if row is None:
        return Deleted(None, int(s.content_bytes))
    m = row_to_message(row)
    if m.seq != int(s.message_count):
        raise Conflict(
            f"message {message_id!r} is message {m.seq} of {s.message_count}: only the session's newest can be removed"
        )
    covered = await _covered_turns(conn, key)
    if m.turn <= covered:
        raise Conflict(
            f"message {message_id!r} is in turn {m.turn}, which the summary covers (turns 1-{covered}):"
            " it can no longer be removed",
            code="already_summarized",
        )
    size = stored_bytes(m)
    values: dict[str, object] = {
        "message_count": m.seq - 1,
        "content_chars": sessions.c.content_chars - m.size,
        "content_bytes": sessions.c.content_bytes - size,
    }
    if row.completes_turn:
        # It answered the turn's question, which waits again.
        values |= {"turn_count": m.turn - 1, "pending_user": 1}
    elif m.role is Role.USER:
        values["pending_user"] = int(await _question_before(conn, key, m))
    # Any other message left the counters as they were (append._turns).
    if m.tool_calls or m.tool_call_id is not None:
        values["open_tool_calls"] = await _open_calls_before(conn, key, m.seq)
    await conn.execute(msgs.delete().where(msgs.c.id == row.id))
    await conn.execute(sessions.update().where(sessions.c.session_id == key).values(**values))
    return Deleted(m, int(s.content_bytes) - size)


async def _locked_session(conn: AsyncConnection, key: SessionKey, caller: Caller) -> sa.Row[*tuple[Any, ...]]:
    """The session's row, locked until the transaction ends. Raises NotFound, or Forbidden when
    it is not the caller's (checked under the lock)."""
    s = (
        await conn.execute(
            sa.select(
                sessions.c.tenant,
                sessions.c.user_id,
                sessions.c.turn_count,
                sessions.c.message_count,
                sessions.c.pending_user,
                sessions.c.content_bytes,
            )
            .where(sessions.c.session_id == key)
            .with_for_update()
        )
    ).one_or_none()
    if s is None:
        raise NotFound("the session does not exist")
    if not caller.may_access(Owner(s.tenant, s.user_id)):
        raise Forbidden
    return s


async def _message_row(conn: AsyncConnection, key: SessionKey, message_id: str) -> sa.Row[*tuple[Any, ...]] | None:
    return (
        await conn.execute(sa.select(msgs).where(msgs.c.session_id == key, msgs.c.message_id == message_id))
    ).one_or_none()


async def _covered_turns(conn: AsyncConnection, key: SessionKey) -> int:
    covered = (await conn.execute(sa.select(cs.c.covered_turns).where(cs.c.session_id == key))).scalar_one_or_none()
    return int(covered or 0)


# Messages read at once, newest first, looking for a user message earlier in a turn: a turn
# rarely holds more than a few.
_TURN_PAGE = 32


async def _question_before(conn: AsyncConnection, key: SessionKey, m: Message) -> bool:
    """Whether a user message precedes `m` in its turn: whether a question was waiting before `m`
    was appended (only a reply that completes the turn clears it, and that ends the turn)."""
    before = m.seq
    while True:
        rows = (
            await conn.execute(
                sa.select(msgs.c.seq, msgs.c.turn, msgs.c.role)
                .where(msgs.c.session_id == key, msgs.c.seq < before)
                .order_by(msgs.c.seq.desc())
                .limit(_TURN_PAGE)
            )
        ).all()
        for r in rows:
            if int(r.turn) < m.turn:
                return False
            if r.role == Role.USER.value:
                return True
        if len(rows) < _TURN_PAGE:
            return False
        before = int(rows[-1].seq)


async def _open_calls_before(conn: AsyncConnection, key: SessionKey, seq: int) -> str | None:
    """The session's open tool calls (`sessions.open_tool_calls`) as they were before message
    `seq`: its tool traffic replayed as the appends kept them (append.py), so that their order and
    their bound are the same. Reads the session's tool messages, only when a tool message is removed."""
    rows = await conn.execute(
        sa.select(msgs.c.tool_calls, msgs.c.tool_call_id)
        .where(
            msgs.c.session_id == key,
            msgs.c.seq < seq,
            sa.or_(msgs.c.tool_calls.is_not(None), msgs.c.tool_call_id.is_not(None)),
        )
        .order_by(msgs.c.seq)
    )
    calls: list[str] = []
    for r in rows:
        if r.tool_calls:
            made = loads(r.tool_calls)
            assert isinstance(made, list)
            calls = [*calls, *(str(call["id"]) for call in made)][-OPEN_CALLS_MAX:]
        elif r.tool_call_id in calls:
            calls.remove(r.tool_call_id)  # the oldest call of that id, as the append took it
    return dumps_text(calls) if calls else None
