"""Mapping between SQL rows and the domain's dataclasses, for the SQL store."""

from __future__ import annotations

import functools
import json
from typing import Any

import sqlalchemy as sa

from tiered_memory.model import (
    AppendResult,
    Channel,
    Message,
    MessageStatus,
    Role,
    SessionInfo,
    SessionKey,
    SessionState,
    Slice,
    Summary,
    SummarySource,
)
from tiered_memory.tiers.sql.schema import conversation_summaries as cs
from tiered_memory.tiers.sql.schema import messages as msgs
from tiered_memory.tiers.sql.schema import session_state, sessions

# A message's reasoning (reasoning.py), read only where the client reads stored messages.
REASONING_COLUMNS = frozenset({"thinking_content", "thinking_duration"})
# What the reads that feed a context, a summary or the recall index select: every column but the
# reasoning, which none of them may see and which would cost each of them up to
# MAX_MESSAGE_BYTES a message more to read.
MEMORY_COLUMNS = tuple(c for c in msgs.c if c.name not in REASONING_COLUMNS)


def message_row(m: Message, completes: bool) -> dict[str, Any]:
    """The `messages` row of a stored message (`completes`: it completed its turn)."""
    return {
        "session_id": m.key,
        "seq": m.seq,
        "turn": m.turn,
        "user_id": m.user_id,
        "role": m.role.value,
        "content": m.content,
        "channel": m.channel.value,
        "message_id": m.message_id,
        "completes_turn": int(completes),
        "status": m.status.value,
        "tool_calls": m.tool_calls or None,
        "tool_call_id": m.tool_call_id,
        "name": m.name,
        "thinking_content": m.thinking_content,
        "thinking_duration": m.thinking_duration,
        "created_at": m.created_at,
    }


# A stored enum value as its member: an Enum's own call costs 0.7 µs, three a row, on every read
# of messages from SQL; a cache of its few members, 0.06 µs.
_role = functools.cache(Role)
_channel = functools.cache(Channel)
_status = functools.cache(MessageStatus)


def row_to_message(r: sa.Row[*tuple[Any, ...]]) -> Message:
    """The message in a row of `messages`."""
    m = r._mapping
    # Absent from a row of MEMORY_COLUMNS. Asked with `in`, not `.get`: a row mapping answers a
    # missing key by raising and catching inside SQLAlchemy (2 µs, seven times an `in`), twice a
    # row, on every read of messages from SQL.
    reasoned = "thinking_content" in m  # the two columns are read together or not at all
    return Message(
        key=m["session_id"],
        seq=int(m["seq"]),
        turn=int(m["turn"]),
        role=_role(m["role"]),
        content=m["content"],
        message_id=m["message_id"],
        created_at=float(m["created_at"]),
        user_id=m["user_id"],
        channel=_channel(m["channel"]),
        status=_status(m["status"]),
        tool_calls=m["tool_calls"] or "",
        tool_call_id=m["tool_call_id"],
        name=m["name"],
        thinking_content=m["thinking_content"] if reasoned else None,
        thinking_duration=m["thinking_duration"] if reasoned else None,
    )


def row_to_session(r: sa.Row[*tuple[Any, ...]], covered: int = 0) -> SessionInfo:
    return SessionInfo(
        key=r.session_id,
        user_id=r.user_id,
        turn_count=int(r.turn_count),
        message_count=int(r.message_count),
        created_at=float(r.created_at),
        last_activity=float(r.last_activity),
        closed_at=float(r.closed_at) if r.closed_at is not None else None,
        covered_turns=covered,
        content_chars=int(r.content_chars),
        tenant=r.tenant,
        content_bytes=int(r.content_bytes),
    )


