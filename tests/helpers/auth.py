"""The bearer tokens of the tests that turn authentication on, and the headers a gateway sends."""

from __future__ import annotations

ADMIN = "admin-token-0123456789abcdef"


ACME = "acme-token-0123456789abcdef"


OTHER = "other-token-0123456789abcdef"


def bearer(token: str, user: str | None = None, tenant: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if user is not None:
        headers["X-User-ID"] = user
    if tenant is not None:
        headers["X-Tenant"] = tenant
    return headers
