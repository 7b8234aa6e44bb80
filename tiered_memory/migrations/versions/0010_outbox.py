"""The transactional outbox of lifecycle events (`outbox_events`): each event written in the
transaction of the change that causes it, one row per sink, until it is delivered.

Only a new table: the previous release still runs against the new schema after a rollback (it
writes no events; those left pending wait for this release).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# As in tiered_memory/tiers/sql/schema.py at this revision.
_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    if "outbox_events" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "outbox_events",
        sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(32), nullable=False),
        sa.Column("sink", sa.String(20), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("session_id", sa.String(193), nullable=True),
        sa.Column("user_id", sa.String(128), nullable=True),
        sa.Column("payload", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=False),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("queued_at", sa.Double(), nullable=False),
        sa.Column("next_attempt_at", sa.Double(), nullable=False),
        sa.Column("delivered_at", sa.Double(), nullable=True),
        sa.Column("last_error", sa.String(200), nullable=True),
        sa.Index("ix_outbox_state_sink_subject", "state", "sink", "subject", "id"),
        sa.Index("ix_outbox_subject", "subject", "id"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("outbox_events")
