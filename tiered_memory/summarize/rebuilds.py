"""Rebuild jobs: `POST …/summary/rebuild` starts one and is answered at once; the job runs in the
background of the process that took the request, and any replica answers how it is going.

- Concurrency: each batch's merge (its LLM call) runs inside a slot of the semaphore that bounds
  background summaries (SUMMARY_CONCURRENCY), so rebuilds and summaries together never exceed it,
  and a long rebuild lets other sessions' summaries run between its batches. A job is `queued`
  until its first slot (or the session's summary lock, held by a pass under way), `running` after.
- One per session, across replicas: the session's lease in the hot tier (jobs.py) names its live
  job; a POST while one is live answers with that job instead of starting another. Once it has
  ended, the next POST starts a new one.
- A job's process renews the lease (LEASE_S) every RENEW_S while the job goes, writing its record
  each time. A lease that lapsed means the process died or lost the hot tier for that long: its
  record, still `queued` or `running`, reads `failed` with reason `lost` (`observed`), and the
  next POST starts afresh. Records are kept RECORD_TTL_S after their last write.
- A job ends `done` or `failed` with a reason code (FAILURES); a failure is never an exception of
  the task. At shutdown, jobs still going after the grace are cancelled and end `cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import structlog

from tiered_memory.errors import Conflict, HotUnavailable, NotFound, Overloaded, SqlUnavailable
from tiered_memory.metrics import Metrics
from tiered_memory.model import JobState, RebuildJob, SessionKey, key_tenant
from tiered_memory.summarize.job import Rebuilt, SummaryJob
from tiered_memory.summarize.scheduler import SharedSlots, drain
from tiered_memory.tiers.errors import TierErrors
from tiered_memory.tiers.jobs import JobStore
from tiered_memory.tiers.sql.store import SqlStore

log = structlog.get_logger("tiered_memory.summarize.rebuilds")

# A lapsed lease is read as a lost job: long enough to ride out a Redis blip or a busy event loop
# (renewed three times within it), short enough that a dead job is told within half a minute.
LEASE_S = 30.0
RENEW_S = 10.0
# How long a job's record is kept after its last write: time for its caller to read the result.
RECORD_TTL_S = 3600.0
# The last write of a job, tried again while the hot tier fails; past that it reads `lost`.
_FINISH_TRIES = 3
_FINISH_RETRY_S = 1.0
# A start that finds a live job whose record is gone (or that ended in between) tries again.
_START_TRIES = 3

# A failed job's reason codes and what each tells its caller.
FAILURES: dict[str, str] = {
    "conflict": "another summary of the session was being written, or was written meanwhile; try again",
    "sql_unavailable": "the message store was unavailable; try again",
    "not_found": "the session was deleted",
    "lost": "the process running the rebuild stopped renewing it (it stopped, or lost the hot tier); try again",
    "cancelled": "the daemon shut down before the rebuild ended; try again",
    "superseded": "another rebuild of the session took its place",
    "overloaded": "the tenant had too much text work queued (TEXT_QUEUE_BYTES); try again",
    "internal": "internal error",
}


def observed(job: RebuildJob, live: bool) -> RebuildJob:
    """The job as a reader must see it: one still going by its record whose lease lapsed is lost."""
    if job.state.ended or live:
        return job
    return dataclasses.replace(job, state=JobState.FAILED, reason="lost")


@dataclass(frozen=True, slots=True)
class Started:
    """The answer to a POST: the session's live job, and whether this POST started it."""

    job: RebuildJob
    started: bool


