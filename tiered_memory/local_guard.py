"""What a daemon without tokens accepts: requests meant for it, from programs rather than web pages.

Without tokens (the embedded default on a developer's laptop) the daemon listens on loopback, where
every local process may use it; a web page in the browser may try to as well. It cannot read an
answer across origins, but it can send a "simple" request (a `text/plain` body needs no CORS
preflight) and, by DNS rebinding (its own name resolved to 127.0.0.1), read answers under its own
name. So a request with a body must say `Content-Type: application/json` (which a page can send
cross-site only after a preflight this daemon never answers), and the `Host` it was sent to must be
this machine's (`localhost`, a loopback address) or one `ALLOWED_HOSTS` names. A daemon that serves
other hosts without tokens on purpose (ALLOW_UNAUTHENTICATED, behind an authenticating gateway)
checks the Host only against ALLOWED_HOSTS, when it names any.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from tiered_memory.addresses import host_name, is_loopback
from tiered_memory.auth import OPEN_PATHS
from tiered_memory.errors import MisdirectedRequest, UnsupportedMedia

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def host_allowed(header: str | None, allowed: frozenset[str], *, loopback: bool) -> bool:
    """Whether a request sent to the Host `header` (None: no header, which no browser sends) is
    meant for this daemon."""
    if header is None:
        return True
    name = host_name(header)
    return name in allowed or (loopback and is_loopback(name))


def local_guard_middleware(allowed_hosts: frozenset[str], *, loopback: bool) -> Middleware:
    """The checks of the module docstring. `loopback`: loopback names are allowed (a daemon that
    serves only loopback); without it and without `allowed_hosts` no Host is checked."""
    check_host = loopback or bool(allowed_hosts)

    @web.middleware
    async def local_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            # Probes and scrapers address the daemon by whatever name reaches it; they say nothing of any session.
            return await handler(request)
        host = request.headers.get("Host")
        if check_host and not host_allowed(host, allowed_hosts, loopback=loopback):
            raise MisdirectedRequest(
                f"Host: {host_name(host or '')[:64]!r} is not this daemon's; without tokens it answers only"
                " localhost and loopback addresses (add a name to ALLOWED_HOSTS)"
            )
        json_body = request.content_type == "application/json" or request.content_type.endswith("+json")
        if request.method in _BODY_METHODS and request.body_exists and not json_body:
            raise UnsupportedMedia(f"Content-Type: expected application/json, got {request.content_type!r}")
        return await handler(request)

    return local_guard
