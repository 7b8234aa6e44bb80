"""MemoryService: the facade the HTTP API calls. It knows the tiers and their order, not HTTP.

Reads walk hot → warm → cold and say which tier answered; a tier that fails or times out is
skipped, counted and logged. Writes commit to SQL first (durable before acknowledged), then update
the hot tier best-effort, and schedule summaries in the background.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from tiered_memory.core.erasure import Erasures
from tiered_memory.core.history import History
from tiered_memory.core.readiness import tier_states
from tiered_memory.core.reads import SessionReads, authorize
from tiered_memory.core.recall import RecallMatch
from tiered_memory.core.user_memory import UserMemory
from tiered_memory.errors import HotUnavailable, NotFound, QuotaExceeded, RateLimited, SqlUnavailable
from tiered_memory.metrics import Metrics
from tiered_memory.model import (
    AppendAnswer,
    AppendResult,
    BatchAnswer,
    Caller,
    CloseResult,
    ContextRequest,
    Message,
    NewMessage,
    Patch,
    PatchAnswer,
    PatchResult,
    RebuildJob,
    SessionInfo,
    SessionKey,
    SessionState,
    Slice,
    SummaryAnswer,
    Tier,
    key_tenant,
)
from tiered_memory.prompt.assemble import ContextAnswer
from tiered_memory.settings import Settings
from tiered_memory.summarize.background import BackgroundSummaries
from tiered_memory.summarize.cadence import at_cadence_point, past_cadence_point
from tiered_memory.summarize.job import LOCK_WAIT_S, JobResult, Outcome, SummaryJob
from tiered_memory.summarize.rebuilds import Rebuilds, Started
from tiered_memory.summarize.scheduler import SharedSlots
from tiered_memory.summarize.topics import TopicTagger
from tiered_memory.tiers.buckets import tenant_bucket, tenant_rate, units
from tiered_memory.tiers.errors import TierErrors
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.outbox import SqlOutbox
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tiers.sql.users import SqlUsers
from tiered_memory.webhooks import HELD_MAX_S

log = structlog.get_logger("tiered_memory.core.service")
T = TypeVar("T")

# One more try of a hot write that failed (the gateway state's), after this long.
_HOT_RETRY_S = 0.2
# How many sessions one sweep looks at; the next sweep takes the rest.
_SWEEP_BATCH = 500
# How long a close waits for a summarization that is already running: long enough for a
# deterministic pass, short against an LLM call.
_CLOSE_LOCK_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class TurnAnswer:
    """What a turn did: the context before the user's message, and the message's append."""

    context: ContextAnswer
    appended: AppendAnswer


class MemoryService:
    """Every operation of the daemon. Owns no connections: the app hands in the tiers and closes them."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: SqlStore,
        hot: HotTier,
        job: SummaryJob,
        history: History,
        reads: SessionReads,
        tagger: TopicTagger,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """The parts are composed by app.py (`build_service`), the one place that does."""
        self._s = settings
        self._hot = hot
        self._metrics = metrics
        self._errors = TierErrors(metrics.tier_errors)
        self._rates = settings.rate_limits
        self._history = history
        self._store = store
        self._job = job
        self._tagger = tagger
        self._clock = clock
        self._users = SqlUsers(store)
        self._erasures = Erasures(
            self._users, hot, forget=self._history.forget, stream=settings.events_stream, clock=clock
        )
        self._reads = reads
        # A user's memory across sessions, as the API reads and erases it.
        self.users = UserMemory(store, self._users, self._erasures, whole=self._whole, clock=clock)
        self._outbox = SqlOutbox(store)
        # Bounds background summaries and rebuild jobs: a start-up sweep that finds hundreds of due
        # sessions, or a burst of rebuilds, must not open hundreds of transactions and LLM calls
        # at once; and one tenant holds at most half of them. close() does not queue.
        self._slots = SharedSlots(settings.summary_concurrency, share=(settings.summary_concurrency + 1) // 2)
        self.summaries = BackgroundSummaries(job=job, store=store, slots=self._slots, metrics=metrics, clock=clock)
        # A rebuild used to hold a request in flight for its whole run; as a job it holds none, so
        # the jobs a process keeps queued or running get the bound its requests have (0: none).
        self.rebuilds = Rebuilds(
            job=job,
            store=store,
            jobs=hot.jobs,
            slots=self._slots,
            metrics=metrics,
            max_pending=settings.max_inflight_requests or None,
            clock=clock,
        )
        # Writes running whole while their requests were cancelled (_whole).
        self._writes: set[asyncio.Task[Any]] = set()

    # --- writes ---------------------------------------------------------------------------

    async def _whole(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` (a write) run to its end even when the request waiting for it is cancelled (its
        deadline passed, its client went away): a write whose SQL half committed must do its hot
        half too, or the hot tier lags behind SQL until the next append finds the gap. The caller
        still stops waiting at once."""
        task = asyncio.ensure_future(work)
        # Kept until done (the loop holds tasks weakly); an error nobody waits for is still read.
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(task)

    async def _charge(self, tenant: str, nbytes: int) -> None:
        """Take `nbytes` of text a request makes the daemon read back for the tenant from its
        rate's bucket, into debt if need be: its next requests wait it out (rate_limit.py)."""
        rate = tenant_rate(self._rates, tenant)
        if rate is None:
            return
        try:
            await self._hot.buckets.take(tenant_bucket(tenant), rate, units(nbytes), owed=True)
        except HotUnavailable:
            self._metrics.rate_limit_skipped.inc()

    async def _metered(self, storing: Awaitable[T]) -> T:
        """`storing`'s result; a refusal for the tenant's quota counted."""
        try:
            return await storing
        except QuotaExceeded as exc:
            self._metrics.quota_refusals.labels(exc.quota).inc()
            raise

    async def append(self, new: NewMessage, *, caller: Caller) -> AppendAnswer:
        """`_append`, run whole (`_whole`)."""
        return await self._whole(self._append(new, caller=caller))

    async def _append(self, new: NewMessage, *, caller: Caller) -> AppendAnswer:
        """Commit a message to SQL, then the hot tier; schedule a summary at every Nth turn.

        Raises SqlUnavailable when the commit cannot be made (nothing is acknowledged then), and
        Forbidden when the session is not the caller's (nothing is stored then).
        A retry of a stored message_id returns the original result and changes nothing.
        """
        result = await self._metered(self._store.append(new, now=self._clock(), caller=caller))
        self._metrics.appends.labels(new.role.value, "duplicate" if result.duplicate else "created").inc()
        log.debug(
            "append",
            session_key=new.key,
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
        await self._carry_on(result)
        if due:
            # On a retry too: the first attempt may have died before it scheduled the summary.
            self.summaries.schedule(new.key)
        return AppendAnswer(result, due)

    async def turn(self, new: NewMessage, want: ContextRequest, *, caller: Caller) -> TurnAnswer:
        """Load-then-append, one round trip per utterance: the context as it was before the
        user's new message (`new`, shown as the closing question), then the message recorded.
        A retry of a stored message leaves it out of the history (it is the question)."""
        want = dataclasses.replace(want, question=new.content, user_id=new.user_id)
        context = await self.context(new.key, want, caller=caller)
        return TurnAnswer(context, await self.append(new, caller=caller))

    async def append_batch(self, news: Sequence[NewMessage], *, caller: Caller) -> BatchAnswer:
        """`_append_batch`, run whole (`_whole`)."""
        return await self._whole(self._append_batch(news, caller=caller))

    async def _append_batch(self, news: Sequence[NewMessage], *, caller: Caller) -> BatchAnswer:
        """Commit messages of one session in one transaction, all or none (a bulk import), then
        carry them on as if appended one by one: the hot tier in order, the recall postings, and
        a summary when a cadence point was passed. A retried batch stores nothing twice. Raises
        SqlUnavailable, Forbidden and Conflict (nothing stored then)."""
        results = await self._metered(self._store.append_all(news, now=self._clock(), caller=caller))
        for r in results:
            self._metrics.appends.labels(r.message.role.value, "duplicate" if r.duplicate else "created").inc()
            await self._carry_on(r)
        due = any(self._summary_due(r) for r in results)
        if due:
            self.summaries.schedule(results[0].message.key)
        log.info("append_batch", messages=len(results), created=sum(not r.duplicate for r in results))
        return BatchAnswer(results, due)

    async def _carry_on(self, result: AppendResult) -> None:
        """After a message's commit: the hot tier, then the recall postings (a new message only)."""
        try:
            # A retry too: if the first attempt committed but died before its hot write, this
            # puts the message in Redis; if the hot tier has it, the write changes nothing.
            await self._hot.record_append(result.message, result.counters)
        except HotUnavailable as exc:
            # SQL has it; the hot entry is now behind. The hot tier drops it before its next
            # read (or at the next append, by the seq gap), so SQL answers and backfills. The
            # log says why (the operator's first question), so this one is not `_errors.hot`.
            self._errors.count("hot", "append")
            log.warning("hot_append_failed", error=str(exc))
        if not result.duplicate:
            self._history.appended(result.message)

    def _summary_due(self, result: AppendResult | PatchResult) -> bool:
        """Whether the turn a write completed is a cadence point (summarize.cadence)."""
        every_n, start = self._s.summary_every_n_turns, self._s.summary_start_turns
        return (
            self._s.summaries_enabled
            and result.completed_turn
            and at_cadence_point(result.turn_count, every_n=every_n, start=start)
        )

    async def _close_pass(self, key: SessionKey, *, answering: bool) -> JobResult:
        """The summary pass of a close. One that a caller waits for (`answering`) never waits on
        the LLM: it merges the turns the background passes have not covered yet with the
        deterministic extractor (on top of what the LLM wrote before, whose text it carries), so
        a hung or slow LLM costs close nothing, and it waits for a pass already running (which
        may be waiting on the LLM) at most _CLOSE_LOCK_WAIT_S; past that, close answers with
        what SQL has and the final pass runs in the background after it (LLM first), as the
        sweeper would. The sweeper's idle close has nobody waiting: LLM first, and it waits for
        a running pass as long as a background pass does."""
        # Started now, so it sees every turn committed before close. It does not queue behind
        # background summaries; the summary lock still keeps it the only writer.
        wait_s = _CLOSE_LOCK_WAIT_S if answering else LOCK_WAIT_S
        result = await self._job.run_waiting(key, wait_s=wait_s, use_llm=not answering)
        if result.outcome is Outcome.LOCKED:
            self.summaries.schedule(key)
            log.info("close_summary_left_to_background", session_key=key)
        return result

    async def aclose(self) -> None:
        """Let the writes still running whole (`_whole`: their requests cancelled) finish, within
        SHUTDOWN_GRACE_SECONDS, then stop this process's background indexing of appends (the
        summaries drain separately). A write left running would reach a closed store."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=self._s.shutdown_grace_seconds)
        await self._history.aclose()

    async def close(self, key: SessionKey, *, caller: Caller, reason: str = "client") -> CloseResult:
        """`_close`, run whole (`_whole`)."""
        return await self._whole(self._close(key, caller=caller, reason=reason))

    async def _close(self, key: SessionKey, *, caller: Caller, reason: str = "client") -> CloseResult:
        """Persist the final summary to both tiers (summarizing the uncovered turns now) when the
        session has at least SUMMARY_MIN_TURNS_TO_PERSIST turns, and mark it closed. Idempotent.

        `persisted` means the warm row covers every turn; `cached` that Redis holds it too.
        Raises NotFound, or Forbidden when the session is not the caller's.
        """
        info = await self._owned_session(key, caller)
        persisted = cached = refine = left = False
        if self._s.summaries_enabled and info.turn_count >= max(1, self._s.summary_min_turns_to_persist):
            result = await self._close_pass(key, answering=reason == "client")
            left = result.outcome is Outcome.LOCKED  # a pass runs on after close
            after = await self._store.get_session(key)
            persisted = after is not None and after.covered_turns >= info.turn_count
            # A pass locked out by another process's may still see SQL cover every turn (that
            # pass wrote meanwhile); the hot copy is then made sure of here, so every close of
            # the session answers alike.
            cached = persisted and (result.hot_written or (left and await self._job.cache_stored(key)))
            # A short call may never have reached a cadence point: its summary is the extractor's.
            # The LLM makes it again in the background (the job decides whether it is short
            # enough and not the LLM's already).
            refine = persisted and reason == "client" and self._s.llm_enabled
        # With a pass still to come, the final summary's event is held until it ends.
        last_pass = refine or left
        if await self._store.close_session(key, reason=reason, now=self._clock(), final=not last_pass):
            self._metrics.sessions_closed.labels(reason).inc()
            log.info("session_closed", session_key=key, reason=reason, persisted=persisted, cached=cached)
            if last_pass:
                # Scheduled only now: a pass that ended before the close committed would find no
                # held event to release.
                self.summaries.after_close(key, refine=refine)
        return CloseResult(key, persisted, cached, info.turn_count)

    async def patch_message(self, key: SessionKey, message_id: str, patch: Patch, *, caller: Caller) -> PatchAnswer:
        """`_patch_message`, run whole (`_whole`)."""
        return await self._whole(self._patch_message(key, message_id, patch, caller=caller))

    async def _patch_message(self, key: SessionKey, message_id: str, patch: Patch, *, caller: Caller) -> PatchAnswer:
        """Correct a stored message while no summary covers it (tiers/sql/patch.py), holding the
        session's summary lock so that no summary reads it meanwhile; then the hot tier forgets
        what it cached of the session (its recent list and recall postings held the old text) and
        a reply finalized into a completed turn schedules a summary at its cadence point. A
        repeated patch changes nothing and answers the same. Raises NotFound, Forbidden, Conflict,
        InvalidInput, SqlUnavailable, and HotUnavailable when the hot tier could not forget (the
        patch is in SQL: a retry, which changes nothing more, clears it)."""
        async with self._job.holding(key):
            result = await self._store.patch_message(key, message_id, patch, caller=caller)
        # Even a repeated patch: its first may have answered 503 with the hot tier still holding
        # the old text.
        await self._forget_cached(key, result.message.seq, result.session_bytes)
        due = self._summary_due(result)
        if due:
            self.summaries.schedule(key)
        log.info("message_patched", session_key=key, message_id=message_id, changed=result.changed)
        return PatchAnswer(result, due)

    async def delete_message(self, key: SessionKey, message_id: str, *, caller: Caller) -> None:
        """`_delete_message`, run whole (`_whole`)."""
        return await self._whole(self._delete_message(key, message_id, caller=caller))

    async def _delete_message(self, key: SessionKey, message_id: str, *, caller: Caller) -> None:
        """Remove the session's newest message while no summary covers its turn (tiers/sql/patch.py),
        holding the session's summary lock as a patch does; then the hot tier forgets what it
        cached of the session (its recent list, counters and recall postings held the message).
        Raises NotFound (the session, or the message: gone already), Forbidden, Conflict,
        SqlUnavailable, and HotUnavailable when the hot tier could not forget. The hot tier forgets
        on a NotFound for the message too: a delete that answered 503 after SQL removed the
        message is completed by its retry."""
        async with self._job.holding(key):
            deleted = await self._store.delete_newest(key, message_id, caller=caller)
        # Its postings go whether or not they reach the message: its seq is the next append's, and
        # postings that start over refuse a batch of the old message by its seq, not only by the
        # floor's time (which another replica's clock sets).
        await self._forget_cached(key, 0, deleted.session_bytes)
        if deleted.message is None:
            raise NotFound(f"the session has no message {message_id!r}")
        log.info("message_deleted", session_key=key, message_id=message_id, seq=deleted.message.seq)

    async def _forget_cached(self, key: SessionKey, changed_seq: int, session_bytes: int) -> None:
        """After the message `changed_seq` changed in SQL (patched; 0: taken back): the hot tier
        forgets what it cached of the session (its recent list and summary held the message), and
        its recall postings when they reach that message (in any case for 0); then the tenant pays for the postings'
        catch-up from SQL at the next question, up to RECALL_MAX_BYTES of its `session_bytes`: one
        small request, up to megabytes of work. (A catch-up after postings expired or Redis was
        lost is the daemon's own.) A streaming reply finalized drops and costs nothing of that: it
        is not indexed while it streams (history.py). Raises HotUnavailable when the hot tier could
        not forget: the change is in SQL, and a retry of the request forgets again."""
        self._history.forget(key, changed_seq=changed_seq)
        with self._errors.counted("hot", "invalidate"):
            dropped = await self._hot.invalidate(key, changed_seq=changed_seq)
        if dropped:
            await self._charge(key_tenant(key), min(session_bytes, self._s.recall_max_bytes))

    async def delete(self, key: SessionKey, *, caller: Caller) -> None:
        """`_delete`, run whole (`_whole`)."""
        return await self._whole(self._delete(key, caller=caller))

    async def _delete(self, key: SessionKey, *, caller: Caller) -> None:
        """Remove a session from every tier, SQL first, with what it put in its user's profile and
        its entries in EVENTS_STREAM. Raises HotUnavailable when Redis could not be cleared: the
        caller must retry (delete is idempotent) rather than leave a deleted
        conversation readable from the cache until its TTL. Raises Forbidden, deleting nothing,
        when the session is not the caller's (checked under the session-row lock)."""
        await self._store.delete_session(key, caller=caller, now=self._clock())
        self._history.forget(key)
        with self._errors.counted("hot", "delete"):
            await self._hot.delete(key)
            if self._s.events_stream:
                # Its events in EVENTS_STREAM (its summaries among them) go too.
                await self._hot.remove_from_stream(self._s.events_stream, {"session": key})

    async def reset_summary(self, key: SessionKey, *, caller: Caller) -> None:
        """Forget a session's summary in both tiers and keep its messages. The next read (or the
        sweeper) schedules a new one from the cold tier when a cadence point is behind (with the
        current prompt and model).
        Raises NotFound for an unknown session, Forbidden (changing nothing) when it is not the
        caller's, HotUnavailable when Redis could not be cleared."""
        if not await self._store.delete_summary(key, caller=caller):
            raise NotFound("the session does not exist")
        # The whole hot entry: it is a cache, and the next read refills it from SQL. Not the
        # state floor: the session lives on, and a read refilling it must not cache a state
        # older than a PUT made meanwhile.
        with self._errors.counted("hot", "delete"):
            await self._hot.delete(key, keep_state_floor=True)

    async def start_rebuild(self, key: SessionKey, *, caller: Caller) -> Started:
        """Start recomputing every slice and the summary from the messages, COMPRESSION_BATCH_TURNS
        turns per slice, with the current prompt and model, as a job (rebuilds.py); or answer with
        the session's rebuild still going. Run whole (`_whole`): a job that took the session's
        lease is launched even when the request is cancelled. A new job is charged the session's
        text against the tenant's rate. Raises NotFound, Forbidden, RateLimited (the tenant's
        REBUILD_RATE_LIMIT), SqlUnavailable, HotUnavailable, Overloaded, Conflict; nothing is
        started then."""
        info = await self._owned_session(key, caller)
        tenant = key_tenant(key)
        await self._rebuild_allowed(tenant)
        started = await self._whole(self.rebuilds.start(key))
        if started.started:
            # It reads the whole session into the LLM again: charged its text, as a take-back is.
            await self._charge(tenant, info.content_bytes)
        return started

    async def _rebuild_allowed(self, tenant: str) -> None:
        """Draw a rebuild from the tenant's REBUILD_RATE_LIMIT bucket; RateLimited past it. A hot
        tier that fails lets it through (counted), as the request rates do."""
        rate = self._s.rebuild_rate_limit
        if rate is None:
            return
        try:
            wait = await self._hot.buckets.take(f"rebuild:{tenant}", rate)
        except HotUnavailable:
            self._metrics.rate_limit_skipped.inc()
            return
        if wait > 0:
            self._metrics.rate_limited.labels("rebuild").inc()
            raise RateLimited("the tenant's rebuilds are past REBUILD_RATE_LIMIT; retry", retry_after_s=wait)

    async def rebuild_job(self, key: SessionKey, job_id: str, *, caller: Caller) -> RebuildJob:
        """A rebuild job of the session as it is now. Raises NotFound (the session or the job),
        Forbidden, SqlUnavailable, HotUnavailable."""
        await self._owned_session(key, caller)
        return await self.rebuilds.get(key, job_id)

    # --- reads ----------------------------------------------------------------------------

    async def slices(
        self, key: SessionKey, *, caller: Caller, from_turn: int = 1, limit: int | None = None
    ) -> list[Slice]:
        """The session's summarizations that end at `from_turn` or later (at most `limit`), oldest
        first, each leading back to its messages."""
        await self._owned_session(key, caller)
        return await self._store.slices(key, from_turn=from_turn, limit=limit, replica=True)

    async def messages(
        self, key: SessionKey, *, caller: Caller, first_seq: int, last_seq: int, limit: int, max_bytes: int
    ) -> list[Message]:
        """Raw messages by seq range, with their reasoning, from the cold tier (the source of
        truth): read as far as the first that takes their text past `max_bytes`, and one more."""
        await self._owned_session(key, caller)
        return await self._store.messages_by_seq(
            key, first_seq=first_seq, last_seq=last_seq, limit=limit, max_bytes=max_bytes, replica=True, reasoning=True
        )

    async def session(self, key: SessionKey, *, caller: Caller) -> SessionInfo:
        """The session's bookkeeping. Raises NotFound, or Forbidden when it is not the caller's."""
        return await self._owned_session(key, caller)

    async def _owned_session(self, key: SessionKey, caller: Caller) -> SessionInfo:
        # The owner never changes: a replica's copy of the row answers (its None is asked again).
        info = await self._store.get_session(key, replica=True)
        if info is None:
            raise NotFound("the session does not exist")
        authorize(caller, info.owner)
        return info

    async def load_best_summary(self, key: SessionKey, *, caller: Caller) -> SummaryAnswer:
        """Hot summary → warm row (backfilling hot) → deterministic extraction → none (see reads.py)."""
        answer = await self._reads.load_best_summary(key, caller=caller)
        self._catch_up(key, answer.tier, answer.turn_count)
        return answer

    def _catch_up(self, key: SessionKey, tier: Tier, turn_count: int) -> None:
        """Schedule the summary of a session read cold whose summary is due (a cadence point is
        behind it): its summary was lost with both caches, or never made (a bulk import, a job
        that failed), and until it is made every read extracts again on the request path. The
        periodic sweep would find it too, but only at its next pass."""
        every_n, start = self._s.summary_every_n_turns, self._s.summary_start_turns
        due = past_cadence_point(turn_count, 0, every_n=every_n, start=start)
        if tier is Tier.COLD and self._s.summaries_enabled and due:
            self.summaries.schedule(key)

    async def context(self, key: SessionKey, want: ContextRequest, *, caller: Caller) -> ContextAnswer:
        """Summary plus recent and older turns within max_chars (see reads.py), led by what the
        session carries over from its user's earlier sessions (`user_memory`, USER_MEMORY by
        default; `user_id`: the user of a session not stored yet), and the gateway's state: from
        the hot tier, or SQL when the hot tier lost it (then cached again); left out (None) when
        neither answers."""
        want = dataclasses.replace(want, user_memory=want.user_memory or self._s.user_memory)
        answer = await self._reads.context(key, want, caller=caller)
        if answer.state is None and answer.turn_count + len(answer.messages) > 0:
            state = await self._errors.sql("get_state", self._store.get_state(key), None)
            if state is not None:
                await self._cache_state(key, state, written=False)
                answer = dataclasses.replace(answer, state=state)
        # Last: the summary job's first reads would otherwise share the loop with this read's
        # own round trips, on the request's time.
        self._catch_up(key, answer.summary_tier, answer.turn_count)
        return answer

    async def get_state(self, key: SessionKey, *, caller: Caller) -> SessionState:
        """The gateway's state of a session (version 0, None when it has none), from SQL.
        Raises NotFound, Forbidden, SqlUnavailable."""
        await self._owned_session(key, caller)
        return await self._store.get_state(key)

    async def put_state(
        self, key: SessionKey, value: dict[str, Any], *, if_match: int | None, caller: Caller
    ) -> SessionState:
        """Store the gateway's state as its next version (only over `if_match` when given), SQL
        first, then the hot tier, run whole (`_whole`). Raises NotFound, Forbidden, Conflict
        (precondition_failed), SqlUnavailable."""

        async def put() -> SessionState:
            state = await self._store.put_state(key, value, if_match=if_match, now=self._clock(), caller=caller)
            await self._cache_state(key, state)
            return state

        return await self._whole(put())

    async def _cache_state(self, key: SessionKey, state: SessionState, *, written: bool = True) -> None:
        # A failed write leaves an older state cached (it carries its version): counted, and
        # tried once more, as for a summary. `written`: a PUT's (HotTier.put_state).
        for attempt in range(2):
            # put_state answers a bool either way: None is the hot tier failing.
            cache = self._hot.put_state(key, state, written=written)
            if await self._errors.hot("put_state", cache, None) is not None:
                return
            if attempt == 0:
                await asyncio.sleep(_HOT_RETRY_S)

    async def recall(self, key: SessionKey, *, caller: Caller, query: str, k: int) -> list[RecallMatch]:
        """The k messages that best match `query` (BM25), best first, each with the raw messages
        of its turn and the slice that covers it. Raises NotFound, Forbidden, SqlUnavailable."""
        info = await self._owned_session(key, caller)
        return await self._history.matches(key, query, info.message_count, k)

    # --- health and background ------------------------------------------------------------

    async def readiness(self) -> dict[str, str]:
        """Each tier's state: `ok`, or `degraded` with reads falling through / writes refused."""
        return await tier_states(self._hot, self._store)

    async def sweep(self) -> None:
        """Close idle sessions and schedule every summary that is due but not done (after a
        crash, a lost lock, or an SQL outage during a summary). While SQL is down there is nothing
        to find: the next sweep after it returns does the work."""
        try:
            await self._sweep()
        except SqlUnavailable as exc:
            self._errors.count("sql", "sweep")
            log.warning("sweep_skipped", error=str(exc))

    async def _sweep(self) -> None:
        if await self._erasures.resume():
            log.info("sweep_finished_erasures")
        if self._store.sinks:
            now = self._clock()
            stale = await self._outbox.release_stale(created_before=now - HELD_MAX_S, now=now, skip=self.summaries.held)
            if released := stale:
                log.info("sweep_released_final_events", count=released)
        if self._s.summaries_enabled:
            due = await self._store.sessions_due(
                every_n=self._s.summary_every_n_turns,
                start_turns=self._s.summary_start_turns,
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
