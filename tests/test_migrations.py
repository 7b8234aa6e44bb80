"""Schema migrations (Alembic): a new database gets exactly the schema the code declares, and a
database made by the versioning before Alembic (schema versions 1, 2 and 3, built here with the
DDL those versions used) is upgraded by `tiered-memory migrate` without losing a row, then served."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.dialects import mysql

from tests.helpers.daemon import Daemon, MakeDaemon, TextWorkers, new_sid
from tests.helpers.servers import RealServers, own_database
from tiered_memory.errors import ConfigError
from tiered_memory.tiers.sql.migrate import config, head_version
from tiered_memory.tiers.sql.schema import SCHEMA_VERSION, metadata
from tiered_memory.tiers.sql.schema import conversation_summaries as t_summaries
from tiered_memory.tiers.sql.schema import messages as t_messages
from tiered_memory.tiers.sql.schema import sessions as t_sessions
from tiered_memory.tiers.sql.schema import summary_slices as t_slices

_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def legacy_metadata(version: str) -> sa.MetaData:
    """The tables as the pre-Alembic tiers/sql/schema.py declared them at `version`: "1-early" (the
    first commit), "1", "2" or "3" (see `git log -p tiered_memory/tiers/sql/schema.py`)."""
    v = {"1-early": 0, "1": 1, "2": 2, "3": 3}[version]
    md = sa.MetaData()
    sa.Table(
        "schema_version",
        md,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("applied_at", sa.Double(), nullable=False),
        **_MYSQL_TABLE,
    )
    session_columns: list[sa.Column[Any]] = [
        sa.Column("session_id", sa.String(128), primary_key=True),
        sa.Column("user_id", sa.String(128), nullable=True),
        *([sa.Column("tenant", sa.String(64), nullable=False, server_default="")] if v >= 3 else []),
        sa.Column("turn_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("message_count", sa.Integer, nullable=False, server_default="0"),
        *([sa.Column("pending_user", sa.SmallInteger, nullable=False, server_default="0")] if v >= 1 else []),
        *([sa.Column("content_chars", sa.BigInteger, nullable=False, server_default="0")] if v >= 2 else []),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("last_activity", sa.Double(), nullable=False),
        sa.Column("closed_at", sa.Double(), nullable=True),
        sa.Column("close_reason", sa.String(16), nullable=True),
    ]
    sa.Table(
        "sessions",
        md,
        *session_columns,
        sa.Index("ix_sessions_open_activity", "closed_at", "last_activity"),
        **_MYSQL_TABLE,
    )
    sa.Table(
        "messages",
        md,
        sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("turn", sa.Integer, nullable=False),
        sa.Column("user_id", sa.String(128), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=False),
        sa.Column("channel", sa.String(8), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        *([sa.Column("completes_turn", sa.SmallInteger, nullable=False, server_default="0")] if v >= 1 else []),
        *([sa.Column("status", sa.String(16), nullable=False, server_default="completed")] if v >= 2 else []),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Index("ix_messages_session_id", "session_id", "id"),
        sa.UniqueConstraint("session_id", "message_id", name="uq_messages_session_message_id"),
        **_MYSQL_TABLE,
    )
    sa.Table(
        "conversation_summaries",
        md,
        sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(128), nullable=False, unique=True),
        sa.Column("user_id", sa.String(128), nullable=True),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("turn_count", sa.Integer, nullable=False),
        sa.Column("covered_turns", sa.Integer, nullable=False),
        sa.Column("topics", sa.JSON, nullable=False),
        sa.Column("structured", sa.JSON, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("compressions", sa.Integer, nullable=False, server_default="0"),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Index("ix_summaries_user_updated", "user_id", "updated_at"),
        **_MYSQL_TABLE,
    )
    if v >= 2:
        sa.Table(
            "summary_slices",
            md,
            sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
            sa.Column("session_id", sa.String(128), nullable=False),
            sa.Column("from_turn", sa.Integer, nullable=False),
            sa.Column("to_turn", sa.Integer, nullable=False),
            sa.Column("first_seq", sa.Integer, nullable=False),
            sa.Column("last_seq", sa.Integer, nullable=False),
            sa.Column("text", sa.Text, nullable=False),
            sa.Column("source", sa.String(16), nullable=False),
            sa.Column("model", sa.String(128), nullable=True),
            sa.Column("prompt_id", sa.String(64), nullable=True),
            sa.Column("summary_version", sa.Integer, nullable=False),
            sa.Column("created_at", sa.Double(), nullable=False),
            sa.Index("ix_slices_session_turn", "session_id", "to_turn"),
            **_MYSQL_TABLE,
        )
    return md


QUESTIONS = ["活力健怎么吃？", "饭前还是饭后？", "孕妇能吃吗？"]
ANSWERS = ["每天2次，每次1条。", "饭后半小时。", "请先咨询医生。"]


def fill_legacy(conn: sa.Connection, md: sa.MetaData, sid: str, *, version: str) -> None:
    """A session of three turns with its summary (and a slice where the table exists), written
    as the daemon of that version wrote them."""
    t = md.tables
    v = {"1-early": 0, "1": 1, "2": 2, "3": 3}[version]
    recorded = {"1-early": [1], "1": [1], "2": [1, 2], "3": [1, 2, 3]}[version]
    conn.execute(t["schema_version"].insert(), [{"version": n, "applied_at": 1.0} for n in recorded])
    session: dict[str, Any] = {
        "session_id": sid,
        "user_id": "u-old",
        "turn_count": 3,
        "message_count": 6,
        "created_at": 100.0,
        "last_activity": 160.0,
    }
    if v >= 2:
        session["content_chars"] = sum(len(x) for x in QUESTIONS + ANSWERS)
    conn.execute(t["sessions"].insert().values(**session))
    rows = []
    for i, (q, a) in enumerate(zip(QUESTIONS, ANSWERS, strict=True)):
        for k, (role, content) in enumerate((("user", q), ("assistant", a))):
            row: dict[str, Any] = {
                "session_id": sid,
                "seq": 2 * i + k + 1,
                "turn": i + 1,
                "user_id": "u-old",
                "role": role,
                "content": content,
                "channel": "voice",
                "message_id": f"m-{2 * i + k + 1}",
                "created_at": 100.0 + 10 * (2 * i + k),
            }
            if v >= 1:
                row["completes_turn"] = int(role == "assistant")
            rows.append(row)
    conn.execute(t["messages"].insert(), rows)
    conn.execute(
        t["conversation_summaries"]
        .insert()
        .values(
            session_id=sid,
            user_id="u-old",
            summary="用户问活力健的吃法：每天2次，饭后半小时；孕妇请先咨询医生。",
            turn_count=3,
            covered_turns=3,
            topics=["活力健"],
            structured={"facts": ["每天2次"]},
            source="deterministic",
            compressions=1,
            version=1,
            created_at=150.0,
            updated_at=150.0,
        )
    )
    if "summary_slices" in t:
        conn.execute(
            t["summary_slices"]
            .insert()
            .values(
                session_id=sid,
                from_turn=1,
                to_turn=3,
                first_seq=1,
                last_seq=6,
                text="三轮：吃法、时间、孕妇。",
                source="deterministic",
                summary_version=1,
                created_at=150.0,
            )
        )


@pytest.fixture(params=["sqlite", "mariadb"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The SQLAlchemy async URL of an empty database of this test's own."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'old.sqlite3'}"
        return
    servers: RealServers = request.getfixturevalue("real_servers")
    with own_database(servers.mysql_url) as url:
        yield url


def sync_engine(async_url: str) -> sa.Engine:
    url = sa.make_url(async_url)
    return sa.create_engine(url.set(drivername="mysql+pymysql" if url.drivername.startswith("mysql") else "sqlite"))


def schema_differences(engine: sa.Engine) -> list[Any]:
    """What Alembic's autogenerate finds between the database and the declared metadata."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiered_memory", *args],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=100,  # under the test's own 120 s, so that this one says what hung
        check=False,
    )


