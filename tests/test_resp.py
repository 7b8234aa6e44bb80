"""RespMux, the multiplexed client of the hot reads, against private redis-server processes: replies
reach the right caller under concurrency, error replies, AUTH and SELECT, a killed server, a
blackholed one, and the same under uvloop (the serving loop)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from tests.faults import RedisProcess, proxied
from tiered_memory.tiers.resp import Endpoint, RespMux


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[RedisProcess]:
    proc = RedisProcess(tmp_path / "redis").start()
    try:
        yield proc
    finally:
        proc.kill()


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


async def test_replies_reach_their_callers(redis_proc: RedisProcess) -> None:
    await _replies_reach_their_callers(redis_proc.port)


def test_replies_reach_their_callers_under_uvloop(redis_proc: RedisProcess) -> None:
    """The daemon serves on uvloop (EVENT_LOOP), whose transports are not asyncio's classes."""
    uvloop.run(_replies_reach_their_callers(redis_proc.port))


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


async def test_a_killed_server_fails_fast_and_is_reconnected(redis_proc: RedisProcess) -> None:
    mux = _mux("127.0.0.1", redis_proc.port)
    try:
        await mux.execute(("SET", "k", "v1"))
        redis_proc.kill()
        with pytest.raises(RedisConnectionError):
            await mux.execute(("GET", "k"))
        with pytest.raises(RedisConnectionError):
            await mux.execute(("GET", "k"))
        redis_proc.start()
        await mux.execute(("SET", "k", "v2"))
        assert await mux.execute(("GET", "k")) == [b"v2"]
    finally:
        await mux.aclose()


async def test_a_blackholed_server_times_out_and_the_connection_is_replaced(redis_proc: RedisProcess) -> None:
    """A server that stops answering: callers time out, the silent connection is dropped, and
    once the network heals a new one answers (no reply of the old one reaches a new caller)."""
    with proxied("127.0.0.1", redis_proc.port) as proxy:
        mux = _mux("127.0.0.1", proxy.port, timeout_s=0.3)
        try:
            await mux.execute(("SET", "k", "before"))
            proxy.blackhole()
            for _ in range(3):
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await mux.execute(("GET", "k"))
            proxy.heal()
            with redis_proc.client() as r:
                r.set("k", "after")
            async with asyncio.timeout(5):
                assert await mux.execute(("GET", "k")) == [b"after"]
        finally:
            await mux.aclose()


async def test_a_caller_that_times_out_leaves_the_others_in_step(redis_proc: RedisProcess) -> None:
    """A slow reply (a script that keeps the server busy) makes one caller give up; the replies
    behind it still go to the callers that sent them, and the connection is kept (the server was
    busy, not gone)."""
    mux = _mux("127.0.0.1", redis_proc.port, timeout_s=5)
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
