"""A closed-loop HTTP/1.1 load generator on raw asyncio protocols: `concurrency` keep-alive
connections, one request in flight on each, for a fixed time.

Raw protocols rather than aiohttp's client: the client shares two cores with the server, and
aiohttp's client costs several times more CPU per request than this parser, which only finds the
status, Content-Length and body. Every response the server sends here has a Content-Length.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A request factory: (worker index, request index of that worker) -> raw request bytes, or None
# when that worker has nothing more to send (a pool of sessions ran out).
Factory = Callable[[int, int], bytes | None]
# A response check: (status, body) -> True when the answer is the one the measurement is about.
Check = Callable[[int, bytes], bool]


def request(method: str, path: str, body: bytes = b"", host: str = "127.0.0.1") -> bytes:
    """The raw bytes of one keep-alive request."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode("ascii") + body


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self._buf = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._transport: asyncio.Transport | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("server closed the connection"))
        if not self._closed.done():
            self._closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buf[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        length = 0
        if at >= 0:
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop >= 0 else len(head)])
        total = end + 4 + length
        if len(self._buf) < total:
            return
        body = bytes(self._buf[end + 4 : total])
        del self._buf[:total]
        waiter.set_result((int(head[9:12]), body))

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        assert self._transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(raw)
        return await self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def connect(host: str, port: int) -> _Conn:
    _transport, conn = await asyncio.get_running_loop().create_connection(_Conn, host, port)
    return conn


@dataclass
class Stats:
    """One measurement: completed requests, failed or unexpected answers, and latencies in seconds."""

    name: str
    concurrency: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    client_cpu_us: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def quantile_ms(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def mean_ms(self) -> float:
        return sum(self.latencies) / len(self.latencies) * 1000 if self.latencies else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "throughput": round(self.throughput, 1),
            "p50_ms": round(self.quantile_ms(0.50), 3),
            "p99_ms": round(self.quantile_ms(0.99), 3),
            "mean_ms": round(self.mean_ms, 3),
            "client_cpu_us": round(self.client_cpu_us, 1),
            **self.extra,
        }


async def measure(
    name: str,
    port: int,
    *,
    concurrency: int,
    duration_s: float,
    make: Factory,
    check: Check,
    host: str = "127.0.0.1",
    label: Callable[[int, int], str | None] | None = None,
) -> dict[str, Stats]:
    """Drive `concurrency` connections for `duration_s` seconds (each finishes its request in
    flight) and return the figures of what was completed, by label. Connections are opened
    before the clock starts; `seconds` ends when the last worker stops.

    `label(worker, i)` sorts requests into separate figures (a user and an assistant append of
    one conversation); None keeps a request in the workload but out of the figures (the reply a
    gateway posts between two load-then-append calls). By default every request is `name`.
    """
    conns = [await connect(host, port) for _ in range(concurrency)]
    stats: dict[str, Stats] = {}
    lost = 0
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + duration_s
    ends: list[float] = []

    def figures(key: str) -> Stats:
        found = stats.get(key)
        if found is None:
            found = stats[key] = Stats(key, concurrency)
        return found

    async def worker(w: int) -> None:
        nonlocal lost
        conn = conns[w]
        i = 0
        while time.perf_counter() < deadline:
            raw = make(w, i)
            if raw is None:
                break
            t0 = time.perf_counter()
            try:
                status, body = await conn.send(raw)
            except ConnectionError:
                lost += 1
                break
            t1 = time.perf_counter()
            key = name if label is None else label(w, i)
            if key is not None:
                st = figures(key)
                st.latencies.append(t1 - t0)
                if not check(status, body):
                    st.errors += 1
            i += 1
        ends.append(time.perf_counter())

    try:
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    finally:
        for c in conns:
            c.close()
    seconds = max(ends) - start
    # This process's CPU per request: what the client costs the two cores it shares.
    cpu_us = (time.process_time() - cpu) * 1e6 / max(1, sum(len(st.latencies) for st in stats.values()))
    for st in stats.values():
        st.seconds = seconds
        st.client_cpu_us = cpu_us
    if lost:
        (next(iter(stats.values())) if stats else figures(name)).errors += lost
    return stats
