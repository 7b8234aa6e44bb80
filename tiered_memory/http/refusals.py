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
100 ms, each holding up the other tenants' requests). Keyed by a digest of the bearer token, as
`http/auth.py` reads it (whatever the scheme's case and the spaces around it; a daemon without
tokens has none: its refusals all go through the app). Requests on a connection already open, and
the probes, are not held back here; the limiter's answer to any request of a credential counts.

A credential the rate has not refused yet can still send its heads together: the first refusal
comes one draw on the hot tier after the first head, and every head read before it went on (the
soak's slow bodies, opened together at once: 256 through the app in one go, the loop held for
about 100 ms). So, with a limiter, at most AT_ONCE heads of one credential go on to the app before
the limiter has answered one of them (within PROBE_S); the others are answered the fixed 503 of a
connection cap, `Retry-After: 1`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from tiered_memory.http.auth import bearer_token, is_open
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
# The scope of a head refused because AT_ONCE of its credential's were out (not a rate's).
CROWD = "connections"


def header_value(head: bytes | bytearray, name: bytes) -> bytes | None:
    """The first value of header `name` (lowercase) in a request head, its surrounding spaces
    and tabs stripped, as aiohttp reads it; None when the head has none."""
    at = bytes(head).lower().find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    end = head.find(b"\r\n", start)
    return bytes(head[start : end if end >= 0 else len(head)]).strip(b" \t")


def credential_key(authorization: bytes | str | None) -> bytes | None:
    """What an `Authorization` value is remembered by: a digest of its bearer token, read as the
    auth middleware reads it (`bearer_token`; a head's bytes decoded as aiohttp decodes them), so
    that neither another spelling of the scheme nor a long value (a head may hold 64 KiB) gets
    past or fills what is kept; None when it carries no bearer token."""
    if not authorization:
        return None
    value = authorization if isinstance(authorization, str) else authorization.decode("utf-8", "surrogateescape")
    token = bearer_token(value)
    if token is None:
        return None
    return hashlib.blake2b(token.encode("utf-8", "surrogateescape"), digest_size=16).digest()


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


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a head is answered at the socket: `scope` "token" or "tenant" (its rate: a 429 after
    `wait_s`), or CROWD (AT_ONCE of its credential's heads out: the connection cap's 503)."""

    wait_s: float
    scope: str


class Refusals:
    """The credentials a rate refused, each with when a request of cost one may go again, the
    scope ("token" or "tenant") that refused it, and until when the request let through since
    then is out (0: none is); and, when `at_once` (a limiter answers), each credential's heads
    handed on since the limiter last answered one of its requests, and since when."""

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
        key = credential_key(authorization)
        if key is not None and wait_s > 0:
            self._until.put(key, (self._clock() + wait_s, scope, 0.0))

    def answered(self, authorization: str) -> None:
        """The limiter answered a request of `authorization` (let it go or refused it): the
        credential's next head may go on."""
        if not (len(self._until) or len(self._out)):
            return
        key = credential_key(authorization)
        if key is None:
            return
        self._out.pop(key)
        found = self._until.get(key)
        if found is not None and found[2]:
            self._until.put(key, (found[0], found[1], 0.0))

    def refused(self, head: bytes | bytearray) -> Refused | None:
        """Why a whole request head is answered at the socket; None when it goes on to the app
        (no bearer token, a probe's path, a wait over for PROBE_S, the one request that is then
        out until the limiter answers it, fewer than `at_once` of its credential's out)."""
        if not (len(self._until) or self._at_once):
            return None
        key = credential_key(header_value(head, b"authorization"))
        if key is None or is_open(target_path(head)):
            return None
        now = self._clock()
        found = self._until.get(key)
        if found is not None:
            until, scope, out_until = found
            if until > now:
                return Refused(until - now, scope)
            if out_until > now:
                return Refused(out_until - now, scope)
            if now - until > self._probe_s:
                self._until.pop(key)
                found = None
        if self._at_once:
            out = self._out.get(key)
            if out is None or now - out[1] >= self._probe_s:
                self._out.put(key, (1, now))
            elif out[0] >= self._at_once:
                return Refused(1.0, CROWD)
            else:
                self._out.put(key, (out[0] + 1, out[1]))
        if found is not None:
            # This one goes on; the others wait until the limiter answers it.
            self._until.put(key, (found[0], found[1], now + self._probe_s))
        return None
