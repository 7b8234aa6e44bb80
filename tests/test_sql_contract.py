"""One contract for the SQL tiers, run against SQLite, a real MariaDB and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event as sa_event
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.helpers.daemon import new_sid
from tests.helpers.servers import RealServers, own_database
from tiered_memory.errors import Conflict, Forbidden, SqlUnavailable
from tiered_memory.model import AppendResult, Caller, NewMessage, Owner, Role, SessionKey, Summary, SummarySource
from tiered_memory.testing import free_port
from tiered_memory.tiers.sql import append, schema
from tiered_memory.tiers.sql.engine import create_engine
from tiered_memory.tiers.sql.maintenance import SqlMaintenance
from tiered_memory.tiers.sql.migrate import current_version
from tiered_memory.tiers.sql.outbox import SqlOutbox, add_event
from tiered_memory.tiers.sql.replica import Replica
from tiered_memory.tiers.sql.schema import SCHEMA_VERSION, metadata
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tiers.sql.users import SqlUsers
from tiered_memory.webhooks import Event, retry_delay


async def _store_on(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    """A migrated store on the backend `request.param` names."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'tm.sqlite3'}"
    elif request.param == "postgres":
        url = request.getfixturevalue("postgres_url")
    else:
        servers: RealServers = request.getfixturevalue("real_servers")
        url = servers.mysql_url
    s = SqlStore(create_engine(url), timeout_s=10)
    await s.migrate()
    yield s
    await s.aclose()


