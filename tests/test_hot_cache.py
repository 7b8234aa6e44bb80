"""The hot tier's reads kept in process memory (hot_cache.py, client-side caching through
resp.py): a read is served from memory only while Redis tracks it, a change by any client is seen
by the next read of every other one, and a lost invalidation connection empties the cache. Against
a private redis-server, and with two daemon processes on the real servers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.daemon import new_sid
from tests.helpers.faults import RedisProcess
from tests.helpers.gateway import crash_env
from tests.helpers.servers import RealServers
from tiered_memory.model import Message, Owner, Role, SessionCounters, SessionKey
from tiered_memory.testing import DaemonProcess, FakeLlm, processes
from tiered_memory.tiers.hot import RecentBound
from tiered_memory.tiers.redis.hot import RedisHot
from tiered_memory.tiers.redis.hot_cache import HotCache
from tiered_memory.tiers.redis.keys import Keys

_OWNER = Owner("", "u1")


def _tier(port: int, prefix: str, cache_sessions: int = 100) -> RedisHot:
    return RedisHot.from_url(
        f"redis://127.0.0.1:{port}/0",
        keys=Keys(prefix),
        timeout_s=1.0,
        summary_ttl_s=600,
        history_ttl_s=600,
        recent=RecentBound(least=50, most=50),
        cache_sessions=cache_sessions,
    )


@pytest.fixture
async def pair(private_redis: RedisProcess) -> AsyncIterator[tuple[RedisHot, RedisHot]]:
    """Two clients of one Redis, as two replicas are."""
    prefix = f"tmt{uuid.uuid4().hex[:8]}"
    a, b = _tier(private_redis.port, prefix), _tier(private_redis.port, prefix)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def _append(hot: RedisHot, sid: SessionKey, seq: int) -> None:
    m = Message(sid, seq, (seq + 1) // 2, Role.USER if seq % 2 else Role.ASSISTANT, f"m{seq}", f"id{seq}", 1.0)
    await hot.record_append(m, SessionCounters(seq // 2, seq, float(seq), _OWNER, seq))


async def test_every_change_by_another_client_is_seen_by_the_next_read(pair: tuple[RedisHot, RedisHot]) -> None:
    """B reads (and caches) a session after each of A's appends, with no pause in between: B
    never answers with what A has just replaced, although A's invalidation reaches B on another
    socket than A's reply reaches A (the barrier waits for it; without it about one run in two
    failed). Reads that changed nothing come from memory."""
    a, b = pair
    sid = new_sid()
    await _append(a, sid, 1)
    await b.read_session(sid)
    assert b._cached() is not None  # tracking is on
    for seq in range(2, 1002):
        await _append(a, sid, seq)
        seen = await b.read_session(sid)
        assert seen.message_count == seq
        assert seen.recent[-1].seq == seq
    cache = b._cached()
    assert cache is not None
    assert cache.get(sid, "session") is not None
    again = await b.read_session(sid)
    assert again is cache.get(sid, "session")  # served from memory


async def test_a_session_read_before_it_exists_is_seen_once_created(pair: tuple[RedisHot, RedisHot]) -> None:
    """Redis tracks the keys a read asked for whether or not they existed: a miss kept in memory
    goes when another client creates the session."""
    a, b = pair
    await b.read_session(new_sid())  # connects: the reads after it are tracked
    sid = new_sid()
    for _ in range(2):
        assert (await b.read_session(sid)).message_count is None
    cache = b._cached()
    assert cache is not None
    assert cache.get(sid, "session") is not None
    await _append(a, sid, 1)
    assert (await b.read_session(sid)).message_count == 1


async def test_a_clients_own_write_is_never_read_back_stale(pair: tuple[RedisHot, RedisHot]) -> None:
    a, _ = pair
    sid = new_sid()
    for seq in range(1, 51):
        await _append(a, sid, seq)
        assert (await a.read_session(sid)).message_count == seq
    await a.delete(sid)
    assert (await a.read_session(sid)).message_count is None


async def test_losing_the_invalidation_connection_empties_the_cache(
    pair: tuple[RedisHot, RedisHot], private_redis: RedisProcess
) -> None:
    """When the subscribed connection drops, nothing cached counts any more (invalidations may
    have been missed): the next read goes to Redis, and tracking is set up again."""
    a, b = pair
    sid = new_sid()
    await _append(a, sid, 1)
    await b.read_session(sid)  # connects; the next read is the first one tracked
    await b.read_session(sid)
    cache = b._cached()
    assert cache is not None
    assert len(cache) == 1
    with private_redis.client() as r:
        killed = r.client_kill_filter(_type="pubsub")
    assert killed >= 1
    for _ in range(100):
        if b._cached() is None:
            break
        await asyncio.sleep(0.01)
    assert len(cache) == 0
    await _append(a, sid, 2)
    assert (await b.read_session(sid)).message_count == 2  # reconnects both connections
    assert b._cached() is cache


def test_a_read_that_raced_a_change_is_not_kept() -> None:
    """A read whose session changed while it was in flight (an invalidation, a write of ours, a
    reset) answers its caller but is not kept."""
    cache: HotCache[object] = HotCache(10)
    stamp = cache.stamp(SessionKey("s"))
    cache.changed(SessionKey("s"))
    cache.put(SessionKey("s"), "session", "old", stamp)
    assert cache.get(SessionKey("s"), "session") is None
    stamp = cache.stamp(SessionKey("s"))
    cache.reset()
    cache.put(SessionKey("s"), "session", "old", stamp)
    assert cache.get(SessionKey("s"), "session") is None
    stamp = cache.stamp(SessionKey("s"))
    cache.changed(SessionKey("other"))
    cache.put(SessionKey("s"), "session", "new", stamp)
    assert cache.get(SessionKey("s"), "session") == "new"


async def test_two_processes_never_read_what_the_other_just_replaced(
    real_servers: RealServers, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    """Every message is appended through one daemon and, once acknowledged, the session is read
    through the other (which never writes it, so only Redis's invalidations can tell it): its
    context always holds that message and its count is exact."""
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    a = DaemonProcess(crash_env(real_servers, prefix, fake_llm), tmp_path / "a.log")
    b = DaemonProcess(crash_env(real_servers, prefix, fake_llm), tmp_path / "b.log")
    sid = new_sid()
    async with processes(a, b), aiohttp.ClientSession() as http:
        for n in range(1, 61):
            writer, reader = a, b
            role = "user" if n % 2 else "assistant"
            body = {"role": role, "content": f"message {n}", "message_id": f"m{n}"}
            async with http.post(f"{writer.url}/v1/sessions/{sid}/messages", json=body) as resp:
                assert resp.status == 201
            for _ in range(2):  # the second read is the one a cache would answer
                async with http.get(f"{reader.url}/v1/sessions/{sid}/context?max_chars=4000") as resp:
                    ctx = await resp.json()
                assert f"message {n}" in [m["content"] for m in ctx["messages"]], n
            async with http.get(f"{reader.url}/v1/sessions/{sid}") as resp:
                assert (await resp.json())["message_count"] == n
