"""A summary's recent versions (`summary_versions`): each summary written is kept beside the
current one, the newest `keep` of them, so that an operator can see when a fact left the summary
(a compression dropped it, an LLM reworded it) by comparing two versions.

The statements run inside the caller's transaction: a version is recorded with the summary write
that makes it, and removed with the session, its summary or its user's content.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.model import SessionKey, Summary
from tiered_memory.tiers.sql.schema import summary_versions as sv


@dataclass(frozen=True, slots=True)
class SummaryVersion:
    """One stored version of a session's summary."""

    version: int
    text: str
    source: str
    covered_turns: int
    created_at: float


async def record_version(conn: AsyncConnection, key: SessionKey, summary: Summary, *, keep: int) -> None:
    """Keep `summary` as a version of the session's, and drop those older than the newest `keep`
    (none kept when `keep` is 0). A version number seen already (a rebuild that started the
    versions again) replaces the rows it had."""
    if keep <= 0:
        return
    await conn.execute(
        sv.delete().where(
            sv.c.session_id == key,
            sa.or_(sv.c.version >= summary.version, sv.c.version <= summary.version - keep),
        )
    )
    await conn.execute(
        sv.insert().values(
            session_id=key,
            version=summary.version,
            summary=summary.text,
            source=summary.source.value,
            covered_turns=summary.covered_turns,
            created_at=summary.updated_at,
        )
    )


async def versions(conn: AsyncConnection, key: SessionKey, *, limit: int) -> list[SummaryVersion]:
    """The session's stored versions, newest first, at most `limit`."""
    q = sa.select(sv).where(sv.c.session_id == key).order_by(sv.c.version.desc(), sv.c.id.desc()).limit(limit)
    return [
        SummaryVersion(int(r.version), r.summary, r.source, int(r.covered_turns), float(r.created_at))
        for r in (await conn.execute(q)).all()
    ]


async def forget_versions(conn: AsyncConnection, key: SessionKey) -> None:
    """Remove the session's versions (its summary is deleted, or its content erased)."""
    await conn.execute(sv.delete().where(sv.c.session_id == key))