@pytest.fixture(params=["sqlite", "mariadb", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    async for s in _store_on(request, tmp_path):
        yield s


@pytest.fixture(params=["mariadb", "postgres"])
async def locking_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    """A store on a server whose session rows another connection can hold locked meanwhile."""
    async for s in _store_on(request, tmp_path):
        yield s


def new(sid: SessionKey, role: Role, content: str, mid: str, user: str | None = "u1") -> NewMessage:
    return NewMessage(sid, role, content, mid, user)


async def turns(store: SqlStore, sid: SessionKey, n: int) -> None:
    for i in range(1, n + 1):
        await store.append(new(sid, Role.USER, f"问题{i}", f"u{i}"), now=float(i))
        await store.append(new(sid, Role.ASSISTANT, f"回答{i}", f"a{i}"), now=float(i) + 0.5)


async def test_migrate_is_idempotent(store: SqlStore) -> None:
    """Running the migration again changes nothing and reports the same version."""
    assert await store.migrate() == SCHEMA_VERSION
    assert await current_version(store._engine) == SCHEMA_VERSION


async def test_append_numbers_messages_and_turns(store: SqlStore) -> None:
    """seq counts messages, turn counts user+assistant pairs; an assistant message completes a turn."""
    sid = new_sid()
    r1 = await store.append(new(sid, Role.USER, "你好", "m1"), now=1.0)
    r2 = await store.append(new(sid, Role.ASSISTANT, "您好", "m2"), now=2.0)
    r3 = await store.append(new(sid, Role.USER, "再问", "m3"), now=3.0)
    assert [(r.message.seq, r.message.turn, r.turn_count) for r in (r1, r2, r3)] == [(1, 1, 0), (2, 1, 1), (3, 2, 1)]
    info = await store.get_session(sid)
    assert info is not None
    assert (info.turn_count, info.message_count, info.user_id, info.last_activity) == (1, 3, "u1", 3.0)


async def test_append_is_idempotent_and_checks_owner(store: SqlStore) -> None:
    """The same message_id returns the original result; other content under it is a Conflict;
    another user_id is Forbidden; nothing is stored twice."""
    sid = new_sid()
    first = await store.append(new(sid, Role.USER, "你好", "m1"), now=1.0)
    again = await store.append(new(sid, Role.USER, "你好", "m1"), now=5.0)
    # The result a client sees is the same; content_chars is the session's current total.
    assert again == dataclasses.replace(first, duplicate=True)
    with pytest.raises(Conflict):
        await store.append(new(sid, Role.USER, "不同", "m1"), now=6.0)
    with pytest.raises(Forbidden):
        await store.append(new(sid, Role.USER, "hi", "m2", user="other"), now=6.0)
    assert await store.count_messages(sid) == 1


async def test_retries_of_one_message_id_in_two_sessions_each_find_their_own(store: SqlStore) -> None:
    """Two sessions that used the same message_id, retried in one batch: each retry answers its
    own session's original message, and a new message under that id in the other session is
    stored. The first appends take the group commit's slots, so the three after them queue and
    are committed together."""
    a, b = new_sid(), new_sid()
    first_a = await store.append(new(a, Role.USER, "你好", "m1"), now=1.0)
    await store.append(new(a, Role.ASSISTANT, "您好", "m2"), now=2.0)
    first_b = await store.append(new(b, Role.USER, "别的话", "m2"), now=3.0)
    sizes: list[int] = []
    store._commits._on_batch = sizes.append
    fillers = [store.append(new(new_sid(), Role.USER, "占位", "f"), now=4.0) for _ in range(4)]
    *_, again_a, again_b, fresh_b = await asyncio.gather(
        *fillers,
        store.append(new(a, Role.USER, "你好", "m1"), now=4.0),
        store.append(new(b, Role.USER, "别的话", "m2"), now=4.0),
        store.append(new(b, Role.ASSISTANT, "回答", "m1"), now=4.0),
    )
    assert 3 in sizes, sizes  # the three were one batch
    # The retries' results are the originals (content_chars aside: the session's current total).
    assert (again_a.duplicate, again_a.message) == (True, first_a.message)
    assert (again_b.duplicate, again_b.message) == (True, first_b.message)
    assert (fresh_b.duplicate, fresh_b.message.seq) == (False, 2)
    assert (await store.count_messages(a), await store.count_messages(b)) == (2, 2)


async def test_a_retry_that_waits_for_the_batch_holding_its_original_answers_duplicate(
    locking_store: SqlStore,
) -> None:
    """Another process's batch holds the session's row, its original message inserted and not
    committed yet; a retry of that message waits for the lock, and once the batch commits it is
    answered as the duplicate it is (on PostgreSQL the lock re-reads only the session's row, so
    the stored messages are read after it), not refused by the unique key."""
    store = locking_store
    sid = new_sid()
    await store.append(new(sid, Role.USER, "你好", "m1"), now=1.0)
    original = new(sid, Role.ASSISTANT, "您好", "m2")
    async with store._engine.connect() as other:
        async with other.begin():
            batch = [append.Append(original, 2.0, Caller())]
            (stored,) = await append.store_batch(other, append.AppendStatements(), batch, store._insert_if_absent)
            assert isinstance(stored, AppendResult)
            assert not stored.duplicate
            retry = asyncio.create_task(store.append(original, now=3.0))
            await asyncio.sleep(0.5)
            assert not retry.done()  # waiting for the session's row
        again = await retry
    assert (again.duplicate, again.message) == (True, stored.message)
    assert await store.count_messages(sid) == 2


async def test_sessions_belong_to_a_tenant(store: SqlStore) -> None:
    """A session takes the tenant of the caller that created it ('' for an unrestricted one).
    Another tenant's append, delete or summary reset is Forbidden under the row lock and changes
    nothing; the owner's, or an unrestricted caller's, goes through."""
    acme, other = Caller(tenant="acme"), Caller(tenant="other")
    sid = new_sid()
    first = await store.append(new(sid, Role.USER, "你好", "m1"), now=1.0, caller=acme)
    assert first.owner == Owner("acme", "u1")
    info = await store.get_session(sid)
    assert info is not None
    assert info.owner == Owner("acme", "u1")
    for attempt in (
        store.append(new(sid, Role.USER, "hi", "m2"), now=2.0, caller=other),
        # A retry of a stored message_id is no way around it either.
        store.append(new(sid, Role.USER, "你好", "m1"), now=2.0, caller=other),
        store.append(new(sid, Role.USER, "hi", "m2"), now=2.0, caller=Caller(user_id="u2")),
        store.delete_session(sid, caller=other),
        store.delete_summary(sid, caller=other),
    ):
        with pytest.raises(Forbidden):
            await attempt
    assert await store.count_messages(sid) == 1
    assert await store.get_session(sid) == info
    await store.append(new(sid, Role.ASSISTANT, "您好", "m2"), now=3.0, caller=Caller(tenant="acme", user_id="u1"))
    assert await store.delete_summary(sid, caller=Caller()) is True
    assert await store.delete_summary(new_sid(), caller=acme) is False
    unrestricted = new_sid()
    assert (await store.append(new(unrestricted, Role.USER, "x", "m1"), now=1.0)).owner == Owner("", "u1")
    with pytest.raises(Forbidden):
        await store.append(new(unrestricted, Role.USER, "y", "m2"), now=2.0, caller=acme)
    await store.delete_session(sid, caller=acme)
    assert await store.get_session(sid) is None


async def test_user_summaries_of_one_tenant(store: SqlStore) -> None:
    """user_summaries with a tenant lists only that tenant's sessions of the user."""
    mine, theirs = new_sid(), new_sid()
    for sid, tenant in ((mine, "acme"), (theirs, "other")):
        await store.append(new(sid, Role.USER, "问", "m1"), now=1.0, caller=Caller(tenant=tenant))
        s = Summary(f"摘要 {tenant}", 1, 1, SummarySource.DETERMINISTIC, 1.0, 1.0)
        assert await store.put_summary(sid, s, user_id="u1", turn_count=1)
    listed = {sid for sid, _, _ in await store.user_summaries("u1", limit=100)}
    assert {mine, theirs} <= listed
    assert [
        sid for sid, _, _ in await store.user_summaries("u1", limit=100, tenant="acme") if sid in (mine, theirs)
    ] == [mine]


async def test_concurrent_appends_get_distinct_seqs(store: SqlStore) -> None:
    """Appends racing on one session are serialized: seq 1..n, each message once, even with retries."""
    sid = new_sid()
    batch = [new(sid, Role.USER, f"m{i}", f"id{i}") for i in range(20)]
    results = await asyncio.gather(*(store.append(m, now=time.time()) for m in batch + batch[:5]))
    created = [r for r in results if not r.duplicate]
    assert sorted(r.message.seq for r in created) == list(range(1, 21))
    assert await store.count_messages(sid) == 20


async def test_concurrent_appends_share_commits_and_keep_each_sessions_order(store: SqlStore) -> None:
    """Group commit: appends to several sessions at once share transactions, and each session's
    messages get seqs in the order they were sent."""
    sizes: list[int] = []
    store._commits._on_batch = sizes.append
    sids = [new_sid() for _ in range(4)]
    sent = [new(sids[i % 4], Role.USER, f"m{i}", f"id{i}") for i in range(40)]
    results = await asyncio.gather(*(store.append(m, now=time.time()) for m in sent))
    for sid in sids:
        mine = [r.message for r in results if r.message.key == sid]
        assert [m.seq for m in mine] == list(range(1, 11))
        assert [m.content for m in mine] == [m.content for m in sent if m.key == sid]
        assert await store.count_messages(sid) == 10
    assert max(sizes) > 1
    assert sum(sizes) == 40


async def test_one_batch_updates_each_of_its_sessions_rows_as_appends_one_by_one_do(store: SqlStore) -> None:
    """A batch's session rows are updated by one statement: each row gets its own counts, sizes,
    time, first user and open tool calls (a closed session is reopened), as when the same
    messages are appended one at a time to twin sessions, never another row's."""
    calls = json.dumps([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}])

    def messages(a: SessionKey, b: SessionKey, c: SessionKey) -> list[tuple[NewMessage, float]]:
        return [
            (new(a, Role.USER, "又来了", "m2"), 3.0),
            (new(b, Role.USER, "第一句话", "b1", user="ub"), 4.0),
            (NewMessage(b, Role.ASSISTANT, "", "b2", "ub", tool_calls=calls), 5.0),
            (new(c, Role.USER, "x" * 10, "c1", user=None), 6.0),
            (new(a, Role.ASSISTANT, "欢迎", "m3"), 7.0),
        ]

    batched, alone = [new_sid() for _ in range(3)], [new_sid() for _ in range(3)]
    for a in (batched[0], alone[0]):
        await store.append(new(a, Role.USER, "早", "m0", user=None), now=1.0)
        await store.append(new(a, Role.ASSISTANT, "早上好", "m1", user="u1"), now=1.5)
        assert await store.close_session(a, reason="idle", now=2.0)
    for m, now in messages(*alone):
        await store.append(m, now=now)
    statements: list[tuple[str, bool]] = []
    sa_event.listen(
        store._engine.sync_engine, "before_cursor_execute", lambda *args: statements.append((args[2], args[5]))
    )
    batch = [append.Append(m, now, Caller()) for m, now in messages(*batched)]
    async with store._engine.begin() as conn:
        out = await append.store_batch(conn, append.AppendStatements(), batch, store._insert_if_absent)
    assert all(isinstance(r, AppendResult) and not r.duplicate for r in out)
    # One statement, not one executemany (which a driver may send as a statement per row).
    assert [many for text, many in statements if text.lstrip().upper().startswith("UPDATE")] == [False]
    async with store._engine.connect() as conn:
        rows = {
            r.session_id: r._asdict()
            for r in await conn.execute(
                sa.select(schema.sessions).where(schema.sessions.c.session_id.in_(batched + alone))
            )
        }
    for one, twin in zip(batched, alone, strict=True):
        assert {**rows[one], "session_id": twin} == rows[twin]
    assert [rows[sid]["message_count"] for sid in batched] == [4, 2, 1]
    assert [(rows[sid]["user_id"], rows[sid]["closed_at"]) for sid in batched] == [
        ("u1", None),
        ("ub", None),
        (None, None),
    ]
    assert rows[batched[1]]["open_tool_calls"] is not None
    assert "call_1" in rows[batched[1]]["open_tool_calls"]


async def test_a_refused_message_fails_alone_in_its_batch(store: SqlStore) -> None:
    """In one batch: a reused message_id (Conflict) and another tenant's session (Forbidden) fail
    their own callers only; every other message is stored, once."""
    sid, theirs = new_sid(), new_sid()
    await store.append(new(sid, Role.USER, "first", "m1"), now=1.0)
    await store.append(new(theirs, Role.USER, "x", "t1"), now=1.0, caller=Caller(tenant="other"))
    results = await asyncio.gather(
        store.append(new(sid, Role.ASSISTANT, "a", "m2"), now=2.0),
        store.append(new(sid, Role.USER, "not first", "m1"), now=2.0),
        store.append(new(theirs, Role.USER, "y", "t2"), now=2.0, caller=Caller(tenant="acme")),
        store.append(new(sid, Role.USER, "b", "m3"), now=2.0),
        return_exceptions=True,
    )
    assert isinstance(results[1], Conflict)
    assert isinstance(results[2], Forbidden)
    assert [m.content for m in await store.recent_messages(sid, 10)] == ["first", "a", "b"]
    assert [m.content for m in await store.recent_messages(theirs, 10)] == ["x"]


async def test_a_statement_the_server_refuses_fails_only_its_caller(store: SqlStore) -> None:
    """A message whose statement the server refuses (a message_id over the column's 128
    characters, on MariaDB's strict mode and PostgreSQL) aborts the shared transaction; the others
    are then committed alone and only its caller gets the error. SQLite does not enforce the length."""
    sid = new_sid()
    results = await asyncio.gather(
        *(store.append(new(sid, Role.USER, f"m{i}", "x" * 200 if i == 2 else f"id{i}"), now=1.0) for i in range(5)),
        return_exceptions=True,
    )
    stored = [m.content for m in await store.recent_messages(sid, 10)]
    if store.dialect in ("mysql", "postgresql"):
        assert isinstance(results[2], SqlUnavailable)
        assert stored == ["m0", "m1", "m3", "m4"]
    else:
        assert stored == [f"m{i}" for i in range(5)]
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 2)


