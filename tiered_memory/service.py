"""MemoryService: the facade the HTTP API calls. It knows the tiers and their order, not HTTP.

Reads walk hot → warm → cold and say which tier answered; a tier that fails or times out is
skipped, counted and logged. Writes commit to SQL first (durable before acknowledged), then update
the hot tier best-effort, and schedule summaries in the background.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from tiered_memory.context import (
    ChatMessage,
    alternate,
    assemble,
    hot_window_complete,
    window,
    window_start_turn,
)
from tiered_memory.errors import HotUnavailable, NotFound, SqlUnavailable
from tiered_memory.metrics import Metrics
from tiered_memory.model import (
    AppendResult,
    HotSession,
    Message,
    NewMessage,
    Role,
    SessionInfo,
    Summary,
    SummaryAnswer,
    SummarySource,
    Tier,
)
from tiered_memory.settings import Settings
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.scheduler import SingleFlight
from tiered_memory.summarizing import Outcome, SummaryJob
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql_store import SqlStore

log = structlog.get_logger("tiered_memory.service")

# How many sessions one sweep looks at; the next sweep takes the rest.
_SWEEP_BATCH = 500
# While another replica holds a session's summary lock, look again this often, this many times.
_LOCKED_RETRY_S = 0.2
_LOCKED_RETRIES = 50


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    result: AppendResult
    summary_scheduled: bool


@dataclass(frozen=True, slots=True)
class ContextAnswer:
    session_id: str
    summary_tier: Tier
    summary: str | None
    messages: list[ChatMessage]
    turn_count: int


@dataclass(frozen=True, slots=True)
class CloseResult:
    session_id: str
    persisted: bool
    turn_count: int


class MemoryService:
    """Every operation of the daemon. Owns no connections: the app hands in the tiers and closes them."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: SqlStore,
        hot: HotTier,
        job: SummaryJob,
        extractor: Extractor,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._s = settings
        self._store = store
        self._hot = hot
        self._job = job
        self._extractor = extractor
        self._metrics = metrics
        self._clock = clock
        self.summaries = SingleFlight(
            self._summarize,
            max_concurrent=settings.summary_concurrency,
            on_pending=metrics.pending_summarizations.set,
        )

    # --- writes ---------------------------------------------------------------------------

    async def append(self, new: NewMessage) -> AppendOutcome:
        """Commit a message to SQL, then the hot tier; schedule a summary at every Nth turn.

        Raises SqlUnavailable when the commit cannot be made (nothing is acknowledged then).
        A retry of a stored message_id returns the original result and changes nothing.
        """
        result = await self._store.append(new, now=self._clock())
        self._metrics.appends.labels(new.role.value, "duplicate" if result.duplicate else "created").inc()
        due = self._summary_due(result)
        if result.duplicate:
            return AppendOutcome(result, due)
        try:
            await self._hot.record_append(
                result.message,
                turn_count=result.turn_count,
                message_count=result.message_count,
                last_activity=result.message.created_at,
            )
        except HotUnavailable as exc:
            # SQL has it; the hot list now has a gap, which the read path detects (seq) and
            # serves from SQL instead.
            self._metrics.tier_errors.labels("hot", "append").inc()
            log.warning("hot_append_failed", error=str(exc))
        if due:
            self.summaries.schedule(new.session_id)
        return AppendOutcome(result, due)

    def _summary_due(self, result: AppendResult) -> bool:
        return (
            self._s.enable_conversation_summary
            and result.message.role is Role.ASSISTANT
            and result.turn_count % self._s.summary_every_n_turns == 0
        )

    async def _summarize(self, session_id: str) -> None:
        # Another replica holding the lock may have started before our latest turn was
        # committed, so wait for it and look again rather than assume it covers everything.
        for _ in range(_LOCKED_RETRIES):
            if await self._job.run(session_id) is not Outcome.LOCKED:
                return
            await asyncio.sleep(_LOCKED_RETRY_S)
        log.info("summary_locked_elsewhere", session_id=session_id)

    async def close(self, session_id: str, *, reason: str = "client") -> CloseResult:
        """Persist the final summary to both tiers (summarizing the uncovered turns now) when the
        session has at least SUMMARY_MIN_TURNS_TO_PERSIST turns, and mark it closed. Idempotent."""
        info = await self._store.get_session(session_id)
        if info is None:
            raise NotFound(f"session {session_id!r} does not exist")
        persisted = False
        if self._s.enable_conversation_summary and info.turn_count >= max(1, self._s.summary_min_turns_to_persist):
            # run_now waits for a pass that starts after this call, so it sees every turn
            # committed before close; the pass also re-caches an up-to-date summary in Redis.
            await self.summaries.run_now(session_id)
            after = await self._store.get_session(session_id)
            persisted = after is not None and after.covered_turns >= info.turn_count
        if await self._store.close_session(session_id, reason=reason, now=self._clock()):
            self._metrics.sessions_closed.labels(reason).inc()
            log.info("session_closed", session_id=session_id, reason=reason, persisted=persisted)
        return CloseResult(session_id, persisted, info.turn_count)

    async def delete(self, session_id: str) -> None:
        """Remove a session from every tier. SQL first: if Redis is down, its keys expire anyway."""
        await self._store.delete_session(session_id)
        try:
            await self._hot.delete(session_id)
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "delete").inc()

    # --- reads ----------------------------------------------------------------------------

    async def session(self, session_id: str) -> SessionInfo:
        info = await self._store.get_session(session_id)
        if info is None:
            raise NotFound(f"session {session_id!r} does not exist")
        return info

    async def load_best_summary(self, session_id: str) -> SummaryAnswer:
        """Hot summary → warm row (backfilling hot) → deterministic extraction from messages → none."""
        try:
            summary, turns = await self._hot.read_summary(session_id)
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "read_summary").inc()
            summary, turns = None, None
        if summary is not None:
            if turns is None:
                info = await self._sql_session(session_id)
                turns = info.turn_count if info else summary.covered_turns
            return self._answer(session_id, Tier.HOT, summary, turns)
        return await self._summary_below_hot(session_id)

    async def _summary_below_hot(self, session_id: str) -> SummaryAnswer:
        try:
            summary, info = await self._store.get_summary(session_id)
        except SqlUnavailable:
            self._metrics.tier_errors.labels("sql", "read_summary").inc()
            return self._answer(session_id, Tier.NONE, None, 0)
        if info is None:
            return self._answer(session_id, Tier.NONE, None, 0)
        if summary is not None:
            try:
                await self._hot.put_summary(session_id, summary)
            except HotUnavailable:
                self._metrics.tier_errors.labels("hot", "backfill").inc()
            return self._answer(session_id, Tier.WARM, summary, info.turn_count)
        cold = await self._cold_summary(info)
        if cold is None:
            return self._answer(session_id, Tier.NONE, None, info.turn_count)
        return self._answer(session_id, Tier.COLD, cold, info.turn_count)

    async def _cold_summary(self, info: SessionInfo) -> Summary | None:
        try:
            messages = await self._store.messages_in_turns(info.session_id, after_turn=0)
        except SqlUnavailable:
            self._metrics.tier_errors.labels("sql", "read_messages").inc()
            return None
        if not messages:
            return None
        extraction = await asyncio.to_thread(self._extractor.extract, messages, max_chars=self._s.summary_max_chars)
        if not extraction.text:
            return None
        return Summary(
            text=extraction.text,
            covered_turns=info.turn_count,
            version=0,
            source=SummarySource.DETERMINISTIC,
            updated_at=info.last_activity,
            created_at=info.created_at,
            topics=extraction.topics,
            structured=extraction.structured,
        )

    def _answer(self, session_id: str, tier: Tier, summary: Summary | None, turns: int) -> SummaryAnswer:
        self._metrics.summary_loads.labels(tier.value).inc()
        if summary is not None:
            self._metrics.summary_lag.observe(max(0, turns - summary.covered_turns))
        return SummaryAnswer(session_id=session_id, tier=tier, summary=summary, turn_count=turns)

    async def _sql_session(self, session_id: str) -> SessionInfo | None:
        try:
            return await self._store.get_session(session_id)
        except SqlUnavailable:
            self._metrics.tier_errors.labels("sql", "read_session").inc()
            return None

    async def context(self, session_id: str, *, max_chars: int) -> ContextAnswer:
        """Summary plus recent turns, prompt-ordered, within max_chars.

        One hot round trip answers both when Redis has them; otherwise the summary walk and the
        SQL read of the recent turns run concurrently, each with its own fallback.
        """
        try:
            hot = await self._hot.read_session(session_id)
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "read_session").inc()
            hot = HotSession(summary=None, recent=(), turn_count=None, message_count=None, last_activity=None)
        keep = self._s.keep_recent_turns
        complete = hot_window_complete(
            hot.recent, message_count=hot.message_count, turn_count=hot.turn_count, keep_recent_turns=keep
        )
        want_summary = self._s.enable_conversation_summary

        async def summary_part() -> SummaryAnswer:
            if not want_summary:
                return SummaryAnswer(session_id, Tier.NONE, None, hot.turn_count or 0)
            if hot.summary is not None and hot.turn_count is not None:
                return self._answer(session_id, Tier.HOT, hot.summary, hot.turn_count)
            return await self._summary_below_hot(session_id)

        async def recent_part() -> tuple[list[Message], int]:
            if complete:
                assert hot.turn_count is not None
                return window(hot.recent, turn_count=hot.turn_count, keep_recent_turns=keep), hot.turn_count
            info = await self._sql_session(session_id)
            if info is None or keep <= 0:
                return [], info.turn_count if info else 0
            first = window_start_turn(info.turn_count, keep)
            try:
                rows = await self._store.messages_in_turns(session_id, after_turn=first - 1)
            except SqlUnavailable:
                self._metrics.tier_errors.labels("sql", "read_recent").inc()
                # Whatever Redis still has beats nothing.
                rows = list(hot.recent)
            return window(rows, turn_count=info.turn_count, keep_recent_turns=keep), info.turn_count

        answer, (recent, turns) = await asyncio.gather(summary_part(), recent_part())
        text = answer.summary.text if answer.summary else None
        messages = assemble(text, alternate(recent), max_chars=max_chars)
        return ContextAnswer(
            session_id=session_id,
            summary_tier=answer.tier,
            summary=text,
            messages=messages,
            turn_count=max(turns, answer.turn_count),
        )

    # --- health and background ------------------------------------------------------------

    async def readiness(self) -> dict[str, str]:
        """Each tier's state: `ok`, or `degraded` with reads falling through / writes refused."""

        async def probe(ping: Callable[[], Awaitable[None]]) -> str:
            try:
                await asyncio.wait_for(ping(), timeout=1.0)
            except (HotUnavailable, SqlUnavailable, TimeoutError):
                return "degraded"
            return "ok"

        hot, sql = await asyncio.gather(probe(self._hot.ping), probe(self._store.ping))
        return {"hot": hot, "sql": sql}

    async def sweep(self) -> None:
        """Close idle sessions and schedule every summary that is due but not done (after a
        crash, a lost lock, or an SQL outage during a summary)."""
        if self._s.enable_conversation_summary:
            due = await self._store.sessions_due(
                every_n=self._s.summary_every_n_turns,
                min_turns_to_persist=self._s.summary_min_turns_to_persist,
                limit=_SWEEP_BATCH,
            )
            for sid in due:
                self.summaries.schedule(sid)
            if due:
                log.info("sweep_scheduled_due_summaries", count=len(due))
        idle = await self._store.idle_sessions(
            idle_before=self._clock() - self._s.session_idle_close_seconds, limit=_SWEEP_BATCH
        )
        for sid in idle:
            try:
                await self.close(sid, reason="idle")
            except NotFound:
                continue
