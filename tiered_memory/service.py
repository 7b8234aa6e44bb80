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
from typing import Any

import structlog

from tiered_memory.context import (
    ChatMessage,
    alternate,
    answer_transcript,
    compose,
    estimate_tokens,
    fit_recent,
    frame,
    hot_window_complete,
    language_of,
    recall_text,
    recent_transcript,
    summary_room,
    summary_system_text,
    window,
    window_start_turn,
    with_recall,
)
from tiered_memory.errors import Forbidden, HotUnavailable, NotFound, SqlUnavailable
from tiered_memory.history import History
from tiered_memory.metrics import Metrics
from tiered_memory.model import (
    AppendOutcome,
    AppendResult,
    Caller,
    CloseResult,
    HotSession,
    Message,
    NewMessage,
    Owner,
    SessionInfo,
    Slice,
    Summary,
    SummaryAnswer,
    SummarySource,
    Tier,
)
from tiered_memory.recall import RecallIndex, RecallMatch
from tiered_memory.settings import Settings
from tiered_memory.summarize.cold import cold_summary
from tiered_memory.summarize.extractive import Extractor, render
from tiered_memory.summarize.payload import planning, planning_history
from tiered_memory.summarize.scheduler import SingleFlight
from tiered_memory.summarize.topics import TopicTagger
from tiered_memory.summary_job import JobResult, Outcome, SummaryJob
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql_schema import SCHEMA_VERSION
from tiered_memory.tiers.sql_store import SqlStore

log = structlog.get_logger("tiered_memory.service")

# Sessions whose recall index this process keeps (least recently asked dropped first).
_RECALL_SESSIONS = 256
# Earlier turns that match a question may take up to this fraction (1/3) of the budget.
_SNIPPET_SHARE = 3
# How many sessions one sweep looks at; the next sweep takes the rest.
_SWEEP_BATCH = 500
# While another replica holds a session's summary lock, look again this often, this many times.
_LOCKED_RETRY_S = 0.2
_LOCKED_RETRIES = 50


# A cold extraction reads at most this many messages from the start of a session and from its end.
_COLD_HEAD_MESSAGES = 200
_COLD_TAIL_MESSAGES = 400
# A context read puts at most this many turns between a lagging summary and the window.
_GAP_MAX_TURNS = 100


