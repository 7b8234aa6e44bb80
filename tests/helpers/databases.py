"""A database of each test's own on the real MariaDB and PostgreSQL, cloned from one migrated per run.

Tests that shared one database per run passed or failed by their order: every daemon start sweeps
its whole database, and a query over a tenant's or a user's sessions saw an earlier test's rows.
A clone of an already migrated database costs a tenth of a second (no Alembic run), so every test
gets its own and the suite can run in any order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlparse

import asyncpg
import pymysql

from tiered_memory.tiers.sql.engine import create_engine
from tiered_memory.tiers.sql.migrate import migrate

T = TypeVar("T")


def in_thread(work: Callable[[], Awaitable[T]]) -> T:
    """`work()` run to completion on an event loop of its own, in a thread: fixtures and tests
    call this from inside a running event loop too."""

    async def run() -> T:
        return await work()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def mysql_connect(url: str, *, database: str | None = None) -> pymysql.Connection[Any]:
    """A direct connection to the MySQL/MariaDB server of `url` (to `database` on it, if given)."""
    parsed = urlparse(url)
    return pymysql.connect(
        host=parsed.hostname or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        database=database,
        connect_timeout=3,
        autocommit=True,
    )


def postgres(url: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """`work` on a connection to `url` (a SQLAlchemy or a plain PostgreSQL URL)."""
    plain = urlparse(url)._replace(scheme="postgresql").geturl()

    async def run() -> T:
        conn = await asyncpg.connect(plain, timeout=3)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return in_thread(run)


def migrate_database(url: str) -> None:
    """Bring the database of `url` to the newest schema, as AUTO_MIGRATE would."""

    async def run() -> None:
        engine = create_engine(url)
        try:
            await migrate(engine)
        finally:
            # A PostgreSQL template must have no connection left when it is copied.
            await engine.dispose()

    in_thread(run)


def clone_mariadb(base: str, template: str, name: str) -> None:
    """Create database `name` with `template`'s tables and rows (the schema version) on the server
    of `base`. SHOW CREATE TABLE keeps every index and column as migrated."""
    conn = mysql_connect(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            cur.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema=%s AND table_type='BASE TABLE'",
                (template,),
            )
            tables = [row[0] for row in cur.fetchall()]
            cur.execute(f"USE `{name}`")
            for table in tables:
                cur.execute(f"SHOW CREATE TABLE `{template}`.`{table}`")
                cur.execute(cur.fetchone()[1])
                cur.execute(f"INSERT INTO `{name}`.`{table}` SELECT * FROM `{template}`.`{table}`")
    finally:
        conn.close()


def drop_mariadb(base: str, name: str) -> None:
    conn = mysql_connect(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def clone_postgres(base: str, template: str, name: str) -> None:
    """Create database `name` as a copy of `template` (PostgreSQL copies it whole)."""

    async def create(conn: asyncpg.Connection) -> None:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

    postgres(base, create)


def drop_postgres(base: str, name: str) -> None:
    async def drop(conn: asyncpg.Connection) -> None:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    postgres(base, drop)
