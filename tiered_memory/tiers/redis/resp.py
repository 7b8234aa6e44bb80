"""A multiplexed Redis client for the hot tier: one connection, every concurrent request's
commands written together once per event-loop tick, replies matched in order.

Why not redis-py here: its asyncio client checks a connection out of a pool under a lock, builds a
pipeline object and writes to the socket once per request. At 64 concurrent hot reads that costs
more CPU than everything else the daemon does for the read (docs/BENCHMARKS.md). Redis answers the
commands of one connection in order, so concurrent requests can share it: each appends its
commands to a buffer and a future to a queue; one write per tick sends them all; hiredis parses
the replies and they resolve the futures in queue order.

Only plain `redis://` URLs get this client (host, port, db, username, password), and then every
command of the hot tier goes through it; every other URL form stays on redis-py.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import unquote, urlparse

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, RedisError, ResponseError

Arg = bytes | str | int | float
# The channel Redis publishes tracked keys' invalidations on (RESP2 clients, REDIRECT mode).
_INVALIDATE = "__redis__:invalidate"
Command = Sequence[Arg]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and as whom to connect, from a `redis://[[user]:password@]host[:port][/db]` URL."""

    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_url(cls, url: str) -> Endpoint | None:
        """The endpoint of a plain redis:// URL without query options; None for anything else
        (TLS, unix sockets, cluster, sentinel, options such as socket_timeout), which redis-py
        handles."""
        parsed = urlparse(url)
        if parsed.scheme != "redis" or not parsed.hostname or parsed.query:
            return None
        path = parsed.path.strip("/")
        if path and not path.isdigit():
            return None
        return cls(
            host=parsed.hostname,
            port=parsed.port or 6379,
            db=int(path) if path else 0,
            username=unquote(parsed.username) if parsed.username else None,
            password=unquote(parsed.password) if parsed.password is not None else None,
        )


def _pack(command: Command, out: bytearray) -> None:
    out += b"*%d\r\n" % len(command)
    for arg in command:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode("utf-8")
        else:
            # int or float: Redis reads numbers as their decimal text.
            data = repr(arg).encode("ascii")
        out += b"$%d\r\n" % len(data)
        out += data
        out += b"\r\n"


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script and its SHA1, as EVALSHA names it."""

    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> Script:
        return cls(source, hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest())


@dataclass(slots=True)
class _Pending:
    """One caller's batch: how many replies it waits for, and those received so far."""

    future: asyncio.Future[list[object]]
    expected: int
    replies: list[object] = field(default_factory=list)
    sent_at: float | None = None  # when its commands left in a write (None: still buffered)


