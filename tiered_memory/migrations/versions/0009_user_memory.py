"""Memory across a user's sessions: `user_profiles` (one profile per user of a tenant, merged
from each summary written), `user_erasures` (a user's erasure, kept until it finished, so that a
crash part-way is resumed), and an index that lists a user's sessions newest first.

Only new tables and an index: the previous release still runs against the new schema after a
rollback (it neither merges profiles nor lists by user).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# As in tiered_memory/tiers/sql/schema.py at this revision.
_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
_INDEX = "ix_sessions_user_created"


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    tables = inspector.get_table_names()
    if "user_profiles" not in tables:
        op.create_table(
            "user_profiles",
            sa.Column("user_key", sa.String(64), primary_key=True),
            sa.Column("tenant", sa.String(64), nullable=False),
            sa.Column("user_id", sa.String(128), nullable=False),
            sa.Column("profile", sa.Text, nullable=False),
            sa.Column("updated_at", sa.Double(), nullable=False),
            **_MYSQL_TABLE,
        )
    if "user_erasures" not in tables:
        op.create_table(
            "user_erasures",
            sa.Column("user_key", sa.String(64), primary_key=True),
            sa.Column("tenant", sa.String(64), nullable=False),
            sa.Column("user_id", sa.String(128), nullable=False),
            sa.Column("requested_at", sa.Double(), nullable=False),
            sa.Column("finished_at", sa.Double(), nullable=True),
            sa.Column("sessions", sa.Integer, nullable=False, server_default="0"),
            sa.Column("messages", sa.BigInteger, nullable=False, server_default="0"),
            **_MYSQL_TABLE,
        )
    # MySQL commits DDL at once: a migration that died after the tables is run again from the start.
    if _INDEX not in {i["name"] for i in inspector.get_indexes("sessions")}:
        op.create_index(_INDEX, "sessions", ["tenant", "user_id", "created_at"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="sessions")
    op.drop_table("user_erasures")
    op.drop_table("user_profiles")
