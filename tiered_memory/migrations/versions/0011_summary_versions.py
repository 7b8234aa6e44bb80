"""The summary's recent versions (`summary_versions`), for the inspector's history and diff.

Only a new table: the previous release still runs against the new schema after a rollback (it
writes no versions, and deletes a session without them: rows it leaves belong to no session and
are removed with the next write of that session id's summary history, or by hand).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# As in tiered_memory/tiers/sql/schema.py at this revision.
_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    if "summary_versions" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "summary_versions",
        sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(193), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("covered_turns", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Index("ix_summary_versions_session_version", "session_id", "version"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("summary_versions")