class _Protocol(asyncio.Protocol):
    """One connection. `on_push` takes the replies nobody asked for (the messages of a
    subscription); without it such a reply means the stream is out of step."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_push: Callable[[object], None] | None = None) -> None:
        self._loop = loop
        self._on_push = on_push
        self._transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader(protocolError=InvalidResponse, replyError=ResponseError)
        self._queue: deque[_Pending] = deque()
        self._out = bytearray()
        self._unsent: list[_Pending] = []
        self._flush_scheduled = False
        self.closed: asyncio.Future[None] = loop.create_future()
        # When a reply last arrived: a connection that has requests in flight and has sent
        # nothing for a whole timeout is dead (a blackholed peer), not merely busy.
        self.last_reply = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection lost: {exc}" if exc else "connection closed by the server"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.last_reply = time.monotonic()
        self._reader.feed(data)
        queue = self._queue
        while True:
            try:
                reply = self._reader.gets()
            except InvalidResponse as exc:
                self.close(exc)
                return
            if reply is False:
                return
            if self._on_push is not None and isinstance(reply, list) and reply and reply[0] == b"message":
                # A subscription's message, between or before the replies to our commands.
                self._on_push(reply)
                continue
            if not queue:
                # A reply nobody asked for: the stream is out of step, and every later reply
                # would go to the wrong caller.
                self.close(InvalidResponse("unexpected reply"))
                return
            head = queue[0]
            head.replies.append(reply)
            if len(head.replies) == head.expected:
                queue.popleft()
                if not head.future.done():  # a caller that timed out has gone; its replies are dropped
                    head.future.set_result(head.replies)

    @property
    def usable(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    @property
    def in_flight(self) -> int:
        return len(self._queue)

    def send(self, commands: Sequence[Command]) -> _Pending:
        pending = _Pending(self._loop.create_future(), len(commands))
        for command in commands:
            _pack(command, self._out)
        self._queue.append(pending)
        self._unsent.append(pending)
        if not self._flush_scheduled:
            # Every request of this tick joins the same write.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return pending

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(bytes(self._out))
        now = time.monotonic()
        for pending in self._unsent:
            pending.sent_at = now
        self._unsent.clear()
        self._out.clear()

    def silent_for(self, pending: _Pending) -> float:
        """Seconds the server has sent nothing since `pending`'s commands were written (0 while
        they are still buffered): how long Redis, not the event loop, has kept it waiting."""
        if pending.sent_at is None:
            return 0.0
        return time.monotonic() - max(pending.sent_at, self.last_reply)

    def _fail(self, exc: Exception) -> None:
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(exc)

    def close(self, exc: Exception) -> None:
        self._fail(exc)
        if self._transport is not None:
            self._transport.close()


class RespMux:
    """Commands from any number of tasks over one lazily (re)connected connection.

    `execute` raises redis-py's exceptions (ConnectionError, ResponseError, InvalidResponse), all
    RedisError, so that callers handle it like the rest of the hot tier, and TimeoutError when
    the server has sent nothing for `stale_after_s` since the call's commands were written.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        connect_timeout_s: float,
        stale_after_s: float,
        on_invalidate: Callable[[list[str] | None], None] | None = None,
    ) -> None:
        """With `on_invalidate`, the connection is tracked (`CLIENT TRACKING ON REDIRECT` to a
        second connection subscribed to `__redis__:invalidate`): it gets the names of the keys
        this client read that changed or expired since, and None when everything may have
        (a flush, or tracking was lost or set up anew). `tracking` says whether it is on."""
        self._endpoint = endpoint
        self._connect_timeout = connect_timeout_s
        self._stale_after = stale_after_s
        self._conn: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None
        self._on_invalidate = on_invalidate
        self._tracker: _Protocol | None = None  # the subscribed connection
        self._tracked: _Protocol | None = None  # the connection whose reads it is told of
        self._barrier: _Pending | None = None  # the PING the next barrier waits for

    @property
    def tracking(self) -> bool:
        """Whether invalidations reach `on_invalidate` for what is read now."""
        return (
            self._tracked is not None
            and self._tracked is self._conn
            and self._tracked.usable
            and self._tracker is not None
            and self._tracker.usable
        )

    async def execute(self, *commands: Command) -> list[object]:
        """Send the commands together and return their replies in order; an error reply raises."""
        if not commands:
            raise ValueError("execute: expected at least one command")
        conn = self._conn if self._conn is not None and self._conn.usable else await self._connection()
        pending = conn.send(commands)
        try:
            replies = await self._patient(conn, pending)
        except asyncio.CancelledError:
            # The caller timed out (or went away). The connection stays, and the replies meant
            # for this caller are dropped when they come; unless the server has sent nothing for
            # as long as a timeout: then it is gone, and waiting longer only makes every request
            # behind this one time out too.
            if conn.in_flight and time.monotonic() - conn.last_reply > self._stale_after:
                conn.close(RedisConnectionError("no reply within the timeout; reconnecting"))
            raise
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies

    async def _patient(self, conn: _Protocol, pending: _Pending) -> list[object]:
        """The replies, waited for as long as the server keeps answering: the bound measures
        Redis's silence since these commands were written, not the time this task spent queued
        behind a busy event loop (that is overload, not an outage, and must not open the
        breaker). TimeoutError once the server has sent nothing for `stale_after`; the
        connection is then dropped, since every request behind this one would wait as long."""
        while True:
            # A reply that arrived while the loop was busy is processed before the timer fires.
            await _settled(pending.future, self._stale_after)
            if pending.future.done():
                return pending.future.result()
            if conn.silent_for(pending) >= self._stale_after:
                conn.close(RedisConnectionError("no reply within the timeout; reconnecting"))
                raise TimeoutError(f"redis: no reply for {self._stale_after:.3f} s")

    async def run_script(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> object:
        """EVALSHA, and EVAL when the server does not have the script yet (a new or restarted
        server, or SCRIPT FLUSH): EVAL also caches it for the next EVALSHA."""
        try:
            (reply,) = await self.execute(("EVALSHA", script.sha, len(keys), *keys, *args))
        except ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            (reply,) = await self.execute(("EVAL", script.source, len(keys), *keys, *args))
        return reply

    async def _connection(self) -> _Protocol:
        # One connect at a time: the requests that find no connection all wait for the same one.
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
            # Its failure reaches whoever awaits it; if they all timed out first, nobody does.
            self._connecting.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        ep = self._endpoint
        conn: _Protocol | None = None
        try:
            async with asyncio.timeout(self._connect_timeout):
                _transport, conn = await loop.create_connection(lambda: _Protocol(loop), ep.host, ep.port)
                setup = self._login()
                if ep.db:
                    setup.append(("SELECT", ep.db))
                tracker_id = await self._track() if self._on_invalidate is not None else None
                if tracker_id is not None:
                    setup.append(("CLIENT", "TRACKING", "ON", "REDIRECT", tracker_id))
                if setup:
                    for reply in await conn.send(setup).future:
                        if isinstance(reply, ResponseError):
                            raise reply
        except BaseException as exc:
            if conn is not None:
                conn.close(RedisConnectionError("set-up failed"))
            if isinstance(exc, OSError):
                raise RedisConnectionError(f"cannot connect to {ep.host}:{ep.port}: {exc}") from exc
            if isinstance(exc, TimeoutError):
                raise RedisConnectionError(f"connecting to {ep.host}:{ep.port} timed out") from exc
            raise
        old, self._conn = self._conn, conn
        if old is not None:
            old.close(RedisConnectionError("replaced"))
        if self._on_invalidate is not None:
            # A new connection has read nothing yet: what was cached through the old one is not
            # covered by any invalidation to come.
            self._tracked = conn if self._tracker is not None and self._tracker.usable else None
            self._on_invalidate(None)
            conn.closed.add_done_callback(lambda _: self._lost(conn))
        return conn

    async def barrier(self) -> bool:
        """Wait until every invalidation for a write Redis finished before this call has been
        handled: a PING on the subscribed connection, whose reply comes after every message
        queued for it before. Calls of one event-loop tick share one PING. False when tracking
        is off or the PING failed (then nothing cached may be used)."""
        tracker = self._tracker
        if tracker is None or not tracker.usable:
            return False
        pending = self._barrier
        if pending is None or pending.sent_at is not None or pending.future.done():
            # Only a PING not written yet is sent after this call began.
            pending = self._barrier = tracker.send([("PING",)])
        try:
            await self._patient(tracker, pending)
        except (RedisError, TimeoutError):
            return False
        return True

    def _login(self) -> list[Command]:
        ep = self._endpoint
        if ep.password is None:
            return []
        return [("AUTH", ep.username, ep.password) if ep.username else ("AUTH", ep.password)]

    async def _track(self) -> int | None:
        """A new invalidation connection, subscribed; its client id (None when the server does
        not offer tracking, e.g. before Redis 6 or under an ACL without CLIENT: no cache then)."""
        loop = asyncio.get_running_loop()
        ep = self._endpoint
        if self._tracker is not None:
            self._tracker.close(RedisConnectionError("replaced"))
            self._tracker = None
        _transport, tracker = await loop.create_connection(lambda: _Protocol(loop, self._pushed), ep.host, ep.port)
        try:
            replies = await tracker.send([*self._login(), ("CLIENT", "ID"), ("SUBSCRIBE", _INVALIDATE)]).future
        except RedisError:
            tracker.close(RedisConnectionError("tracking set-up failed"))
            return None
        except BaseException:
            tracker.close(RedisConnectionError("tracking set-up interrupted"))  # a timeout: not leaked
            raise
        if any(isinstance(r, ResponseError) for r in replies):
            tracker.close(RedisConnectionError("tracking refused"))
            return None
        self._tracker = tracker
        tracker.closed.add_done_callback(lambda _: self._lost(tracker))
        return int(cast(int, replies[-2]))

    def _pushed(self, message: object) -> None:
        # ["message", "__redis__:invalidate", [key, ...] or nil (a flush)]
        if self._on_invalidate is None or not isinstance(message, list) or len(message) != 3:
            return
        kind, channel, keys = message
        if kind != b"message" or channel != _INVALIDATE.encode():
            return
        if keys is None:
            self._on_invalidate(None)
        elif isinstance(keys, list):
            self._on_invalidate([k.decode() if isinstance(k, bytes) else str(k) for k in keys])

    def _lost(self, conn: _Protocol) -> None:
        """A tracked or tracking connection closed: invalidations may be lost from now on, so
        nothing cached counts, and the main connection is dropped too, so that the next call
        sets both up again (rare: a restart of Redis or a network fault)."""
        if conn is self._tracker:
            self._tracker = None
            if self._conn is not None:
                self._conn.close(RedisConnectionError("invalidation connection lost"))
        if conn is self._tracked:
            self._tracked = None
        if self._on_invalidate is not None:
            self._on_invalidate(None)

    async def aclose(self) -> None:
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        conn, self._conn = self._conn, None
        tracker, self._tracker = self._tracker, None
        for c in (conn, tracker):
            if c is not None:
                c.close(RedisConnectionError("client closed"))
                await c.closed


async def _settled(future: asyncio.Future[list[object]], patience_s: float) -> None:
    """Return when `future` is done or `patience_s` seconds have passed, whichever comes first;
    `future` is never cancelled. `asyncio.wait((future,), timeout=...)` does the same, but every
    command of the hot tier waits here: its set of tasks and its check that each is no coroutine
    (an ABC isinstance test that misses for a future) cost about 3 µs a command more."""
    if future.done():
        return
    woken = asyncio.get_running_loop().create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    timer = woken.get_loop().call_later(patience_s, wake)
    future.add_done_callback(wake)
    try:
        await woken
    finally:
        timer.cancel()
        future.remove_done_callback(wake)
