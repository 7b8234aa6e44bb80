"""Reads from a replica (DATABASE_READ_URL): a session's warm and cold reads go to an asynchronous
replica of the primary, when the replica holds the session's newest write this process knows.

Why by seq: a replica applies the primary's writes some time after they commit. A gateway that
appends a message and reads the context at once must see the message, so a read does not trust a
replica behind the session's last seq: this process's own appends (remembered here, per session)
and the caller's hint (the hot tier's counters, which every daemon writes). The replica's
`sessions.message_count` is read first, in the same connection; when it is behind, or the replica
does not answer in time, or it does not know the session at all, the read goes to the primary and
is counted (`tiered_memory_sql_replica_reads_total{outcome="primary"}`). A replica never fails a
read and never trips the primary's breaker. A patched message keeps its seq: a read right after a
patch may show the replica's copy until it applies the patch (a few ms at its usual lag).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tiered_memory.tiers.sql_schema import sessions

log = structlog.get_logger("tiered_memory.tiers.sql_replica")

T = TypeVar("T")

# Sessions whose newest seq this process remembers (its own appends), the least recent forgotten
# first: some 100 bytes each. A session forgotten here is read on the replica on its hint alone.
_REMEMBERED = 50_000
# A PostgreSQL standby's lag: NULL (-1) on a server that is not one, or has replayed nothing yet.
_PG_LAG = "SELECT CASE WHEN pg_is_in_recovery() THEN EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END"


class Behind(Exception):
    """The replica cannot answer this read: behind the session's last write, not answering, or
    without the session."""


class Replica:
    """The replica's engine, and the newest seq of each session this process wrote."""

    def __init__(self, engine: AsyncEngine, *, timeout_s: float, on_read: Callable[[str], None]) -> None:
        """`on_read` is told where each session read went: `replica`, or `primary` (fallen back)."""
        self._engine = engine
        self._timeout = timeout_s
        self._on_read = on_read
        self._written: OrderedDict[str, int] = OrderedDict()

    def wrote(self, session_id: str, seq: int) -> None:
        """The session's message `seq` committed on the primary."""
        if seq > self._written.get(session_id, 0):
            self._written[session_id] = seq
        self._written.move_to_end(session_id)
        while len(self._written) > _REMEMBERED:
            self._written.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """The session was deleted: its ids may start again from seq 1."""
        self._written.pop(session_id, None)

    def fell_back(self) -> None:
        self._on_read("primary")

    async def read(
        self,
        session_id: str,
        op: Callable[[AsyncConnection], Awaitable[T]],
        *,
        known_seq: int = 0,
        trust: Callable[[T], bool] = lambda _: True,
    ) -> T:
        """`op` on the replica when its copy of the session is at least at the newest seq known
        (this process's own write, or `known_seq`) and `trust` takes its answer; Behind otherwise."""
        needed = max(known_seq, self._written.get(session_id, 0))
        try:
            async with asyncio.timeout(self._timeout), self._engine.connect() as conn:
                if needed:
                    q = sa.select(sessions.c.message_count).where(sessions.c.session_id == session_id)
                    seen = (await conn.execute(q)).scalar()
                    if seen is None or int(seen) < needed:
                        raise Behind
                found = await op(conn)
        except (TimeoutError, sa.exc.SQLAlchemyError, OSError) as exc:
            log.warning("replica_read_failed", error=type(exc).__name__)
            raise Behind from exc
        if not trust(found):
            raise Behind
        self._on_read("replica")
        return found

    async def lag_seconds(self) -> float:
        """How far the replica is behind its primary by its own account (MySQL's and MariaDB's
        `Seconds_Behind_Master`; PostgreSQL's time since the last transaction it replayed), -1
        when it is not replicating (a thread stopped, or not a replica at all)."""
        async with asyncio.timeout(self._timeout), self._engine.connect() as conn:
            if self._engine.dialect.name == "postgresql":
                behind = (await conn.execute(sa.text(_PG_LAG))).scalar()
            else:
                row = (await conn.execute(sa.text("SHOW SLAVE STATUS"))).mappings().first()
                behind = row.get("Seconds_Behind_Master") if row is not None else None
        return float(behind) if behind is not None else -1.0

    async def aclose(self) -> None:
        await self._engine.dispose()