@dataclass(frozen=True, slots=True)
class ContextAnswer:
    session_id: str
    summary_tier: Tier
    summary: str | None
    covered_turns: int
    topics: tuple[str, ...]
    messages: list[ChatMessage]
    turn_count: int
    recent_transcript: str
    answer_transcript: str
    estimated_tokens: dict[str, int]
    planning: dict[str, Any] | None
    planning_history: str


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
        tagger: TopicTagger,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        recall: RecallIndex | None = None,
    ) -> None:
        self._s = settings
        self._history = History(
            store,
            recall or RecallIndex(extractor.search_terms, max_sessions=_RECALL_SESSIONS),
            sql_error=lambda op: metrics.tier_errors.labels("sql", op).inc(),
        )
        self._store = store
        self._hot = hot
        self._job = job
        self._extractor = extractor
        self._tagger = tagger
        self._metrics = metrics
        self._clock = clock
        self.summaries = SingleFlight(self._summarize, on_pending=metrics.pending_summarizations.set)
        # Bounds background summaries only: a start-up sweep that finds hundreds of due sessions
        # must not open hundreds of transactions and LLM calls at once. close() does not queue.
        self._slots = asyncio.Semaphore(settings.summary_concurrency)

    # --- writes ---------------------------------------------------------------------------

    async def append(self, new: NewMessage, *, caller: Caller) -> AppendOutcome:
        """Commit a message to SQL, then the hot tier; schedule a summary at every Nth turn.

        Raises SqlUnavailable when the commit cannot be made (nothing is acknowledged then), and
        Forbidden when the session is not the caller's (nothing is stored then).
        A retry of a stored message_id returns the original result and changes nothing.
        """
        result = await self._store.append(new, now=self._clock(), caller=caller)
        self._metrics.appends.labels(new.role.value, "duplicate" if result.duplicate else "created").inc()
        log.debug(
            "append",
            session_id=new.session_id,
            message_id=new.message_id,
            role=new.role.value,
            seq=result.message.seq,
            turn=result.message.turn,
            chars=len(new.content),
            duplicate=result.duplicate,
            # Conversations are personal data: only an operator who asked for them sees them.
            **({"content": new.content} if self._s.log_message_content else {}),
        )
        due = self._summary_due(result)
        try:
            # A retry too: if the first attempt committed but died before its hot write, this
            # puts the message in Redis; if the hot tier has it, the write changes nothing.
            await self._hot.record_append(
                result.message,
                turn_count=result.turn_count,
                message_count=result.message_count,
                last_activity=result.message.created_at,
                owner=result.owner,
                content_chars=result.content_chars,
            )
        except HotUnavailable as exc:
            # SQL has it; the hot entry is now behind. The hot tier drops it before its next
            # read (or at the next append, by the seq gap), so SQL answers and backfills.
            self._metrics.tier_errors.labels("hot", "append").inc()
            log.warning("hot_append_failed", error=str(exc))
        if not result.duplicate:
            self._history.appended(result.message)
        if due:
            # On a retry too: the first attempt may have died before it scheduled the summary.
            self.summaries.schedule(new.session_id)
        return AppendOutcome(result, due)

    def _summary_due(self, result: AppendResult) -> bool:
        return (
            self._s.summaries_enabled
            and result.completed_turn
            and result.turn_count % self._s.summary_every_n_turns == 0
        )

    async def _run_until_unlocked(self, session_id: str, *, background: bool) -> JobResult:
        # Another replica holding the lock may have started before our latest turn was
        # committed, so wait for it and look again rather than assume it covers everything.
        # The wait happens outside the concurrency slot, so it blocks no other session.
        for _ in range(_LOCKED_RETRIES):
            if background:
                async with self._slots:
                    result = await self._job.run(session_id)
            else:
                result = await self._job.run(session_id)
            if result.outcome is not Outcome.LOCKED:
                return result
            await asyncio.sleep(_LOCKED_RETRY_S)
        log.info("summary_locked_elsewhere", session_id=session_id)
        return result

    async def _summarize(self, session_id: str) -> None:
        await self._run_until_unlocked(session_id, background=True)

    async def close(self, session_id: str, *, caller: Caller, reason: str = "client") -> CloseResult:
        """Persist the final summary to both tiers (summarizing the uncovered turns now) when the
        session has at least SUMMARY_MIN_TURNS_TO_PERSIST turns, and mark it closed. Idempotent.

        `persisted` means the warm row covers every turn; `cached` that Redis holds it too.
        Raises NotFound, or Forbidden when the session is not the caller's.
        """
        info = await self._owned_session(session_id, caller)
        persisted = cached = False
        if self._s.summaries_enabled and info.turn_count >= max(1, self._s.summary_min_turns_to_persist):
            # A pass started now sees every turn committed before close. It does not queue
            # behind background summaries; the summary lock still keeps it the only writer.
            result = await self._run_until_unlocked(session_id, background=False)
            after = await self._store.get_session(session_id)
            persisted = after is not None and after.covered_turns >= info.turn_count
            cached = persisted and result.hot_written
        if await self._store.close_session(session_id, reason=reason, now=self._clock()):
            self._metrics.sessions_closed.labels(reason).inc()
            log.info("session_closed", session_id=session_id, reason=reason, persisted=persisted, cached=cached)
        return CloseResult(session_id, persisted, cached, info.turn_count)

    async def delete(self, session_id: str, *, caller: Caller) -> None:
        """Remove a session from every tier, SQL first. Raises HotUnavailable when Redis could not
        be cleared: the caller must retry (delete is idempotent) rather than leave a deleted
        conversation readable from the cache until its TTL. Raises Forbidden, deleting nothing,
        when the session is not the caller's (checked under the session-row lock)."""
        await self._store.delete_session(session_id, caller=caller)
        self._history.forget(session_id)
        try:
            await self._hot.delete(session_id)
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "delete").inc()
            raise

    async def reset_summary(self, session_id: str, *, caller: Caller) -> None:
        """Forget a session's summary in both tiers and keep its messages. The sweeper then builds
        a new one from the cold tier at the next cadence point (with the current prompt and model).
        Raises NotFound for an unknown session, Forbidden (changing nothing) when it is not the
        caller's, HotUnavailable when Redis could not be cleared."""
        if not await self._store.delete_summary(session_id, caller=caller):
            raise NotFound(f"session {session_id!r} does not exist")
        try:
            # The whole hot entry: it is a cache, and the next read refills it from SQL.
            await self._hot.delete(session_id)
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "delete").inc()
            raise

    async def rebuild_summary(self, session_id: str, *, caller: Caller) -> tuple[Summary | None, list[Slice]]:
        """Recompute every slice and the summary from the messages, COMPRESSION_BATCH_TURNS turns
        per slice, with the current prompt and model. Raises NotFound, Forbidden, Conflict,
        SqlUnavailable."""
        await self._owned_session(session_id, caller)
        summary = await self._job.rebuild(session_id)
        return summary, await self._store.slices(session_id)

    # --- reads ----------------------------------------------------------------------------

    async def slices(self, session_id: str, *, caller: Caller) -> list[Slice]:
        """Every summarization of the session, oldest first, each leading back to its messages."""
        await self._owned_session(session_id, caller)
        return await self._store.slices(session_id)

    async def messages(
        self, session_id: str, *, caller: Caller, first_seq: int, last_seq: int, limit: int
    ) -> list[Message]:
        """Raw messages by seq range, from the cold tier (the source of truth)."""
        await self._owned_session(session_id, caller)
        return await self._store.messages_by_seq(session_id, first_seq=first_seq, last_seq=last_seq, limit=limit)

    async def user_summaries(self, user_id: str, *, caller: Caller, limit: int) -> list[tuple[str, int, Summary]]:
        """The user's most recent session summaries (warm tier), newest first; for a caller
        restricted to a tenant, of that tenant's sessions only. Raises Forbidden when the caller
        speaks for another user."""
        if caller.user_id is not None and caller.user_id != user_id:
            raise Forbidden
        return await self._store.user_summaries(user_id, limit=limit, tenant=caller.tenant)

    async def session(self, session_id: str, *, caller: Caller) -> SessionInfo:
        """The session's bookkeeping. Raises NotFound, or Forbidden when it is not the caller's."""
        return await self._owned_session(session_id, caller)

    async def _owned_session(self, session_id: str, caller: Caller) -> SessionInfo:
        info = await self._store.get_session(session_id)
        if info is None:
            raise NotFound(f"session {session_id!r} does not exist")
        _authorize(caller, info.owner)
        return info

    async def load_best_summary(self, session_id: str, *, caller: Caller) -> SummaryAnswer:
        """Hot summary → warm row (backfilling hot) → deterministic extraction from messages → none.

        The owner comes from the same hot round trip; only when the hot tier does not know it is
        SQL asked, and for a restricted caller that answer is required (SqlUnavailable otherwise).
        Raises Forbidden when the session is not the caller's.
        """
        try:
            summary, turns, owner = await self._hot.read_summary(session_id)
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "read_summary").inc()
            summary, turns, owner = None, None, None
        if owner is not None:
            _authorize(caller, owner)
        if summary is not None:
            info: SessionInfo | None = None
            if owner is None and not caller.unrestricted:
                info = await self._store.get_session(session_id)
                if info is None:
                    # SQL knows no such session: the cached summary is an orphan, shown to nobody.
                    return self._answer(session_id, Tier.NONE, None, 0)
                _authorize(caller, info.owner)
            elif turns is None:
                # The counters expired before the summary did; SQL knows the turn count.
                info = await self._sql_session(session_id)
            if info is not None:
                # Counters and owner back into the hot tier, so that the next read needs no SQL.
                await self._backfill(info, summary=None, recent=None)
                turns = info.turn_count
            return self._answer(session_id, Tier.HOT, summary, summary.covered_turns if turns is None else turns)
        answer, info = await self._summary_below_hot(session_id, caller)
        if info is not None and (answer.tier is Tier.WARM or owner is None):
            await self._backfill(info, summary=answer.summary if answer.tier is Tier.WARM else None, recent=None)
        return answer

    async def _summary_below_hot(self, session_id: str, caller: Caller) -> tuple[SummaryAnswer, SessionInfo | None]:
        """The warm row, else the cold extraction, else none; with the session SQL returned.
        Raises Forbidden when SQL says the session is not the caller's."""
        try:
            summary, info = await self._store.get_summary(session_id)
        except SqlUnavailable:
            self._metrics.tier_errors.labels("sql", "read_summary").inc()
            return self._answer(session_id, Tier.NONE, None, 0), None
        if info is None:
            return self._answer(session_id, Tier.NONE, None, 0), None
        _authorize(caller, info.owner)
        if summary is not None:
            return self._answer(session_id, Tier.WARM, summary, info.turn_count), info
        cold = await self._cold_summary(info)
        tier = Tier.NONE if cold is None else Tier.COLD
        return self._answer(session_id, tier, cold, info.turn_count), info

    async def _backfill(self, info: SessionInfo, *, summary: Summary | None, recent: list[Message] | None) -> None:
        try:
            await self._hot.backfill(
                info.session_id,
                summary=summary,
                recent=recent,
                turn_count=info.turn_count,
                message_count=info.message_count,
                last_activity=info.last_activity,
                owner=info.owner,
                content_chars=info.content_chars,
            )
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "backfill").inc()

    async def _keep_older(
        self, session_id: str, info: SessionInfo | None, hot: HotSession, messages: list[Message]
    ) -> None:
        """Put older messages a context read from SQL into the hot list, in front of what it
        holds, so that the next context of the session reads them from the hot tier (a list that
        was refilled with the window only, after Redis lost it, otherwise sends every context to
        SQL until appends have grown it back). Written only if no append reached the hot tier
        meanwhile; the tier keeps the newest of them it has room for."""
        if info is not None:
            # The list must end where the counters do, or the next read takes it as incomplete.
            if messages and messages[-1].seq == info.message_count:
                await self._backfill(info, summary=None, recent=messages)
            return
        if hot.turn_count is None or hot.message_count is None or hot.last_activity is None or hot.owner is None:
            return
        if not messages or messages[-1].seq != hot.message_count:
            return
        try:
            await self._hot.backfill(
                session_id,
                summary=None,
                recent=messages,
                turn_count=hot.turn_count,
                message_count=hot.message_count,
                last_activity=hot.last_activity,
                owner=hot.owner,
                content_chars=hot.content_chars or 0,
            )
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "backfill").inc()

    async def _cold_summary(self, info: SessionInfo) -> Summary | None:
        try:
            messages = await self._cold_messages(info)
        except SqlUnavailable:
            self._metrics.tier_errors.labels("sql", "read_messages").inc()
            return None
        return await asyncio.to_thread(
            cold_summary,
            info,
            messages,
            extractor=self._extractor,
            tagger=self._tagger,
            max_chars=self._s.summary_max_chars,
        )

    async def _cold_messages(self, info: SessionInfo) -> list[Message]:
        """What a cold extraction reads: the whole session when it is short, else its opening and
        its latest messages. A cold read runs on the request path, so its cost must not grow with
        the session (a 10,000-turn session took 8 s read whole); the opening holds who the user is
        and what they came for, the tail what is going on now, and the background summary job,
        which reads every turn batch by batch, covers the middle. Completed turns only, like a
        real summary: an open question is in the window, raw."""
        sid = info.session_id
        head = await self._store.first_messages(sid, _COLD_HEAD_MESSAGES)
        if len(head) < _COLD_HEAD_MESSAGES:
            messages = head
        else:
            tail = await self._store.recent_messages(sid, _COLD_TAIL_MESSAGES)
            last_head = head[-1].seq
            messages = head + [m for m in tail if m.seq > last_head]
        return [m for m in messages if m.turn <= info.turn_count]

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

    async def context(
        self,
        session_id: str,
        *,
        caller: Caller,
        max_chars: int,
        system_prompt: str | None = None,
        question: str | None = None,
        exclude_message_id: str | None = None,
    ) -> ContextAnswer:
        """Summary plus recent turns, prompt-ordered, within max_chars of memory.

        One hot round trip answers both when Redis has them; otherwise the summary walk and the
        SQL read of the recent turns run concurrently, each with its own fallback, and what SQL
        gave is backfilled into the hot tier in one more round trip so the next read is hot.
        Turns the summary does not cover yet (it lags behind a slow LLM) and that are older than
        the window are added raw when they fit, or as a deterministic digest: no turn falls
        between the summary and the window. `system_prompt` and `question` (not counted in
        max_chars) frame the result: rules and summary in one system message, the question last.

        The owner comes from the same hot round trip; only when the hot tier does not know it is
        SQL asked, and for a restricted caller that answer is required (SqlUnavailable otherwise).
        Raises Forbidden when the session is not the caller's.
        """
        try:
            hot = await self._hot.read_session(session_id)
        except HotUnavailable:
            self._metrics.tier_errors.labels("hot", "read_session").inc()
            hot = _NO_HOT
        known: SessionInfo | None = None
        if hot.owner is not None:
            _authorize(caller, hot.owner)
        elif not caller.unrestricted:
            known = await self._store.get_session(session_id)
            if known is None:
                # SQL knows no such session: whatever the cache still holds is shown to nobody.
                hot = _NO_HOT
            else:
                _authorize(caller, known.owner)

        async def sql_session() -> SessionInfo | None:
            return known if known is not None else await self._sql_session(session_id)

        mode = self._s.memory_mode
        keep = 0 if mode == "none" else self._s.keep_recent_turns
        complete = hot_window_complete(
            hot.recent, message_count=hot.message_count, turn_count=hot.turn_count, keep_recent_turns=keep
        )

        async def summary_part() -> tuple[SummaryAnswer, SessionInfo | None]:
            if mode != "summary":
                return SummaryAnswer(session_id, Tier.NONE, None, hot.turn_count or 0), None
            if hot.summary is not None:
                turns = hot.turn_count if hot.turn_count is not None else hot.summary.covered_turns
                return self._answer(session_id, Tier.HOT, hot.summary, turns), None
            return await self._summary_below_hot(session_id, caller)

        async def recent_part() -> tuple[list[Message], SessionInfo | None, list[Message] | None]:
            """Messages from the window's first turn (hot list, or SQL with one turn more), the SQL
            session when SQL was asked, and the rows to backfill."""
            if keep == 0:
                return [], known if hot.turn_count is not None else await sql_session(), None
            if complete:
                return list(hot.recent), known, None
            info = await sql_session()
            if info is None:
                # SQL is down (or the session is unknown): whatever Redis still has beats nothing.
                return list(hot.recent), None, None
            first = window_start_turn(info.turn_count, max(keep, 1))
            try:
                # One turn more than the window (down to turn 0, a greeting), so that the hot
                # list this refills is seen as complete by hot_window_complete next time.
                rows = await self._store.messages_in_turns(session_id, after_turn=first - 2)
            except SqlUnavailable:
                self._metrics.tier_errors.labels("sql", "read_recent").inc()
                return list(hot.recent), info, None
            return rows, info, rows

        (answer, warm_info), (available, info, rows) = await asyncio.gather(summary_part(), recent_part())
        if exclude_message_id is not None:
            # A retried load-then-append: its message is stored already and comes back as the question.
            available = [m for m in available if m.message_id != exclude_message_id]
        sql_info = info or warm_info
        warm_summary = answer.summary if answer.tier is Tier.WARM else None
        if sql_info is not None and (rows is not None or warm_summary is not None or hot.owner is None):
            await self._backfill(sql_info, summary=warm_summary, recent=rows)
        turn_count = sql_info.turn_count if sql_info else max(hot.turn_count or 0, answer.turn_count)
        recent = window(available, turn_count=turn_count, keep_recent_turns=keep)
        summary = answer.summary
        memory_text = None
        summary_last = sql_info.last_activity if sql_info else hot.last_activity
        if summary is not None:
            memory_text = self._summary_text(summary.text, summary_last)
        covered = summary.covered_turns if summary else 0
        shown = recent
        snippets: list[list[Message]] = []
        budget = max_chars
        if mode == "summary":
            recent = await self._with_gap(session_id, covered, turn_count, recent, available)
            count = sql_info.message_count if sql_info else hot.message_count
            if question and recent and count:
                # Earlier turns that match the question get up to a third of the budget.
                snippets = await self._history.snippets(
                    session_id, question, count, before_seq=recent[0].seq, seen=available
                )
                budget -= min(max_chars // _SNIPPET_SHARE, len(recall_text(snippets, max_chars=max_chars)))
            room = budget - summary_room(len(memory_text or ""), budget) - _chars(recent)
            if self._s.context_older_turns:
                before_window = await self._history.older(
                    session_id,
                    recent,
                    available,
                    room,
                    message_count=sql_info.message_count if sql_info else hot.message_count,
                    content_chars=sql_info.content_chars if sql_info else hot.content_chars,
                )
                shown = [*before_window, *recent]
                fetched = [m for m in before_window if not available or m.seq < available[0].seq]
                # Only while the hot list has room: once it is full, the rest of a long, terse
                # session's older turns come from SQL on each read (one indexed read).
                if fetched and exclude_message_id is None and len(available) < self._hot.recent_max:
                    await self._keep_older(session_id, sql_info, hot, [*fetched, *available])
            else:
                shown = recent
        if memory_text is not None and shown and shown[0].seq <= 1 and _chars(shown) <= budget:
            # The raw turns hold the whole conversation: a summary of them would only repeat them.
            memory_text = None
        kept, dropped = fit_recent(shown, room=budget - summary_room(len(memory_text or ""), budget))
        if memory_text is not None and summary is not None and summary.source is SummarySource.DETERMINISTIC:
            # Re-rendered for the room the raw turns left, from the facts said before them: whole
            # facts by priority instead of the cut-off start of the stored text, none repeated.
            frame_chars = len(self._summary_text("", summary_last))
            body = render(
                summary.structured,
                budget - _chars(kept) - frame_chars,
                before_turn=kept[0].turn if kept else None,
                topics=summary.topics,
                # The facts just before the raw turns first: the turns shown raw and the summary
                # then cover one stretch back from now, which is what later turns refer to most.
                newest_first=True,
            )
            if body is not None:
                memory_text = self._summary_text(body, summary_last) if body else None
        uncovered = [m for m in dropped if m.turn > covered] if mode == "summary" else []
        if uncovered:
            # Turns the summary does not hold yet and that did not fit raw: a digest of them leads
            # the system text, so that a budget cut falls on the (older) summary, not on them.
            digest = await asyncio.to_thread(
                self._extractor.extract, uncovered, max_chars=max(50, min(self._s.summary_max_chars, budget // 4))
            )
            if digest.text:
                label = "最近几轮：" if language_of(digest.text) == "zh" else "Recent turns: "
                memory_text = label + digest.text + (f"\n{memory_text}" if memory_text else "")
        messages = compose(memory_text, alternate(kept), max_chars=budget)
        if snippets:
            # Only turns not shown raw; whatever the rest left unused is theirs too.
            first_shown = kept[0].seq if kept else None
            older = [t for t in snippets if first_shown is None or t[-1].seq < first_shown]
            room = max_chars - sum(len(m.content) for m in messages) - 1
            messages = with_recall(messages, recall_text(older, max_chars=room))
        messages = frame(messages, system_prompt=system_prompt, question=question)
        # What sending the whole history instead would cost, framed the same way.
        framing = len(system_prompt or "") + len(question or "")
        full = (sql_info.content_chars if sql_info else (hot.content_chars or 0)) + framing
        returned = sum(len(m.content) for m in messages)
        payload = summary.structured.get("payload") if summary else None
        return ContextAnswer(
            session_id=session_id,
            summary_tier=answer.tier,
            summary=summary.text if summary else None,
            covered_turns=summary.covered_turns if summary else 0,
            topics=summary.topics if summary else (),
            messages=messages,
            turn_count=turn_count,
            recent_transcript=recent_transcript(recent, max_chars=self._s.recent_transcript_max_chars),
            answer_transcript=answer_transcript(recent, max_chars=self._s.answer_history_max_chars),
            estimated_tokens={
                "context": estimate_tokens(returned, self._s.chars_per_token),
                "full_history": estimate_tokens(full, self._s.chars_per_token),
            },
            planning=planning(payload) if payload else None,
            planning_history=planning_history(
                recent_transcript(recent, max_chars=self._s.planning_history_max_chars),
                payload,
                max_chars=self._s.planning_history_max_chars,
            ),
        )

    def _summary_text(self, text: str, last_activity: float | None) -> str:
        return summary_system_text(
            text,
            idle_seconds=None if last_activity is None else self._clock() - last_activity,
            reconnect_gap_s=self._s.reconnect_gap_seconds,
            templates=self._s.reconnect_templates,
        )

    async def recall(self, session_id: str, *, caller: Caller, query: str, k: int) -> list[RecallMatch]:
        """The k messages that best match `query` (BM25), best first, each with the raw messages
        of its turn and the slice that covers it. Raises NotFound, Forbidden, SqlUnavailable."""
        info = await self._owned_session(session_id, caller)
        return await self._history.matches(session_id, query, info.message_count, k)

    async def _with_gap(
        self, session_id: str, covered: int, turn_count: int, recent: list[Message], available: list[Message]
    ) -> list[Message]:
        """The window with the turns covered+1 … (window start - 1) in front of it: turns the
        summary does not hold yet (it lags behind a slow LLM) and that left the window."""
        first = recent[0].turn if recent else turn_count + 1
        # A summary that lags far (hours of LLM outage) leaves a gap too long to read on every
        # request: its latest turns are read, and the summary job catches up with the rest.
        covered = max(covered, first - 1 - _GAP_MAX_TURNS)
        if covered + 1 >= first:
            return recent
        gap = [m for m in available if covered < m.turn < first]
        if not gap or gap[0].turn != covered + 1:
            try:
                gap = await self._store.messages_in_turns(session_id, after_turn=covered, through_turn=first - 1)
            except SqlUnavailable:
                self._metrics.tier_errors.labels("sql", "read_gap").inc()
                return recent
        return [*gap, *recent]

    # --- health and background ------------------------------------------------------------

    async def readiness(self) -> dict[str, str]:
        """Each tier's state: `ok`, or `degraded` with reads falling through / writes refused."""

        async def probe(ping: Callable[[], Awaitable[None]]) -> str:
            try:
                await asyncio.wait_for(ping(), timeout=1.0)
            except (HotUnavailable, SqlUnavailable, TimeoutError):
                return "degraded"
            return "ok"

        async def sql_ping() -> None:
            # Reachable is not enough: a database whose schema is missing or old refuses writes.
            if await self._store.schema_version() < SCHEMA_VERSION:
                raise SqlUnavailable("schema not migrated")

        hot, sql = await asyncio.gather(probe(self._hot.ping), probe(sql_ping))
        return {"hot": hot, "sql": sql}

    async def sweep(self) -> None:
        """Close idle sessions and schedule every summary that is due but not done (after a
        crash, a lost lock, or an SQL outage during a summary). While SQL is down there is nothing
        to find: the next sweep after it returns does the work."""
        try:
            await self._sweep()
        except SqlUnavailable as exc:
            self._metrics.tier_errors.labels("sql", "sweep").inc()
            log.warning("sweep_skipped", error=str(exc))

    async def _sweep(self) -> None:
        if self._s.summaries_enabled:
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
                # The daemon's own housekeeping acts for no tenant and no user.
                await self.close(sid, caller=Caller(), reason="idle")
            except NotFound:
                continue


def _chars(messages: list[Message]) -> int:
    return sum(len(m.content) for m in messages)


def _authorize(caller: Caller, owner: Owner) -> None:
    if not caller.may_access(owner):
        raise Forbidden


_NO_HOT = HotSession(summary=None, recent=(), turn_count=None, message_count=None, last_activity=None)