async def test_turn_queries(store: SqlStore) -> None:
    """recent_messages returns the last n oldest-first; messages_in_turns selects whole turns."""
    sid = new_sid()
    await turns(store, sid, 4)
    assert [m.content for m in await store.recent_messages(sid, 3)] == ["回答3", "问题4", "回答4"]
    got = await store.messages_in_turns(sid, after_turn=1, through_turn=3)
    assert [m.content for m in got] == ["问题2", "回答2", "问题3", "回答3"]
    assert len(await store.messages_in_turns(sid, after_turn=0)) == 8


async def test_a_read_by_seq_stops_past_its_bytes(store: SqlStore) -> None:
    """messages_by_seq with max_bytes reads as far as the first message that takes the text past
    it, and one more; bytes are UTF-8's (a Chinese character is 3), tool calls count; without a
    bound, or within it, every message up to the limit."""
    sid = new_sid()
    # seq 1..6: 30 bytes each (10 Chinese characters), but seq 4 carries 60 bytes of tool calls.
    for i in range(1, 7):
        calls = [{"id": "c" * 10, "type": "function", "function": {"name": "x" * 8, "arguments": "{}"}}]
        role = Role.ASSISTANT if i == 4 else Role.USER if i % 2 else Role.ASSISTANT
        msg = new(sid, role, "字" * 10, f"m{i}")
        if i == 4:
            msg = dataclasses.replace(msg, tool_calls=json.dumps(calls, separators=(",", ":")))
        await store.append(msg, now=float(i))
    read = functools.partial(store.messages_by_seq, sid, first_seq=1, last_seq=99, limit=50)
    assert [m.seq for m in await read()] == [1, 2, 3, 4, 5, 6]
    assert [m.seq for m in await read(max_bytes=1000)] == [1, 2, 3, 4, 5, 6]
    # 30 + 30 = 60 fits 60; the third takes it to 90: read, with one more.
    assert [m.seq for m in await read(max_bytes=60)] == [1, 2, 3, 4]
    # The first alone passes 10: it and the next.
    assert [m.seq for m in await read(max_bytes=10)] == [1, 2]
    # 90 after three; the fourth's tool calls take it past 120 (its content alone would not).
    assert [m.seq for m in await read(max_bytes=120)] == [1, 2, 3, 4, 5]
    # The limit still holds, and the range's end: the last message passing is the range's last.
    assert [m.seq for m in await read(max_bytes=60, limit=2)] == [1, 2]
    assert [m.seq for m in await store.messages_by_seq(sid, first_seq=5, last_seq=6, limit=9, max_bytes=1)] == [5, 6]