def test_revision_ids_are_schema_versions() -> None:
    """Revisions are numbered 0003, 0004, … in one line, and the head is the version the code needs."""
    scripts = ScriptDirectory.from_config(config())
    revisions = list(reversed(list(scripts.walk_revisions())))
    assert [int(r.revision) for r in revisions] == list(range(3, SCHEMA_VERSION + 1))
    assert [r.down_revision for r in revisions][1:] == [r.revision for r in revisions][:-1]
    assert head_version() == SCHEMA_VERSION


def test_a_new_database_gets_exactly_the_declared_schema(database: str, tmp_path: Path) -> None:
    """`tiered-memory migrate` on an empty database builds what tiers/sql/schema.py declares (Alembic's
    autogenerate finds no difference) and records the head; a second run changes nothing."""
    env = {"DATABASE_URL": database, "DATA_DIR": str(tmp_path)}
    first = run_cli("migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"schema version {SCHEMA_VERSION} ")
    again = run_cli("migrate", env=env)
    assert (again.returncode, again.stdout) == (0, first.stdout)
    engine = sync_engine(database)
    try:
        assert schema_differences(engine) == []
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).all() == [
                (f"{SCHEMA_VERSION:04d}",)
            ]
            assert [r[0] for r in conn.execute(sa.text("SELECT version FROM schema_version ORDER BY version"))] == [
                1,
                2,
                3,
            ]
    finally:
        engine.dispose()


