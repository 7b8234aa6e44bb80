"""The async SQLAlchemy engine for MySQL/MariaDB, PostgreSQL or SQLite, tuned for the daemon's short
transactions.

A MySQL URL may name several servers, `mysql+aiomysql://user@db1:3306,db2:3306,db3:3306/memory`:
the nodes of a multi-primary cluster (MariaDB Galera, Percona XtraDB Cluster), any of which takes
every write. A new connection goes to the first that answers, in the order given, so that the
daemons of a deployment write through one node while it lives (fewer certification conflicts
than spreading them) and move to the next when it dies: its pooled connections fail their
pre-ping and are opened again elsewhere.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import AdaptedConnection, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, PoolResetState

from tiered_memory.tiers.codec import dumps_text, loads
from tiered_memory.tiers.sql.url import server_urls

if TYPE_CHECKING:
    from aiomysql import Connection

# How long a new connection waits for one server before it tries the next (multi-host URLs): a
# node that died with its machine answers nothing, where a dead process is refused at once.
_CONNECT_TIMEOUT_S = 3


def create_engine(url: str) -> AsyncEngine:
    """An async engine for a MySQL/MariaDB (one server or several), PostgreSQL or SQLite URL,
    tuned for short transactions."""
    if url.startswith("sqlite"):
        # hide_parameters: driver errors must never carry message content into logs.
        engine = create_async_engine(
            url,
            connect_args={"timeout": 30},
            hide_parameters=True,
            json_serializer=dumps_text,
            json_deserializer=loads,
        )

        @sa.event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: sqlite3.Connection, _record: object) -> None:
            cur = dbapi_conn.cursor()
            # WAL lets readers proceed during a write; NORMAL sync is durable across process crashes.
            # WAL is a property of the file: when another process holds the lock while setting it,
            # this connection's attempt fails at once, and the file ends up in WAL all the same.
            with contextlib.suppress(sqlite3.OperationalError):
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    servers = [make_url(server) for server in server_urls(url)]
    extra: dict[str, Any] = {}
    if len(servers) > 1:

        async def first_that_answers() -> Connection:
            """A connection to the first server that takes one (the dialect's own arguments)."""
            import aiomysql  # the driver the URL names; imported where it is used

            failure: Exception | None = None
            for server in servers:
                cargs, cparams = engine.dialect.create_connect_args(server)
                try:
                    return await aiomysql.connect(*cargs, **{**cparams, "connect_timeout": _CONNECT_TIMEOUT_S})
                except (OSError, aiomysql.OperationalError) as exc:
                    failure = exc
            assert failure is not None
            raise failure

        extra["async_creator"] = first_that_answers
    mysql = servers[0].get_backend_name() in ("mysql", "mariadb")
    if mysql:
        # A connection given back after its commit is not rolled back again (_skip_rollback_after_commit).
        extra["pool_reset_on_return"] = None
    engine = create_async_engine(
        servers[0],
        **extra,
        pool_size=10,
        max_overflow=10,
        pool_pre_ping=True,
        pool_recycle=1800,
        hide_parameters=True,
        # The summary row's JSON columns, on every warm read: orjson, as for the hot tier.
        json_serializer=dumps_text,
        json_deserializer=loads,
        # Fewer gap locks than REPEATABLE READ; every append locks its session row explicitly.
        isolation_level="READ COMMITTED",
    )
    if mysql:
        _skip_rollback_after_commit(engine)
    return engine


# A connection's pool record holds this from its commit until its next statement or error.
_COMMITTED = "tm_committed"


def _skip_rollback_after_commit(engine: AsyncEngine) -> None:
    """The pool's reset of a MySQL connection given back: the ROLLBACK the pool sends every time,
    unless the connection's last act was a commit the server confirmed. A write's connection
    comes back committed, and that ROLLBACK was one round trip more per commit (a fifth of an
    append's statements at c=64). Both must say so: SQLAlchemy's commit, not followed by a
    statement or an error, and the driver's transaction flag (which the server's OK packet of
    the COMMIT set; the driver does not refresh it after a result set, so alone it is not enough).
    A statement sent through the driver itself after a commit is not seen by SQLAlchemy: after a
    SELECT that opened a transaction (a locking one) the flag is stale too, and the connection
    would go back with it open. The daemon never sends one; code that does must roll back itself.
    (asyncpg's adapter sends no ROLLBACK when no transaction is open, and SQLite's costs no round
    trip: only MySQL engines have this.)"""
    sync = engine.sync_engine

    def committed(conn: sa.Connection) -> None:
        conn.info[_COMMITTED] = True

    def touched(conn: sa.Connection, *_: object) -> None:
        conn.info.pop(_COMMITTED, None)

    def failed(context: sa.engine.ExceptionContext) -> None:
        conn = context.connection
        # An invalidated connection's mark goes with its DBAPI connection (and `info` would raise).
        if conn is not None and not conn.closed and not conn.invalidated:
            conn.info.pop(_COMMITTED, None)

    def reset(dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry | None, state: PoolResetState) -> None:
        driver = dbapi_conn.driver_connection if isinstance(dbapi_conn, AdaptedConnection) else None
        # A detached connection comes without its record.
        marked = record is not None and record.info.pop(_COMMITTED, False)
        clean = marked and driver is not None and not driver.get_transaction_status()
        if clean or not state.asyncio_safe or state.transaction_was_reset:
            return  # as the pool's own reset: no I/O outside the loop; or already rolled back
        dbapi_conn.rollback()

    sa.event.listen(sync, "commit", committed)
    sa.event.listen(sync, "before_cursor_execute", touched)
    sa.event.listen(sync, "handle_error", failed)
    sa.event.listen(sync, "reset", reset)