async def test_closing_waits_for_a_statement_in_flight(store: SqlStore) -> None:
    """A store closed while a read holds a connection lets the read finish, then closes the pool
    with the connection back in it (one given back to a pool already closed would stay open
    until the collector found it)."""
    started, release = asyncio.Event(), asyncio.Event()

    async def op(conn: AsyncConnection) -> int:
        await conn.execute(sa.text("SELECT 1"))
        started.set()
        await release.wait()
        return int((await conn.execute(sa.text("SELECT 2"))).scalar_one())

    reading = asyncio.create_task(store.read(op))
    await started.wait()
    closing = asyncio.create_task(store.aclose())
    await asyncio.sleep(0.2)
    assert not closing.done()
    release.set()
    assert await reading == 2
    await closing


async def test_a_closed_store_refuses_statements_and_opens_no_connection(store: SqlStore) -> None:
    """A statement asked of a closed store (a task that outlived the daemon's shutdown) is refused
    with SqlUnavailable: the disposed engine would open a connection in a new pool, which
    nothing would close."""
    sid = new_sid()
    await turns(store, sid, 1)
    await store.aclose()
    with pytest.raises(SqlUnavailable, match="closed"):
        await store.get_session(sid)
    with pytest.raises(SqlUnavailable, match="closed"):
        await store.transaction(lambda conn: conn.execute(sa.text("SELECT 1")))
    pool = store._engine.pool  # the pool a statement would have opened
    assert (pool.checkedin(), pool.checkedout()) == (0, 0)  # type: ignore[attr-defined]


