"""Writing benchmark sessions straight into the stores, in bulk, in the daemon's own formats.

A 10,000-turn session would take 20,000 HTTP appends to build; the measured operations go through
HTTP, but the sessions they read are written here: session rows, messages and summary rows with
the daemon's schema (tiered_memory.tiers.sql.schema), and hot keys with its key builders and codec.
Summary rows are copies of one the daemon itself made, so every summary has a real size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tiered_memory.model import SessionKey, Summary, SummarySource
from tiered_memory.testing import ZH_12_TURNS
from tiered_memory.tiers.codec import encode_summary
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.sql.schema import conversation_summaries, messages, sessions

_CHUNK = 2000
USER_ID = "bench-user"


async def summary_row(engine: AsyncEngine, session_id: str) -> dict[str, Any]:
    """The summary row the daemon wrote for `session_id`, as values to copy."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.select(conversation_summaries).where(conversation_summaries.c.session_id == session_id)
            )
        ).one()
    values = dict(row._mapping)
    values.pop("id")
    return values


def summary_of(row: dict[str, Any]) -> Summary:
    """The row as the daemon's Summary, for writing hot keys with its codec."""
    return Summary(
        text=row["summary"],
        covered_turns=int(row["covered_turns"]),
        version=int(row["version"]),
        source=SummarySource(row["source"]),
        updated_at=float(row["updated_at"]),
        created_at=float(row["created_at"]),
        topics=tuple(row["topics"] or ()),
        structured=dict(row["structured"] or {}),
        compressions=int(row["compressions"]),
    )


async def _insert(engine: AsyncEngine, table: sa.Table, rows: Sequence[dict[str, Any]]) -> None:
    for i in range(0, len(rows), _CHUNK):
        async with engine.begin() as conn:
            await conn.execute(table.insert(), list(rows[i : i + _CHUNK]))


def _messages(session_id: str, turns: int, now: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in range(1, turns + 1):
        user, assistant = ZH_12_TURNS[(turn - 1) % len(ZH_12_TURNS)]
        for k, (role, content) in enumerate((("user", user), ("assistant", assistant))):
            seq = 2 * turn - 1 + k
            out.append(
                {
                    "session_id": session_id,
                    "seq": seq,
                    "turn": turn,
                    "user_id": USER_ID,
                    "role": role,
                    "content": content,
                    "channel": "chat",
                    "message_id": f"seed-{seq}",
                    "completes_turn": k,
                    "status": "completed",
                    "created_at": now - 2 * turns + seq,
                }
            )
    return out


async def sessions_with(
    engine: AsyncEngine,
    session_ids: Sequence[str],
    *,
    turns: int,
    summary: dict[str, Any] | None,
    with_messages: bool,
) -> None:
    """Sessions of `turns` completed turns. `summary` (a row from summary_row) is copied as the
    session's warm row covering every turn; `with_messages` writes the messages themselves (the
    warm read never reads them, so pools for it leave them out)."""
    now = time.time()
    chars = sum(len(u) + len(a) for u, a in (ZH_12_TURNS[t % len(ZH_12_TURNS)] for t in range(turns)))
    await _insert(
        engine,
        sessions,
        [
            {
                "session_id": sid,
                "user_id": USER_ID,
                "turn_count": turns,
                "message_count": 2 * turns,
                "pending_user": 0,
                "content_chars": chars,
                "created_at": now - 2 * turns,
                "last_activity": now,
            }
            for sid in session_ids
        ],
    )
    if summary is not None:
        copies = [
            summary | {"session_id": sid, "user_id": USER_ID, "turn_count": turns, "covered_turns": turns}
            for sid in session_ids
        ]
        await _insert(engine, conversation_summaries, copies)
    if with_messages:
        for sid in session_ids:
            await _insert(engine, messages, _messages(sid, turns, now))


async def hot_summaries(
    client: aioredis.Redis, keys: Keys, session_ids: Sequence[str], summary: Summary, *, turns: int, ttl_s: int
) -> None:
    """The hot summary and counters of each session, as the daemon's backfill writes them."""
    encoded = encode_summary(summary)
    now = time.time()
    for i in range(0, len(session_ids), _CHUNK):
        async with client.pipeline(transaction=False) as p:
            for key in map(SessionKey, session_ids[i : i + _CHUNK]):
                p.set(keys.summary(key), encoded, ex=ttl_s)
                p.hset(keys.state(key), mapping={"turns": turns, "msgs": 2 * turns, "last": now, "chars": 0})
                p.expire(keys.state(key), ttl_s)
            await p.execute()


async def naive_hot(
    client: aioredis.Redis,
    bodies: dict[str, str],
    key_of: Callable[[str], tuple[str, str, str]],
    *,
    recent: Sequence[str],
    turns: int,
) -> None:
    """The naive hot ceiling's data: the daemon's answer as a string, a 6-item list, a counter."""
    async with client.pipeline(transaction=False) as p:
        for sid, body in bodies.items():
            k_summary, k_recent, k_turns = key_of(sid)
            p.set(k_summary, body)
            p.delete(k_recent)
            p.rpush(k_recent, *recent[:6])
            p.set(k_turns, turns)
        await p.execute()
