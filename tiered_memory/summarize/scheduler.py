"""Background execution for summaries: one job per session at a time, and a periodic sweep.

Knows nothing of what a job does: the pool runs what it is handed (background.py hands in the
summary job's pass). This keeps summarization off the request path: schedule returns at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

import structlog

from tiered_memory.model import SessionKey

log = structlog.get_logger("tiered_memory.scheduler")


@dataclass(slots=True)
class _Flight:
    task: asyncio.Task[None]
    rerun: bool = False


class SingleFlight:
    """Runs `job(key)` at most once at a time per key. Scheduling a key whose job is running
    makes the job run once more afterwards, so no request is lost and none runs twice at once."""

    def __init__(
        self,
        job: Callable[[SessionKey], Awaitable[None]],
        *,
        on_pending: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self._job = job
        self._flights: dict[SessionKey, _Flight] = {}
        self._on_pending = on_pending

    @property
    def pending(self) -> int:
        return len(self._flights)

    def schedule(self, key: SessionKey) -> None:
        """Ask for a run of key's job; returns at once."""
        flight = self._flights.get(key)
        if flight is None:
            self._flights[key] = _Flight(task=asyncio.create_task(self._loop(key), name=f"summarize:{key}"))
            self._on_pending(len(self._flights))
        else:
            flight.rerun = True

    async def _loop(self, key: SessionKey) -> None:
        # The flight is registered right after this task is created, before it first runs.
        await asyncio.sleep(0)
        flight = self._flights[key]
        try:
            while True:
                flight.rerun = False
                try:
                    await self._job(key)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("summary_job_failed", session_key=key)
                if not flight.rerun:
                    break
        finally:
            del self._flights[key]
            self._on_pending(len(self._flights))

    async def drain(self, timeout_s: float) -> int:
        """Wait up to timeout_s for running jobs, then cancel the rest; returns how many were cancelled."""
        return await drain([f.task for f in self._flights.values()], timeout_s)


async def drain(tasks: Collection[asyncio.Task[Any]], timeout_s: float) -> int:
    """Wait up to timeout_s for `tasks`, then cancel the rest and wait for them to end; returns
    how many were cancelled (the shutdown's drain of background work)."""
    if not tasks:
        return 0
    _done, still = await asyncio.wait(tasks, timeout=timeout_s)
    for t in still:
        t.cancel()
    # Every cancelled task is waited for, whatever one of them ends with.
    await asyncio.gather(*still, return_exceptions=True)
    return len(still)


class SharedSlots:
    """SUMMARY_CONCURRENCY slots that every tenant's summaries and rebuilds share, of which one
    tenant holds at most `share` at once: one tenant's backlog (a rebuild of a long session, an
    import's summaries, a slow LLM) leaves the others slots to run in. Waiters get a slot in the
    order they asked for one, a tenant past its share waiting apart."""

    def __init__(self, total: int, *, share: int) -> None:
        self._all = asyncio.Semaphore(total)
        self._share = max(1, share)
        # Each tenant's own bound, while one of its summaries holds or waits for a slot.
        self._tenants: dict[str, tuple[asyncio.Semaphore, int]] = {}

    @property
    def tenants(self) -> int:
        """How many tenants hold or wait for a slot."""
        return len(self._tenants)

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        """Hold one slot for `tenant` (its share first, then one of all)."""
        own, users = self._tenants.get(tenant) or (asyncio.Semaphore(self._share), 0)
        self._tenants[tenant] = (own, users + 1)
        try:
            async with own, self._all:
                yield
        finally:
            own, users = self._tenants[tenant]
            if users == 1:
                del self._tenants[tenant]
            else:
                self._tenants[tenant] = (own, users - 1)


class Periodic:
    """Calls `tick()` now and then every `interval_s` until stopped; a failing tick is logged."""

    def __init__(self, tick: Callable[[], Awaitable[None]], *, interval_s: float, name: str) -> None:
        self._tick = tick
        self._interval = interval_s
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic_tick_failed", task=self._name)
            await asyncio.sleep(self._interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
