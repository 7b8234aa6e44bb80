"""The rebuild jobs' contract (tiers/jobs.py), run against the in-process store and a real Redis
(the multiplexed connection and redis-py's): one live job per session by its lease, records kept
by job id, a lease that lapses without its process, and a record that outlives its job."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator

import pytest

from tests.helpers.daemon import new_sid
from tests.helpers.hot import RECENT, tier_of
from tiered_memory.model import JobState, RebuildJob, SessionKey, SummarySource
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.jobs import JobStore
from tiered_memory.tiers.redis.keys import Keys


@pytest.fixture(params=["memory", "redis", "redis-py"])
async def hot(request: pytest.FixtureRequest) -> AsyncIterator[HotTier]:
    async for tier in tier_of(request, RECENT):
        yield tier


def queued() -> RebuildJob:
    return RebuildJob(secrets.token_hex(16), JobState.QUEUED, queued_at=1000.5)


async def test_one_live_job_per_session(hot: HotTier) -> None:
    """A start while another job's lease is live writes nothing and names that job; another
    session is free; a job that finished frees its session and keeps its record."""
    jobs: JobStore = hot.jobs
    sid, other = new_sid(), new_sid()
    first, second = queued(), queued()
    assert await jobs.start(sid, first, lease_s=30, ttl_s=60) is None
    assert await jobs.start(sid, second, lease_s=30, ttl_s=60) == first.job_id
    assert await jobs.read(sid, second.job_id) == (None, False)
    assert await jobs.read(sid, first.job_id) == (first, True)
    assert await jobs.holder(sid) == first.job_id
    assert await jobs.start(other, second, lease_s=30, ttl_s=60) is None
    done = dataclasses.replace(
        first,
        state=JobState.DONE,
        started_at=1001.0,
        ended_at=1002.25,
        version=3,
        covered_turns=7,
        source=SummarySource.LLM,
        slices=2,
    )
    await jobs.finish(sid, done, ttl_s=60)
    assert await jobs.read(sid, first.job_id) == (done, False)
    assert await jobs.holder(sid) is None
    third = queued()
    assert await jobs.start(sid, third, lease_s=30, ttl_s=60) is None
    # The earlier job's record is still its own.
    assert await jobs.read(sid, first.job_id) == (done, False)


async def test_a_lease_lapses_unless_renewed(hot: HotTier) -> None:
    """A renewed lease stays live past its first term; one nobody renews lapses (the record stays,
    still saying running), and the session is free for a new job; the old job's renewal then
    finds the lease another's (False) and still writes its own record."""
    jobs = hot.jobs
    sid = new_sid()
    job = queued()
    # A lease of 1 s renewed every 0.3 s: a renewal late by most of a second still keeps it.
    assert await jobs.start(sid, job, lease_s=1.0, ttl_s=60) is None
    running = dataclasses.replace(job, state=JobState.RUNNING, started_at=1001.0)
    started = time.monotonic()
    for _ in range(5):
        await asyncio.sleep(0.3)
        assert await jobs.renew(sid, running, lease_s=1.0, ttl_s=60)
    assert time.monotonic() - started > 1.0  # live past its first term
    assert await jobs.read(sid, job.job_id) == (running, True)
    await _lapsed(jobs, sid)
    assert await jobs.read(sid, job.job_id) == (running, False)
    # A lapsed lease is taken again by its own job's renewal while nobody else holds it.
    assert await jobs.renew(sid, running, lease_s=0.3, ttl_s=60)
    assert await jobs.holder(sid) == job.job_id
    await _lapsed(jobs, sid)
    newer = queued()
    assert await jobs.start(sid, newer, lease_s=30, ttl_s=60) is None
    assert not await jobs.renew(sid, dataclasses.replace(running, slices=1), lease_s=0.3, ttl_s=60)
    assert await jobs.read(sid, job.job_id) == (dataclasses.replace(running, slices=1), False)
    assert await jobs.read(sid, newer.job_id) == (newer, True)
    # Finishing the superseded job leaves the newer one's lease alone.
    await jobs.finish(sid, dataclasses.replace(running, state=JobState.FAILED, reason="superseded"), ttl_s=60)
    assert await jobs.holder(sid) == newer.job_id


async def _lapsed(jobs: JobStore, sid: SessionKey) -> None:
    """Wait (at most 5 s) until nobody holds the session's lease."""
    deadline = time.monotonic() + 5
    while await jobs.holder(sid) is not None:
        assert time.monotonic() < deadline, "the lease did not lapse"
        await asyncio.sleep(0.05)


async def test_a_record_expires_after_its_ttl(hot: HotTier) -> None:
    """A record is kept its TTL after its last write, then reads as unknown."""
    jobs = hot.jobs
    sid = new_sid()
    job = queued()
    assert await jobs.start(sid, job, lease_s=30, ttl_s=60) is None
    await jobs.finish(sid, dataclasses.replace(job, state=JobState.FAILED, reason="conflict"), ttl_s=1)
    assert (await jobs.read(sid, job.job_id))[0] is not None
    await asyncio.sleep(1.3)
    assert await jobs.read(sid, job.job_id) == (None, False)


def test_job_keys_are_hash_tagged_by_session() -> None:
    """A job's record and its session's lease carry the session's hash tag (one cluster slot)."""
    keys = Keys("tm")
    assert keys.rebuild(SessionKey("acme/call-1"), "ab" * 16) == "tm:{acme/call-1}:rebuild:" + "ab" * 16
    assert keys.rebuild_lease(SessionKey("acme/call-1")) == "tm:{acme/call-1}:rebuild-lease"
