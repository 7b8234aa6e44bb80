"""An index on messages (session_id, seq), for reads of a session's messages by seq range.

The context's older turns and `GET …/messages?from_seq=&to_seq=` read a seq range; with only the
(session_id, id) index that read visited every message of the session (50 ms at 10,000 turns, on
every context read of a long session).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "ix_messages_session_seq" not in {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("messages")}:
        op.create_index("ix_messages_session_seq", "messages", ["session_id", "seq"])


def downgrade() -> None:
    op.drop_index("ix_messages_session_seq", table_name="messages")