class _Run:
    """One job while it goes in this process: its current record, written in order."""

    def __init__(
        self,
        jobs: JobStore,
        key: SessionKey,
        job: RebuildJob,
        *,
        clock: Callable[[], float],
        hot_failed: Callable[[], None],
    ) -> None:
        self.key = key
        self.job = job
        self._jobs = jobs
        self._clock = clock
        self._hot_failed = hot_failed
        self._writing = asyncio.Lock()

    async def save(self, job: RebuildJob | None, *, lease_s: float, ttl_s: float) -> bool:
        """Write the record (`job` becoming the current one) and renew the lease; False when
        another job holds the lease. A hot tier that fails is no answer: True, carry on."""
        async with self._writing:
            if job is not None:
                self.job = job
            try:
                return await self._jobs.renew(self.key, self.job, lease_s=lease_s, ttl_s=ttl_s)
            except HotUnavailable:
                self._hot_failed()
                return True

    async def finish(self, job: RebuildJob, *, ttl_s: float) -> bool:
        """Write the record of the ended job; False when the hot tier failed every time."""
        self.job = job
        for attempt in range(_FINISH_TRIES):
            try:
                async with self._writing:
                    await self._jobs.finish(self.key, job, ttl_s=ttl_s)
            except HotUnavailable:
                self._hot_failed()
                if attempt + 1 < _FINISH_TRIES:
                    await asyncio.sleep(_FINISH_RETRY_S)
            else:
                return True
        return False

    def failed(self, reason: str) -> RebuildJob:
        return dataclasses.replace(self.job, state=JobState.FAILED, ended_at=self._clock(), reason=reason)

    def done(self, rebuilt: Rebuilt) -> RebuildJob:
        s = rebuilt.summary
        return dataclasses.replace(
            self.job,
            state=JobState.DONE,
            ended_at=self._clock(),
            version=s.version if s else 0,
            covered_turns=s.covered_turns if s else 0,
            source=s.source if s else None,
            slices=rebuilt.slices,
        )


