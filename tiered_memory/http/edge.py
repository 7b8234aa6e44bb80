"""The HTTP edge every request passes: its id, its one log line and metric, and the one place where
domain errors become status codes (`observe`, the outermost middleware), with the JSON reply
shapes every route shares. Errors are `{"error": {"code", "message"}}`.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from tiered_memory.errors import (
    BodyTimeout,
    Conflict,
    DeadlineExceeded,
    Forbidden,
    InvalidInput,
    NotFound,
    Overloaded,
    RateLimited,
    SqlUnavailable,
    TieredMemoryError,
    TierUnavailable,
    Unauthorized,
)
from tiered_memory.http.auth import OPEN_PATHS
from tiered_memory.http.keys import METRICS_KEY, SETTINGS_KEY
from tiered_memory.tiers.codec import dumps
from tiered_memory.tracing import UNTRACED_PATHS, Tracing, failed

log = structlog.get_logger("tiered_memory.http.api")

# The tier that answered a read (hot, warm, cold, none), for the request's log line.
TIER_KEY = web.RequestKey("tier", str)

_RETRY_AFTER_S = "1"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def reply(body: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # UTF-8 JSON: Chinese stays readable, and takes a third of the bytes that ASCII escapes would.
    return web.Response(
        body=dumps(body), status=status, headers=headers, content_type="application/json", charset="utf-8"
    )


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return reply({"error": {"code": code, "message": message}}, status=status, headers=headers)


_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bind request and session ids to the logs, time the request, map domain errors to status
    codes (the one place where errors become HTTP), and write the request's one log line: route
    template, method, status, duration_ms, session_id and the tier that answered a read."""
    # A caller's id is echoed and logged only when it is one a log line can carry as it is.
    stated = request.headers.get("X-Request-ID", "")
    # 128 random bits, as a uuid4's hex without its version bits: a UUID object cost 1.4 µs more.
    request_id = stated if _REQUEST_ID.fullmatch(stated) else os.urandom(16).hex()
    session_id = request.match_info.get("session_id")
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id, session_id=session_id)
    started = time.perf_counter()
    try:
        response = await _mapped(request, handler)
    except asyncio.CancelledError:
        # The client went away and the server cancelled its handler (handler_cancellation): no
        # failure of ours. Counted and logged as a 499, as nginx has it.
        if request.transport is not None and not request.transport.is_closing():
            raise  # a shutdown, not a client
        _record(request, "client_closed", CLIENT_CLOSED, started, session_id, request_id)
        raise
    except ConnectionResetError:
        # The client went away while its body was read (the handler is not cancelled): the same
        # 499, answered to nobody (aiohttp drops a reply to a closed connection without a word).
        _record(request, "client_closed", CLIENT_CLOSED, started, session_id, request_id)
        return web.Response(status=CLIENT_CLOSED)
    finally:
        structlog.contextvars.clear_contextvars()
    _record(request, "request", response.status, started, session_id, request_id)
    response.headers["X-Request-ID"] = request_id
    return response


# The status a request whose client went away is counted under (nginx's "client closed request").
CLIENT_CLOSED = 499


