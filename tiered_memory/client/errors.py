"""The client's exception tree: what a caller catches, whatever went wrong on the way.

ClientError
├── ApiError            the daemon answered 4xx; `status`, `code` and `message` are the server's
│   ├── InvalidRequest  400 (a field is wrong: the message names it) and 413 (body too large)
│   ├── Unauthorized    401 (no token, or one the daemon does not know)
│   ├── Forbidden       403 (the session belongs to another tenant or user)
│   ├── NotFound        404 (no such session, or rebuild job)
│   └── Conflict        409 (a message_id reused for other content, a rebuild racing a summary,
│                       a summarized message patched), 412 (a state written over a stale version)
├── Unavailable         no usable answer after every retry: the daemon was unreachable, cut the
│                       connection, or answered 5xx (503: a store is down; `retry_after` seconds);
│                       or a rebuild job failed for a reason a retry may cure (`status` None)
└── Timeout             no answer within the timeout (not retried: the request may still be running)

A 4xx is never retried: the same request would get the same answer. Only `Unavailable` is what
retries were for; when it is raised they are used up. A rebuild job that failed (`rebuild_summary`)
raises what its code names: Conflict for `conflict` (409), NotFound for `not_found` (404), and
Unavailable (`status` None) for the reasons a later try may cure.
"""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error the client raises."""


class ApiError(ClientError):
    """The daemon refused the request (4xx). `message` is the server's own explanation."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class InvalidRequest(ApiError):
    """400 or 413: the request is malformed or too large; nothing was changed."""


class Unauthorized(ApiError):
    """401: the daemon requires a bearer token and this one is missing or unknown."""


class Forbidden(ApiError):
    """403: the session is not accessible with these credentials (tenant or user)."""


class NotFound(ApiError):
    """404: the session does not exist."""


class Conflict(ApiError):
    """409: the request contradicts what is stored; 412 (code `precondition_failed`): a state
    write's If-Match names another version than the stored one."""


class Unavailable(ClientError):
    """The daemon could not serve the request, after every retry. `status` is the last HTTP status
    (None when no answer came: connection refused or cut), `retry_after` its Retry-After in seconds."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class Timeout(ClientError):
    """No answer within the timeout. The request may have been carried out: repeat a write with
    the same message_id (the client's own retries reuse it) and it is stored once."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: Conflict,
    413: InvalidRequest,
}


def api_error(status: int, code: str, message: str) -> ApiError:
    """The ApiError subclass for a 4xx status (ApiError itself for one the API does not use)."""
    return _BY_STATUS.get(status, ApiError)(status, code, message)
