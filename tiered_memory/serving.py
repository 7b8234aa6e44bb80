"""Serving the app on its port, with a cap on open connections.

aiohttp accepts every connection it is offered and gives each a handler, so a client that opens
thousands of idle or slow connections takes the file descriptors and memory that every tenant's
requests need (MAX_INFLIGHT_REQUESTS bounds requests, not connections). Past MAX_CONNECTIONS open
connections, a new one gets a fixed 503 with Retry-After and is closed, before any parsing: the
gateway retries, or its load balancer picks another replica.

`run` is aiohttp's `run_app` (the same shutdown on SIGTERM and SIGINT: the sites stop, requests
in progress finish within the grace, cleanup_ctx drains the summaries) with `CappedSite` as its
one site, since run_app takes no site of the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from typing import cast

from aiohttp import web

from tiered_memory.app_keys import METRICS_KEY
from tiered_memory.edge import error_response

# How long a request answered before its body was read whole (a 408, a 413) may still send what
# it was sending before its connection is closed (aiohttp's default is 10 s).
LINGERING_S = 2.0

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
    """One refused connection: the fixed 503, then closed once the client is done or the linger ends."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, hence the cast).
        transport = cast(asyncio.Transport, transport)
        transport.write(REFUSAL)
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


class CappedSite(web.TCPSite):
    """A TCP site that serves at most `limit` open connections (0: no limit); past it a new
    connection is refused with REFUSAL and `on_refused` is called."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limit: int,
        on_refused: Callable[[], None],
        reuse_port: bool | None = None,
    ) -> None:
        super().__init__(runner, host, port, reuse_port=reuse_port)
        self._limit = limit
        self._on_refused = on_refused

    async def start(self) -> None:
        # TCPSite.start with the server wrapped; BaseSite.start registers the site with its runner.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # Handlers made this loop turn: asyncio registers a connection with the server one turn
        # after making its handler, and accepts a whole backlog in one turn (uvloop at once).
        fresh: list[asyncio.BaseProtocol] = []

        def protocol() -> asyncio.BaseProtocol:
            known = set(server.connections)
            if self._limit and len(known) + sum(h not in known for h in fresh) >= self._limit:
                self._on_refused()
                return _Refusal()
            handler = server()
            handler.__class__ = _JsonErrors
            if not fresh:
                loop.call_soon(fresh.clear)
            fresh.append(handler)
            return handler

        self._server = await loop.create_server(
            protocol,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        # The port bound (PORT=0 asks the system for one), for `name` and the startup line.
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


def run(
    app: web.Application,
    *,
    host: str,
    port: int,
    max_connections: int,
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
                on_refused=metrics.connections_refused.inc,
                reuse_port=reuse_port or None,
            )
            await site.start()
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
