"""Tool calls and their results: an assistant message's `tool_calls` (the JSON array verbatim), a
tool result's `tool_call_id` and `name`, and each session's calls still waiting for a result; and
each session's UTF-8 bytes (`content_bytes`, what MAX_SESSION_BYTES bounds), summed from its
messages for the sessions already there.

Only nullable columns and a counter with a default are added: the previous release, which names
its columns, still runs against the new schema after a rollback (the byte counter then misses what
it appends, so MAX_SESSION_BYTES is looser by that much).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _columns() -> dict[str, list[sa.Column[object]]]:
    """The new columns by table, as in tiered_memory/tiers/sql/schema.py at this revision."""
    return {
        "messages": [
            sa.Column("tool_calls", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=True),
            sa.Column("tool_call_id", sa.String(128), nullable=True),
            sa.Column("name", sa.String(64), nullable=True),
        ],
        "sessions": [
            sa.Column("open_tool_calls", sa.Text, nullable=True),
            sa.Column("content_bytes", sa.BigInteger, nullable=False, server_default="0"),
        ],
    }


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for table, columns in _columns().items():
        # MySQL commits DDL at once: a migration that died half-way is run again from the start.
        present = {c["name"] for c in inspector.get_columns(table)}
        for column in columns:
            if column.name not in present:
                op.add_column(table, column)
    # Every time: MySQL commits the ADD COLUMN at once, so a run that died before the count is
    # run again from the start and must count again.
    _count_bytes()


def _count_bytes() -> None:
    """Each session's bytes, from its messages (LENGTH counts bytes in MySQL; SQLite counts a
    BLOB's bytes; PostgreSQL's LENGTH counts characters, OCTET_LENGTH bytes)."""
    size = {
        "sqlite": "LENGTH(CAST(content AS BLOB))",
        "postgresql": "OCTET_LENGTH(content)",
    }.get(op.get_bind().dialect.name, "LENGTH(content)")
    op.execute(
        f"UPDATE sessions SET content_bytes = (SELECT COALESCE(SUM({size}), 0) FROM messages"
        " WHERE messages.session_id = sessions.session_id)"
    )


def downgrade() -> None:
    for table, columns in _columns().items():
        for column in columns:
            op.drop_column(table, column.name)
