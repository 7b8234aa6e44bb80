"""Each tenant gets its own namespace of session ids: a tenant's sessions are stored under
`<tenant>/<session_id>`.

With one namespace across tenants, a session id another tenant used answered 403 where an unused
one answered empty or 404, so a tenant could tell which ids others use (and squat on the ids
another tenant was going to use). The session key columns widen to 193 characters (a 64-character
tenant, "/", a 128-character id) and the rows of every session with a tenant move to their key.
Sessions of no tenant keep their ids. The hot tier's entries under the old ids expire by their TTL;
a read under the new key misses them and is answered from SQL.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Parent last: the child tables find their session's tenant through sessions.session_id.
_TABLES = ("messages", "conversation_summaries", "summary_slices", "sessions")
# Session ids the API accepts never hold "/": a key with one has moved already, which makes each
# statement safe to repeat (MySQL commits DDL at once, so a migration that died half-way is run
# again from the start).
_NOT_MOVED = "tenant <> '' AND session_id NOT LIKE '%/%'"
_MOVED = "tenant <> '' AND session_id LIKE '%/%'"


def _mysql() -> bool:
    return op.get_bind().dialect.name == "mysql"


def _resize(old: int, new: int) -> None:
    for table in _TABLES:
        # SQLite cannot alter a column: batch mode rebuilds the table (copying its rows), which
        # only the embedded default's small databases meet.
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                "session_id", existing_type=sa.String(old), type_=sa.String(new), existing_nullable=False
            )


def _rekey(new_key: str, which: str) -> None:
    """Set every table's session_id to `new_key` (SQL over `{tenant}` and session_id) for the
    sessions that `which` (a condition on sessions.tenant and sessions.session_id) selects."""
    for table in _TABLES:
        if table == "sessions":
            op.execute(f"UPDATE sessions SET session_id = {new_key.format(tenant='tenant')} WHERE {which}")
            continue
        tenant = f"(SELECT s.tenant FROM sessions s WHERE s.session_id = {table}.session_id)"
        selected = which.replace("tenant", "s.tenant").replace("session_id", "s.session_id")
        op.execute(
            f"UPDATE {table} SET session_id = {new_key.format(tenant=tenant)} "
            f"WHERE session_id IN (SELECT s.session_id FROM sessions s WHERE {selected})"
        )


def upgrade() -> None:
    _resize(128, 193)
    _rekey("CONCAT({tenant}, '/', session_id)" if _mysql() else "({tenant} || '/' || session_id)", _NOT_MOVED)


def downgrade() -> None:
    # Back to one namespace: fails on the primary key when a session of no tenant holds the same
    # id as a tenant's session, which version 5 cannot store.
    _rekey("SUBSTR(session_id, LENGTH({tenant}) + 2)", _MOVED)
    _resize(193, 128)
