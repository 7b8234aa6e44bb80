"""An index on sessions.last_activity, for the retention purge (`tiered-memory purge`, RETENTION_DAYS).

The purge looks for sessions inactive since a cutoff, closed or not; the index on
(closed_at, last_activity) serves the idle sweep of open sessions only.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "ix_sessions_last_activity" not in {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("sessions")}:
        op.create_index("ix_sessions_last_activity", "sessions", ["last_activity"])


def downgrade() -> None:
    op.drop_index("ix_sessions_last_activity", table_name="sessions")
