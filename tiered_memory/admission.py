"""Admission: how much work one process takes on at once.

A saturated process that accepts every request only lengthens its queue: each new request waits
behind all the others, its latency grows without bound, and its Redis and SQL calls time out
while it waits, which looks like an outage of those stores. Past MAX_INFLIGHT_REQUESTS requests
in progress, a new one is refused at once with 503 and Retry-After (`Overloaded`), before any
work: the gateway retries, or its load balancer sends it to another replica. The probes and
/metrics are always answered, so that an operator sees the overload.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from tiered_memory.auth import OPEN_PATHS
from tiered_memory.errors import Overloaded
from tiered_memory.metrics import Metrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def admission_middleware(limit: int, metrics: Metrics) -> Middleware:
    """Refuse a request (Overloaded) while `limit` others are in progress; 0 means no limit."""
    in_flight = 0

    @web.middleware
    async def admit(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal in_flight
        if request.path in OPEN_PATHS:
            return await handler(request)
        if limit and in_flight >= limit:
            metrics.requests_shed.inc()
            raise Overloaded(f"{limit} requests in progress (MAX_INFLIGHT_REQUESTS); retry")
        in_flight += 1
        metrics.requests_in_flight.set(in_flight)
        try:
            return await handler(request)
        finally:
            in_flight -= 1
            metrics.requests_in_flight.set(in_flight)

    return admit
