"""The real servers as a test sees them: this run's Redis and a database of the test's own
(`RealServers`, made by the `real_servers` fixture), a daemon's environment on one backend, and
what a test reads or clears on them directly, not through the daemon."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import asyncpg
import pytest
import redis

from tests.helpers.databases import mysql_connect, postgres


@dataclass(frozen=True)
class RealServers:
    redis_url: str
    mysql_url: str  # SQLAlchemy URL of this test's own database
    run_id: str


def redis_flush_prefix(redis_url: str, prefix: str) -> int:
    """Delete every key under `prefix`: a Redis flush, limited to what this test created."""
    r = redis.Redis.from_url(redis_url)
    try:
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        return int(r.delete(*keys)) if keys else 0
    finally:
        r.close()


def sql_rows(url: str, query: str, *args: object) -> list[tuple[Any, ...]]:
    """Rows of one query on a real database (MariaDB or PostgreSQL), read directly (not through
    the daemon); `%s` marks each argument, whichever the server."""
    parsed = urlparse(url)
    if parsed.scheme.startswith("postgresql"):
        numbered = query
        for n in range(1, len(args) + 1):
            numbered = numbered.replace("%s", f"${n}", 1)

        async def fetch(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
            return [tuple(row) for row in await conn.fetch(numbered, *args)]

        rows: list[tuple[Any, ...]] = postgres(url, fetch)
        return rows
    conn = mysql_connect(url, database=parsed.path.lstrip("/"))
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())
    finally:
        conn.close()


@contextlib.contextmanager
def own_database(url: str) -> Iterator[str]:
    """A database of its own on the server of `url` (MariaDB or PostgreSQL), as a URL like `url`;
    dropped afterwards. For tests whose work spans a whole database (purge, sweeps)."""
    base, _, name = url.rpartition("/")
    own = f"{name.split('?')[0]}_{uuid.uuid4().hex[:6]}"
    parsed = urlparse(url)
    if parsed.scheme.startswith("postgresql"):
        postgres(url, lambda conn: conn.execute(f"CREATE DATABASE \"{own}\" ENCODING 'UTF8'"))
        try:
            yield f"{base}/{own}"
        finally:
            postgres(url, lambda conn: conn.execute(f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)'))
        return
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{own}` CHARACTER SET utf8mb4")
        yield f"{base}/{own}"
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{own}`")
        conn.close()


def backend_environment(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Environment for the daemon on one backend: the embedded default (`embedded`), real Redis +
    MariaDB (`real`) or real Redis + PostgreSQL (`postgres`); the real ones ask `request` for the
    `real_servers` (and `postgres_url`) fixtures."""
    # A loaded CI machine has stalled a SQLite write (its fsync) and a MariaDB statement past the
    # 3 s default (an append answered 503). No test on these settings means to cut SQL: the tests
    # that do set their own, shorter timeout over these.
    env = {"DATA_DIR": str(tmp_path / "data"), "SWEEP_INTERVAL_SECONDS": "3600", "SQL_TIMEOUT_MS": "15000"}
    if kind in ("real", "postgres"):
        servers: RealServers = request.getfixturevalue("real_servers")
        url = servers.mysql_url if kind == "real" else request.getfixturevalue("postgres_url")
        env |= {
            "REDIS_URL": servers.redis_url,
            "REDIS_KEY_PREFIX": f"tmt{servers.run_id}{uuid.uuid4().hex[:6]}",
            "DATABASE_URL": url,
            "AUTO_MIGRATE": "true",
        }
    return env
