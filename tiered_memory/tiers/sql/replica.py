"""Reads from a replica (DATABASE_READ_URL): a session's warm and cold reads go to an asynchronous
replica of the primary, when the replica holds the session's newest write this process knows.

Why by seq: a replica applies the primary's writes some time after they commit. A gateway that
appends a message and reads the context at once must see the message, so a read does not trust a
replica behind the session's last seq: this process's own appends (remembered here, per session)
and the caller's hint (the hot tier's counters, which every daemon writes). The replica's
`sessions.message_count` is read first, in the same connection; when it is behind, or it does not
know the session at all, the read goes to the primary and is counted
(`tiered_memory_sql_replica_reads_total{outcome="primary"}`).

A change that keeps the seq (a summary written, a close, a patch, a delete, an erasure) cannot be
told by it: after one of this process's own, the session's reads go to the primary for PIN_S, or
for as long as the replica is behind by its own account (`lag_seconds`, polled), whichever is
longer; a deleted session's content is never read back from a replica that has not applied the
delete. Such changes made by another daemon reach this one's reads after the replica's lag.

A replica never fails a read and never trips the primary's breaker: it has a short timeout of its
own, and one that failed is left alone for COOL_DOWN_S (its reads go to the primary at once), so
that a hung replica costs one request its timeout, not every request. One that does not replicate
(lag -1) or lags past PIN_S takes no reads until it catches up.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tiered_memory.model import SessionKey
from tiered_memory.tiers.sql.schema import sessions

log = structlog.get_logger("tiered_memory.tiers.sql.replica")

T = TypeVar("T")

# Sessions whose newest seq this process remembers (its own appends), the least recent forgotten
# first: some 100 bytes each. A session forgotten here is read on the replica on its hint alone.
_REMEMBERED = 50_000
# A PostgreSQL standby's lag: NULL (-1) on a server that is not one, or has replayed nothing yet.
_PG_LAG = "SELECT CASE WHEN pg_is_in_recovery() THEN EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END"


# How long a session's reads stay on the primary after this process changed it other than by an
# append (at least; longer while the replica says it lags more).
PIN_S = 10.0
# How long a replica that failed or timed out is left alone.
COOL_DOWN_S = 10.0
# A replica read's own bound: a few ms normally; a replica slower than this is as good as down.
READ_TIMEOUT_S = 1.0


class Behind(Exception):
    """The replica cannot answer this read: behind the session's last write, not answering, or
    without the session."""


class Replica:
    """The replica's engine, and the newest seq of each session this process wrote."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        timeout_s: float,
        on_read: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_read` is told where each session read went: `replica`, or `primary` (fallen back);
        a read waits `timeout_s` at most (and READ_TIMEOUT_S)."""
        self._engine = engine
        self._timeout = min(timeout_s, READ_TIMEOUT_S)
        self._on_read = on_read
        self._clock = clock
        self._written: OrderedDict[str, int] = OrderedDict()
        self._pinned: OrderedDict[str, float] = OrderedDict()  # session → until when
        self._down_until = 0.0
        # The replica's lag by its own account (lag_seconds), None before the first poll.
        self.lag: float | None = None

    def wrote(self, key: SessionKey, seq: int) -> None:
        """The session's message `seq` committed on the primary."""
        if seq > self._written.get(key, 0):
            self._written[key] = seq
        self._written.move_to_end(key)
        while len(self._written) > _REMEMBERED:
            self._written.popitem(last=False)

    def changed(self, key: SessionKey, *, deleted: bool = False) -> None:
        """This process changed the session other than by an append (`deleted`: removed it, so
        its seqs may start again from 1): its reads skip the replica until it has applied that."""
        if deleted:
            self._written.pop(key, None)
        self._pinned[key] = self._clock() + max(PIN_S, self.lag or 0.0)
        self._pinned.move_to_end(key)
        while len(self._pinned) > _REMEMBERED:
            self._pinned.popitem(last=False)

    def _usable(self, key: SessionKey) -> bool:
        now = self._clock()
        if now < self._down_until or (self.lag is not None and not 0 <= self.lag <= PIN_S):
            return False
        until = self._pinned.get(key)
        if until is None:
            return True
        if now < until:
            return False
        del self._pinned[key]
        return True

    def fell_back(self) -> None:
        self._on_read("primary")

    async def read(
        self,
        key: SessionKey,
        op: Callable[[AsyncConnection], Awaitable[T]],
        *,
        known_seq: int = 0,
        trust: Callable[[T], bool] = lambda _: True,
    ) -> T:
        """`op` on the replica when its copy of the session is at least at the newest seq known
        (this process's own write, or `known_seq`) and `trust` takes its answer; Behind otherwise."""
        if not self._usable(key):
            raise Behind
        needed = max(known_seq, self._written.get(key, 0))
        try:
            async with asyncio.timeout(self._timeout), self._engine.connect() as conn:
                if needed:
                    q = sa.select(sessions.c.message_count).where(sessions.c.session_id == key)
                    seen = (await conn.execute(q)).scalar()
                    if seen is None or int(seen) < needed:
                        raise Behind
                found = await op(conn)
        except (TimeoutError, sa.exc.SQLAlchemyError, OSError) as exc:
            self._down_until = self._clock() + COOL_DOWN_S
            log.warning("replica_read_failed", error=type(exc).__name__, cool_down_s=COOL_DOWN_S)
            raise Behind from exc
        if not trust(found):
            raise Behind
        self._on_read("replica")
        return found

    async def lag_seconds(self) -> float:
        """How far the replica is behind its primary by its own account (MySQL's and MariaDB's
        `Seconds_Behind_Master`; PostgreSQL's time since the last transaction it replayed), -1
        when it is not replicating (a thread stopped, or not a replica at all)."""
        try:
            async with asyncio.timeout(self._timeout), self._engine.connect() as conn:
                if self._engine.dialect.name == "postgresql":
                    behind = (await conn.execute(sa.text(_PG_LAG))).scalar()
                else:
                    row = (await conn.execute(sa.text("SHOW SLAVE STATUS"))).mappings().first()
                    behind = row.get("Seconds_Behind_Master") if row is not None else None
        except (TimeoutError, sa.exc.SQLAlchemyError, OSError):
            self.lag = -1.0
            raise
        self.lag = float(behind) if behind is not None else -1.0
        return self.lag

    async def aclose(self) -> None:
        await self._engine.dispose()
