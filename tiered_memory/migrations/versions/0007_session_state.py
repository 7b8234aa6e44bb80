"""The session_state table: what a gateway keeps of its own across reconnects (PUT …/state).

One JSON object per session and its version, for optimistic concurrency (ETag / If-Match).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# As in tiered_memory/tiers/sql/schema.py at this revision.
_SID = sa.String(193)
_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    if "session_state" not in sa.inspect(op.get_bind()).get_table_names():
        op.create_table(
            "session_state",
            sa.Column("session_id", _SID, primary_key=True),
            sa.Column("state", sa.Text, nullable=False),
            sa.Column("version", sa.Integer, nullable=False),
            sa.Column("updated_at", sa.Double(), nullable=False),
            **_MYSQL_TABLE,
        )


def downgrade() -> None:
    op.drop_table("session_state")