def _record(
    request: web.Request, event: str, status: int, started: float, session_id: str | None, request_id: str
) -> None:
    """A request's metric and its one log line. The ids are passed, not bound: the log context
    is cleared before this runs."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    elapsed = time.perf_counter() - started
    request.app[METRICS_KEY].request_seconds.labels(route, request.method, str(status)).observe(elapsed)
    log.info(
        event,
        route=route,
        method=request.method,
        status=status,
        duration_ms=round(elapsed * 1000, 3),
        session_id=session_id,
        tier=request.get(TIER_KEY),
        request_id=request_id,
    )


async def _mapped(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except InvalidInput as exc:
        response = error_response(exc.status, exc.code, str(exc))
        # A BodyTimeout: the rest of the body may still come, so the connection is closed after
        # the answer (once aiohttp has read and dropped what still comes, at most its lingering
        # time: closing at once, with unread bytes queued, would reset the connection before the
        # 408 is read). Otherwise, when the body stream broke (a Content-Encoding that does not
        # decode), aiohttp drops the connection after this reply, so it must say so, or a pooled
        # client reuses it and its next request fails with a disconnect.
        if isinstance(exc, BodyTimeout) or request.content.exception() is not None:
            response.force_close()
        return response
    except TieredMemoryError as exc:
        return _domain_error(exc)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS_KEY].max_body_bytes
        return error_response(413, "request_entity_too_large", f"body: expected at most {limit} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400:
            # Its headers carry meaning (Allow on a 405, WWW-Authenticate on a 401); only the body changes.
            headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
            return error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason, headers)
        raise
    except ConnectionResetError:
        if request.transport is not None and not request.transport.is_closing():
            log.exception("request_failed")  # a reset of ours (a store's connection), not the client's
            return error_response(500, "internal", "internal error")
        raise  # the client went away mid-request: observe counts it, as no failure of ours
    except Exception:
        log.exception("request_failed")
        return error_response(500, "internal", "internal error")


def _domain_error(exc: TieredMemoryError) -> web.Response:
    """The answer to a domain error other than InvalidInput (whose answer depends on the
    connection), as errors.py's tree has it. One no request should meet (ConfigError, LlmFailed)
    is a 500 like any other failure: called while `exc` is being handled, which is what
    `log.exception` logs."""
    if isinstance(exc, Unauthorized):
        return error_response(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"})
    if isinstance(exc, NotFound):
        return error_response(404, "not_found", str(exc))
    if isinstance(exc, Forbidden):
        # One body whatever the reason: it must not tell whose the session is.
        return error_response(403, "forbidden", Forbidden.message)
    if isinstance(exc, Conflict):
        return error_response(412 if exc.code == "precondition_failed" else 409, exc.code, str(exc))
    if isinstance(exc, DeadlineExceeded):
        return error_response(504, "deadline_exceeded", str(exc))
    if isinstance(exc, RateLimited):
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        return error_response(429, "rate_limited", str(exc), {"Retry-After": retry})
    if isinstance(exc, Overloaded):
        return error_response(503, "overloaded", str(exc), {"Retry-After": _RETRY_AFTER_S})
    if isinstance(exc, SqlUnavailable):
        log.warning("sql_unavailable", error=str(exc))
        return error_response(
            503, "sql_unavailable", "the message store is unavailable; retry", {"Retry-After": _RETRY_AFTER_S}
        )
    if isinstance(exc, TierUnavailable):
        # The driver's words (an internal address, a key) are for the log, not for the caller.
        log.warning("tier_unavailable", tier=exc.tier, error=str(exc))
        return error_response(
            503, "unavailable", f"the {exc.tier} tier is unavailable; retry", {"Retry-After": _RETRY_AFTER_S}
        )
    log.exception("request_failed")
    return error_response(500, "internal", "internal error")


def deadline_middleware(timeout_s: float) -> Middleware:
    """Cancel a request's work past `timeout_s` (REQUEST_TIMEOUT_MS) and answer 504: the probes and
    /metrics excepted. A TimeoutError of the work's own (a store's) is not the deadline's."""

    @web.middleware
    async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        try:
            async with asyncio.timeout(timeout_s) as scope:
                return await handler(request)
        except TimeoutError:
            if not scope.expired():
                raise
            raise DeadlineExceeded(
                f"the request ran past {timeout_s * 1000:g} ms (REQUEST_TIMEOUT_MS) and was cancelled; a write it"
                " made may have committed: retry with the same message_id"
            ) from None

    return deadline


def tracing_middleware(tracing: Tracing) -> Middleware:
    """A span per request (outermost, so that it sees the status observe maps errors to), the
    child of the caller's `traceparent`: route template, method, status, session id and the tier
    that answered a read. Probes and scrapes get none."""

    @web.middleware
    async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in UNTRACED_PATHS:
            return await handler(request)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        attributes: dict[str, str | int] = {"http.request.method": request.method, "http.route": route}
        session_id = request.match_info.get("session_id")
        if session_id is not None:
            attributes["tiered_memory.session_id"] = session_id
        with tracing.server_span(f"{request.method} {route}", request.headers, attributes) as span:
            response = await handler(request)
            if span is not None:
                span.set_attribute("http.response.status_code", response.status)
                tier = request.get(TIER_KEY)
                if tier is not None:
                    span.set_attribute("tiered_memory.tier", str(tier))
                if response.status >= 500:
                    failed(span, f"status {response.status}")
            return response

    return traced