def row_to_summary(r: sa.Row[*tuple[Any, ...]]) -> Summary:
    return Summary(
        text=r.summary,
        covered_turns=int(r.covered_turns),
        version=int(r.version),
        source=SummarySource(r.source),
        updated_at=float(r.updated_at),
        created_at=float(r.summary_created_at),
        topics=tuple(r.topics or ()),
        structured=dict(r.structured or {}),
        compressions=int(r.compressions),
    )


def slice_values(key: SessionKey, s: Slice) -> dict[str, Any]:
    return {
        "session_id": key,
        "from_turn": s.from_turn,
        "to_turn": s.to_turn,
        "first_seq": s.first_seq,
        "last_seq": s.last_seq,
        "text": s.text,
        "source": s.source.value,
        "model": s.model,
        "prompt_id": s.prompt_id,
        "summary_version": s.summary_version,
        "created_at": s.created_at,
    }


def row_to_slice(r: sa.Row[*tuple[Any, ...]]) -> Slice:
    return Slice(
        from_turn=int(r.from_turn),
        to_turn=int(r.to_turn),
        first_seq=int(r.first_seq),
        last_seq=int(r.last_seq),
        text=r.text,
        source=SummarySource(r.source),
        summary_version=int(r.summary_version),
        created_at=float(r.created_at),
        model=r.model,
        prompt_id=r.prompt_id,
    )


def append_result_of(message: Message, *, completed_turn: bool, duplicate: bool) -> AppendResult:
    """The result an append of `message` returned: rebuilt exactly from the stored row on a retry.
    A message of turn n leaves n-1 turns completed, unless it is the reply that completed turn n."""
    turns = message.turn if completed_turn else message.turn - 1
    return AppendResult(
        message=message,
        turn_count=turns,
        message_count=message.seq,
        duplicate=duplicate,
        completed_turn=completed_turn,
    )


# The session a statement built once reads: executed with `{KEY: session_key}`. A statement built
# on every call costs its construction and its cache key, about 0.5 ms on the request path.
KEY = "key"


def sessions_with_summaries() -> sa.Select[Any]:
    """`sessions` outer-joined with their summary rows, the summary's columns named as
    `row_to_summary` reads them beside the session's: a session and its summary in one query."""
    return sa.select(
        sessions,
        cs.c.summary,
        cs.c.covered_turns,
        cs.c.version,
        cs.c.source,
        cs.c.updated_at,
        cs.c.created_at.label("summary_created_at"),
        cs.c.topics,
        cs.c.structured,
        cs.c.compressions,
    ).select_from(sessions.outerjoin(cs, cs.c.session_id == sessions.c.session_id))


@functools.cache
def session_and_summary() -> sa.Select[Any]:
    """A session's row and its summary's (`sessions_with_summaries`), of the session KEY, with the
    gateway's state (`row_to_state`): a read that finds the hot tier empty needs all three, and a
    statement more costs it about 0.7 ms."""
    return (
        sessions_with_summaries()
        .add_columns(session_state.c.state.label("gateway_state"), session_state.c.version.label("state_version"))
        .outerjoin(session_state, session_state.c.session_id == sessions.c.session_id)
        .where(sessions.c.session_id == sa.bindparam(KEY))
    )


def row_to_state(state: str | None, version: int | None) -> SessionState:
    """The gateway's state of a `session_state` row's columns (version 0 and None: no row)."""
    return SessionState(0, None) if state is None or version is None else SessionState(int(version), json.loads(state))


@functools.cache
def session_row() -> sa.Select[Any]:
    """A session's row and how many turns its summary covers, of the session KEY."""
    return (
        sa.select(sessions, cs.c.covered_turns)
        .select_from(sessions.outerjoin(cs, cs.c.session_id == sessions.c.session_id))
        .where(sessions.c.session_id == sa.bindparam(KEY))
    )


@functools.cache
def state_row() -> sa.Select[Any]:
    """The gateway's state of the session KEY and its version."""
    return sa.select(session_state.c.state, session_state.c.version).where(
        session_state.c.session_id == sa.bindparam(KEY)
    )
