"""RespMux, the multiplexed client of the hot reads, against private redis-server processes: replies
reach the right caller under concurrency, error replies, AUTH and SELECT, a killed server, a
blackholed one, and the same under uvloop (the serving loop)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from tests.helpers.faults import RedisProcess, proxied
from tiered_memory.breaker import CircuitBreaker
from tiered_memory.model import HotSession, SessionKey
from tiered_memory.tiers.hot import RecentBound
from tiered_memory.tiers.redis.hot import RedisHot
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.redis.resp import Endpoint, RespMux, Script

# Keeps the server busy for 0.3 s, then answers.
_BUSY_300_MS = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
while true do
  local n = redis.call('TIME')
  if n[1] * 1000000 + n[2] - start > 300000 then return 1 end
end
"""


def _mux(host: str, port: int, *, db: int = 0, password: str | None = None, timeout_s: float = 2.0) -> RespMux:
    return RespMux(Endpoint(host, port, db=db, password=password), connect_timeout_s=timeout_s, stale_after_s=timeout_s)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", Endpoint("127.0.0.1", 6379, 0)),
        ("redis://localhost", Endpoint("localhost", 6379, 0)),
        ("redis://:p%40ss@h:6380/3", Endpoint("h", 6380, 3, None, "p@ss")),
        ("redis://user:pw@h/2", Endpoint("h", 6379, 2, "user", "pw")),
        ("rediss://h:6379/0", None),
        ("unix:///tmp/redis.sock", None),
        ("redis://h:6379/0?socket_timeout=1", None),
        ("redis://h:6379/x", None),
        ("redis+cluster://h:7000", None),
    ],
)
def test_only_plain_urls_get_the_multiplexed_client(url: str, expected: Endpoint | None) -> None:
    """TLS, sockets, options and cluster or sentinel URLs stay with redis-py."""
    assert Endpoint.from_url(url) == expected


async def _replies_reach_their_callers(port: int) -> None:
    mux = _mux("127.0.0.1", port)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    try:
        await mux.execute(*[("SET", f"{prefix}:{i}", f"value-{i}") for i in range(500)])
        await mux.execute(("RPUSH", f"{prefix}:list", "a", "b", "c"), ("HSET", f"{prefix}:h", "x", 1, "y", "二"))

        async def read(i: int) -> None:
            got = await mux.execute(("GET", f"{prefix}:{i}"), ("GET", f"{prefix}:missing"))
            assert got == [f"value-{i}".encode(), None]

        # 2,000 concurrent callers, in bursts that share writes: each gets its own replies.
        await asyncio.gather(*(read(i % 500) for i in range(2000)))
        lrange, hmget = await mux.execute(("LRANGE", f"{prefix}:list", 0, -1), ("HMGET", f"{prefix}:h", "x", "y", "z"))
        assert lrange == [b"a", b"b", b"c"]
        assert hmget == [b"1", "二".encode(), None]
        # An error reply raises, and the connection stays in step for the next caller.
        with pytest.raises(ResponseError):
            await mux.execute(("GET", f"{prefix}:0"), ("LRANGE", f"{prefix}:0", 0, -1))
        assert await mux.execute(("GET", f"{prefix}:1")) == [b"value-1"]
        with pytest.raises(ValueError, match="at least one command"):
            await mux.execute()
    finally:
        await mux.aclose()


async def test_replies_reach_their_callers(private_redis: RedisProcess) -> None:
    await _replies_reach_their_callers(private_redis.port)


def test_replies_reach_their_callers_under_uvloop(private_redis: RedisProcess) -> None:
    """The daemon serves on uvloop (EVENT_LOOP), whose transports are not asyncio's classes."""
    uvloop.run(_replies_reach_their_callers(private_redis.port))


async def test_auth_and_select(tmp_path: Path) -> None:
    proc = RedisProcess(tmp_path / "auth", password="s3cret").start()
    try:
        with proc.client() as r:
            r.execute_command("SELECT", 5)
            r.set("in-db-5", "yes")
        mux = _mux("127.0.0.1", proc.port, db=5, password="s3cret")
        try:
            assert await mux.execute(("GET", "in-db-5")) == [b"yes"]
        finally:
            await mux.aclose()
        wrong = _mux("127.0.0.1", proc.port, password="wrong")
        try:
            with pytest.raises(ResponseError):
                await wrong.execute(("GET", "in-db-5"))
        finally:
            await wrong.aclose()
    finally:
        proc.kill()


async def test_a_killed_server_fails_fast_and_is_reconnected(private_redis: RedisProcess) -> None:
    mux = _mux("127.0.0.1", private_redis.port)
    try:
        await mux.execute(("SET", "k", "v1"))
        private_redis.kill()
        with pytest.raises(RedisConnectionError):
            await mux.execute(("GET", "k"))
        with pytest.raises(RedisConnectionError):
            await mux.execute(("GET", "k"))
        private_redis.start()
        await mux.execute(("SET", "k", "v2"))
        assert await mux.execute(("GET", "k")) == [b"v2"]
    finally:
        await mux.aclose()


