"""The SQL schema (sessions, cold `messages`, warm `conversation_summaries`, `summary_slices`) as
the code reads and writes it.

One definition serves MySQL/MariaDB and SQLite; dialect variants are declared per column. The
database is brought to this shape by the Alembic revisions in `tiered_memory/migrations/versions`
(run by `migrate.py`); a test checks that the two agree. A change here needs a new revision.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

# The Alembic head revision, as a number: the schema version this code needs.
SCHEMA_VERSION = 12

_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

# SQLite only auto-increments an INTEGER PRIMARY KEY; MySQL wants BIGINT for a table that grows forever.
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIMESTAMP: sa.Double[float] = sa.Double()  # epoch seconds, fractional: ordering and ages without time-zone questions
# A stored session key: the id the API accepts (128 characters), under a tenant's name (64) and
# "/" for a tenant's session (Caller.session_key). (Version 6; 128 before.)
_SID = sa.String(193)

metadata = sa.MetaData()

# Versions 1-3, as recorded before Alembic; kept so that the previous release still starts after a
# rollback. Alembic's own table (alembic_version) holds the version now.
schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", _TIMESTAMP, nullable=False),
    **_MYSQL_TABLE,
)

# Per-session bookkeeping. Its row is locked by every append, which serializes a session's appends
# across replicas and makes seq, turn and the counters exact.
sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("session_id", _SID, primary_key=True),
    sa.Column("user_id", sa.String(128), nullable=True),
    # The tenant of the token that created the session; '' without one (an unrestricted token,
    # or no authentication). Set once, like user_id, and checked under the row lock. (Version 3.)
    sa.Column("tenant", sa.String(64), nullable=False, server_default=""),
    sa.Column("turn_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("message_count", sa.Integer, nullable=False, server_default="0"),
    # 1 while the open turn has a user message waiting for its reply: only then does an
    # assistant message complete a turn (a greeting or a second reply part does not).
    sa.Column("pending_user", sa.SmallInteger, nullable=False, server_default="0"),
    # Characters of every message so far: what the whole history would cost a prompt. (Version 2.)
    sa.Column("content_chars", sa.BigInteger, nullable=False, server_default="0"),
    # The ids of the tool calls still waiting for their result (a JSON array; NULL for none): a
    # tool message must answer one of them. Kept here, under the lock every append takes, so the
    # check costs no read. (Version 8.)
    sa.Column("open_tool_calls", sa.Text, nullable=True),
    # UTF-8 bytes of every message so far (content and tool calls): what MAX_SESSION_BYTES bounds.
    # (Version 8; sessions older than it count from their messages, as the migration summed them.)
    sa.Column("content_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Column("last_activity", _TIMESTAMP, nullable=False),
    sa.Column("closed_at", _TIMESTAMP, nullable=True),
    sa.Column("close_reason", sa.String(16), nullable=True),
    sa.Index("ix_sessions_open_activity", "closed_at", "last_activity"),
    # The retention purge finds sessions inactive since a cutoff. (Version 4.)
    sa.Index("ix_sessions_last_activity", "last_activity"),
    # A user's sessions, newest first (GET /v1/users/{uid}/sessions, an erasure). (Version 9.)
    sa.Index("ix_sessions_user_created", "tenant", "user_id", "created_at"),
    **_MYSQL_TABLE,
)

# Cold tier: every message verbatim, the source of truth.
# A session's messages in the order they were stored: the indexes its first, last, tail and
# forward reads name (messages.py).
MESSAGES_BY_SESSION = "ix_messages_session_id"
MESSAGES_BY_SEQ = "ix_messages_session_seq"

messages = sa.Table(
    "messages",
    metadata,
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
    # An assistant reply that was stopped, failed or is still streaming completes no turn and is
    # never summarized as an answer. (Schema version 2.)
    sa.Column("status", sa.String(16), nullable=False, server_default="completed"),
    # An assistant message's tool calls, the JSON array verbatim; a tool result's call id and tool
    # name. (Version 8.)
    sa.Column("tool_calls", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=True),
    sa.Column("tool_call_id", sa.String(128), nullable=True),
    sa.Column("name", sa.String(64), nullable=True),
    # An assistant reply's reasoning and its seconds (reasoning.py: returned with the message, never
    # read into a context, a summary or the recall index). (Version 12.)
    sa.Column("thinking_content", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=True),
    sa.Column("thinking_duration", sa.Integer, nullable=True),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Index(MESSAGES_BY_SESSION, "session_id", "id"),
    # Reads by seq range: the context's older turns, GET …/messages. (Version 5.)
    sa.Index(MESSAGES_BY_SEQ, "session_id", "seq"),
    sa.UniqueConstraint("session_id", "message_id", name="uq_messages_session_message_id"),
    **_MYSQL_TABLE,
)

# Warm tier: the best summary of each session.
conversation_summaries = sa.Table(
    "conversation_summaries",
    metadata,
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
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Column("updated_at", _TIMESTAMP, nullable=False),
    sa.Index("ix_summaries_user_updated", "user_id", "updated_at"),
    **_MYSQL_TABLE,
)


# One row per summarization: the range it covered and a digest of that range, so a summary can be
# traced back to its raw messages and rebuilt slice by slice. (Version 2.)
summary_slices = sa.Table(
    "summary_slices",
    metadata,
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
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Index("ix_slices_session_turn", "session_id", "to_turn"),
    **_MYSQL_TABLE,
)


# The summary's recent versions, newest kept (SqlStore's `summary_history`): what an operator
# compares to see when a fact left the summary (the inspector's diff). Written in the summary's
# own transaction; erased, purged and deleted with it. (Version 11.)
summary_versions = sa.Table(
    "summary_versions",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("session_id", _SID, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("covered_turns", sa.Integer, nullable=False),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    sa.Index("ix_summary_versions_session_version", "session_id", "version"),
    **_MYSQL_TABLE,
)

# What a gateway keeps of its own across reconnects (a knowledge-base topic, a keyword tracker):
# one JSON object per session, written with a version check (PUT …/state with If-Match). Apart
# from `sessions`, so that writing it takes no lock an append waits for. (Version 7.)
session_state = sa.Table(
    "session_state",
    metadata,
    sa.Column("session_id", _SID, primary_key=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("updated_at", _TIMESTAMP, nullable=False),
    **_MYSQL_TABLE,
)


# What is known of a user across the user's sessions (users.py): one JSON document per user of a
# tenant, merged from every summary written for one of the user's sessions. (Version 9.)
user_profiles = sa.Table(
    "user_profiles",
    metadata,
    # users.user_key: a digest of tenant and user_id. MySQL/MariaDB collations pad with spaces
    # ('u1' = 'u1 '), so the two as a key could give two users one profile; a digest is exact.
    sa.Column("user_key", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("profile", sa.Text, nullable=False),
    sa.Column("updated_at", _TIMESTAMP, nullable=False),
    **_MYSQL_TABLE,
)

# A user's erasure (DELETE /v1/users/{uid}), from its request until it finished: one that a crash
# or an outage stopped part-way is found here and resumed. (Version 9.)
user_erasures = sa.Table(
    "user_erasures",
    metadata,
    sa.Column("user_key", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("requested_at", _TIMESTAMP, nullable=False),
    sa.Column("finished_at", _TIMESTAMP, nullable=True),
    sa.Column("sessions", sa.Integer, nullable=False, server_default="0"),
    sa.Column("messages", sa.BigInteger, nullable=False, server_default="0"),
    **_MYSQL_TABLE,
)

# Lifecycle events on their way to receivers (webhooks.py, delivery.py): written in the transaction
# of the change that causes them, one row per sink, delivered in id order per sink and subject
# (a session, or a user). `state`: held (a final summary waiting for the session's last pass),
# pending, delivered, failed (parked after WEBHOOK_MAX_AGE_SECONDS). (Version 10.)
outbox_events = sa.Table(
    "outbox_events",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.String(32), nullable=False),
    sa.Column("sink", sa.String(20), nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("tenant", sa.String(64), nullable=False),
    # The session's stored key, or `user:` and users.user_key for a user's event.
    sa.Column("subject", sa.String(200), nullable=False),
    sa.Column("session_id", _SID, nullable=True),
    sa.Column("user_id", sa.String(128), nullable=True),
    sa.Column("payload", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=False),
    sa.Column("state", sa.String(10), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
    # When it was queued: created, or replayed (`tiered-memory events --replay`); its age counts from here.
    sa.Column("queued_at", _TIMESTAMP, nullable=False),
    sa.Column("next_attempt_at", _TIMESTAMP, nullable=False),
    sa.Column("delivered_at", _TIMESTAMP, nullable=True),
    sa.Column("last_error", sa.String(200), nullable=True),
    # The head of each sink's subject: the oldest row not delivered.
    sa.Index("ix_outbox_state_sink_subject", "state", "sink", "subject", "id"),
    # A session's or user's events, when it is erased.
    sa.Index("ix_outbox_subject", "subject", "id"),
    **_MYSQL_TABLE,
)
