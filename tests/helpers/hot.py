"""The hot tier of a test's backend parameter (in-process, Redis on the multiplexed connection,
Redis through redis-py), with the bounds and lifetimes the hot tier's contract tests use."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tests.helpers.servers import RealServers, redis_flush_prefix
from tiered_memory.tiers.hot import HotTier, RecentBound
from tiered_memory.tiers.memory_hot import MemoryHot
from tiered_memory.tiers.redis.hot import RedisHot
from tiered_memory.tiers.redis.keys import Keys

RECENT = RecentBound(least=4, most=4)


SUMMARY_TTL = 7200


HISTORY_TTL = 1800


def redis_tier(url: str, prefix: str, recent: RecentBound = RECENT) -> RedisHot:
    return RedisHot.from_url(
        url,
        keys=Keys(prefix),
        timeout_s=1.0,
        summary_ttl_s=SUMMARY_TTL,
        history_ttl_s=HISTORY_TTL,
        recent=recent,
    )


async def tier_of(request: pytest.FixtureRequest, recent: RecentBound) -> AsyncIterator[HotTier]:
    """The tier of the fixture's parameter, its list bounded by `recent`; a Redis one under a key
    prefix of its own, flushed after."""
    if request.param == "memory":
        yield MemoryHot(max_sessions=100, summary_ttl_s=SUMMARY_TTL, history_ttl_s=HISTORY_TTL, recent=recent)
        return
    servers: RealServers = request.getfixturevalue("real_servers")
    prefix = f"tmt{servers.run_id}{uuid.uuid4().hex[:6]}"
    url = servers.redis_url if request.param == "redis" else f"{servers.redis_url}?socket_keepalive=true"
    tier = redis_tier(url, prefix, recent)
    assert (tier._mux is not None) == (request.param == "redis")
    yield tier
    await tier.aclose()
    redis_flush_prefix(servers.redis_url, prefix)
