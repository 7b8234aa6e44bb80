"""Rebuild jobs' records and leases in the hot tier, where every replica reads them: in Redis
(tiers/redis/jobs.py) or, on the embedded default, in process memory (`MemoryJobs`).

A session has at most one *live* job: the one whose id its lease holds. The lease expires unless
the job's process renews it, so a job whose process died stops being live by itself, and its
record, which still says `queued` or `running`, is then known to be lost. Records are kept by job
id for a TTL after their last write, so a job that ended can still be read by whoever polls it.
What the states mean, and how long leases and records last, is the caller's (rebuilds.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from tiered_memory.lru import Lru
from tiered_memory.model import RebuildJob, SessionKey

# Job records the embedded default keeps at most, the least recently written dropped first.
_MAX_RECORDS = 10_000


class JobStore(Protocol):
    async def start(self, key: SessionKey, job: RebuildJob, *, lease_s: float, ttl_s: float) -> str | None:
        """Make `job` the session's live job and write its record, unless another job's lease
        is live: None when `job` started, else the id of the live job (nothing written)."""
        ...

    async def renew(self, key: SessionKey, job: RebuildJob, *, lease_s: float, ttl_s: float) -> bool:
        """Write the record of a job still going and give its lease `lease_s` more (taking it
        again if it expired meanwhile); False, the record written all the same, when another job
        holds the lease now."""
        ...

    async def finish(self, key: SessionKey, job: RebuildJob, *, ttl_s: float) -> None:
        """Write the record of a job that ended, and release its lease if it still holds it."""
        ...

    async def read(self, key: SessionKey, job_id: str) -> tuple[RebuildJob | None, bool]:
        """A job's record (None when unknown or expired) and whether its lease is live."""
        ...

    async def holder(self, key: SessionKey) -> str | None:
        """The id of the session's live job; None when it has none."""
        ...


class MemoryJobs:
    """Jobs in process memory, for the one process of the embedded default."""

    def __init__(self, *, max_records: int = _MAX_RECORDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._records: Lru[tuple[str, str], tuple[RebuildJob, float]] = Lru(max_records)
        # Session → (live job id, lease deadline); at most one entry per job still going.
        self._leases: dict[str, tuple[str, float]] = {}
        self._clock = clock

    def _holder(self, key: SessionKey) -> str | None:
        lease = self._leases.get(key)
        if lease is None:
            return None
        if lease[1] <= self._clock():
            del self._leases[key]
            return None
        return lease[0]

    def _put(self, key: SessionKey, job: RebuildJob, ttl_s: float) -> None:
        self._records.put((key, job.job_id), (job, self._clock() + ttl_s))

    async def start(self, key: SessionKey, job: RebuildJob, *, lease_s: float, ttl_s: float) -> str | None:
        holder = self._holder(key)
        if holder is not None:
            return holder
        self._leases[key] = (job.job_id, self._clock() + lease_s)
        self._put(key, job, ttl_s)
        return None

    async def renew(self, key: SessionKey, job: RebuildJob, *, lease_s: float, ttl_s: float) -> bool:
        self._put(key, job, ttl_s)
        holder = self._holder(key)
        if holder is not None and holder != job.job_id:
            return False
        self._leases[key] = (job.job_id, self._clock() + lease_s)
        return True

    async def finish(self, key: SessionKey, job: RebuildJob, *, ttl_s: float) -> None:
        self._put(key, job, ttl_s)
        if self._holder(key) == job.job_id:
            del self._leases[key]

    async def read(self, key: SessionKey, job_id: str) -> tuple[RebuildJob | None, bool]:
        found = self._records.get((key, job_id))
        if found is not None and found[1] <= self._clock():
            self._records.pop((key, job_id))
            found = None
        return (found[0] if found else None), self._holder(key) == job_id

    async def holder(self, key: SessionKey) -> str | None:
        return self._holder(key)

    def clear(self) -> None:
        """Forget every record and lease (the hot tier lost, as a Redis flush loses them)."""
        self._records.clear()
        self._leases.clear()
