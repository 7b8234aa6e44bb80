"""The async SQLAlchemy engine for MySQL/MariaDB or SQLite, tuned for the daemon's short transactions."""

from __future__ import annotations

import contextlib
import sqlite3

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tiered_memory.tiers.codec import dumps_text, loads


def create_engine(url: str) -> AsyncEngine:
    """An async engine for a MySQL/MariaDB or SQLite URL, tuned for short transactions."""
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
    return create_async_engine(
        url,
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
