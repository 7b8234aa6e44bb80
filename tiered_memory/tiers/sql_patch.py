"""Correcting a stored message (`PATCH …/messages/{message_id}`): its content (a speech
recognizer's transcript corrected, a reply's spoken part) and a reply's status (a streaming reply
finalized, a reply cut by a barge-in), while no summary covers it.

The rule is pure (`plan`); `patch_message` applies it under the session row's lock, the lock every
append and every summary write takes, with the session's counters kept in step.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.errors import Conflict, Forbidden, InvalidInput, NotFound
from tiered_memory.model import Caller, Message, MessageStatus, Owner, Patch, PatchResult, Role
from tiered_memory.tiers.sql_rows import row_to_message
from tiered_memory.tiers.sql_schema import conversation_summaries as cs
from tiered_memory.tiers.sql_schema import messages as msgs
from tiered_memory.tiers.sql_schema import sessions


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
    conn: AsyncConnection, session_id: str, message_id: str, patch: Patch, caller: Caller
) -> PatchResult:
    """Apply `patch` to the stored message, inside the caller's transaction. Raises NotFound,
    Forbidden (changing nothing) and what `plan` raises."""
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
            .where(sessions.c.session_id == session_id)
            .with_for_update()
        )
    ).one_or_none()
    if s is None:
        raise NotFound("the session does not exist")
    if not caller.may_access(Owner(s.tenant, s.user_id)):
        raise Forbidden
    row = (
        await conn.execute(sa.select(msgs).where(msgs.c.session_id == session_id, msgs.c.message_id == message_id))
    ).one_or_none()
    if row is None:
        raise NotFound(f"the session has no message {message_id!r}")
    stored, completes = row_to_message(row), bool(row.completes_turn)
    covered = (
        await conn.execute(sa.select(cs.c.covered_turns).where(cs.c.session_id == session_id))
    ).scalar_one_or_none()
    patched, completes_after = plan(
        stored,
        patch,
        completes=completes,
        newest=stored.seq == int(s.message_count),
        question_waits=bool(s.pending_user),
        covered_turns=int(covered or 0),
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
    await conn.execute(sessions.update().where(sessions.c.session_id == session_id).values(**values))
    size = int(s.content_bytes) + len(patched.content.encode()) - len(stored.content.encode())
    return PatchResult(patched, turn_count, changed=True, completed_turn=finished, session_bytes=size)
