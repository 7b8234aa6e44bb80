"""The SQL schema (sessions, cold `messages`, warm `conversation_summaries`) and its idempotent migration.

One definition serves MySQL/MariaDB and SQLite; dialect variants are declared per column.
`migrate` creates what is missing and applies numbered upgrade steps recorded in `schema_version`,
so running it twice, or on a database another replica just migrated, changes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

SCHEMA_VERSION = 3

_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

# SQLite only auto-increments an INTEGER PRIMARY KEY; MySQL wants BIGINT for a table that grows forever.
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIMESTAMP: sa.Double[float] = sa.Double()  # epoch seconds, fractional: ordering and ages without time-zone questions
_SID = sa.String(128)

metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", _TIMESTAMP, nullable=False),
    **_MYSQL_TABLE,
)

# Per-session bookkeeping. Its row is locked by every append, which serializes a session's appends
# across replicas and makes seq, turn and the counters exact.
sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("session_id", _SID, primary_key=True),
    sa.Column("user_id", sa.String(128), nullable=True),
    # The tenant of the token that created the session; '' without one (an unrestricted token,
    # or no authentication). Set once, like user_id, and checked under the row lock. (Version 3.)
    sa.Column("tenant", sa.String(64), nullable=False, server_default=""),
    sa.Column("turn_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("message_count", sa.Integer, nullable=False, server_default="0"),
    # 1 while the open turn has a user message waiting for its reply: only then does an
    # assistant message complete a turn (a greeting or a second reply part does not).
    sa.Column("pending_user", sa.SmallInteger, nullable=False, server_default="0"),
    # Characters of every message so far: what the whole history would cost a prompt. (Version 2.)
    sa.Column("content_chars", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Column("last_activity", _TIMESTAMP, nullable=False),
    sa.Column("closed_at", _TIMESTAMP, nullable=True),
    sa.Column("close_reason", sa.String(16), nullable=True),
    sa.Index("ix_sessions_open_activity", "closed_at", "last_activity"),
    **_MYSQL_TABLE,
)

# Cold tier: every message verbatim, the source of truth.
messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("session_id", _SID, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("turn", sa.Integer, nullable=False),
    sa.Column("user_id", sa.String(128), nullable=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=False),
    sa.Column("channel", sa.String(8), nullable=False),
    sa.Column("message_id", sa.String(128), nullable=False),
    sa.Column("completes_turn", sa.SmallInteger, nullable=False, server_default="0"),
    # An assistant reply that was stopped, failed or is still streaming completes no turn and is
    # never summarized as an answer. (Schema version 2.)
    sa.Column("status", sa.String(16), nullable=False, server_default="completed"),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Index("ix_messages_session_id", "session_id", "id"),
    sa.UniqueConstraint("session_id", "message_id", name="uq_messages_session_message_id"),
    **_MYSQL_TABLE,
)

# Warm tier: the best summary of each session.
conversation_summaries = sa.Table(
    "conversation_summaries",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("session_id", _SID, nullable=False, unique=True),
    sa.Column("user_id", sa.String(128), nullable=True),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("turn_count", sa.Integer, nullable=False),
    sa.Column("covered_turns", sa.Integer, nullable=False),
    sa.Column("topics", sa.JSON, nullable=False),
    sa.Column("structured", sa.JSON, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("compressions", sa.Integer, nullable=False, server_default="0"),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Column("updated_at", _TIMESTAMP, nullable=False),
    sa.Index("ix_summaries_user_updated", "user_id", "updated_at"),
    **_MYSQL_TABLE,
)


# One row per summarization: the range it covered and a digest of that range, so a summary can be
# traced back to its raw messages and rebuilt slice by slice. (Version 2; created by create_all.)
summary_slices = sa.Table(
    "summary_slices",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("session_id", _SID, nullable=False),
    sa.Column("from_turn", sa.Integer, nullable=False),
    sa.Column("to_turn", sa.Integer, nullable=False),
    sa.Column("first_seq", sa.Integer, nullable=False),
    sa.Column("last_seq", sa.Integer, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("model", sa.String(128), nullable=True),
    sa.Column("prompt_id", sa.String(64), nullable=True),
    sa.Column("summary_version", sa.Integer, nullable=False),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Index("ix_slices_session_turn", "session_id", "to_turn"),
    **_MYSQL_TABLE,
)


async def _applied_version(conn: AsyncConnection) -> int:
    result = await conn.execute(sa.select(sa.func.max(schema_version.c.version)))
    return int(result.scalar() or 0)


_MIGRATE_LOCK = "tiered_memory_migrate"
_MIGRATE_LOCK_WAIT_S = 60


async def _create_tables(conn: AsyncConnection) -> None:
    # create_all checks, then creates: two processes can both find a table missing. MySQL
    # serializes migrations with a named lock; on SQLite (or a lock that timed out) the loser's
    # "already exists" is harmless, and one more pass finds everything in place.
    for attempt in range(3):
        try:
            await conn.run_sync(metadata.create_all, checkfirst=True)
            await conn.commit()
            return
        except sa.exc.OperationalError as exc:
            await conn.rollback()
            if "already exists" not in str(exc.orig) or attempt == 2:
                raise


async def migrate(engine: AsyncEngine, *, now: float) -> int:
    """Create missing tables and record the schema version; returns the version now in force.

    Safe to run concurrently from several replicas (a named lock on MySQL, conditional creates
    and an ignored duplicate version row everywhere).
    """
    async with engine.connect() as conn:
        mysql_lock = conn.dialect.name == "mysql"
        if mysql_lock:
            got = (
                await conn.execute(
                    sa.text("SELECT GET_LOCK(:name, :wait)"), {"name": _MIGRATE_LOCK, "wait": _MIGRATE_LOCK_WAIT_S}
                )
            ).scalar()
            await conn.commit()
            if got != 1:
                raise TimeoutError("another process holds the migration lock")
        try:
            await _create_tables(conn)
            return await _record_version(conn, now)
        finally:
            if mysql_lock:
                await conn.execute(sa.text("SELECT RELEASE_LOCK(:name)"), {"name": _MIGRATE_LOCK})
                await conn.commit()


async def _add_missing_columns(conn: AsyncConnection, table: sa.Table, names: Sequence[str]) -> None:
    """ALTER TABLE … ADD COLUMN for each of `names` the table lacks (its definition as declared above)."""
    existing = await conn.run_sync(lambda c: {col["name"] for col in sa.inspect(c).get_columns(table.name)})
    for name in names:
        if name in existing:
            continue
        ddl = sa.schema.CreateColumn(table.c[name]).compile(dialect=conn.dialect)
        try:
            await conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {ddl}")
        except sa.exc.OperationalError as exc:
            # SQLite has no migration lock: a concurrent migrator may have added it first.
            if "duplicate column" not in str(exc.orig).lower():
                raise


async def _upgrade_to_2(conn: AsyncConnection) -> None:
    await _add_missing_columns(conn, messages, ["status"])
    added = "content_chars" not in await conn.run_sync(
        lambda c: {col["name"] for col in sa.inspect(c).get_columns(sessions.name)}
    )
    await _add_missing_columns(conn, sessions, ["content_chars"])
    if added:
        total = (
            sa.select(sa.func.coalesce(sa.func.sum(sa.func.length(messages.c.content)), 0))
            .where(messages.c.session_id == sessions.c.session_id)
            .scalar_subquery()
        )
        await conn.execute(sessions.update().values(content_chars=total))


async def _upgrade_to_3(conn: AsyncConnection) -> None:
    # Sessions made before tenants existed were made without a tenant-restricted token: ''.
    await _add_missing_columns(conn, sessions, ["tenant"])


# Step n brings a version n-1 schema to version n; create_all already made new databases whole,
# so every step checks what is there before changing it.
_UPGRADES: dict[int, Callable[[AsyncConnection], Awaitable[None]]] = {2: _upgrade_to_2, 3: _upgrade_to_3}


async def _record_version(conn: AsyncConnection, now: float) -> int:
    current = await _applied_version(conn)
    await conn.commit()
    if current == 0:
        # A database create_all just made whole: nothing to upgrade.
        current = 1
    for version in range(current + 1, SCHEMA_VERSION + 1):
        await _UPGRADES[version](conn)
        await conn.commit()
    async with conn.begin():
        for version in range(1, SCHEMA_VERSION + 1):
            try:
                async with conn.begin_nested():
                    await conn.execute(schema_version.insert().values(version=version, applied_at=now))
            except sa.exc.IntegrityError:
                pass  # recorded before, or by another replica between our read and our insert
    return SCHEMA_VERSION


async def current_version(engine: AsyncEngine) -> int:
    """The recorded schema version, 0 when the schema was never migrated."""
    async with engine.connect() as conn:
        exists = await conn.run_sync(lambda c: sa.inspect(c).has_table(schema_version.name))
        return await _applied_version(conn) if exists else 0