@pytest.mark.parametrize("version", ["1-early", "1", "2", "3"])
async def test_an_old_database_is_migrated_without_loss_and_served(
    database: str, tmp_path: Path, version: str, make_daemon: MakeDaemon, text_workers: TextWorkers
) -> None:
    """A database made by schema version 1, 2 or 3 with a conversation in it: the daemon refuses
    to start on it unmigrated; `tiered-memory migrate` brings it to the declared schema keeping
    every message, the summary and the slices (new columns take what the old rows meant); then
    the daemon serves the conversation and appends after it."""
    env = {"DATABASE_URL": database, "DATA_DIR": str(tmp_path / "data"), "AUTO_MIGRATE": "false"}
    sid = new_sid()
    engine = sync_engine(database)
    try:
        old = legacy_metadata(version)
        old.create_all(engine)
        with engine.begin() as conn:
            fill_legacy(conn, old, sid, version=version)

        refused = Daemon(env, text_workers)
        with pytest.raises(ConfigError, match="tiered-memory migrate"):
            await refused.start()

        done = run_cli("migrate", env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"schema version {SCHEMA_VERSION} ")
        assert schema_differences(engine) == []
        with engine.connect() as conn:
            messages = conn.execute(
                sa.text("SELECT seq, turn, role, content, message_id, status, channel FROM messages ORDER BY seq")
            ).all()
            session = conn.execute(sa.text("SELECT tenant, user_id, turn_count, content_chars FROM sessions")).one()
            summary = conn.execute(sa.text("SELECT summary, covered_turns, version FROM conversation_summaries")).one()
            slices = conn.execute(sa.text("SELECT from_turn, to_turn FROM summary_slices")).all()
        expected = [
            (2 * i + k + 1, i + 1, role, text, f"m-{2 * i + k + 1}", "completed", "voice")
            for i, pair in enumerate(zip(QUESTIONS, ANSWERS, strict=True))
            for k, (role, text) in enumerate(zip(("user", "assistant"), pair, strict=True))
        ]
        assert [tuple(m) for m in messages] == expected
        assert tuple(session) == ("", "u-old", 3, sum(len(x) for x in QUESTIONS + ANSWERS))
        assert tuple(summary) == ("用户问活力健的吃法：每天2次，饭后半小时；孕妇请先咨询医生。", 3, 1)
        assert [tuple(s) for s in slices] == ([(1, 3)] if version in ("2", "3") else [])
    finally:
        engine.dispose()

    daemon = await make_daemon(env)
    summary_reply = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert (summary_reply["tier"], summary_reply["covered_turns"]) == ("warm", 3)
    stored = await daemon.get(f"/v1/sessions/{sid}/messages")
    assert [m["content"] for m in stored["messages"]] == [
        x for pair in zip(QUESTIONS, ANSWERS, strict=True) for x in pair
    ]
    context = await daemon.get(f"/v1/sessions/{sid}/context?question=还有别的吗")
    assert context["turn_count"] == 3
    after = await daemon.post(sid, "user", "谢谢", message_id="m-7", user_id="u-old")
    assert after["turn_count"] == 3
    retried = await daemon.post(sid, "user", "活力健怎么吃？", message_id="m-1")
    assert retried["message_id"] == "m-1"  # a retry of a message stored before the migration
    info = await daemon.get(f"/v1/sessions/{sid}")
    assert (info["message_count"], info["user_id"]) == (7, "u-old")


