"""Serving the app on its port, with caps on open connections and a deadline on request heads.

aiohttp accepts every connection it is offered and gives each a handler, so a client that opens
thousands of idle or slow connections takes the file descriptors and memory that every tenant's
requests need (MAX_INFLIGHT_REQUESTS bounds requests, not connections). So:

- past MAX_CONNECTIONS open connections, or MAX_CONNECTIONS_PER_PEER from one address, a new
  one gets a fixed 503 with Retry-After and is closed: the gateway retries, or its load
  balancer picks another replica. One client holding its share leaves the others theirs;
- a connection must send its first request head within HEADER_TIMEOUT_SECONDS (else 408 and
  closed), so neither silence nor a header dripped a byte at a time holds a slot for long
  (after a first request, aiohttp's keep-alive timeout bounds the idle time);
- the probes (/healthz, /readyz, /metrics) are answered even past the caps: a replica that
  someone floods is not also marked down by its load balancer and unseen by Prometheus;
- a first request whose credential its rate refused a moment ago gets the same 429 here, from
  its head, with no handler made (http/refusals.py): a tenant's refused clients coming back
  together cost the others little.

`run` is aiohttp's `run_app` (the same shutdown on SIGTERM and SIGINT: the sites stop, requests
in progress finish within the grace, cleanup_ctx drains the summaries) with `CappedSite` as its
one site, since run_app takes no site of the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import ipaddress
import os
from collections import Counter
from collections.abc import Callable
from typing import cast

from aiohttp import web

from tiered_memory.errors import ConfigError
from tiered_memory.http.edge import error_response
from tiered_memory.http.keys import METRICS_KEY, REFUSALS_KEY
from tiered_memory.http.refusals import CROWD, Refusals, too_many

# How long a request answered before its body was read whole (a 408, a 413) may still send what
# it was sending before its connection is closed (aiohttp's default is 10 s).
LINGERING_S = 2.0

# The accept queue's least length (aiohttp's default); a site serving more connections has as long a one.
_BACKLOG_MIN = 128

# A refused client may still be sending its request: the answer is written, the connection
# half-closed, and what arrives is read and dropped for up to this long. Closing a socket with
# unread data resets it, and the reset can destroy the 503 before the client reads it.
REFUSAL_LINGER_S = 1.0

_REFUSAL_BODY = b'{"error": {"code": "too_many_connections", "message": "too many open connections; retry"}}'
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY
)


class _Refusal(asyncio.Protocol):
    """A connection answered without a handler (REFUSAL, LATE): the fixed answer, half-closed,
    then closed once the client is done or the linger ends."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, hence the cast).
        transport = cast(asyncio.Transport, transport)
        transport.write(self._answer)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        """Dropped: read only so that closing does not reset the answer away."""

    def eof_received(self) -> bool:
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _JsonErrors(web.RequestHandler):
    """aiohttp's connection handler, answering what it refuses before the app sees a request (a
    malformed request line, a header line over its limit, a bad chunk) in the daemon's JSON error
    shape, saying what was wrong and echoing none of the request's bytes: aiohttp's own text
    answer repeats the line it refused, a bearer token in an over-long Authorization line
    included. No new state: a handler aiohttp made becomes one of these (`__class__`)."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's: it logs, and refuses to answer once a response has started.
        super().handle_error(request, status, exc, message)
        code, said = _REFUSED.get(status, ("internal_error", "the request failed"))
        if status == 400 and exc is not None:
            said = f"{said} ({type(exc).__name__})"
        response = error_response(status, code, said)
        response.force_close()
        return response


# What a request refused by the HTTP parser is told, by status: never its own bytes.
_REFUSED = {
    400: ("bad_request", "malformed HTTP request"),
    413: ("request_entity_too_large", "request too large"),
    500: ("internal_error", "the request failed"),
    504: ("deadline_exceeded", "the request was not answered in time"),
}


# A connection over a cap may still be a probe: it is read this far (its request line), served
# when it asks for one of PROBES, and refused otherwise. At most this many are read at once.
_PROBATION_MAX = 32
# Past this many bytes without the end of a request head, the head goes to aiohttp's parser as
# it is: over its line and field limits, it is refused there (400, in JSON).
_HEAD_MAX = 64 * 1024
# What a load balancer and Prometheus ask: served even while the caps refuse other requests.
PROBES = (b"/healthz", b"/readyz", b"/metrics")

_LATE_BODY = b'{"error": {"code": "request_timeout", "message": "the request head did not arrive in time"}}'
LATE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: application/json\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_LATE_BODY)).encode() + b"\r\n\r\n" + _LATE_BODY
)


def peer_of(transport: asyncio.BaseTransport) -> str:
    """Whose connection this is, for the per-peer cap: the IPv4 address, or the IPv6 /64 (one
    host is given a whole /64; counting its addresses one by one would count nothing)."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return ""  # a Unix socket: one peer
    try:
        address = ipaddress.ip_address(peer[0])
    except ValueError:
        return str(peer[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def is_probe(head: bytes | bytearray) -> bool:
    """Whether a request head's first line asks GET (or HEAD) of one of PROBES."""
    line = bytes(head).split(b"\r\n", 1)[0]
    method, _, rest = line.partition(b" ")
    target = rest.partition(b" ")[0].partition(b"?")[0]
    return method in (b"GET", b"HEAD") and target in PROBES


class _Verdict(enum.Enum):
    SERVE = "serve"
    PROBATION = "probation"  # over a cap: served only if it asks for a probe
    REFUSE = "refuse"


class _Gate(asyncio.Protocol):
    """One connection, in front of aiohttp's handler for it. Until its first request head is
    whole it holds the bytes, for at most the site's head timeout from the connection: a client
    that sends nothing, or drips its headers, is answered 408 (or, silent, just closed) and holds
    no slot for long. Then the handler gets the bytes and every later callback. On probation
    (over a cap) only a head asking for a probe is handed on, and the connection is closed after
    that one answer; any other is refused. A head whose credential is still refused its rate
    (`CappedSite.refusals`) gets that 429 instead of a handler."""

    def __init__(self, site: CappedSite) -> None:
        self._site = site
        self._head = bytearray()
        # aiohttp's handler once the head is whole, or the fixed answer of a refused connection.
        self._handler: asyncio.Protocol | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.verdict = _Verdict.SERVE

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, hence the cast).
        self.transport = cast(asyncio.Transport, transport)
        self.peer = peer_of(transport)
        self.verdict = self._site.admit(self)
        if self.verdict is _Verdict.REFUSE:
            self._answer(REFUSAL)
            return
        self._timer = asyncio.get_running_loop().call_later(self._site.head_timeout_s, self._late)

    def data_received(self, data: bytes) -> None:
        if self._handler is not None:
            self._handler.data_received(data)
            return
        if self.transport is None or self.transport.is_closing():
            return
        self._head += data
        whole = b"\r\n\r\n" in self._head or len(self._head) > _HEAD_MAX
        if self.verdict is _Verdict.PROBATION and (whole or b"\r\n" in self._head) and not is_probe(self._head):
            self._site.refused()
            self._answer(REFUSAL)
        elif whole:
            refused = self._site.refusals.refused(self._head)
            if refused is None:
                self._hand_on(self.transport)
            elif refused.scope == CROWD:
                self._site.refused()
                self._answer(REFUSAL)
            else:
                self._site.rate_refused(refused.scope)
                self._answer(too_many(refused.wait_s, refused.scope))

    def eof_received(self) -> bool | None:
        if self._handler is not None:
            return self._handler.eof_received()
        return False  # nothing whole arrived: the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._site.closed(self)
        if self._handler is not None:
            self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def _answer(self, answer: bytes) -> None:
        """A fixed answer (REFUSAL, LATE) instead of a handler; the connection is then closed."""
        assert self.transport is not None
        self._cancel_timer()
        self._site.handed_on(self)
        self._handler = _Refusal(answer)
        self._handler.connection_made(self.transport)

    def _hand_on(self, transport: asyncio.Transport) -> None:
        self._cancel_timer()
        self._site.handed_on(self)
        handler = self._site.handler()
        self._handler = handler
        handler.connection_made(transport)
        handler.data_received(bytes(self._head))
        self._head.clear()
        if self.verdict is _Verdict.PROBATION:
            handler.close()  # after this answer: a probe does not open a way past the cap

    def _late(self) -> None:
        self._timer = None
        if self.transport is None or self._handler is not None or self.transport.is_closing():
            return
        self._site.late()
        if self._head:
            self._answer(LATE)
        else:
            self.transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class CappedSite(web.TCPSite):
    """A TCP site that serves at most `limit` open connections (0: no limit), at most `per_peer`
    of them from one peer (0: no limit), and gives each `head_timeout_s` to send its first
    request head (_Gate). Past a cap a new connection is refused with REFUSAL (and `on_refused`
    called), unless its first request asks for a probe: a load balancer and Prometheus still
    see the replica while someone holds every connection it allows. A first request whose
    credential `refusals` still refuses is answered its 429 (and `on_rate_refused` called with
    the scope that refused it)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limit: int,
        on_refused: Callable[[], None],
        per_peer: int = 0,
        head_timeout_s: float = 10.0,
        on_late: Callable[[], None] = lambda: None,
        refusals: Refusals | None = None,
        on_rate_refused: Callable[[str], None] = lambda scope: None,
        reuse_port: bool | None = None,
    ) -> None:
        # The queue of connections not yet accepted holds as many as the site serves (the system
        # caps it at net.core.somaxconn): with aiohttp's 128, a flood of a few hundred connections
        # overflowed it, and another client's new connection waited for its SYN's retry, a second.
        super().__init__(runner, host, port, reuse_port=reuse_port, backlog=max(_BACKLOG_MIN, limit))
        self.refusals = refusals if refusals is not None else Refusals()
        self._on_rate_refused = on_rate_refused
        self._limit = limit
        self._per_peer = per_peer
        self.head_timeout_s = head_timeout_s
        self._on_refused = on_refused
        self._on_late = on_late
        # Connections served, by peer; how many are on probation; which still read their head.
        self._open: Counter[str] = Counter()
        self._served = 0
        self._on_probation = 0
        self._reading: set[_Gate] = set()

    def admit(self, gate: _Gate) -> _Verdict:
        """Whether a new connection is served, read on probation, or refused at once (counted)."""
        over = (self._limit and self._served >= self._limit) or (
            self._per_peer and self._open[gate.peer] >= self._per_peer
        )
        if not over:
            self._open[gate.peer] += 1
            self._served += 1
        elif self._on_probation < _PROBATION_MAX:
            self._on_probation += 1
        else:
            self._on_refused()
            return _Verdict.REFUSE
        self._reading.add(gate)
        return _Verdict.PROBATION if over else _Verdict.SERVE

    def closed(self, gate: _Gate) -> None:
        self._reading.discard(gate)
        if gate.verdict is _Verdict.PROBATION:
            self._on_probation -= 1
        elif gate.verdict is _Verdict.SERVE:
            self._served -= 1
            self._open[gate.peer] -= 1
            if self._open[gate.peer] <= 0:
                del self._open[gate.peer]

    def handed_on(self, gate: _Gate) -> None:
        self._reading.discard(gate)

    def refused(self) -> None:
        self._on_refused()

    def late(self) -> None:
        self._on_late()

    def rate_refused(self, scope: str) -> None:
        self._on_rate_refused(scope)

    def handler(self) -> web.RequestHandler:
        """aiohttp's handler for a connection, answering what its parser refuses in JSON."""
        server = self._runner.server
        assert server is not None
        handler = server()
        handler.__class__ = _JsonErrors
        return handler

    async def start(self) -> None:
        # TCPSite.start with the server wrapped; BaseSite.start registers the site with its runner.
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Gate(self),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        # The port bound (PORT=0 asks the system for one), for `name` and the startup line.
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port

    async def stop(self) -> None:
        await super().stop()
        # Connections still reading their first head have no handler: the server's shutdown
        # does not see them.
        for gate in list(self._reading):
            if gate.transport is not None:
                gate.transport.close()


def run(
    app: web.Application,
    *,
    host: str,
    port: int,
    max_connections: int,
    max_connections_per_peer: int,
    header_timeout_s: float,
    reuse_port: bool,
    shutdown_timeout: float,
    loop: asyncio.AbstractEventLoop,
    print_line: Callable[[str], None],
) -> None:
    """Serve `app` until SIGTERM or SIGINT, then shut down gracefully (as web.run_app does),
    letting requests in progress finish within `shutdown_timeout` seconds."""

    async def serve() -> None:
        runner = web.AppRunner(
            app,
            handle_signals=True,
            shutdown_timeout=shutdown_timeout,
            access_log=None,
            lingering_time=LINGERING_S,
            # A client that goes away cancels its request's work (a 499 in the metrics): nobody
            # would read the answer. A write in flight still commits (service.py shields it).
            handler_cancellation=True,
        )
        await runner.setup()
        try:
            metrics = app[METRICS_KEY]
            site = CappedSite(
                runner,
                host,
                port,
                limit=max_connections,
                per_peer=max_connections_per_peer,
                head_timeout_s=header_timeout_s,
                on_refused=metrics.connections_refused.inc,
                on_late=metrics.connections_late.inc,
                refusals=app[REFUSALS_KEY],
                on_rate_refused=lambda scope: metrics.rate_limited.labels(scope).inc(),
                reuse_port=reuse_port or None,
            )
            try:
                await site.start()
            except OSError as exc:
                # Most often a second daemon on the same port: a line naming the settings, no traceback.
                reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
                raise ConfigError(f"cannot listen on {host}:{port} (HOST, PORT): {reason}") from None
            server = runner.server
            metrics.connections_open.set_function(lambda: len(server.connections) if server else 0)
            _freeze_start_up_heap()
            print_line(f"======== Running on {site.name} ========")
            await asyncio.Event().wait()  # until a signal raises GracefulExit out of the loop
        finally:
            await runner.cleanup()

    asyncio.set_event_loop(loop)
    main = loop.create_task(serve())
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        # As run_app: the serving task's cleanup (the graceful shutdown) first, then what is left,
        # and the loop closed even when that cleanup failed.
        try:
            if not main.done():
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    loop.run_until_complete(main)
        finally:
            _cancel_rest(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def _freeze_start_up_heap() -> None:
    """Take what start-up left alive out of the cyclic collector's sight: it lives as long as
    the process, and a full collection would walk it again and again.

    Why: the serving process holds about 150,000 objects once started (modules, functions,
    types, the clients and pools), and a full collection walked them all on the event loop,
    in 107 to 128 ms on the 2-core machine, while every tenant's requests waited. In the tenant
    soak the hostile tenant's allocations brought one such pause every 15 to 20 s: the normal
    tenant's p99 went from 39 to 101 ms and `/healthz` had a 137 ms maximum
    (docs/SECURITY.md). Frozen, a full collection walks only what the process made since.
    """
    gc.collect()
    gc.freeze()


def _cancel_rest(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still on `loop` and wait for them; a failure is reported to the loop's
    exception handler (logged), not dropped."""
    rest = asyncio.all_tasks(loop)
    for task in rest:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
    for task in rest:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {"message": "a task failed at shutdown", "exception": task.exception(), "task": task}
            )
