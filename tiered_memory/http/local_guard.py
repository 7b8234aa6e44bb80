"""What a daemon without tokens accepts: requests meant for it, from programs rather than web pages.

Without tokens (the embedded default on a developer's laptop) the daemon listens on loopback, where
every local process may use it; a web page in the browser may try to as well. It cannot read an
answer across origins, but it can send a "simple" request (a `text/plain` body needs no CORS
preflight) and, by DNS rebinding (its own name resolved to 127.0.0.1), read answers under its own
name. So a request with a body must say `Content-Type: application/json` (which a page can send
cross-site only after a preflight this daemon never answers), and the `Host` it was sent to must be
this machine's (`localhost`, a loopback address) or one `ALLOWED_HOSTS` names. A request that
changes something needs no body (`…/close`, `…/summary/rebuild`), so one that a browser marks as
a page's from another site is refused too (403): `Sec-Fetch-Site: cross-site`, or an `Origin`
whose host is not one the daemon answers (`null` included, a sandboxed page's). Programs send
neither header. A daemon that serves other hosts without tokens on purpose (ALLOW_UNAUTHENTICATED,
behind an authenticating gateway) checks the Host and the Origin only against ALLOWED_HOSTS, when
it names any; a cross-site request is refused there too.
"""

from __future__ import annotations

import urllib.parse

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from tiered_memory.errors import CrossSite, MisdirectedRequest, UnsupportedMedia
from tiered_memory.http.addresses import host_name
from tiered_memory.http.auth import OPEN_PATHS
from tiered_memory.lru import Lru
from tiered_memory.settings import is_loopback

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# What a page cannot do across sites without a preflight this daemon never answers is read; what
# it can do is send, and these change something.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Host headers whose verdict one middleware keeps (`local_guard_middleware`).
_HOSTS_KEPT = 64


def allowed_names(text: str) -> frozenset[str]:
    """ALLOWED_HOSTS's names, each written as a Host header is (a port, brackets) or bare: the
    name is what is compared."""
    return frozenset(host_name(h) for h in text.split(",") if h.strip())


def host_allowed(header: str | None, allowed: frozenset[str], *, loopback: bool) -> bool:
    """Whether a request sent to the Host `header` (None: no header, which no browser sends) is
    meant for this daemon."""
    if header is None:
        return True
    name = host_name(header)
    return name in allowed or (loopback and is_loopback(name))


def _same_site(request: web.Request, allowed: frozenset[str], *, loopback: bool, check_host: bool) -> None:
    """Raise CrossSite when the browser says the request is another site's page's."""
    if request.headers.get("Sec-Fetch-Site", "").strip().lower() == "cross-site":
        raise CrossSite("Sec-Fetch-Site: cross-site; without tokens a web page of another site may change nothing")
    origin = request.headers.get("Origin")
    if origin is None or not check_host:
        return
    host = _origin_host(origin)
    if not host or not host_allowed(host, allowed, loopback=loopback):
        raise CrossSite(
            "Origin: not this daemon's; without tokens a web page of another site may change nothing"
            " (add its name to ALLOWED_HOSTS)"
        )


def _origin_host(origin: str) -> str:
    """The host (and port) an `Origin` header names; empty for one that names none (`null`)."""
    try:
        parsed = urllib.parse.urlsplit(origin.strip())
    except ValueError:
        return ""
    return parsed.netloc if parsed.scheme in ("http", "https") else ""


def local_guard_middleware(allowed_hosts: frozenset[str], *, loopback: bool) -> Middleware:
    """The checks of the module docstring. `loopback`: loopback names are allowed (a daemon that
    serves only loopback); without it and without `allowed_hosts` no Host is checked."""
    check_host = loopback or bool(allowed_hosts)
    # The verdicts on the Host headers seen most recently: a gateway sends the same one on every
    # request, and parsing it as an address took 2 µs a request. Bounded, since the header is
    # the client's to choose; least recently used first out, so junk cannot crowd out a gateway.
    judged: Lru[str | None, bool] = Lru(_HOSTS_KEPT)

    def meant_for_us(host: str | None) -> bool:
        verdict = judged.get(host)
        if verdict is None:
            verdict = judged.put(host, host_allowed(host, allowed_hosts, loopback=loopback))
        return verdict

    @web.middleware
    async def local_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            # Probes and scrapers address the daemon by whatever name reaches it; they say nothing of any session.
            return await handler(request)
        host = request.headers.get("Host")
        if check_host and not meant_for_us(host):
            # The Host is not repeated: an error echoes none of the request's bytes.
            raise MisdirectedRequest(
                "Host: not this daemon's name; without tokens it answers only localhost and loopback"
                " addresses (add a name to ALLOWED_HOSTS)"
            )
        if request.method not in _SAFE_METHODS:
            _same_site(request, allowed_hosts, loopback=loopback, check_host=check_host)
        json_body = request.content_type == "application/json" or request.content_type.endswith("+json")
        if request.method in _BODY_METHODS and request.body_exists and not json_body:
            raise UnsupportedMedia("Content-Type: expected application/json (or a +json type)")
        return await handler(request)

    return local_guard
