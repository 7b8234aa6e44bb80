"""Request rates per tenant and per token (RATE_LIMITS, TOKEN_RATE_LIMIT), so that one tenant's
burst, a runaway loop or a leaked token, cannot take the others' share of the replicas.

A request counts one for each started TEXT_UNIT (4 KiB) of its body, one at least, and a
take-back, or a patch of a message its session's recall postings held (both drop them), is
charged the session's text that the next question reads back from SQL (service.py). Why: a request's cost
grows with its text (parsed, escaped for SQL, written to both tiers, tokenized, summarized), and a
rate counted in requests alone let a tenant at 50 appends a second of 32 KB each push 1.6 MB/s
through the serving process, taking the other tenants' p99 to 2.8 times its calm value
(python -m bench.tenant_soak), and let one small request (a patched message, then a question) rebuild
a 3.2 MB session's postings. Counted by size, an utterance is one request, and a tenant's rate
bounds its bytes as well: 50/s is 50 appends of up to 4 KiB, or 6 of 32 KB.

Each request draws on its tenant's bucket and, with a token, on its token's: the buckets live in
the hot tier (tiers/buckets.py), so every replica draws on the same ones. A request past its rate
is refused with 429 and `Retry-After` before any work. A hot tier that fails lets requests through
(counted): a rate limit must not turn a Redis outage into a full one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from tiered_memory.errors import HotUnavailable, RateLimited
from tiered_memory.http.auth import PRINCIPAL_KEY, is_open, request_tenant
from tiered_memory.http.input import BODY_SECONDS_KEY
from tiered_memory.http.refusals import Refusals, past_its_rate
from tiered_memory.metrics import Metrics
from tiered_memory.settings import Rate
from tiered_memory.tiers.buckets import Buckets, tenant_bucket, tenant_rate, units

log = structlog.get_logger("tiered_memory.http.rate_limit")


def request_cost(request: web.BaseRequest, max_body_bytes: int) -> int:
    """What a request counts against its rates: its body's `units`, by its Content-Length, never
    more than the largest body a request may send (a larger one is refused when it is read: a
    claimed length must not put the tenant in debt). A body whose size on the wire does not bound
    its text, sent without a length (chunked) or compressed (`Content-Encoding`), counts as the
    largest: what it holds is not known before it is read, and must not go uncounted."""
    if not request.body_exists:
        return 1
    size = request.content_length
    if size is None or request.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        size = max_body_bytes
    return units(min(size, max_body_bytes))


def rate_limit_middleware(
    tenant_rates: dict[str, Rate],
    token_rate: Rate | None,
    buckets_of: Callable[[web.Request], Buckets],
    metrics: Metrics,
    *,
    max_body_bytes: int,
    refusals: Refusals,
) -> Middleware:
    """Draw each request but the probes' on its tenant's bucket (the token's tenant, or the one an
    unrestricted token or a daemon without tokens states with X-Tenant; '' for none) and on its
    token's, in the buckets `buckets_of` the request's app keeps, by its `request_cost`;
    RateLimited past either, its credential kept in `refusals` until a request costing one may
    go."""

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_open(request.path):
            return await handler(request)
        principal = request.get(PRINCIPAL_KEY)
        tenant = request_tenant(request)
        # The token's bucket first: a request its own token's rate refuses must not spend its
        # tenant's (a runaway token would starve the tenant's other tokens).
        draws = []
        if token_rate is not None and principal is not None:
            draws.append(("token", f"token:{principal.token_id}", token_rate))
        rate = tenant_rate(tenant_rates, tenant)
        if rate is not None:
            draws.append(("tenant", tenant_bucket(tenant), rate))
        cost = request_cost(request, max_body_bytes)
        buckets = buckets_of(request)
        taken: list[tuple[str, Rate]] = []
        try:
            for scope, key, rate in draws:
                try:
                    wait = await buckets.take(key, rate, cost)
                except HotUnavailable:
                    metrics.rate_limit_skipped.inc()
                    continue
                if wait > 0:
                    metrics.rate_limited.labels(scope).inc()
                    # A request its tenant refuses gives its token back what it took: a gateway that
                    # retries while its tenant is at its rate must not run its token into debt.
                    for key_taken, rate_taken in taken:
                        with contextlib.suppress(HotUnavailable):
                            await buckets.take(key_taken, rate_taken, -cost, owed=True)
                    if principal is not None and (scope == "token" or principal.tenant is not None):
                        # The credential alone says whose bucket refused (not so for a request
                        # without a token, or an unrestricted token's, whose X-Tenant says it).
                        # Its cost was waited for; a request costing one goes sooner, by what the
                        # rest of its cost takes to come.
                        cheapest = wait - (min(cost, rate.burst) - 1) / rate.per_second
                        refusals.refuse(request.headers.get("Authorization", ""), cheapest, scope)
                    raise RateLimited(past_its_rate(scope), retry_after_s=wait)
                taken.append((key, rate))
        finally:
            # Whatever the draws came to (a client that left cancels them): the credential's next
            # head may go on to the app (http/refusals.py).
            refusals.answered(request.headers.get("Authorization", ""))
        try:
            return await handler(request)
        finally:
            # Time held is charged too: each whole second its body took to arrive counts one
            # more, owed (a body dripped for BODY_TIMEOUT_SECONDS holds a connection that long).
            held = int(request.get(BODY_SECONDS_KEY, 0.0))
            for key, rate in taken if held else ():
                with contextlib.suppress(HotUnavailable):
                    await buckets.take(key, rate, held, owed=True)

    return limit