class Rebuilds:
    """Starts, runs and reports this process's rebuild jobs. `slots` are the slots background
    summaries take (SUMMARY_CONCURRENCY); `max_pending` bounds the jobs queued or running here
    (None: no bound)."""

    def __init__(
        self,
        *,
        job: SummaryJob,
        store: SqlStore,
        jobs: JobStore,
        slots: SharedSlots,
        metrics: Metrics,
        max_pending: int | None,
        lease_s: float = LEASE_S,
        renew_s: float = RENEW_S,
        ttl_s: float = RECORD_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._job = job
        self._store = store
        self._jobs = jobs
        self._slots = slots
        self._metrics = metrics
        self._errors = TierErrors(metrics.tier_errors)
        self._max_pending = max_pending
        self._lease = lease_s
        self._renew = renew_s
        self._ttl = ttl_s
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        """Jobs queued or running in this process."""
        return len(self._tasks)

    async def start(self, key: SessionKey) -> Started:
        """Start a rebuild of the session, or answer with its live one. Raises HotUnavailable
        (nothing started: the guard and the state other replicas read live there), Overloaded
        when this process has `max_pending` jobs going, and Conflict when a live job's record
        could not be read (it reappears within RENEW_S)."""
        for _ in range(_START_TRIES):
            if self._max_pending is not None and len(self._tasks) >= self._max_pending:
                # No job is started that this process would not run; a live one is still answered.
                holder_id = await self._jobs.holder(key)
                if holder_id is None:
                    raise Overloaded(
                        f"this process has {self._max_pending} rebuilds queued or running"
                        " (MAX_INFLIGHT_REQUESTS); retry"
                    )
            else:
                job = RebuildJob(secrets.token_hex(16), JobState.QUEUED, queued_at=self._clock())
                holder_id = await self._jobs.start(key, job, lease_s=self._lease, ttl_s=self._ttl)
                if holder_id is None:
                    self._launch(_Run(self._jobs, key, job, clock=self._clock, hot_failed=self._hot_failed))
                    log.info("rebuild_queued", session_key=key, job_id=job.job_id)
                    return Started(job, True)
            found, live = await self._jobs.read(key, holder_id)
            if found is not None and live:
                return Started(found, False)
        raise Conflict("a rebuild of this session is starting; try again")

    def _hot_failed(self) -> None:
        self._errors.count("hot", "rebuild_job")

    async def get(self, key: SessionKey, job_id: str) -> RebuildJob:
        """The job as it is now. Raises NotFound for a job of another session, one never started,
        or one that ended more than RECORD_TTL_S ago; HotUnavailable."""
        job, live = await self._jobs.read(key, job_id)
        if job is None:
            raise NotFound("no such rebuild of this session (none was started, or it ended over an hour ago)")
        return observed(job, live)

    def _launch(self, run: _Run) -> None:
        task = asyncio.create_task(self._execute(run), name=f"rebuild:{run.key}")
        # Kept until done (the loop holds tasks weakly), and what drain waits for.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, run: _Run) -> None:
        work = asyncio.create_task(self._work(run), name=f"rebuild-work:{run.key}")
        try:
            ended = await self._heartbeat(run, work)
        except asyncio.CancelledError:
            await _stop(work)
            await self._end(run, run.failed("cancelled"))
            raise
        await self._end(run, ended)

    async def _heartbeat(self, run: _Run, work: asyncio.Task[RebuildJob]) -> RebuildJob:
        """`work`'s answer, the lease renewed every RENEW_S until it comes. A job whose lease
        another job took (after this process lost the hot tier for a whole lease) stops: two
        rebuilds of a session would only refuse each other at the summary lock."""
        while True:
            done, _ = await asyncio.wait({work}, timeout=self._renew)
            if done:
                return work.result()
            if not await run.save(None, lease_s=self._lease, ttl_s=self._ttl):
                log.warning("rebuild_superseded", session_key=run.key, job_id=run.job.job_id)
                await _stop(work)
                return run.failed("superseded")

    async def _work(self, run: _Run) -> RebuildJob:
        """The rebuild itself, its failures turned into the job's reason."""
        key = run.key

        @contextlib.asynccontextmanager
        async def slot() -> AsyncIterator[None]:
            async with self._slots.slot(key_tenant(key)):
                if run.job.state is JobState.QUEUED:
                    running = dataclasses.replace(run.job, state=JobState.RUNNING, started_at=self._clock())
                    await run.save(running, lease_s=self._lease, ttl_s=self._ttl)
                yield

        try:
            if await self._store.get_session(key) is None:
                return run.failed("not_found")
            return run.done(await self._job.rebuild(key, gate=slot))
        except Conflict:
            # A delete that came in between also ends in the summary write's refusal.
            return run.failed("not_found" if await self._deleted(key) else "conflict")
        except SqlUnavailable:
            return run.failed("sql_unavailable")
        except Overloaded:
            return run.failed("overloaded")
        except Exception:
            log.exception("rebuild_failed", session_key=key, job_id=run.job.job_id)
            return run.failed("internal")

    async def _deleted(self, key: SessionKey) -> bool:
        try:
            return await self._store.get_session(key) is None
        except SqlUnavailable:
            return False

    async def _end(self, run: _Run, job: RebuildJob) -> None:
        written = await run.finish(job, ttl_s=self._ttl)
        self._metrics.rebuilds.labels(job.reason or job.state.value).inc()
        if not written:
            # It reads `lost` once its lease lapsed; the summary it wrote (if done) stands.
            log.warning("rebuild_state_not_written", session_key=run.key, job_id=job.job_id)
        log.info(
            "rebuild_ended",
            session_key=run.key,
            job_id=job.job_id,
            state=job.state.value,
            reason=job.reason,
            version=job.version,
            slices=job.slices,
        )

    async def drain(self, timeout_s: float) -> int:
        """Wait up to timeout_s for the jobs going here, then cancel the rest (each ends
        `cancelled`); returns how many were cancelled."""
        return await drain(set(self._tasks), timeout_s)


async def _stop(task: asyncio.Task[RebuildJob]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