async def test_turn_range_reads_across_pages(store: SqlStore) -> None:
    """messages_in_turns reads the tail backwards in growing pages: every range, near the end or
    deep into a long session, holds exactly its turns in order."""
    sid = new_sid()
    await turns(store, sid, 200)
    for after, through in [(199, None), (197, 199), (150, None), (10, 12), (10, None), (1, 200), (200, None)]:
        got = await store.messages_in_turns(sid, after_turn=after, through_turn=through)
        last = 200 if through is None else through
        expected = [text for t in range(after + 1, last + 1) for text in (f"问题{t}", f"回答{t}")]
        assert [m.content for m in got] == expected, (after, through)
        assert [m.seq for m in got] == sorted(m.seq for m in got)


async def test_turn_ranges_read_forwards_from_the_previous_range(store: SqlStore) -> None:
    """A range read from the first turn, or from the seq where the previous range ended
    (`after_seq`), reads forwards across pages (no backward page of the session's newest
    messages): chained ranges hold exactly their turns in order, as the backward read gives them,
    also where a page ends inside a turn (a greeting makes the first turn three messages), and a
    range past the end holds nothing."""
    sid = new_sid()
    await store.append(new(sid, Role.ASSISTANT, "您好", "g0"), now=0.5)
    await turns(store, sid, 200)
    statements: list[tuple[str, Any]] = []

    def seen(_conn: object, _cursor: object, statement: str, parameters: Any, *_: object) -> None:
        statements.append((statement, parameters))

    after_seq: int | None = None
    bounds = [0, 5, 40, 180, 200]
    for after, through in itertools.pairwise(bounds):
        sa_event.listen(store._engine.sync_engine, "before_cursor_execute", seen)
        try:
            got = await store.messages_in_turns(sid, after_turn=after, through_turn=through, after_seq=after_seq)
        finally:
            sa_event.remove(store._engine.sync_engine, "before_cursor_execute", seen)
        assert got == await store.messages_in_turns(sid, after_turn=after, through_turn=through), (after, through)
        greeting = ["您好"] if after == 0 else []
        expected = greeting + [text for t in range(after + 1, through + 1) for text in (f"问题{t}", f"回答{t}")]
        assert [m.content for m in got] == expected, (after, through)
        after_seq = got[-1].seq
    assert await store.messages_in_turns(sid, after_turn=200, through_turn=210, after_seq=after_seq) == []
    reads = [statement for statement, _ in statements if "FROM messages" in statement]
    assert reads
    assert all("messages.seq >" in statement and "messages.id <" not in statement for statement in reads), reads


async def test_summary_versions_are_compare_and_set(store: SqlStore) -> None:
    """Version n+1 replaces version n; a stale writer (same or older base) is refused."""
    sid = new_sid()
    await turns(store, sid, 3)
    s1 = Summary("一", 3, 1, SummarySource.DETERMINISTIC, 10.0, 10.0, ("活力健",), {"facts": ["398元"]}, 1)
    assert await store.put_summary(sid, s1, user_id="u1", turn_count=3) is True
    assert await store.put_summary(sid, s1, user_id="u1", turn_count=3) is False
    s2 = dataclasses.replace(s1, text="二", version=2, updated_at=11.0)
    assert await store.put_summary(sid, s2, user_id="u1", turn_count=3) is True
    assert await store.put_summary(sid, dataclasses.replace(s2, text="stale"), user_id="u1", turn_count=3) is False
    got, info = await store.get_summary(sid)
    assert got == s2
    assert info is not None
    assert info.covered_turns == 3
    assert info.turn_count == 3


async def test_a_summarys_versions_are_kept_bounded_and_go_with_it(store: SqlStore) -> None:
    """Each summary written is kept as a version, the newest `summary_history` (10) of them (a
    stale write keeps none); deleting the summary, the session, the user's content or a retention
    purge removes them."""
    kept = store
    sid = new_sid()
    await turns(store, sid, 3)

    async def write(versions: range) -> None:
        for v in versions:
            s = Summary(f"第{v}版", 3, v, SummarySource.DETERMINISTIC, float(v), 1.0)
            assert await kept.put_summary(sid, s, user_id="u1", turn_count=3) is True

    await write(range(1, 13))
    stale = Summary("stale", 3, 12, SummarySource.LLM, 99.0, 1.0)
    assert await kept.put_summary(sid, stale, user_id="u1", turn_count=3) is False
    found = await kept.summary_versions(sid)
    assert [(v.version, v.text, v.created_at) for v in found] == [(v, f"第{v}版", float(v)) for v in range(12, 2, -1)]
    assert await kept.summary_versions(sid, limit=1) == found[:1]

    assert await kept.delete_summary(sid) is True
    assert await kept.summary_versions(sid) == []
    await write(range(1, 3))
    await kept.delete_session(sid)
    assert await kept.summary_versions(sid) == []

    await turns(store, sid, 3)
    await write(range(1, 3))
    users = SqlUsers(kept, batch=1)
    await users.erase_content(sid)
    assert await kept.summary_versions(sid) == []
    await write(range(3, 5))
    assert (await users.erase_session(sid))[0] is True
    assert await kept.summary_versions(sid) == []

    await turns(store, sid, 3)
    await write(range(1, 3))
    assert (await SqlMaintenance(kept).purge_session(sid, before=time.time() + 10)).complete
    assert await kept.summary_versions(sid) == []


