"""An assistant reply's reasoning: `thinking_content` (the model's chain of thought) and
`thinking_duration` (its seconds), two nullable columns of `messages`.

Only nullable columns are added: the previous release, which names its columns, still runs
against the new schema after a rollback (what it appends has no reasoning).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _columns() -> list[sa.Column[object]]:
    """The new columns of `messages`, as in tiered_memory/tiers/sql/schema.py at this revision."""
    return [
        sa.Column("thinking_content", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=True),
        sa.Column("thinking_duration", sa.Integer, nullable=True),
    ]


def upgrade() -> None:
    # MySQL commits DDL at once: a migration that died half-way is run again from the start.
    present = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("messages")}
    for column in _columns():
        if column.name not in present:
            op.add_column("messages", column)


def downgrade() -> None:
    for column in _columns():
        op.drop_column("messages", column.name)