def session_keys(engine: sa.Engine) -> dict[str, list[str]]:
    """Each table's session_id values, sorted."""
    with engine.connect() as conn:
        return {
            t.name: sorted(r[0] for r in conn.execute(sa.select(t.c.session_id)))
            for t in (t_sessions, t_messages, t_summaries, t_slices)
        }


async def test_tenant_sessions_move_to_their_namespace(database: str, tmp_path: Path, make_daemon: MakeDaemon) -> None:
    """Version 6 stores a tenant's sessions under `<tenant>/<id>`: a version-5 database's tenant
    sessions move there in every table (sessions of no tenant stay), a downgrade moves them back
    and the upgrade again, and the tenant's token then finds its conversation under its old id."""
    env = {"DATABASE_URL": database, "DATA_DIR": str(tmp_path / "data"), "AUTO_MIGRATE": "false"}
    mine, open_sid = new_sid(), new_sid()
    engine = sync_engine(database)
    try:
        with engine.begin() as conn:
            command.upgrade(config(conn), "0005")
        with engine.begin() as conn:
            for sid, tenant in ((mine, "acme"), (open_sid, "")):
                conn.execute(
                    t_sessions.insert().values(
                        session_id=sid,
                        tenant=tenant,
                        user_id="u-old",
                        turn_count=3,
                        message_count=6,
                        created_at=100.0,
                        last_activity=160.0,
                        content_chars=0,
                    )
                )
                conn.execute(
                    t_messages.insert(),
                    [
                        {
                            "session_id": sid,
                            "seq": n,
                            "turn": (n + 1) // 2,
                            "user_id": "u-old",
                            "role": "user" if n % 2 else "assistant",
                            "content": text,
                            "channel": "chat",
                            "message_id": f"m-{n}",
                            "completes_turn": int(n % 2 == 0),
                            "created_at": 100.0 + n,
                        }
                        for n, text in enumerate((x for pair in zip(QUESTIONS, ANSWERS, strict=True) for x in pair), 1)
                    ],
                )
                conn.execute(
                    t_summaries.insert().values(
                        session_id=sid,
                        user_id="u-old",
                        summary=f"活力健：每天2次（{tenant or 'none'}）",
                        turn_count=3,
                        covered_turns=3,
                        topics=["活力健"],
                        structured={},
                        source="deterministic",
                        compressions=1,
                        version=1,
                        created_at=150.0,
                        updated_at=150.0,
                    )
                )
                conn.execute(
                    t_slices.insert().values(
                        session_id=sid,
                        from_turn=1,
                        to_turn=3,
                        first_seq=1,
                        last_seq=6,
                        text="三轮",
                        source="deterministic",
                        summary_version=1,
                        created_at=150.0,
                    )
                )
        before = session_keys(engine)
        moved = {
            "sessions": sorted([f"acme/{mine}", open_sid]),
            "messages": sorted([f"acme/{mine}"] * 6 + [open_sid] * 6),
            "conversation_summaries": sorted([f"acme/{mine}", open_sid]),
            "summary_slices": sorted([f"acme/{mine}", open_sid]),
        }
        done = run_cli("migrate", env=env)
        assert done.returncode == 0, done.stderr
        assert session_keys(engine) == moved
        assert schema_differences(engine) == []
        with engine.begin() as conn:
            command.downgrade(config(conn), "0005")
        assert session_keys(engine) == before
        assert run_cli("migrate", env=env).returncode == 0
        assert session_keys(engine) == moved
    finally:
        engine.dispose()

    token = "acme-token-0123456789abcdef"
    daemon = await make_daemon(env | {"API_TOKENS": f"acme:{token}"}, headers={"Authorization": f"Bearer {token}"})
    summary = await daemon.get(f"/v1/sessions/{mine}/summary")
    assert (summary["session_id"], summary["tier"], summary["summary"]) == (mine, "warm", "活力健：每天2次（acme）")
    assert len((await daemon.get(f"/v1/sessions/{mine}/messages"))["messages"]) == 6
    # The session of no tenant is not in acme's namespace.
    assert (await daemon.http.get(f"/v1/sessions/{open_sid}")).status == 404