async def test_due_idle_close_delete(store: SqlStore) -> None:
    """sessions_due finds passed cadence points and unsummarized closed sessions; idle_sessions
    finds open sessions past the cutoff; delete removes everything."""
    sid = new_sid()
    await turns(store, sid, 4)
    assert sid in await store.sessions_due(every_n=3, min_turns_to_persist=2, limit=10_000)
    s = Summary("x", 3, 1, SummarySource.DETERMINISTIC, 1.0, 1.0)
    await store.put_summary(sid, s, user_id="u1", turn_count=4)
    assert sid not in await store.sessions_due(every_n=3, min_turns_to_persist=2, limit=10_000)
    assert sid in await store.idle_sessions(idle_before=100.0, limit=10_000)
    assert await store.close_session(sid, reason="idle", now=200.0) is True
    assert await store.close_session(sid, reason="idle", now=201.0) is False
    assert sid not in await store.idle_sessions(idle_before=100.0, limit=10_000)
    assert sid in await store.sessions_due(every_n=3, min_turns_to_persist=2, limit=10_000)
    await store.delete_session(sid)
    assert await store.get_session(sid) is None
    assert await store.get_summary(sid) == (None, None)
    assert await store.count_messages(sid) == 0


async def test_a_url_of_several_servers_connects_to_the_first_that_answers(real_servers: RealServers) -> None:
    """A cluster's URL whose first node is down (nothing listens on its port) connects to the next:
    migrations, appends and reads all go there."""
    scheme, _, rest = real_servers.mysql_url.partition("://")
    user, _, host_and_path = rest.rpartition("@")
    url = f"{scheme}://{user}@127.0.0.1:{free_port()},{host_and_path}"
    store = SqlStore(create_engine(url), timeout_s=10)
    try:
        await store.migrate()
        sid = new_sid()
        await turns(store, sid, 2)
        info = await store.get_session(sid)
        assert info is not None
        assert info.turn_count == 2
    finally:
        await store.aclose()


