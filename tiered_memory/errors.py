"""The domain's exception tree. Stores raise these; only the HTTP edge maps them to status codes.

TieredMemoryError
├── ConfigError            a setting is missing, malformed or unusable (start-up stops)
├── InvalidInput           a request is malformed (→ 400)
│   ├── BodyTimeout        its body did not arrive within BODY_TIMEOUT_SECONDS (→ 408)
│   ├── UnsupportedMedia   a body that is not application/json, without tokens (→ 415)
│   └── MisdirectedRequest a Host that is not this daemon's, without tokens (→ 421)
├── Unauthorized           no valid bearer token where one is required (→ 401)
├── NotFound               the session does not exist (→ 404)
├── Forbidden              the session belongs to another tenant or user (→ 403)
├── Conflict               a message_id was reused for different content (→ 409)
│   └── QuotaExceeded      the tenant is at TENANT_MAX_SESSIONS or TENANT_MAX_BYTES (→ 409)
├── Overloaded             this process has MAX_INFLIGHT_REQUESTS in progress (→ 503)
├── RateLimited            the tenant or token is past its RATE_LIMITS rate (→ 429)
├── DeadlineExceeded       the request ran past REQUEST_TIMEOUT_MS and was cancelled (→ 504)
├── LlmFailed              the LLM gave no usable summary (→ deterministic fallback)
└── TierUnavailable        a store did not answer in time or failed (→ 503 on writes)
    ├── HotUnavailable     Redis / the in-process cache
    └── SqlUnavailable     MySQL/MariaDB / SQLite
"""

from __future__ import annotations


class TieredMemoryError(Exception):
    """Base of every error the daemon raises on purpose."""


class ConfigError(TieredMemoryError):
    """A setting is missing or malformed, or cannot be used (HOST and PORT another process holds);
    the message names the variable and what it expects."""


class InvalidInput(TieredMemoryError):
    """A request is malformed; the message says what was wrong. `status` and `code` are what the
    HTTP edge answers."""

    status = 400
    code = "invalid_input"


class BodyTimeout(InvalidInput):
    """A request's body did not arrive in time (a client that drips it holds a connection and a
    handler for nothing)."""

    status = 408
    code = "request_timeout"


class UnsupportedMedia(InvalidInput):
    """A body that does not say it is JSON, on a daemon without tokens (local_guard.py)."""

    status = 415
    code = "unsupported_media_type"


class MisdirectedRequest(InvalidInput):
    """A request sent to a Host that is not this daemon's, on one without tokens (local_guard.py)."""

    status = 421
    code = "misdirected_request"


class CrossSite(InvalidInput):
    """A web page's request that changes something, on a daemon without tokens (local_guard.py)."""

    status = 403
    code = "cross_site_request"


class Unauthorized(TieredMemoryError):
    """The request carries no valid bearer token; the message never says which part was wrong."""


class NotFound(TieredMemoryError):
    """The session does not exist."""


class Forbidden(TieredMemoryError):
    """The session belongs to another tenant or user than the caller's. It takes no message: the
    answer is the same whatever the reason, so that it tells a caller nothing about the owner."""

    message = "session not accessible with these credentials"

    def __init__(self) -> None:
        super().__init__(self.message)


class Conflict(TieredMemoryError):
    """The request contradicts what is stored (a message_id reused for other content, a change
    of a message a summary covers). `code` names the case for the caller."""

    def __init__(self, message: str, *, code: str = "conflict") -> None:
        super().__init__(message)
        self.code = code


class QuotaExceeded(Conflict):
    """The caller's tenant holds what its quota allows (`quota`: "sessions" or "bytes"):
    nothing more is stored for it until it deletes something (tiers/sql/quota.py)."""

    def __init__(self, quota: str, message: str) -> None:
        super().__init__(message, code="quota_exceeded")
        self.quota = quota


class Overloaded(TieredMemoryError):
    """The process is at its limit of requests in progress (or a tenant at its bound of queued
    text work, summarize/lane.py): refused at once, so that a gateway retries (or goes to another
    replica) instead of queueing behind the others."""


class RateLimited(TieredMemoryError):
    """A tenant or token is past its rate (RATE_LIMITS, TOKEN_RATE_LIMIT): refused before any work,
    `retry_after_s` being when its bucket has a request again."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(TieredMemoryError):
    """A request ran past its deadline (REQUEST_TIMEOUT_MS) and its work was cancelled. A write it
    was making may have committed: a retry with the same message_id tells (it stores nothing twice)."""


class TierUnavailable(TieredMemoryError):
    """A store failed or did not answer within its timeout."""

    tier: str = "unknown"


class HotUnavailable(TierUnavailable):
    tier = "hot"


class SqlUnavailable(TierUnavailable):
    tier = "sql"


class LlmFailed(TieredMemoryError):
    """The LLM did not give a usable summary; `reason` is one of timeout, http_error,
    transport, malformed, empty, answer, ungrounded (no sentence of its summary was in the
    conversation), circuit_open. Callers fall back to the deterministic summarizer."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
