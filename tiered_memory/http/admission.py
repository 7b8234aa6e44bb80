"""Admission: how much work one process takes on at once, and how much of it one client may hold.

A saturated process that accepts every request only lengthens its queue: each new request waits
behind all the others, its latency grows without bound, and its Redis and SQL calls time out
while it waits, which looks like an outage of those stores. Past MAX_INFLIGHT_REQUESTS requests
in progress, a new one is refused at once with 503 and Retry-After (`Overloaded`), before any
work: the gateway retries, or its load balancer sends it to another replica. The probes and
/metrics are always answered, so that an operator sees the overload.

Two rules keep one client from taking every slot:

- a request is admitted once its body has arrived (`read_first`, bounded by MAX_BODY_BYTES and
  BODY_TIMEOUT_SECONDS): a client that drips its bodies holds connections, which are bounded per
  address (serving.py), but no slot. Dripping 26 bodies a second used to hold all 256;
- one tenant, and one token, holds at most MAX_INFLIGHT_PER_TENANT of the slots: the others
  find room while it is at its share.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from tiered_memory.errors import Overloaded
from tiered_memory.http.auth import OPEN_PATHS, PRINCIPAL_KEY, request_tenant
from tiered_memory.http.input import read_body
from tiered_memory.metrics import Metrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def read_first_middleware(timeout_s: float) -> Middleware:
    """Read each request's body whole before the middlewares after this one see it (`read_body`)."""

    @web.middleware
    async def read_first(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            await read_body(request, timeout_s=timeout_s)
        return await handler(request)

    return read_first


def admission_middleware(limit: int, per_tenant: int, metrics: Metrics) -> Middleware:
    """Refuse a request (Overloaded) while `limit` others are in progress, or `per_tenant` of
    its tenant's or its token's; 0 means no limit."""
    in_flight = 0
    held: dict[str, int] = {}
    # Read when scraped, not set twice a request (each set takes the gauge's lock).
    metrics.requests_in_flight.set_function(lambda: in_flight)

    @web.middleware
    async def admit(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal in_flight
        if request.path in OPEN_PATHS:
            return await handler(request)
        if limit and in_flight >= limit:
            metrics.requests_shed.inc()
            raise Overloaded(f"{limit} requests in progress (MAX_INFLIGHT_REQUESTS); retry")
        principal = request.get(PRINCIPAL_KEY)
        holders = [f"tenant:{request_tenant(request)}"]
        if principal is not None:
            holders.append(f"token:{principal.token_id}")
        if per_tenant and any(held.get(h, 0) >= per_tenant for h in holders):
            metrics.requests_shed.inc()
            raise Overloaded(
                f"{per_tenant} requests of this tenant or token in progress (MAX_INFLIGHT_PER_TENANT); retry"
            )
        in_flight += 1
        for h in holders:
            held[h] = held.get(h, 0) + 1
        try:
            return await handler(request)
        finally:
            in_flight -= 1
            for h in holders:
                left = held[h] - 1
                if left:
                    held[h] = left
                else:
                    del held[h]

    return admit
