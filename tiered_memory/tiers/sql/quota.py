"""What one tenant may store in SQL: at most so many sessions and so many bytes of message text
(TENANT_MAX_SESSIONS, TENANT_MAX_BYTES; 0: no bound). Past either, an append is refused with 409
`quota_exceeded` and stores nothing, so that one tenant cannot fill the database every tenant
shares; deleting sessions makes room again.

A tenant's usage is counted from its session rows (`COUNT(*)`, `SUM(content_bytes)`), so that
every way a session goes (a delete, an erasure, retention) is seen without bookkeeping of its own.
The count is a query, so it is not made for every batch: a process keeps each tenant's usage and
counts again when it is older than REFRESH_SECONDS, or at once while the tenant is near a bound
(within NEAR of it), where the answer must be exact. Several replicas appending for one tenant
at the same moment may together pass a bound by what their batches in flight hold; nothing more.

The tenant-less namespace (no tokens, or an unrestricted token without X-Tenant: the operator's
or a trusted gateway's) has no quota.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tiered_memory.errors import QuotaExceeded
from tiered_memory.tiers.sql.schema import sessions

# How long a tenant's counted usage is trusted while it is far from its bounds.
REFRESH_SECONDS = 5.0
# "Near" a bound: within this share of it, every batch counts again.
NEAR = 0.1


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """One tenant's bounds (0: none)."""

    sessions: int = 0
    bytes: int = 0

    @property
    def active(self) -> bool:
        return bool(self.sessions or self.bytes)


@dataclass(slots=True)
class Usage:
    """What a tenant holds, as last counted plus what this process has stored since."""

    sessions: int
    bytes: int
    counted_at: float


class TenantQuotas:
    """The bounds and each tenant's usage as this process knows it."""

    def __init__(self, quota: TenantQuota, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.quota = quota
        self._clock = clock
        self._usage: dict[str, Usage] = {}
        self._count = (
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(sessions.c.content_bytes), 0))
            .select_from(sessions)
            .where(sessions.c.tenant == sa.bindparam("tenant"))
        )

    def _stale(self, usage: Usage | None) -> bool:
        if usage is None or self._clock() - usage.counted_at > REFRESH_SECONDS:
            return True
        q = self.quota
        near_sessions = q.sessions and usage.sessions >= q.sessions * (1 - NEAR)
        near_bytes = q.bytes and usage.bytes >= q.bytes * (1 - NEAR)
        return bool(near_sessions or near_bytes)

    async def load(self, conn: AsyncConnection, tenants: set[str]) -> None:
        """Count again, in the batch's transaction, the usage of those of `tenants` whose known
        usage is too old or near a bound."""
        if not self.quota.active:
            return
        for tenant in sorted(tenants):
            if self._stale(self._usage.get(tenant)):
                count, size = (await conn.execute(self._count, {"tenant": tenant})).one()
                self._usage[tenant] = Usage(int(count), int(size), self._clock())

    def admit(self, tenant: str, *, new_session: bool, size: int) -> None:
        """Count a message of `size` bytes (opening a session when `new_session`) for `tenant`,
        loaded first; QuotaExceeded, counting nothing, when it would pass a bound."""
        usage = self._usage.get(tenant)
        if usage is None:
            return
        q = self.quota
        if new_session and q.sessions and usage.sessions + 1 > q.sessions:
            raise QuotaExceeded(
                "sessions",
                f"the tenant holds {usage.sessions} sessions, TENANT_MAX_SESSIONS is {q.sessions}:"
                " delete sessions it no longer needs, or ask the operator for a larger quota",
            )
        if q.bytes and usage.bytes + size > q.bytes:
            raise QuotaExceeded(
                "bytes",
                f"the tenant's sessions hold {usage.bytes} bytes of text and this message has {size},"
                f" TENANT_MAX_BYTES is {q.bytes}: delete sessions it no longer needs, or ask the"
                " operator for a larger quota",
            )
        usage.sessions += int(new_session)
        usage.bytes += size
