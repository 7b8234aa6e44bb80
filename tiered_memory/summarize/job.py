"""Bringing one session's summary up to date: the job the scheduler runs in the background.

Incremental by construction: it reads the stored summary and only the turns past its watermark,
merges them (LLM first, the deterministic extractor when the LLM fails or is absent), writes SQL
first with a version check, then Redis, and so advances the watermark. A crash between the two
writes leaves SQL ahead, which the read path and backfill repair.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import structlog

from tiered_memory.errors import Conflict, LlmFailed, SqlUnavailable
from tiered_memory.metrics import Metrics
from tiered_memory.model import Message, SessionInfo, SessionKey, Slice, Summary, SummarySource, key_tenant
from tiered_memory.payload import rule_payload
from tiered_memory.summarize.extractive import Extraction, Extractor
from tiered_memory.summarize.lane import TextLane, TextQueueFull, Ticket, text_bytes
from tiered_memory.summarize.llm import LlmSummarizer
from tiered_memory.summarize.topics import TopicTagger
from tiered_memory.text.dialogue import for_summary
from tiered_memory.text.language import as_spoken
from tiered_memory.tiers.errors import TierErrors
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tracing import Tracing

log = structlog.get_logger("tiered_memory.summarize.job")
# The turns of a backlog read from SQL at once (rounded to whole batches).
_PAGE_TURNS = 120
# ... and at most about this much text: the SQL driver parses the rows on the event loop, where a
# page of 32 KB messages (7.7 MB at 120 turns) held every tenant's requests while it was read.
_PAGE_CHARS = 256 * 1024


def _page_turns(info: SessionInfo) -> int:
    """Turns read from SQL at a time for a summary backlog: _PAGE_TURNS, fewer when the
    session's turns are long (its mean), one batch at least (the caller rounds to batches)."""
    mean = info.content_chars / max(1, info.turn_count)
    return max(1, min(_PAGE_TURNS, int(_PAGE_CHARS / max(1.0, mean))))


class Outcome(enum.StrEnum):
    WRITTEN = "written"
    UP_TO_DATE = "up_to_date"
    NO_SESSION = "no_session"
    LOCKED = "locked"
    STALE = "stale"
    FAILED = "failed"


# Entered around each batch's merge (its LLM call): how a rebuild runs within SUMMARY_CONCURRENCY.
Gate = Callable[[], AbstractAsyncContextManager[None]]


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """What a rebuild wrote: the summary (None when the session has no completed turn) and how
    many slices now lead back to its messages."""

    summary: Summary | None
    slices: int


@dataclass(frozen=True, slots=True)
class JobResult:
    outcome: Outcome
    hot_written: bool = False
    """Whether the hot tier now holds the summary SQL has (written or refreshed by this pass)."""


# One more try of a hot write that failed: a Redis blip must not leave an older summary
# answering as hot for a whole TTL while SQL already has a newer one.
_HOT_RETRY_S = 0.2
# While another pass (of this process or another replica) holds a session's summary lock, look
# again this often, for at most this long: a pass, even an LLM's, holds it for seconds.
LOCK_RETRY_S = 0.2
LOCK_WAIT_S = 10.0
# A slice's own digest: a few sentences on the range it covers.
_SLICE_CHARS = 400


def next_version(summary: Summary, stored: Summary | None) -> Summary:
    """`summary` stamped as the version after `stored` (the SQL version check and the caches'
    newer-wins rule compare it), as first made when `stored` was."""
    if stored is None:
        return dataclasses.replace(summary, version=1)
    return dataclasses.replace(summary, version=stored.version + 1, created_at=stored.created_at)


