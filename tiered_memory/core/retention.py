"""Retention: remove the messages and summaries of sessions inactive for longer than a number of
days, in small transactions, and their hot keys. `tiered-memory purge` runs it on demand; with
RETENTION_DAYS the daemon runs it every hour, one replica at a time (a lock in the hot tier)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from tiered_memory.errors import HotUnavailable, SqlUnavailable
from tiered_memory.progress import Progress
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.maintenance import SqlMaintenance

log = structlog.get_logger("tiered_memory.core.retention")

DAY_S = 86_400.0
# How often the daemon purges when RETENTION_DAYS is set: retention is counted in days, so an
# hour late costs nothing, and a pass over nothing to do is two indexed queries.
INTERVAL_S = 3600.0
# The lock of the scheduled purge, taken like a session's summary lock. `#` is not allowed in a
# session id, so no session's lock can ever be this one.
_LOCK_ID = "#retention"
_LOCK_TTL_S = 300.0
_LOCK_ATTEMPTS = 5
_LOCK_RETRY_S = 2.0
_PAGE = 100


@dataclass(slots=True)
class PurgeReport:
    """`sessions` removed whole; `reactivated` sessions that became active part-way and were kept
    (less their oldest messages); `hot_errors` sessions whose hot keys could not be deleted (they
    expire with their TTL)."""

    sessions: int = 0
    messages: int = 0
    slices: int = 0
    reactivated: int = 0
    hot_errors: int = 0


async def purge(
    maintenance: SqlMaintenance,
    hot: HotTier,
    *,
    before: float,
    progress: Progress,
    keep_lock: Callable[[], Awaitable[None]] | None = None,
) -> PurgeReport:
    """Purge every session inactive since `before` (epoch seconds), longest inactive first;
    SQL first, then the session's hot keys. Raises SqlUnavailable (what is purged stays purged,
    and the next run takes the rest)."""
    report = PurgeReport()
    while page := await maintenance.inactive_sessions(before=before, limit=_PAGE):
        for key in page:
            done = await maintenance.purge_session(key, before=before)
            report.messages += done.messages
            report.slices += done.slices
            if not done.complete:
                report.reactivated += 1
            else:
                report.sessions += 1
                try:
                    await hot.delete(key)
                except HotUnavailable:
                    report.hot_errors += 1
            progress.advance()
        if keep_lock is not None:
            await keep_lock()
    progress.finish()
    return report


class RetentionJob:
    """The daemon's scheduled purge of sessions inactive for RETENTION_DAYS."""

    def __init__(
        self, maintenance: SqlMaintenance, hot: HotTier, *, days: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._maintenance = maintenance
        self._hot = hot
        self._days = days
        self._clock = clock

    async def run(self) -> None:
        """One pass, unless another replica holds the lock (or the hot tier that keeps it is down:
        the next pass tries again). Never raises for a store outage; it is logged."""
        token: str | None = None
        for attempt in range(_LOCK_ATTEMPTS):
            try:
                token = await self._hot.try_lock(_LOCK_ID, _LOCK_TTL_S)
                break
            except HotUnavailable:
                # A moment's failure (the first pass runs while the daemon starts up, its event
                # loop busy) must not cost an hour: try again shortly, then give up until the next pass.
                if attempt == _LOCK_ATTEMPTS - 1:
                    log.warning("retention_skipped", reason="hot tier unavailable for the lock")
                    return
                await asyncio.sleep(_LOCK_RETRY_S)
        if token is None:
            log.info("retention_skipped", reason="another replica is purging")
            return

        async def keep_lock() -> None:
            try:
                await self._hot.extend_lock(_LOCK_ID, token, _LOCK_TTL_S)
            except HotUnavailable:
                log.warning("retention_lock_not_extended")

        before = self._clock() - self._days * DAY_S
        try:
            total, _ = await self._maintenance.count_inactive(before=before)
            if total:
                progress = Progress("retention", total, stream=sys.stderr, tty=False)
                report = await purge(
                    self._maintenance, self._hot, before=before, progress=progress, keep_lock=keep_lock
                )
                log.info(
                    "retention_done",
                    days=self._days,
                    sessions=report.sessions,
                    messages=report.messages,
                    reactivated=report.reactivated,
                )
        except SqlUnavailable as exc:
            log.warning("retention_failed", error=str(exc))
        finally:
            try:
                await self._hot.unlock(_LOCK_ID, token)
            except HotUnavailable:
                log.warning("retention_lock_not_released")
