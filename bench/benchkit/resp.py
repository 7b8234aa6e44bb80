"""What the Redis client costs: the naive hot ceiling's read (GET a string, LRANGE a 6-item list,
GET a counter) by redis-py's asyncio pipeline, and by a bare RESP client that pipelines every
task's commands on one connection, from 64 tasks. Evidence for docs/BENCHMARKS.md, not a client
for the daemon (no errors, no reconnects, no timeouts).

    .venv/bin/python -m bench.benchkit.resp redis://127.0.0.1:PORT/0
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlparse

import redis.asyncio as aioredis

READS = 20_000
TASKS = 64
_KEYS = ("bench-resp:{s}:summary", "bench-resp:{s}:recent", "bench-resp:{s}:turns")


class _Resp(asyncio.Protocol):
    """Replies arrive in the order the commands were written: one future per batch of commands."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._waiting: deque[tuple[asyncio.Future[list[Any]], int]] = deque()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while self._waiting:
            future, n = self._waiting[0]
            pos, replies = 0, []
            for _ in range(n):
                parsed = self._parse(pos)
                if parsed is None:
                    return
                value, pos = parsed
                replies.append(value)
            del self._buf[:pos]
            self._waiting.popleft()
            future.set_result(replies)

    def _parse(self, pos: int) -> tuple[Any, int] | None:
        end = self._buf.find(b"\r\n", pos)
        if end < 0:
            return None
        kind, line, pos = self._buf[pos : pos + 1], bytes(self._buf[pos + 1 : end]), end + 2
        if kind == b"$":
            size = int(line)
            if size < 0:
                return None, pos
            if len(self._buf) < pos + size + 2:
                return None
            return bytes(self._buf[pos : pos + size]), pos + size + 2
        if kind == b"*":
            items = []
            for _ in range(int(line)):
                parsed = self._parse(pos)
                if parsed is None:
                    return None
                item, pos = parsed
                items.append(item)
            return items, pos
        return line, pos

    def call(self, *commands: tuple[bytes, ...]) -> asyncio.Future[list[Any]]:
        out = bytearray()
        for command in commands:
            out += b"*%d\r\n" % len(command)
            for arg in command:
                out += b"$%d\r\n%s\r\n" % (len(arg), arg)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append((future, len(commands)))
        assert self._transport is not None
        self._transport.write(out)
        return future


async def _timed(name: str, read: Callable[[], Awaitable[object]]) -> None:
    async def task(n: int) -> None:
        for _ in range(n):
            await read()

    cpu, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(task(READS // TASKS) for _ in range(TASKS)))
    seconds = time.perf_counter() - start
    print(f"{name}: {READS / seconds:,.0f} reads/s, {(time.process_time() - cpu) / READS * 1e6:.0f} µs CPU per read")


async def main(url: str) -> None:
    summary, recent, turns = (k.format(s="s1") for k in _KEYS)
    client = aioredis.Redis.from_url(url)
    await client.set(summary, "x" * 700)
    await client.delete(recent)
    await client.rpush(recent, *(["y" * 120] * 6))
    await client.set(turns, 12)

    async def by_redis_py() -> object:
        async with client.pipeline(transaction=False) as p:
            p.get(summary)
            p.lrange(recent, 0, -1)
            p.get(turns)
            return await p.execute()

    u = urlparse(url)
    _transport, bare = await asyncio.get_running_loop().create_connection(
        _Resp, u.hostname or "127.0.0.1", u.port or 6379
    )
    commands = ((b"GET", summary.encode()), (b"LRANGE", recent.encode(), b"0", b"-1"), (b"GET", turns.encode()))

    async def by_bare_resp() -> object:
        return await bare.call(*commands)

    for _ in range(2):
        await _timed("redis-py pipeline, a pooled connection per task", by_redis_py)
        await _timed("bare RESP, one connection for all tasks", by_bare_resp)
    await client.delete(summary, recent, turns)
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0"))
