"""Rate refusals remembered: a credential its rate refused is refused again at the socket until
its wait is over, without a request's cost.

Why: a refusal through the app costs what a request costs (aiohttp's handler and parser, the
middlewares, a draw on the hot tier, an error response, a log line), and a tenant's clients
refused together come back together, since `Retry-After` tells them all the same second: in the
tenant soak (`bench.tenant_soak`) the 256 slow bodies of one tenant were refused about 80 times a
second, in bursts, on the event loop that serves every tenant. A credential the rate limiter
refused (`rate_limit.py`) is remembered here until a request of the least cost could go again;
the server (`serving.py`) answers the next connection that presents it, on its first request
head, with the same 429, and no handler is made.

Only what the limiter said is repeated: the wait kept is the one for a request that costs one (a
refused request of higher cost waited for its own cost), from a bucket that only refills with
time, so a request refused here would have been refused there. For PROBE_S once the wait is
over, the credential's new connections go on to the limiter one at a time: while one is out (until
the limiter has answered it, at most PROBE_S for one that never reaches it) the others are refused
with `Retry-After: 1`. Clients refused together come back together: without this, every one whose
head arrived before the limiter refused the first of them went on to the app, in a burst as large
as the loop was slow (the soak's 300 slow bodies: bursts of up to 250 refusals through the app in
100 ms, each holding up the other tenants' requests). Keyed by the `Authorization` value as sent
(a daemon without tokens has none: its refusals all go through the app). Requests on a connection
already open, and the probes, are not seen here.

A credential the rate has not refused yet can still send its heads together: the first refusal
comes one draw on the hot tier after the first head, and every head read before it went on (the
soak's slow bodies, opened together at once: 256 through the app in one go, the loop held for
about 100 ms). So, with a limiter, at most AT_ONCE heads of one credential go on to the app before
the limiter has answered one of them (within PROBE_S); the others are answered the fixed 503 of a
connection cap, `Retry-After: 1`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

from tiered_memory.http.auth import is_open
from tiered_memory.lru import Lru

# More credentials than a daemon's tokens; past it the least recently refused is forgotten (its
# next request goes through the app, as every request did before).
MOST_REMEMBERED = 4096
# How long after a wait a credential's new connections go on one at a time, and how long one of
# them holds the others back when the limiter never answers it (a head the HTTP parser refuses, a
# client that left): a Retry-After's second.
PROBE_S = 1.0
# A credential's heads that go on to the app before the limiter has answered one of them: more
# than a gateway's pool opens in the time of one draw on the hot tier, far fewer than a flood.
AT_ONCE = 16


def header_value(head: bytes | bytearray, name: bytes) -> bytes | None:
    """The first value of header `name` (lowercase) in a request head, its surrounding spaces
    and tabs stripped, as aiohttp reads it; None when the head has none."""
    at = bytes(head).lower().find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    end = head.find(b"\r\n", start)
    return bytes(head[start : end if end >= 0 else len(head)]).strip(b" \t")


def target_path(head: bytes | bytearray) -> str:
    """The path of a request head's target, without its query ('' when the line is not one)."""
    line = bytes(head).split(b"\r\n", 1)[0]
    target = line.split(b" ")[1] if line.count(b" ") >= 2 else b""
    return target.partition(b"?")[0].decode("latin-1")


def past_its_rate(scope: str) -> str:
    """What a request refused by `scope`'s rate ("token" or "tenant") is told."""
    return f"the {scope}'s request rate is past its limit; retry"


def too_many(wait_s: float, scope: str) -> bytes:
    """The 429 the rate limiter answers (http/edge.py), as bytes, closing the connection: a
    client may still be sending the body that was never read."""
    body = json.dumps({"error": {"code": "rate_limited", "message": past_its_rate(scope)}}).encode()
    return (
        b"HTTP/1.1 429 Too Many Requests\r\n"
        b"Content-Type: application/json; charset=utf-8\r\n"
        b"Retry-After: " + str(max(1, math.ceil(wait_s))).encode() + b"\r\n"
        b"Connection: close\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class Refusals:
    """The credentials a rate refused, each with when a request of cost one may go again, the
    scope ("token" or "tenant") that refused it, and until when the request let through since
    then is out (0: none is); and, when `at_once` (a limiter answers), each credential's heads
    handed on since the limiter last answered one of them, and since when."""

    def __init__(
        self,
        *,
        most: int = MOST_REMEMBERED,
        probe_s: float = PROBE_S,
        at_once: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._until: Lru[bytes, tuple[float, str, float]] = Lru(most)
        self._out: Lru[bytes, tuple[int, float]] = Lru(most)
        self._probe_s = probe_s
        self._at_once = at_once
        self._clock = clock

    def refuse(self, authorization: str, wait_s: float, scope: str) -> None:
        """`authorization` was refused by `scope`'s rate: no request of it may go for `wait_s`."""
        if authorization and wait_s > 0:
            self._until.put(authorization.encode("latin-1", "replace"), (self._clock() + wait_s, scope, 0.0))

    def answered(self, authorization: str, *, admitted: bool) -> None:
        """The limiter answered a request of `authorization` (`admitted`: let it go, and then the
        next may go on)."""
        if not authorization or not (len(self._until) or len(self._out)):
            return
        credential = authorization.encode("latin-1", "replace")
        self._out.pop(credential)
        found = self._until.get(credential) if admitted else None
        if found is not None:
            self._until.put(credential, (found[0], found[1], 0.0))

    def refused(self, head: bytes | bytearray) -> tuple[float, str] | None:
        """How long a whole request head's credential is still refused, and by which scope; None
        when it may go on to the app (no credential, a probe's path, a wait over for PROBE_S, or
        the one request that is then out until the limiter answers it)."""
        if not len(self._until):
            return None
        credential = header_value(head, b"authorization")
        if not credential:
            return None
        found = self._until.get(credential)
        if found is None or is_open(target_path(head)):
            return None
        until, scope, out_until = found
        now = self._clock()
        if until > now:
            return until - now, scope
        if out_until > now:
            return out_until - now, scope
        if now - until > self._probe_s:
            self._until.pop(credential)
        else:
            self._until.put(credential, (until, scope, now + self._probe_s))
        return None

    def hand_on(self, head: bytes | bytearray) -> bool:
        """Whether a head `refused` let go goes on to the app: not when `at_once` of its
        credential's went on within PROBE_S and the limiter has answered none of them."""
        if not self._at_once:
            return True
        credential = header_value(head, b"authorization")
        if not credential or is_open(target_path(head)):
            return True
        now = self._clock()
        found = self._out.get(credential)
        if found is None or now - found[1] >= self._probe_s:
            self._out.put(credential, (1, now))
            return True
        count, since = found
        if count >= self._at_once:
            return False
        self._out.put(credential, (count + 1, since))
        return True