async def test_a_mysql_connection_is_rolled_back_when_given_back_only_with_a_transaction_open(
    real_servers: RealServers,
) -> None:
    """A committed write's connection goes back to the pool without a ROLLBACK (the server's
    count of them on that connection does not move); one given back with a transaction open that
    SQLAlchemy did not see (a statement sent through the driver after the commit) is rolled back
    before anyone reuses it."""
    engine = create_engine(real_servers.mysql_url)
    nothing = sa.delete(schema.sessions).where(schema.sessions.c.session_id == "none")

    async def rollbacks(conn: AsyncConnection) -> int:
        row = (await conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Com_rollback'")).one()
        return int(row._mapping["Value"])

    async def driver(conn: AsyncConnection) -> Any:
        found = (await conn.get_raw_connection()).driver_connection
        assert found is not None
        return found

    try:
        # The pool's one connection, reused below (the counts are that connection's).
        async with engine.connect() as conn:
            before = await rollbacks(conn)
        for _ in range(3):
            async with engine.begin() as conn:
                await conn.execute(nothing)
        async with engine.connect() as conn:
            # The read above closed its own transaction (+1); the three commits added nothing.
            assert await rollbacks(conn) == before + 1
        async with engine.connect() as conn:
            await conn.execute(nothing)
            await conn.commit()
            aiomysql_conn = await driver(conn)
            cursor = await aiomysql_conn.cursor()
            await cursor.execute("DELETE FROM sessions WHERE session_id = 'none'")
            assert aiomysql_conn.get_transaction_status()
        async with engine.connect() as conn:
            assert not (await driver(conn)).get_transaction_status()
            assert await rollbacks(conn) == before + 3
    finally:
        await engine.dispose()


async def test_a_postgresql_connection_is_reused_after_its_commit(postgres_url: str) -> None:
    """The pool gives the same PostgreSQL connection back after commits (none is closed on its
    way back: the MySQL engine's reset of connections is not PostgreSQL's)."""
    engine = create_engine(postgres_url)
    try:
        pids = set()
        for _ in range(3):
            async with engine.begin() as conn:
                pids.add((await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one())
        assert len(pids) == 1
    finally:
        await engine.dispose()


async def test_session_reads_go_to_a_replica_that_has_the_sessions_last_write(real_servers: RealServers) -> None:
    """With a replica (here the same server: always caught up), a session's reads asked with
    `replica=True` are answered there; one it does not know, or a replica that does not answer,
    is asked of the primary and counted; reads without `replica` never go there."""
    outcomes: list[str] = []
    replica = Replica(create_engine(real_servers.mysql_url), timeout_s=5, on_read=outcomes.append)
    store = SqlStore(create_engine(real_servers.mysql_url), timeout_s=10, replica=replica)
    try:
        await store.migrate()
        sid = new_sid()
        await turns(store, sid, 2)
        info = await store.get_session(sid, replica=True)
        assert info is not None
        assert info.message_count == 4
        assert [m.seq for m in await store.recent_messages(sid, 10, replica=True)] == [1, 2, 3, 4]
        assert outcomes == ["replica", "replica"]
        assert await store.get_session(new_sid(), replica=True) is None
        assert outcomes[-1] == "primary"
        # Ahead of the replica's copy (a write it has not applied yet): the primary answers.
        ahead = await store.recent_messages(sid, 10, replica=True, known_seq=5)
        assert (len(ahead), outcomes[-1]) == (4, "primary")
        outcomes.clear()
        await store.get_summary(sid)
        assert outcomes == []
    finally:
        await store.aclose()

    scheme, _, rest = real_servers.mysql_url.partition("://")
    user, _, host_and_path = rest.rpartition("@")
    _, _, path = host_and_path.partition("/")
    dead = Replica(
        create_engine(f"{scheme}://{user}@127.0.0.1:{free_port()}/{path}"), timeout_s=5, on_read=outcomes.append
    )
    store = SqlStore(create_engine(real_servers.mysql_url), timeout_s=10, replica=dead)
    try:
        found = await store.messages_by_seq(sid, first_seq=1, last_seq=4, limit=10, replica=True)
        assert [m.seq for m in found] == [1, 2, 3, 4]
        assert outcomes == ["primary"]
    finally:
        await store.aclose()


async def test_unreachable_server_is_sql_unavailable() -> None:
    """A database that refuses connections raises SqlUnavailable, not a driver error."""
    dead = SqlStore(create_engine("mysql+aiomysql://root@127.0.0.1:1/test"), timeout_s=2)
    with pytest.raises(SqlUnavailable):
        await dead.append(new(new_sid(), Role.USER, "x", "m1"), now=1.0)
    with pytest.raises(SqlUnavailable):
        await dead.ping()
    await dead.aclose()


async def test_concurrent_migrations_all_succeed(real_servers: RealServers, postgres_url: str, tmp_path: Path) -> None:
    """Four replicas migrating one fresh database at once all succeed (SQLite, MariaDB and
    PostgreSQL)."""
    with own_database(real_servers.mysql_url) as mariadb, own_database(postgres_url) as postgresql:
        for url in (f"sqlite+aiosqlite:///{tmp_path / 'mig.sqlite3'}", mariadb, postgresql):
            stores = [SqlStore(create_engine(url), timeout_s=30) for _ in range(4)]
            versions = await asyncio.gather(*(s.migrate() for s in stores))
            assert versions == [SCHEMA_VERSION] * 4, url
            assert await stores[0].schema_version() == SCHEMA_VERSION
            for s in stores:
                await s.aclose()


async def test_a_new_postgresql_database_gets_exactly_the_declared_schema(postgres_url: str) -> None:
    """Migrated from empty, a PostgreSQL database holds what tiers/sql/schema.py declares: Alembic's
    autogenerate finds no difference (MariaDB and SQLite: test_migrations.py)."""
    with own_database(postgres_url) as url:
        store = SqlStore(create_engine(url), timeout_s=30)
        try:
            assert await store.migrate() == SCHEMA_VERSION

            def differences(conn: sa.Connection) -> list[Any]:
                context = MigrationContext.configure(conn, opts={"compare_type": True})
                return list(compare_metadata(context, metadata))

            async with store._engine.connect() as conn:
                assert await conn.run_sync(differences) == []
        finally:
            await store.aclose()


async def test_unmigrated_database_reports_version_zero(real_servers: RealServers) -> None:
    """schema_version is 0 on a database that was never migrated."""
    db = f"tm_test_{real_servers.run_id}_empty"
    admin = SqlStore(create_engine(real_servers.mysql_url), timeout_s=10)
    async with admin._engine.begin() as conn:
        await conn.exec_driver_sql(f"CREATE DATABASE `{db}`")
    empty = SqlStore(create_engine(real_servers.mysql_url.rsplit("/", 1)[0] + f"/{db}"), timeout_s=10)
    try:
        assert await empty.schema_version() == 0
        with pytest.raises(SqlUnavailable):
            await empty.append(new(new_sid(), Role.USER, "x", "m1"), now=1.0)
    finally:
        await empty.aclose()
        async with admin._engine.begin() as conn:
            await conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{db}`")
        await admin.aclose()


async def test_user_summaries_match_the_user_id_exactly(store: SqlStore) -> None:
    """User ids that differ only in trailing spaces are different users on every backend:
    MariaDB's collations compare 'u1' and 'u1 ' as equal (PAD SPACE), which listed one user's
    summaries under the other's id."""
    owners = {"u-pad": new_sid(), "u-pad ": new_sid(), "u-pad  ": new_sid()}
    for user, sid in owners.items():
        await store.append(new(sid, Role.USER, "问题", "m1", user), now=1.0)
        await store.append(new(sid, Role.ASSISTANT, "回答", "m2", user), now=2.0)
        summary = Summary(f"摘要 {user!r}", 1, 1, SummarySource.DETERMINISTIC, 10.0, 10.0)
        assert await store.put_summary(sid, summary, user_id=user, turn_count=1) is True
    for user, sid in owners.items():
        assert [s for s, _, _ in await store.user_summaries(user, limit=10)] == [sid], repr(user)


async def test_every_failed_delivery_counts_and_puts_the_next_off(store: SqlStore) -> None:
    """A failed delivery counts an attempt and sets when the next is due; delivery waits longer
    after each (events.retry_delay of the attempts made): an outbox whose attempts did not count
    retried a dead receiver every 1 to 2 s forever."""
    outbox = SqlOutbox(store)
    sid = new_sid()
    event = Event("e" * 32, "session.closed", "", sid, "u1", {"turn_count": 1}, 100.0)

    async def queue(conn: AsyncConnection) -> None:
        await add_event(conn, ["w:test"], event)

    await store.transaction(queue)
    now = 100.0
    for attempts in range(4):
        (row,) = [r for r in await outbox.heads(now=now, limit=1000) if r.subject == sid]
        assert row.attempts == attempts
        # What delivery asks for after this failure: longer each time (up to its cap).
        ceiling = min(600.0, 2.0 * 2**attempts)
        assert ceiling / 2 <= retry_delay(attempts + 1) <= ceiling
        await outbox.retry(row.id, error="HTTP 500", at=now + ceiling)
        assert [r for r in await outbox.heads(now=now + ceiling - 0.5, limit=1000) if r.subject == sid] == []
        now += ceiling


async def test_a_sessions_reads_go_through_its_index_whatever_was_stored_after_it(store: SqlStore) -> None:
    """A session's first and last messages and its tail by turns are read through the
    (session_id, id) index (a range read forwards from a seq through the (session_id, seq) one),
    not by walking every later session's rows in id order: MariaDB's optimizer chose that walk
    for `ORDER BY id LIMIT n`, so the read of an old session grew with the table. The plans are
    checked where EXPLAIN names the index (MariaDB); the answers on every backend."""
    old, later = new_sid(), new_sid()
    await turns(store, old, 3)
    rows = [
        {
            "session_id": later,
            "seq": i,
            "turn": (i + 1) // 2,
            "role": "user" if i % 2 else "assistant",
            "content": f"后来的消息{i}",
            "channel": "chat",
            "message_id": f"m{i}",
            "completes_turn": int(i % 2 == 0),
            "created_at": 10.0 + i,
        }
        for i in range(1, 3001)
    ]
    async with store._engine.begin() as conn:
        await conn.execute(schema.messages.insert(), rows)
        await conn.execute(sa.text("ANALYZE TABLE messages") if store.dialect == "mysql" else sa.text("SELECT 1"))
    statements: list[tuple[str, Any]] = []

    def seen(_conn: object, _cursor: object, statement: str, parameters: Any, *_: object) -> None:
        statements.append((statement, parameters))

    engine = store._engine.sync_engine
    sa_event.listen(engine, "before_cursor_execute", seen)
    try:
        first = await store.first_messages(old, 2)
        last = await store.recent_messages(old, 2)
        tail = await store.messages_in_turns(old, after_turn=2)
        forwards = await store.messages_in_turns(old, after_turn=0, through_turn=2)
        *_, both = await store.summary_state_or_ends(old, head=2, tail=3, read_ends=lambda _: True)
    finally:
        sa_event.remove(engine, "before_cursor_execute", seen)
    assert [m.content for m in first] == ["问题1", "回答1"]
    assert [m.content for m in last] == ["问题3", "回答3"]
    assert [m.content for m in tail] == ["问题3", "回答3"]
    assert [m.content for m in forwards] == ["问题1", "回答1", "问题2", "回答2"]
    assert both is not None
    assert ([m.seq for m in both[0]], [m.seq for m in both[1]]) == ([1, 2], [4, 5, 6])
    if store.dialect != "mysql":
        return
    reads = [(s, p) for s, p in statements if "FROM messages" in s]
    assert len(reads) == 5
    async with store._engine.connect() as conn:
        for statement, parameters in reads:
            plans = (await conn.exec_driver_sql("EXPLAIN " + statement, parameters)).mappings().all()
            tables = [plan for plan in plans if plan["table"] == "messages"]
            assert tables
            # A forward read starts at a seq; the others walk the session's ids.
            index = "ix_messages_session_seq" if "messages.seq >" in statement else "ix_messages_session_id"
            assert all(plan["key"] == index for plan in tables), (statement, plans)
