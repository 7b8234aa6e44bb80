"""Whether each tier can serve: what `/readyz` reports, each tier `ok` or `degraded` (its reads
falling through to the next tier, or its writes refused)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tiered_memory.errors import HotUnavailable, SqlUnavailable
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.schema import SCHEMA_VERSION
from tiered_memory.tiers.sql.store import SqlStore

# A probe slower than this counts as a tier down: a load balancer asks often and must not wait.
_PROBE_TIMEOUT_S = 1.0


async def tier_states(hot: HotTier, store: SqlStore) -> dict[str, str]:
    """Each tier's state, both probed at once."""

    async def sql_ping() -> None:
        # Reachable is not enough: a database whose schema is missing or old refuses writes.
        if await store.schema_version() < SCHEMA_VERSION:
            raise SqlUnavailable("schema not migrated")

    hot_state, sql_state = await asyncio.gather(_probe(hot.ping), _probe(sql_ping))
    return {"hot": hot_state, "sql": sql_state}


async def _probe(ping: Callable[[], Awaitable[None]]) -> str:
    try:
        await asyncio.wait_for(ping(), timeout=_PROBE_TIMEOUT_S)
    except (HotUnavailable, SqlUnavailable, TimeoutError):
        return "degraded"
    return "ok"
