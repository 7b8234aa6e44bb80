"""Delivery of the outbox's lifecycle events (webhooks.py) to their sinks: webhooks (WEBHOOK_URLS,
each POST signed with WEBHOOK_SECRET) and the Redis stream (EVENTS_STREAM).

At least once: a row is marked delivered only after its sink took it (a 2xx, or the stream's
XADD), so a crash in between sends it again, with the same event id. In order per subject: only
the oldest undelivered row of a sink's session (or user) is ever in flight, and the next waits
for it. A subject whose receiver is slow or down holds up only itself: every subject's head is
sent by a task of its own, up to _MAX_IN_FLIGHT at once. A failed row is tried again with
exponential backoff and jitter, and parked as failed once WEBHOOK_MAX_AGE_SECONDS have passed
since it was queued (counted; `tiered-memory events --failed` lists them, `--replay` queues one
again). One replica at a time delivers: it holds a lock in the hot tier, as retention does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp
import structlog

from tiered_memory.errors import HotUnavailable, SqlUnavailable
from tiered_memory.metrics import Metrics
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.outbox import OutboxRow, SqlOutbox
from tiered_memory.webhooks import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TYPE_HEADER,
    Sink,
    body,
    retry_delay,
    signature,
)

log = structlog.get_logger("tiered_memory.core.delivery")

# The lock: `#` never occurs in a session id, so no session's lock is this one. Held while the
# replica delivers, renewed every pass; a replica that dies leaves it to expire.
_LOCK_ID = "#outbox"
_LOCK_TTL_S = 10.0
_POLL_S = 0.5
_HEADS = 200
_MAX_IN_FLIGHT = 64
# The outbox's depth is counted, and delivered rows older than a day (failed ones older than a
# week: replayable till then) are deleted, every so often.
_HOUSEKEEPING_S = 5.0
_KEEP_DELIVERED_S = 86_400.0
_KEEP_FAILED_S = 7 * 86_400.0
# What is read of a receiver's answer: its status says whether it took the event, and a body is
# read only so far (a receiver answering hundreds of megabytes, 64 deliveries at once, would
# otherwise hold them in the daemon's memory).
ANSWER_READ_BYTES = 4096

Publish = Callable[[str, Mapping[str, str]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    secret: bytes
    timeout_s: float
    max_age_s: float


class Delivery:
    """Sends what the outbox holds, while this replica holds the delivery lock. `publish` appends
    to a Redis stream (None: no stream sink)."""

    def __init__(
        self,
        outbox: SqlOutbox,
        hot: HotTier,
        sinks: tuple[Sink, ...],
        settings: DeliverySettings,
        *,
        http: aiohttp.ClientSession,
        publish: Publish | None,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._outbox = outbox
        self._hot = hot
        self._sinks = {s.id: s for s in sinks}
        self._s = settings
        self._http = http
        self._publish = publish
        self._metrics = metrics
        self._clock = clock
        self._in_flight: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._token: str | None = None
        self._housekept = 0.0

    async def run(self) -> None:
        """Deliver until cancelled; a store outage is logged and waited out."""
        try:
            while True:
                try:
                    if await self._holding():
                        await self._pass()
                    else:
                        self._abandon()
                except (SqlUnavailable, HotUnavailable) as exc:
                    log.warning("delivery_paused", error=str(exc))
                    self._abandon()
                await asyncio.sleep(_POLL_S)
        finally:
            await self._stop()

    async def _holding(self) -> bool:
        """Whether this replica holds the delivery lock (taken or renewed now)."""
        if self._token is not None and await self._hot.extend_lock(_LOCK_ID, self._token, _LOCK_TTL_S):
            return True
        self._token = await self._hot.try_lock(_LOCK_ID, _LOCK_TTL_S)
        if self._token is not None:
            log.info("delivery_lock_taken")
        return self._token is not None

    async def _pass(self) -> None:
        now = self._clock()
        if now - self._housekept >= _HOUSEKEEPING_S:
            self._housekept = now
            counts = await self._outbox.counts()
            for state, n in counts.items():
                self._metrics.outbox_rows.labels(state).set(n)
            await self._outbox.forget_done(delivered_before=now - _KEEP_DELIVERED_S, failed_before=now - _KEEP_FAILED_S)
        for row in await self._outbox.heads(now=now, limit=_HEADS):
            key = (row.sink, row.subject)
            if key in self._in_flight or len(self._in_flight) >= _MAX_IN_FLIGHT:
                continue
            task = asyncio.create_task(self._deliver(row), name=f"deliver-{row.id}")
            self._in_flight[key] = task
            task.add_done_callback(functools.partial(self._done, key))

    def _abandon(self) -> None:
        """Stop sending: the lock is another replica's now (or cannot be told), and a send still
        going here could reach a receiver after that replica's next one of the same session."""
        self._token = None
        for task in self._in_flight.values():
            task.cancel()

    def _done(self, key: tuple[str, str], _task: asyncio.Task[None]) -> None:
        self._in_flight.pop(key, None)

    async def _deliver(self, row: OutboxRow) -> None:
        sink = self._sinks.get(row.sink)
        kind = sink.kind if sink is not None else "removed"
        try:
            if sink is None:
                # Its sink was configured when the event was written, and is no longer.
                await self._outbox.park(row.id, error="its sink is no longer configured")
                self._metrics.events_parked.labels(kind).inc()
                return
            error = await self._send(sink, row)
            now = self._clock()
            self._metrics.event_attempts.labels(kind, "delivered" if error is None else "failed").inc()
            if error is None:
                await self._outbox.delivered(row.id, now=now)
                self._metrics.event_delivery_seconds.labels(kind).observe(max(0.0, now - row.queued_at))
            elif now - row.queued_at >= self._s.max_age_s:
                await self._outbox.park(row.id, error=error)
                self._metrics.events_parked.labels(kind).inc()
                log.warning("event_parked", event_id=row.event_id, type=row.type, sink=row.sink, error=error)
            else:
                await self._outbox.retry(row.id, error=error, at=now + retry_delay(row.attempts + 1))
        except SqlUnavailable as exc:
            # The outcome is not recorded: the row is sent again (at least once).
            log.warning("delivery_not_recorded", event_id=row.event_id, error=str(exc))

    async def _send(self, sink: Sink, row: OutboxRow) -> str | None:
        """Deliver one row to its sink; None when it took it, else what went wrong."""
        raw = body(
            event_id=row.event_id,
            type=row.type,
            created_at=row.created_at,
            tenant=row.tenant,
            session_key=row.session_key,
            user_id=row.user_id,
            payload=row.payload,
        )
        if sink.kind == "stream":
            if self._publish is None:
                return "no Redis for the stream sink"
            try:
                # Tenant, user and session beside the event, so that a user's erasure and a
                # session's deletion find their entries.
                entry = {
                    "id": row.event_id,
                    "type": row.type,
                    "tenant": row.tenant,
                    "user_id": row.user_id or "",
                    "session": row.session_key or "",
                }
                await self._publish(sink.url, {**entry, "event": raw.decode()})
            except HotUnavailable as exc:
                return f"stream: {exc}"
            return None
        timestamp = str(int(self._clock()))
        headers = {
            "Content-Type": "application/json",
            ID_HEADER: row.event_id,
            TYPE_HEADER: row.type,
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: signature(self._s.secret, timestamp, raw),
        }
        try:
            # No redirect is followed: a 3xx would re-post the signed event, summaries and all, to
            # wherever the receiver names. It is a failure like any answer but a 2xx.
            async with self._http.post(
                sink.url,
                data=raw,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._s.timeout_s),
                allow_redirects=False,
            ) as resp:
                await resp.content.read(ANSWER_READ_BYTES)
                return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
        except TimeoutError:
            return f"no answer within {self._s.timeout_s:g} s"
        except aiohttp.ClientError as exc:
            return f"{type(exc).__name__}: {exc}"

    async def _stop(self) -> None:
        for task in list(self._in_flight.values()):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
        if self._token is not None:
            with contextlib.suppress(HotUnavailable):
                await self._hot.unlock(_LOCK_ID, self._token)