async def test_reasoning_columns_are_added_and_taken_away(
    database: str, tmp_path: Path, make_daemon: MakeDaemon
) -> None:
    """Version 12 adds a reply's reasoning to `messages`: a version-11 database's messages keep
    every field and have none; a downgrade drops the two columns keeping the rows, the upgrade
    adds them again; then an old message lists without reasoning and a new reply stores its own."""
    env = {"DATABASE_URL": database, "DATA_DIR": str(tmp_path / "data"), "AUTO_MIGRATE": "false"}
    sid = new_sid()
    engine = sync_engine(database)
    try:
        with engine.begin() as conn:
            command.upgrade(config(conn), "0011")
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO sessions (session_id, tenant, turn_count, message_count, pending_user,"
                    " content_chars, content_bytes, created_at, last_activity)"
                    " VALUES (:sid, '', 0, 1, 1, 4, 4, 100.0, 101.0)"
                ),
                {"sid": sid},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO messages (session_id, seq, turn, role, content, channel, message_id,"
                    " completes_turn, status, created_at) VALUES (:sid, 1, 1, 'user', '2+2?', 'chat', 'm-1', 0,"
                    " 'completed', 101.0)"
                ),
                {"sid": sid},
            )
        old = "SELECT seq, role, content, message_id, status FROM messages"
        with engine.connect() as conn:
            before = conn.execute(sa.text(old)).all()
        assert run_cli("migrate", env=env).returncode == 0
        assert schema_differences(engine) == []
        with engine.connect() as conn:
            assert conn.execute(sa.text(old)).all() == before
            assert conn.execute(sa.text("SELECT thinking_content, thinking_duration FROM messages")).all() == [
                (None, None)
            ]
        with engine.begin() as conn:
            command.downgrade(config(conn), "0011")
        with engine.connect() as conn:
            assert conn.execute(sa.text(old)).all() == before
        assert not {"thinking_content", "thinking_duration"} & {
            c["name"] for c in sa.inspect(engine).get_columns("messages")
        }
        assert run_cli("migrate", env=env).returncode == 0
        assert schema_differences(engine) == []
    finally:
        engine.dispose()

    daemon = await make_daemon(env)
    reply = {"role": "assistant", "content": "4.", "thinking_content": "2 + 2 = 4", "thinking_duration": 1}
    assert (await daemon.http.post(f"/v1/sessions/{sid}/messages", json=reply)).status == 201
    stored = (await daemon.get(f"/v1/sessions/{sid}/messages"))["messages"]
    assert [{k: m.get(k) for k in ("content", "thinking_content", "thinking_duration")} for m in stored] == [
        {"content": "2+2?", "thinking_content": None, "thinking_duration": None},
        {"content": "4.", "thinking_content": "2 + 2 = 4", "thinking_duration": 1},
    ]


def test_migrate_reports_an_unreachable_database() -> None:
    """`tiered-memory migrate` against a server that is not there exits 1 with the reason."""
    done = run_cli("migrate", env={"DATABASE_URL": "mysql+aiomysql://root@127.0.0.1:1/nothing"})
    assert done.returncode == 1
    assert "migrate failed" in done.stderr