class SummaryJob:
    """Summarizes the uncovered completed turns of a session and stores the result in both tiers."""

    def __init__(
        self,
        *,
        store: SqlStore,
        hot: HotTier,
        text: TextLane,
        tagger: TopicTagger,
        llm: LlmSummarizer | None,
        metrics: Metrics,
        max_chars: int,
        lock_ttl_s: float,
        summary_format: str = "structured",
        batch_turns: int = 6,
        clock: Callable[[], float] = time.time,
        tracing: Tracing | None = None,
    ) -> None:
        self._store = store
        self._tracing = tracing or Tracing.off()
        self._hot = hot
        self._text = text
        self._tagger = tagger
        self._llm = llm
        self._metrics = metrics
        self._errors = TierErrors(metrics.tier_errors)
        self._max_chars = max_chars
        self._format = summary_format
        self._batch = batch_turns
        self._lock_ttl = lock_ttl_s
        self._clock = clock

    async def run(self, key: SessionKey, *, use_llm: bool = True, refine: bool = False) -> JobResult:
        """One pass; never raises for store or LLM failures (they are counted and logged, and
        the sweeper finds the session again because its watermark did not move). With
        use_llm=False the deterministic extractor merges, whatever LLM is configured.

        With `refine`, a summary that is up to date but not the LLM's, of a session of at most
        COMPRESSION_BATCH_TURNS turns (one call: a short call that closed before its first
        cadence point, or one whose LLM failed), is made again by the LLM as the next version;
        it stays as it is when the LLM fails again.

        Traced in a trace of its own, linked to the request that scheduled it (the pass outlives
        the request)."""
        if not self._tracing.enabled:
            return await self._run(key, use_llm=use_llm, refine=refine)
        with self._tracing.linked_root("summary job", {"tiered_memory.session_key": key}) as span:
            result = await self._run(key, use_llm=use_llm, refine=refine)
            if span is not None:
                span.set_attribute("tiered_memory.outcome", result.outcome.value)
            return result

    async def run_waiting(
        self,
        key: SessionKey,
        *,
        wait_s: float = LOCK_WAIT_S,
        gate: Gate | None = None,
        use_llm: bool = True,
        refine: bool = False,
    ) -> JobResult:
        """`run`, and again every LOCK_RETRY_S while another pass holds the session's summary
        lock, for at most `wait_s` (the last result is then LOCKED). Each pass runs within `gate`
        (SUMMARY_CONCURRENCY); the waits between them hold no slot, so they block no other
        session."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            async with gate() if gate is not None else contextlib.nullcontext():
                result = await self.run(key, use_llm=use_llm, refine=refine)
            if result.outcome is not Outcome.LOCKED or loop.time() >= deadline:
                return result
            await asyncio.sleep(LOCK_RETRY_S)

    async def _run(self, key: SessionKey, *, use_llm: bool, refine: bool) -> JobResult:
        # Without Redis ("") the lock cannot span replicas; the SQL version check still keeps a
        # concurrent writer from overwriting a newer summary.
        token = await self._errors.hot("lock", self._hot.try_lock(key, self._lock_ttl), "")
        if token is None:
            return JobResult(Outcome.LOCKED)
        try:
            return await self._run_locked(key, token, self._llm if use_llm else None, refine=refine)
        except SqlUnavailable as exc:
            source = SummarySource.LLM if self._llm and use_llm else SummarySource.DETERMINISTIC
            self._errors.count("sql", "summarize")
            self._metrics.summarizations.labels(source.value, "failed").inc()
            log.warning("summary_failed", session_key=key, error=str(exc))
            return JobResult(Outcome.FAILED)
        except TextQueueFull:
            # The tenant's text work is at its bound: this pass waits for the next sweep.
            self._metrics.summarizations.labels(SummarySource.DETERMINISTIC.value, "deferred").inc()
            log.info("summary_deferred", session_key=key)
            return JobResult(Outcome.FAILED)
        finally:
            await self._unlock(key, token)

    async def _run_locked(
        self, key: SessionKey, token: str, llm: LlmSummarizer | None, *, refine: bool = False
    ) -> JobResult:
        prev, info = await self._store.get_summary(key)
        if info is None:
            return JobResult(Outcome.NO_SESSION)
        covered = prev.covered_turns if prev else 0
        target = info.turn_count
        if target <= covered:
            short = 0 < target <= self._batch
            if refine and short and llm is not None and prev is not None and prev.source is not SummarySource.LLM:
                return await self._refine(key, token, prev, info.user_id, target, llm)
            cached = prev is not None and await self._cache(key, prev)
            return JobResult(Outcome.UP_TO_DATE, hot_written=cached)
        started = time.perf_counter()
        # A backlog (hours of LLM outage, a bulk import) is read a page of turns at a time, not
        # all at once; each page is merged in batches as before, and one summary is written.
        summary, pieces = prev, []
        page = self._batch * max(1, _page_turns(info) // self._batch)
        start = covered
        # Where the previous page ended: the next is read forwards from there.
        after_seq: int | None = None
        while start < target:
            if start > covered:
                await self._keep_lock(key, token)
            end = min(start + page, target)
            rows = await self._store.messages_in_turns(key, after_turn=start, through_turn=end, after_seq=after_seq)
            after_seq = rows[-1].seq if rows else None
            summary, more = await self._merge_batches(
                key, token, summary, rows, covered=start, target=end, llm=llm, stored=prev
            )
            pieces += more
            start = end
        assert summary is not None
        source = summary.source
        if not await self._store.put_summary(key, summary, user_id=info.user_id, turn_count=target, slices=pieces):
            self._metrics.summarizations.labels(source.value, "stale").inc()
            log.info("summary_stale", session_key=key, version=summary.version)
            return JobResult(Outcome.STALE)
        cached = await self._cache(key, summary)
        if cached and await self._store.get_session(key) is None:
            # Deleted between our SQL write and our hot write: take the hot copy back out.
            # (DELETE clears SQL before Redis, so either it or this check removes it.)
            await self._forget(key)
            return JobResult(Outcome.NO_SESSION)
        self._metrics.summarizations.labels(source.value, "ok").inc()
        self._metrics.summarization_seconds.labels(source.value).observe(time.perf_counter() - started)
        log.info(
            "summary_written",
            session_key=key,
            source=source.value,
            covered_turns=target,
            new_turns=target - covered,
            version=summary.version,
        )
        return JobResult(Outcome.WRITTEN, hot_written=cached)

    async def _merge_batches(
        self,
        key: SessionKey,
        token: str,
        prev: Summary | None,
        rows: list[Message],
        *,
        covered: int,
        target: int,
        llm: LlmSummarizer | None,
        stored: Summary | None,
        gate: Gate | None = None,
    ) -> tuple[Summary, list[Slice]]:
        """Merge turns covered+1..target into `prev`, at most COMPRESSION_BATCH_TURNS turns per
        call, one slice per batch, each inside `gate` when one is given. The result is the next
        version of the `stored` summary (`prev`, or the one a merge from nothing replaces)."""
        running = prev
        pieces: list[Slice] = []
        start = covered
        while start < target:
            if start > covered:
                await self._keep_lock(key, token)
            end = min(start + self._batch, target)
            batch = [m for m in rows if start < m.turn <= end]
            async with gate() if gate is not None else contextlib.nullcontext():
                running, piece = await self._merge(key, running, batch, covered=start, target=end, llm=llm)
            if piece:
                pieces.append(piece)
            start = end
        assert running is not None
        final = next_version(running, stored)
        return final, [dataclasses.replace(p, summary_version=final.version) for p in pieces]

    async def _merge(
        self,
        key: SessionKey,
        prev: Summary | None,
        rows: list[Message],
        *,
        covered: int,
        target: int,
        llm: LlmSummarizer | None,
    ) -> tuple[Summary, Slice | None]:
        """The summary of turns 1..target from `prev` (covering 1..covered) and the messages of
        turns covered+1..target, with the slice recording that step: the rule-based merge, made
        again by the LLM when there is one and it answers."""
        # A reply that was stopped, failed or never finished streaming is not an answer.
        new = for_summary(as_spoken([m for m in rows if m.answered]))
        ticket = Ticket(key_tenant(key), text_bytes(new))
        extraction, payload = await self._rule_merge(ticket, prev, new)
        text, source = extraction.text, SummarySource.DETERMINISTIC
        if llm is not None and new:
            try:
                prev_payload = prev.structured.get("payload") if prev else None
                text, payload = await self._ask(key, llm, prev, prev_payload, new, payload)
                source = SummarySource.LLM
            except LlmFailed as exc:
                # Rejected or failed: the rule-based merge above stands, and the reason is counted.
                self._metrics.llm_failures.labels(exc.reason).inc()
                # While the breaker is open every summary lands here; the opening was logged.
                level = log.debug if exc.reason == "circuit_open" else log.warning
                level("llm_summary_failed", session_key=key, reason=exc.reason, error=str(exc))
        now = self._clock()
        made = Summary(
            text=text,
            covered_turns=target,
            version=0,
            source=source,
            updated_at=now,
            created_at=now,
            topics=self._tagger.tags(
                [text, *(m.content for m in new)], [*(prev.topics if prev else ()), *extraction.topics]
            ),
            structured={**extraction.structured, "payload": payload},
            compressions=(prev.compressions if prev else 0) + 1,
        )
        summary = next_version(made, prev)
        if not rows:
            return summary, None
        slice_llm = llm if source is SummarySource.LLM else None
        return summary, await self._slice(ticket, new, rows, covered=covered, summary=summary, llm=slice_llm)

    async def _rule_merge(
        self, ticket: Ticket, prev: Summary | None, new: list[Message]
    ) -> tuple[Extraction, dict[str, Any]]:
        """The deterministic merge of `new` into `prev`: the extractor's text and facts, and the
        structured payload built from them."""
        extraction = await self._text.call(
            ticket,
            Extractor.extract,
            new,
            previous_structured=prev.structured if prev else None,
            # The LLM's text is carried into the rule-based merge; a deterministic text is already
            # in the structured facts.
            previous_text=prev.text if prev and (prev.source is SummarySource.LLM or not prev.structured) else None,
            max_chars=self._max_chars,
        )
        payload = rule_payload(
            text=extraction.text,
            structured=extraction.structured,
            new=new,
            topics=extraction.topics,
            previous=prev.structured.get("payload") if prev else None,
            max_chars=self._max_chars,
        )
        return extraction, payload

    async def _slice(
        self,
        ticket: Ticket,
        new: list[Message],
        rows: list[Message],
        *,
        covered: int,
        summary: Summary,
        llm: LlmSummarizer | None,
    ) -> Slice:
        """The slice of one merge step: its own digest of just this range (so it reads on its
        own), which messages it covers, and, made by the LLM (`llm`), with which prompt."""
        digest = await self._text.call(ticket, Extractor.extract, new, max_chars=min(_SLICE_CHARS, self._max_chars))
        return Slice(
            from_turn=covered + 1,
            to_turn=summary.covered_turns,
            first_seq=rows[0].seq,
            last_seq=rows[-1].seq,
            text=digest.text,
            source=summary.source,
            summary_version=summary.version,
            created_at=summary.updated_at,
            model=llm.model if llm else None,
            prompt_id=llm.prompt_id_for(new) if llm else None,
        )

    async def _ask(
        self,
        key: SessionKey,
        llm: LlmSummarizer,
        prev: Summary | None,
        prev_payload: Mapping[str, Any] | None,
        new: list[Message],
        payload: dict[str, Any],
    ) -> tuple[str, dict[str, Any]]:
        """The LLM's summary text and payload of `new` merged into `prev` (in the text format, the
        rule-based `payload` with the LLM's text). Raises LlmFailed."""
        # The summarizer logs what grounding drops; this names the session on those lines.
        with structlog.contextvars.bound_contextvars(session_key=key):
            if self._format == "structured":
                merged = await llm.summarize_structured(prev_payload, new)
                return merged["summary"], merged
            text = await llm.summarize(prev.text if prev else None, new)
            return text, {**payload, "summary": text}

    async def rebuild(self, key: SessionKey, *, gate: Gate | None = None) -> Rebuilt:
        """Recompute every slice and the summary from the cold tier, COMPRESSION_BATCH_TURNS at a
        time (after a prompt or model change), each batch inside `gate` when one is given (a
        SUMMARY_CONCURRENCY slot: a long rebuild lets other summaries run between its batches).
        Raises SqlUnavailable, or Conflict when another summarizer holds the lock or wrote meanwhile."""
        token = await self._lock_or_raise(key)
        try:
            prev, info = await self._store.get_summary(key)
            if info is None or info.turn_count == 0:
                return Rebuilt(None, 0)
            final, pieces = await self._remade(key, token, prev, info.turn_count, self._llm, gate)
            if not await self._store.put_summary(
                key, final, user_id=info.user_id, turn_count=info.turn_count, slices=pieces, replace_slices=True
            ):
                raise Conflict("the summary changed while it was being rebuilt; try again")
            await self._cache(key, final)
            log.info("summary_rebuilt", session_key=key, slices=len(pieces), version=final.version)
            return Rebuilt(final, len(pieces))
        finally:
            await self._unlock(key, token)

    async def _remade(
        self,
        key: SessionKey,
        token: str,
        prev: Summary | None,
        turns: int,
        llm: LlmSummarizer | None,
        gate: Gate | None = None,
    ) -> tuple[Summary, list[Slice]]:
        """Every slice and the summary of turns 1..`turns` made anew, from nothing, but as the
        next version of `prev` (so that caches take it)."""
        rows = await self._store.messages_in_turns(key, after_turn=0, through_turn=turns)
        return await self._merge_batches(
            key, token, None, rows, covered=0, target=turns, llm=llm, stored=prev, gate=gate
        )

    async def _refine(
        self, key: SessionKey, token: str, prev: Summary, user_id: str | None, turns: int, llm: LlmSummarizer
    ) -> JobResult:
        """`prev`, the extractor's, made again by the LLM; written only when the LLM answered."""
        started = time.perf_counter()
        final, pieces = await self._remade(key, token, prev, turns, llm)
        if final.source is not SummarySource.LLM:
            # The LLM failed again (counted by _merge): the summary stands as it is.
            return JobResult(Outcome.UP_TO_DATE, hot_written=await self._cache(key, prev))
        if not await self._store.put_summary(
            key, final, user_id=user_id, turn_count=turns, slices=pieces, replace_slices=True
        ):
            self._metrics.summarizations.labels(final.source.value, "stale").inc()
            return JobResult(Outcome.STALE)
        cached = await self._cache(key, final)
        if cached and await self._store.get_session(key) is None:
            # Deleted between our SQL write and our hot write (as in _run_locked).
            await self._forget(key)
            return JobResult(Outcome.NO_SESSION)
        self._metrics.summarizations.labels(final.source.value, "ok").inc()
        self._metrics.summarization_seconds.labels(final.source.value).observe(time.perf_counter() - started)
        log.info("summary_refined", session_key=key, covered_turns=turns, version=final.version)
        return JobResult(Outcome.WRITTEN, hot_written=cached)

    async def _keep_lock(self, key: SessionKey, token: str) -> None:
        # The lock lasts about one LLM call; a backlog of several batches renews it before each
        # further batch, so another replica does not start on the same turns meanwhile.
        if not token:
            return
        # A hot tier that fails is counted, not taken for a lost lock.
        if not await self._errors.hot("lock", self._hot.extend_lock(key, token, self._lock_ttl), True):
            log.warning("summary_lock_lost", session_key=key)

    @contextlib.asynccontextmanager
    async def holding(self, key: SessionKey) -> AsyncIterator[None]:
        """The session's summary lock, held around a change of messages a summary would read
        (a patch): no summary reads them meanwhile. Raises Conflict when a summary keeps it."""
        token = await self._lock_or_raise(key)
        try:
            yield
        finally:
            await self._unlock(key, token)

    async def _unlock(self, key: SessionKey, token: str) -> None:
        # "" means the lock could not be taken because Redis was down: nothing to release.
        if not token:
            return
        await self._errors.hot("unlock", self._hot.unlock(key, token), None)

    async def _lock_or_raise(self, key: SessionKey) -> str:
        deadline = asyncio.get_running_loop().time() + LOCK_WAIT_S
        while True:
            token = await self._errors.hot("lock", self._hot.try_lock(key, self._lock_ttl), "")
            if token is not None:
                return token
            if asyncio.get_running_loop().time() >= deadline:
                raise Conflict("a summary of this session is being made; try again")
            await asyncio.sleep(LOCK_RETRY_S)

    async def cache_stored(self, key: SessionKey) -> bool:
        """Copy the summary SQL holds into the hot tier, without the summary lock: the hot
        write keeps a newer cached version, so a writer holding the lock loses nothing. True
        when the hot tier holds it (or a newer one). For a close whose pass found another
        writer's lock: its answer says whether Redis holds the summary, whichever process
        wrote it and whenever that process's own hot write lands."""
        prev, info = await self._store.get_summary(key)
        if prev is None or info is None:
            return False
        cached = await self._cache(key, prev)
        if cached and await self._store.get_session(key) is None:
            # Deleted meanwhile (as in _run_locked).
            await self._forget(key)
            return False
        return cached

    async def _cache(self, key: SessionKey, summary: Summary) -> bool:
        for attempt in range(2):
            # put_summary answers a bool either way: None is the hot tier failing.
            if await self._errors.hot("put_summary", self._hot.put_summary(key, summary), None) is not None:
                return True
            if attempt == 0:
                await asyncio.sleep(_HOT_RETRY_S)
        log.warning("summary_not_cached", session_key=key, version=summary.version)
        return False

    async def _forget(self, key: SessionKey) -> None:
        await self._errors.hot("delete", self._hot.delete(key), None)
