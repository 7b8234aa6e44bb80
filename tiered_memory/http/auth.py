"""Bearer-token authentication: the configured tokens, the principal a token grants, and the
aiohttp middleware that checks every request outside the open probe and metrics paths.

A token entry is `token` (unrestricted: any tenant) or `tenant:token` (restricted to that tenant).
Only a SHA-256 digest of each token is kept, never shown, and a presented token is compared with
every configured digest in constant time, so neither the answer nor its timing says which token,
if any, came close.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from tiered_memory.errors import Unauthorized
from tiered_memory.settings import valid_tenant

MIN_TOKEN_CHARS = 16
# Printable ASCII without spaces: what fits in an Authorization header as it is.
_TOKEN = re.compile(r"^[\x21-\x7e]+$")
_MAX_TOKEN_CHARS = 1024

# Probes and Prometheus carry no token; these say nothing about any session.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
# The inspector's page and its files (http/inspect.py) hold no data: the page asks for a token and
# sends it with each of its reads, which are API requests like any other.
UI_PREFIX = "/ui"


def is_open(path: str) -> bool:
    """Whether `path` is answered without a token: the probes, the scrape, and the UI's files."""
    return path in OPEN_PATHS or path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


@dataclass(frozen=True, slots=True)
class ApiToken:
    """One configured token: its digest (kept out of repr) and the tenant it is restricted to
    (None: unrestricted)."""

    tenant: str | None
    digest: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a valid token speaks for: one tenant, or every tenant (None). `token_id` names the
    token without telling it (a prefix of its digest): what a per-token rate is kept under."""

    tenant: str | None
    token_id: str = ""


PRINCIPAL_KEY = web.RequestKey("principal", Principal)


def request_tenant(request: web.Request) -> str:
    """Whose share of the rates and of the slots a request draws on: its token's tenant, or the
    one an unrestricted token (or a caller of a daemon without tokens) states with X-Tenant ('':
    none, or one that is not a valid name, which the handler refuses)."""
    principal: Principal | None = request.get(PRINCIPAL_KEY)
    if principal is not None and principal.tenant is not None:
        return principal.tenant
    stated = request.headers.get("X-Tenant", "")
    return stated if valid_tenant(stated) else ""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


def _entry(raw: str, where: str) -> ApiToken:
    """One `token` or `tenant:token` entry. Errors name the entry's place, never its text: a
    misplaced colon could make part of a token look like a tenant name."""
    tenant: str | None = None
    token = raw
    if ":" in raw:
        tenant, token = raw.split(":", 1)
        if not valid_tenant(tenant):
            raise ValueError(f"{where}: expected token or tenant:token, the tenant 1-64 characters of [A-Za-z0-9._-]")
    if not _TOKEN.match(token):
        raise ValueError(f"{where}: expected a token of printable ASCII characters without spaces")
    if not MIN_TOKEN_CHARS <= len(token) <= _MAX_TOKEN_CHARS:
        raise ValueError(f"{where}: expected a token of {MIN_TOKEN_CHARS} to {_MAX_TOKEN_CHARS} characters")
    return ApiToken(tenant, _digest(token))


def parse_token_list(text: str, *, name: str = "API_TOKENS") -> list[ApiToken]:
    """Comma-separated entries (empty entries skipped). Raises ValueError naming `name` and the
    entry's position; at least one entry is expected, since an empty list would mean no auth."""
    entries = [e.strip() for e in text.split(",")]
    tokens = [_entry(e, f"{name}: entry {n}") for n, e in enumerate(entries, start=1) if e]
    if not tokens:
        raise ValueError(f"{name}: expected at least one token")
    return tokens


def read_token_file(path: Path, *, name: str = "API_TOKENS_FILE") -> list[ApiToken]:
    """One entry per line; blank lines and lines starting with `#` are skipped. Raises ValueError
    naming `name` and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}: expected a readable UTF-8 file, got {path} ({type(exc).__name__})") from None
    tokens = []
    for n, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if entry and not entry.startswith("#"):
            tokens.append(_entry(entry, f"{name}: line {n}"))
    if not tokens:
        raise ValueError(f"{name}: expected at least one token in {path}")
    return tokens


def merge_tokens(groups: Iterable[tuple[str, Sequence[ApiToken]]]) -> tuple[ApiToken, ...]:
    """The union of (variable name, tokens) groups. A token listed twice with the same scope is
    kept once; with two scopes it is refused, since it could not say which tenant it speaks for."""
    scope: dict[bytes, ApiToken] = {}
    for name, tokens in groups:
        for token in tokens:
            seen = scope.setdefault(token.digest, token)
            if seen.tenant != token.tenant:
                raise ValueError(f"{name}: a token is listed twice with different tenants")
    return tuple(scope.values())


def authenticate(tokens: Sequence[ApiToken], presented: str) -> Principal | None:
    """The principal of `presented`, or None when it matches no configured token."""
    digest = _digest(presented)
    found: ApiToken | None = None
    for token in tokens:
        # Every token is compared even after a match, so the time taken does not depend on
        # which one matched.
        if hmac.compare_digest(token.digest, digest):
            found = token
    return None if found is None else Principal(found.tenant, found.digest[:8].hex())


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` value (the scheme in any case, spaces
    around it ignored); None when the value is not one."""
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _bearer(request: web.Request) -> str | None:
    values = request.headers.getall("Authorization", [])
    return bearer_token(values[0]) if len(values) == 1 else None


def auth_middleware(tokens: Sequence[ApiToken]) -> Middleware:
    """Require `Authorization: Bearer <token>` on every path but the open ones (`is_open`), and put the token's
    Principal on the request. Raises Unauthorized (401) otherwise, with the same message whether
    the header was missing, malformed or wrong."""
    configured = tuple(tokens)

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_open(request.path):
            return await handler(request)
        presented = _bearer(request)
        principal = None if presented is None else authenticate(configured, presented)
        if principal is None:
            raise Unauthorized("expected Authorization: Bearer <token> with a valid token")
        request[PRINCIPAL_KEY] = principal
        return await handler(request)

    return require_token
