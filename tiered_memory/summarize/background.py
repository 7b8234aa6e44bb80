"""The summary job in the background: the passes the service asks for, run on the pool
(scheduler.py: one pass per session at a time, within SUMMARY_CONCURRENCY), and the final-summary
event a closed session's last pass releases.

The service calls this and the pool runs the job; neither calls back into the service, so a
summary's path goes one way: service → background → job.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from tiered_memory.errors import SqlUnavailable
from tiered_memory.metrics import Metrics
from tiered_memory.model import SessionKey, key_tenant
from tiered_memory.summarize.job import Outcome, SummaryJob
from tiered_memory.summarize.scheduler import SharedSlots, SingleFlight
from tiered_memory.tiers.sql.store import SqlStore

log = structlog.get_logger("tiered_memory.summarize.background")


class BackgroundSummaries:
    """Background passes of the summary job: `schedule` returns at once, and the pass runs on
    the pool. A closed session's last pass (`after_close`) may be asked to make its summary again
    with the LLM (`refine`), and releases the session's held final-summary event when it ends."""

    def __init__(
        self,
        *,
        job: SummaryJob,
        store: SqlStore,
        slots: SharedSlots,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self._job = job
        self._store = store
        self._slots = slots
        self._clock = clock
        self._pool = SingleFlight(self._pass, on_pending=metrics.pending_summarizations.set)
        # Sessions a client closed whose next background pass makes their summary again with the
        # LLM (a close answers with the deterministic merge, never waiting for the LLM).
        self._refine: set[str] = set()
        # Closed sessions whose final-summary event waits for their last pass (`_released`).
        self._final_pending: set[str] = set()

    @property
    def pending(self) -> int:
        """How many sessions have a pass queued or running."""
        return self._pool.pending

    @property
    def held(self) -> set[str]:
        """The closed sessions whose final-summary event a pass of this process will release:
        the sweeper leaves them to it."""
        return self._final_pending | self._refine

    def schedule(self, key: SessionKey) -> None:
        """Ask for a pass of the session's summary; returns at once."""
        self._pool.schedule(key)

    def after_close(self, key: SessionKey, *, refine: bool) -> None:
        """The last pass of a session whose close committed with its final-summary event held:
        made with the LLM again when `refine`, and the event released when it ends."""
        self._final_pending.add(key)
        if refine:
            self._refine.add(key)
        self._pool.schedule(key)

    async def drain(self, timeout_s: float) -> int:
        """Wait up to timeout_s for running passes, then cancel the rest; returns how many were cancelled."""
        return await self._pool.drain(timeout_s)

    async def _pass(self, key: SessionKey) -> None:
        """A background pass, within SUMMARY_CONCURRENCY. Another replica holding the lock may
        have started before our latest turn was committed, so wait for it and look again rather
        than assume it covers everything. The wait happens outside the concurrency slot, so it
        blocks no other session."""
        # A close asked for the LLM's summary of what it merged deterministically; kept through
        # the retries while another replica holds the lock.
        refine = key in self._refine
        self._refine.discard(key)
        result = await self._job.run_waiting(key, gate=lambda: self._slots.slot(key_tenant(key)), refine=refine)
        if result.outcome is Outcome.LOCKED:
            log.info("summary_locked_elsewhere", session_key=key)
            return
        await self._released(key)

    async def _released(self, key: SessionKey) -> None:
        """After a closed session's last pass: its held final-summary event goes out with the
        summary SQL holds (a pass that wrote released it already, in its transaction; one that
        wrote nothing, the LLM having failed, leaves it to this). A release lost to an outage
        or a crash is the sweeper's (`release_stale`)."""
        if key not in self._final_pending or key in self._refine:
            # A refine is still to run (asked for while this pass was waiting for the lock): the
            # final summary is its.
            return
        self._final_pending.discard(key)
        try:
            await self._store.release_final(key, now=self._clock())
        except SqlUnavailable as exc:
            log.warning("final_event_not_released", session_key=key, error=str(exc))
