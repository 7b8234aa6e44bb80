"""Schema migrations: the Alembic revisions shipped in `tiered_memory/migrations`, run on the
daemon's own engine, without an alembic.ini.

Revision ids are schema version numbers (0003 is version 3, the last one of the versioning that
came before Alembic, whose databases its script upgrades in place), so "schema version N" means one
thing in logs, `/readyz` and `tiered-memory migrate` whichever tool recorded it.

Alembic announces its context at INFO each time it looks at a database (every `/readyz`, every
admin command) and each revision it applies: logging.py keeps its logger at WARNING, and an
upgrade is told here instead, as one `schema_migrated` line with the versions before and after.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import weakref
from pathlib import Path

import sqlalchemy as sa
import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

# This file is tiered_memory/tiers/sql/migrate.py: the revisions are two folders up.
_SCRIPTS = Path(__file__).resolve().parents[2] / "migrations"
_MIGRATE_LOCK = "tiered_memory_migrate"
_MIGRATE_LOCK_WAIT_S = 60
# On a Galera cluster GET_LOCK holds on one node only: a row of this table is the lock instead
# (its insert is certified cluster-wide, so two nodes cannot both take it). A holder that died
# leaves its row: one older than this is taken over (a migration takes seconds to minutes).
_CLUSTER_LOCK_TABLE = "tiered_memory_migration_lock"
_CLUSTER_LOCK_STALE_S = 600
# SQLite has no named lock: a concurrent migrator's "already exists" is retried after a pause,
# and the next pass finds the work done.
_SQLITE_ATTEMPTS = 5

# Alembic runs a migration through module-level proxies (`alembic.context`, `alembic.op`), so two
# migrations interleaved on one event loop (several stores in one process, as tests make) would
# swap each other's context. One lock per loop serializes them; other processes are kept apart by
# the database (MySQL's named lock, PostgreSQL's advisory lock, SQLite's retries).
_LOOP_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()

log = structlog.get_logger("tiered_memory.sql")


def config(connection: sa.Connection | None = None) -> Config:
    """An Alembic Config for the shipped scripts, migrating on `connection` when given."""
    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_version() -> int:
    """The newest revision shipped, as a schema version number."""
    head = ScriptDirectory.from_config(config()).get_current_head()
    assert head is not None
    return int(head)


def _upgrade(connection: sa.Connection) -> None:
    command.upgrade(config(connection), "head")


def _revision(connection: sa.Connection) -> int:
    current = MigrationContext.configure(connection).get_current_revision()
    return int(current) if current else 0


async def _upgrade_with_retries(conn: AsyncConnection) -> None:
    for attempt in range(_SQLITE_ATTEMPTS if conn.dialect.name == "sqlite" else 1):
        try:
            await conn.run_sync(_upgrade)
            await conn.commit()
            return
        except (sa.exc.OperationalError, sa.exc.IntegrityError) as exc:
            await conn.rollback()
            text = str(exc.orig).lower()
            racing = "already exists" in text or "duplicate column" in text or "unique constraint" in text
            if not racing or attempt == _SQLITE_ATTEMPTS - 1:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))


async def migrate(engine: AsyncEngine) -> int:
    """Bring the schema to the newest revision; returns the schema version now in force.

    Safe to run concurrently from several replicas: MySQL/MariaDB and PostgreSQL serialize
    migrators with a named (advisory) lock, a Galera cluster with a lock row (GET_LOCK is one
    node's); on SQLite each step looks before it acts and a loser's failure is retried.
    """
    lock = _LOOP_LOCKS.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock, engine.connect() as conn:
        locked = await _lock(conn)
        try:
            before = await conn.run_sync(_revision)
            await conn.commit()
            await _upgrade_with_retries(conn)
            version = await conn.run_sync(_revision)
            await conn.commit()
            if version != before:
                log.info("schema_migrated", dialect=conn.dialect.name, from_version=before, to_version=version)
            return version
        finally:
            if locked:
                await _unlock(conn, locked)


async def _lock(conn: AsyncConnection) -> bool | str:
    """Take the database's migration lock, held by this connection's session (so across the
    migration's commits), or on a Galera cluster the lock row (its holder's id is returned);
    False where the database has none (SQLite)."""
    dialect = conn.dialect.name
    if dialect == "mysql" and await _galera(conn):
        return await _cluster_lock(conn)
    if dialect == "mysql":
        query = sa.text("SELECT GET_LOCK(:name, :wait)")
        got = (await conn.execute(query, {"name": _MIGRATE_LOCK, "wait": _MIGRATE_LOCK_WAIT_S})).scalar()
        await conn.commit()
        if got != 1:
            raise TimeoutError("another process holds the migration lock")
        return True
    if dialect == "postgresql":
        # pg_advisory_lock waits without a bound: tried every 0.2 s instead, up to the same wait.
        query = sa.text("SELECT pg_try_advisory_lock(hashtext(:name))")
        deadline = asyncio.get_running_loop().time() + _MIGRATE_LOCK_WAIT_S
        while not (await conn.execute(query, {"name": _MIGRATE_LOCK})).scalar():
            await conn.commit()
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("another process holds the migration lock")
            await asyncio.sleep(0.2)
        await conn.commit()
        return True
    return False


async def _galera(conn: AsyncConnection) -> bool:
    """Whether the server is a node of a Galera cluster (MariaDB's wsrep_on; absent on MySQL)."""
    row = (await conn.execute(sa.text("SHOW VARIABLES LIKE 'wsrep_on'"))).first()
    await conn.commit()
    return row is not None and str(row[1]).upper() == "ON"


async def _cluster_lock(conn: AsyncConnection) -> str:
    """Insert the lock row, tried every 0.2 s up to the lock's wait: a duplicate key is another
    holder (taken over when stale), a deadlock another node's insert certified first."""
    holder = secrets.token_hex(8)
    await conn.execute(
        sa.text(
            f"CREATE TABLE IF NOT EXISTS {_CLUSTER_LOCK_TABLE}"
            " (id INT PRIMARY KEY, holder VARCHAR(32) NOT NULL, taken_at DOUBLE NOT NULL) ENGINE=InnoDB"
        )
    )
    await conn.commit()
    deadline = asyncio.get_running_loop().time() + _MIGRATE_LOCK_WAIT_S
    while True:
        try:
            await conn.execute(
                sa.text(f"INSERT INTO {_CLUSTER_LOCK_TABLE} (id, holder, taken_at) VALUES (1, :holder, :now)"),
                {"holder": holder, "now": time.time()},
            )
            await conn.commit()
            return holder
        except (sa.exc.IntegrityError, sa.exc.OperationalError):
            await conn.rollback()
        stale = sa.text(f"DELETE FROM {_CLUSTER_LOCK_TABLE} WHERE id = 1 AND taken_at < :before")
        try:
            await conn.execute(stale, {"before": time.time() - _CLUSTER_LOCK_STALE_S})
            await conn.commit()
        except sa.exc.OperationalError:
            await conn.rollback()
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("another process holds the migration lock")
        await asyncio.sleep(0.2)


async def _unlock(conn: AsyncConnection, holder: bool | str) -> None:
    # A migration that failed can leave its transaction aborted (PostgreSQL then refuses every
    # statement until a rollback), which would hide its error behind the unlock's.
    await conn.rollback()
    if isinstance(holder, str):
        release = sa.text(f"DELETE FROM {_CLUSTER_LOCK_TABLE} WHERE id = 1 AND holder = :holder")
        await conn.execute(release, {"holder": holder})
    elif conn.dialect.name == "mysql":
        await conn.execute(sa.text("SELECT RELEASE_LOCK(:name)"), {"name": _MIGRATE_LOCK})
    else:
        await conn.execute(sa.text("SELECT pg_advisory_unlock(hashtext(:name))"), {"name": _MIGRATE_LOCK})
    await conn.commit()


async def current_version(engine: AsyncEngine) -> int:
    """The schema version recorded by Alembic, 0 when the database was never migrated by it
    (empty, or made by the versioning before Alembic: `migrate` upgrades both)."""
    async with engine.connect() as conn:
        return await conn.run_sync(_revision)