async def test_a_blackholed_server_times_out_and_the_connection_is_replaced(private_redis: RedisProcess) -> None:
    """A server that stops answering: callers time out, the silent connection is dropped, and
    once the network heals a new one answers (no reply of the old one reaches a new caller)."""
    with proxied("127.0.0.1", private_redis.port) as proxy:
        mux = _mux("127.0.0.1", proxy.port, timeout_s=0.3)
        try:
            await mux.execute(("SET", "k", "before"))
            opened = proxy.accepted
            proxy.blackhole()
            for _ in range(3):
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await mux.execute(("GET", "k"))
            # The silent connection was dropped and another dialled while the server stayed
            # silent (a client that kept waiting on the old one would open none).
            assert proxy.accepted > opened
            proxy.heal()
            with private_redis.client() as r:
                r.set("k", "after")
            async with asyncio.timeout(5):
                assert await mux.execute(("GET", "k")) == [b"after"]
        finally:
            await mux.aclose()


async def test_a_caller_that_times_out_leaves_the_others_in_step(private_redis: RedisProcess) -> None:
    """A slow reply (a script that keeps the server busy) makes one caller give up; the replies
    behind it still go to the callers that sent them, and the connection is kept (the server was
    busy, not gone)."""
    mux = _mux("127.0.0.1", private_redis.port, timeout_s=5)
    try:
        await mux.execute(("SET", "a", "1"), ("SET", "b", "2"))
        slow = asyncio.ensure_future(mux.execute(("EVAL", _BUSY_300_MS, 0), ("GET", "a")))
        await asyncio.sleep(0)
        behind = asyncio.ensure_future(mux.execute(("GET", "b")))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await asyncio.shield(slow)
        slow.cancel()
        assert await behind == [b"2"]
        assert await mux.execute(("GET", "a")) == [b"1"]
    finally:
        await mux.aclose()


async def test_scripts_run_by_sha_and_are_loaded_when_the_server_lacks_them(private_redis: RedisProcess) -> None:
    """EVALSHA first; after SCRIPT FLUSH (or on a new server) the NOSCRIPT reply makes it EVAL,
    which caches the script again. Other error replies still raise."""
    mux = _mux("127.0.0.1", private_redis.port)
    incr = Script.of("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    try:
        assert await mux.run_script(incr, ["n"], [2]) == 2
        assert await mux.execute(("SCRIPT", "EXISTS", incr.sha)) == [[1]]
        await mux.execute(("SCRIPT", "FLUSH"))
        assert await mux.run_script(incr, ["n"], [3]) == 5
        assert await mux.execute(("SCRIPT", "EXISTS", incr.sha)) == [[1]]
        broken = Script.of("return redis.call('NOSUCHCOMMAND')")
        with pytest.raises(ResponseError):
            await mux.run_script(broken, [], [])
    finally:
        await mux.aclose()


async def _blocked_loop_read(call: Callable[[], Awaitable[object]], block_s: float) -> object:
    """Start `call`, let it write its commands, then keep the event loop busy for `block_s`
    (the reply waits in the socket meanwhile), as a saturated daemon does."""
    task = asyncio.ensure_future(call())
    for _ in range(3):
        await asyncio.sleep(0)
    time.sleep(block_s)  # noqa: ASYNC251 - the point: the loop runs nothing else meanwhile
    return await task


async def test_a_busy_event_loop_is_not_a_silent_server(private_redis: RedisProcess) -> None:
    """A reply that waited in the socket while the event loop was busy for longer than the
    timeout still reaches its caller: the bound measures the server's silence since the
    commands were written, not the caller's wait."""
    mux = _mux("127.0.0.1", private_redis.port, timeout_s=0.1)
    try:
        await mux.execute(("SET", "a", "1"))
        assert await _blocked_loop_read(lambda: mux.execute(("GET", "a")), 0.4) == [b"1"]
    finally:
        await mux.aclose()


async def test_a_silent_server_times_out_after_one_timeout(private_redis: RedisProcess) -> None:
    """The multiplexed client bounds a call by itself: a blackholed server fails it after about
    one timeout of silence."""
    with proxied("127.0.0.1", private_redis.port) as proxy:
        mux = _mux("127.0.0.1", proxy.port, timeout_s=0.2)
        try:
            await mux.execute(("SET", "k", "v"))
            proxy.blackhole()
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await mux.execute(("GET", "k"))
            assert time.monotonic() - started < 1.5
        finally:
            await mux.aclose()


async def test_the_hot_tier_counts_a_busy_loop_as_no_redis_failure(private_redis: RedisProcess) -> None:
    """Through RedisHot (REDIS_TIMEOUT_MS 100): a read held up by a busy event loop answers,
    and the breaker records no failure, so overload does not send reads to SQL as an outage."""
    breaker = CircuitBreaker("redis", failures=1, reset_s=60)
    hot = RedisHot.from_url(
        f"redis://127.0.0.1:{private_redis.port}/0",
        keys=Keys(f"tmt{uuid.uuid4().hex[:8]}"),
        timeout_s=0.1,
        summary_ttl_s=60,
        history_ttl_s=60,
        recent=RecentBound(least=4, most=4),
        breaker=breaker,
    )
    try:
        await hot.read_session(SessionKey("s"))
        found = await _blocked_loop_read(lambda: hot.read_session(SessionKey("s")), 0.4)
        assert isinstance(found, HotSession)
        assert breaker.allow()
    finally:
        await hot.aclose()
