"""A database and a Redis key prefix of a run's own, on servers others use too: made at the start,
dropped and deleted at the end (only what the run made)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine


@dataclass(frozen=True)
class Scratch:
    run: str  # 8 hex digits, also in the names below
    database_url: str  # SQLAlchemy URL of the run's database
    prefix: str  # the run's Redis key prefix
    redis_url: str

    def daemon_env(self, llm_url: str, logs: Path) -> dict[str, str]:
        """A daemon's environment on these, quiet, summarizing with the LLM at `llm_url`."""
        return {
            "DATA_DIR": str(logs / self.run),
            "LOG_LEVEL": "WARNING",
            "REDIS_URL": self.redis_url,
            "REDIS_KEY_PREFIX": self.prefix,
            "DATABASE_URL": self.database_url,
            "AUTO_MIGRATE": "true",
            "LLM_BASE_URL": llm_url,
            "SUMMARY_MODEL": "bench",
        }


@contextlib.asynccontextmanager
async def scratch(name: str, mysql_url: str, redis_url: str) -> AsyncIterator[Scratch]:
    """Database `bench_{name}_{run}` on the MySQL/MariaDB server `mysql_url` names and key prefix
    `{name}{run}` on `redis_url`; the database is dropped and the prefix's keys deleted at the end."""
    run = uuid.uuid4().hex[:8]
    database, prefix = f"bench_{name}_{run}", f"{name}{run}"
    root = create_async_engine(mysql_url)
    try:
        async with root.begin() as conn:
            await conn.execute(sa.text(f"CREATE DATABASE {database}"))
        try:
            yield Scratch(run, mysql_url.rstrip("/") + "/" + database, prefix, redis_url)
        finally:
            async with root.begin() as conn:
                await conn.execute(sa.text(f"DROP DATABASE {database}"))
            hot = aioredis.Redis.from_url(redis_url)
            keys = [key async for key in hot.scan_iter(match=f"{prefix}:*", count=1000)]
            for i in range(0, len(keys), 500):
                await hot.delete(*keys[i : i + 500])
            await hot.aclose()
    finally:
        await root.dispose()
