"""Fault injection against real servers: a TCP proxy that can delay, blackhole or cut what passes
through it, and a private redis-server process a test may kill and restart.

The proxy runs its own event loop in a thread, so it keeps forwarding (or stalling) whatever the
test's loop is doing, and works the same for an in-process daemon and for a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from tiered_memory.testing import free_port


class TcpProxy:
    """Forwards 127.0.0.1:<port> to an upstream address, with faults switched on and off at will.

    - `delay_s`: every chunk waits this long before it is forwarded (a slow server);
    - `blackhole()`: connections stay open but nothing passes (a hung server or a dropped route);
    - `cut()`: every open connection is reset and new ones are closed at once (a dead server);
    - `heal()`: back to plain forwarding.
    `accepted` counts the connections the daemon opened to the proxy, `sent` the bytes it sent
    (whether or not they were passed on: a hung server receives requests too), `connections` and
    `upstream_bytes` what reached the upstream, so a test can tell that the daemon stopped calling
    a dependency (a circuit breaker) without timing anything.
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.delay_s = 0.0
        self.accepted = 0
        self.connections = 0
        self.upstream_bytes = 0
        self.sent = 0
        self._mode = "pass"
        self._loop = asyncio.new_event_loop()
        # Set while data may flow; cleared by blackhole(). Touched only on the proxy's loop.
        self._flowing = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)

    @property
    def mode(self) -> str:
        return self._mode

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(5)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def blackhole(self) -> None:
        self._mode = "blackhole"
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def cut(self) -> None:
        self._mode = "cut"
        self._loop.call_soon_threadsafe(self._flowing.set)
        asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(5)

    def heal(self) -> None:
        self.delay_s = 0.0
        self._mode = "pass"
        self._loop.call_soon_threadsafe(self._flowing.set)

    async def _listen(self) -> None:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        await self._reset_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _reset_all(self) -> None:
        for w in list(self._writers):
            _abort(w)
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._mode == "cut":
            _abort(writer)
            return
        self._writers.add(writer)
        if self._mode == "blackhole":
            # Accept and hold: the client's connect succeeds and its reads then time out.
            await self._hold(reader, writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(writer)
            return
        self.connections += 1
        self._writers.add(up_writer)
        await asyncio.gather(
            self._pipe(reader, up_writer, upstream=True),
            self._pipe(up_reader, writer, upstream=False),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            _abort(w)

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                self.sent += len(data)
        self._writers.discard(writer)
        _abort(writer)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, upstream: bool) -> None:
        try:
            while data := await src.read(65536):
                if upstream:
                    self.sent += len(data)
                await self._flowing.wait()
                if self._mode == "cut":
                    return
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if upstream:
                    self.upstream_bytes += len(data)
                dst.write(data)
                await dst.drain()
        except (OSError, ConnectionError):
            return
        finally:
            _abort(dst)


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    if not transport.is_closing():
        transport.abort()


class RedisProcess:
    """A private redis-server on a free loopback port that a test may kill and start again."""

    def __init__(self, workdir: Path, *, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH")
        self._binary = binary
        self._workdir = workdir
        self.port = free_port()
        self.password = password
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self._workdir.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with contextlib.closing(redis.Redis(port=self.port, password=self.password, socket_timeout=0.5)) as r:
                    r.ping()
                return self
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: the server and everything it held are gone at once."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
            self._proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=2)


@contextlib.contextmanager
def proxied(host: str, port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(host, port).start()
    try:
        yield proxy
    finally:
        proxy.stop()
