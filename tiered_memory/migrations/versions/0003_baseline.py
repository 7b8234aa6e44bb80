"""Schema version 3, the schema as the pre-Alembic versioning left it; and the way up for databases
that versioning made (schema_version 1, 2 or 3).

The tables are declared here as they were at version 3, frozen: later revisions change them, this
one never does. Every step looks before it acts (a table, column or index is made only where it
is missing), so one script serves a new database and an old one alike:

- new database: every table is created;
- version 3: nothing changes, Alembic takes over the versioning;
- version 2: `sessions.tenant` is added ('' for every session: they were made without tenant tokens);
- version 1: also `messages.status` ('completed') and `sessions.content_chars` (summed from the
  stored messages), and the `summary_slices` table. (The first version-1 databases also lacked
  `sessions.pending_user` and `messages.completes_turn`; they get them with their defaults.)

The `schema_version` table stays, with versions 1-3 recorded, so that a daemon of the previous
release still starts on a database this release migrated (a rollback).

Revision ID: 0003
Revises: -
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision: str | None = None
branch_labels = None
depends_on = None

_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_SID = sa.String(128)

_v3 = sa.MetaData()

sa.Table(
    "schema_version",
    _v3,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", sa.Double(), nullable=False),
    **_MYSQL_TABLE,
)
sa.Table(
    "sessions",
    _v3,
    sa.Column("session_id", _SID, primary_key=True),
    sa.Column("user_id", sa.String(128), nullable=True),
    sa.Column("tenant", sa.String(64), nullable=False, server_default=""),
    sa.Column("turn_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("message_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("pending_user", sa.SmallInteger, nullable=False, server_default="0"),
    sa.Column("content_chars", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("last_activity", sa.Double(), nullable=False),
    sa.Column("closed_at", sa.Double(), nullable=True),
    sa.Column("close_reason", sa.String(16), nullable=True),
    sa.Index("ix_sessions_open_activity", "closed_at", "last_activity"),
    **_MYSQL_TABLE,
)
sa.Table(
    "messages",
    _v3,
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
    sa.Column("status", sa.String(16), nullable=False, server_default="completed"),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Index("ix_messages_session_id", "session_id", "id"),
    sa.UniqueConstraint("session_id", "message_id", name="uq_messages_session_message_id"),
    **_MYSQL_TABLE,
)
sa.Table(
    "conversation_summaries",
    _v3,
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
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.Index("ix_summaries_user_updated", "user_id", "updated_at"),
    **_MYSQL_TABLE,
)
sa.Table(
    "summary_slices",
    _v3,
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
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Index("ix_slices_session_turn", "session_id", "to_turn"),
    **_MYSQL_TABLE,
)


def upgrade() -> None:
    bind = op.get_bind()
    added: set[tuple[str, str]] = set()
    for table in _v3.sorted_tables:
        inspector = sa.inspect(bind)
        if not inspector.has_table(table.name):
            table.create(bind)
            continue
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                op.add_column(table.name, column._copy())
                added.add((table.name, column.name))
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(bind)
    if ("sessions", "content_chars") in added:
        # What the whole history of each session would cost a prompt, from the messages kept.
        bind.execute(
            sa.text(
                "UPDATE sessions SET content_chars = (SELECT COALESCE(SUM(LENGTH(m.content)), 0)"
                " FROM messages m WHERE m.session_id = sessions.session_id)"
                if bind.dialect.name == "sqlite"
                else "UPDATE sessions SET content_chars = (SELECT COALESCE(SUM(CHAR_LENGTH(m.content)), 0)"
                " FROM messages m WHERE m.session_id = sessions.session_id)"
            )
        )
    versions = _v3.tables["schema_version"]
    recorded = {row[0] for row in bind.execute(sa.select(versions.c.version))}
    for version in sorted({1, 2, 3} - recorded):
        bind.execute(versions.insert().values(version=version, applied_at=time.time()))


def downgrade() -> None:
    raise RuntimeError("schema version 3 is the first Alembic revision: there is nothing below it to go to")
