"""Session reads on a real asynchronous MariaDB replica (DATABASE_READ_URL, tiers/sql/replica.py):
answered there when it holds the session's last write this process knows, by the primary when it
lags behind that, hangs or is gone; through the store, and end to end through the daemon.

Each test works in a database of its own, created on the primary of the run's pair (`replication`,
tests/helpers/replication.py) and dropped after.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.daemon import Daemon, MakeDaemon, new_sid, play
from tests.helpers.replication import ReplicationPair
from tests.helpers.servers import RealServers
from tiered_memory.model import NewMessage, Role, SessionKey, Summary, SummarySource
from tiered_memory.testing import free_port
from tiered_memory.tiers.sql.engine import create_engine
from tiered_memory.tiers.sql.replica import COOL_DOWN_S, PIN_S, Replica
from tiered_memory.tiers.sql.store import SqlStore

pytestmark = pytest.mark.real

REPLICA_READS = "tiered_memory_sql_replica_reads_total"
REPLICA_LAG = "tiered_memory_sql_replica_lag_seconds"
# The daemon reads the replica's lag every 5 s (app.py): a change shows within two readings.
_LAG_SEEN_S = 12.0


@pytest.fixture
def database(replication: ReplicationPair) -> Iterator[str]:
    """A database of this test's own on the primary, already on the replica; dropped after."""
    name = f"tm_replica_{uuid.uuid4().hex[:8]}"
    replication.create_database(name)
    try:
        yield name
    finally:
        replication.drop_database(name)


class Clock:
    """The replica's clock, moved by the test past a pin or a cool-down."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def replicated_store(
    primary_url: str, replica_url: str | None, *, replica_timeout_s: float = 5.0, clock: Clock | None = None
) -> AsyncIterator[tuple[SqlStore, list[str]]]:
    """A store writing to `primary_url` whose session reads may go to `replica_url` (None: no
    replica, everything on the primary), and the list of where each of those reads was answered
    (`replica` or `primary`)."""
    outcomes: list[str] = []
    replica = (
        Replica(
            create_engine(replica_url), timeout_s=replica_timeout_s, on_read=outcomes.append, clock=clock or Clock()
        )
        if replica_url is not None
        else None
    )
    store = SqlStore(create_engine(primary_url), timeout_s=10, replica=replica)
    try:
        yield store, outcomes
    finally:
        await store.aclose()


async def say(store: SqlStore, sid: SessionKey, first: int, count: int) -> None:
    """Messages `first`..`first+count-1` of session `sid`, user and assistant in turn, whose
    content is `m<seq>` (seqs start at 1 and follow commit order)."""
    for seq in range(first, first + count):
        role = Role.USER if seq % 2 else Role.ASSISTANT
        await store.append(NewMessage(sid, role, f"m{seq}", f"id{seq}", "u1"), now=time.time())


async def seqs(store: SqlStore, sid: SessionKey) -> list[int]:
    return [m.seq for m in await store.recent_messages(sid, 100, replica=True)]


async def caught_up(pair: ReplicationPair) -> None:
    """The replica has applied everything the primary logged so far (waited for in a thread: the
    event loop keeps serving the daemon meanwhile)."""
    await asyncio.to_thread(pair.wait_caught_up)


async def test_session_reads_are_answered_by_a_caught_up_replica(replication: ReplicationPair, database: str) -> None:
    """On a replica that has applied the session's writes, every session read (messages, the
    session row, a range of seqs, the summary) returns what was written, answered there."""
    primary = replication.primary_url(database)
    async with (
        replicated_store(primary, replication.replica_url(database)) as (store, outcomes),
        replicated_store(primary, None) as (summarizer, _),
    ):
        await store.migrate()
        sid = new_sid()
        await say(store, sid, 1, 6)
        # Written by another process (this store's own summary write would keep the session's
        # reads on the primary for a while: see the next test but one).
        summary = Summary("they said six things", 3, 1, SummarySource.DETERMINISTIC, time.time(), time.time())
        assert await summarizer.put_summary(sid, summary, user_id="u1", turn_count=3)
        await caught_up(replication)
        selects_before = _replica_selects(replication)

        recent = await store.recent_messages(sid, 10, replica=True)
        assert [(m.seq, m.content) for m in recent] == [(n, f"m{n}") for n in range(1, 7)]
        info = await store.get_session(sid, replica=True)
        assert info is not None
        assert (info.message_count, info.turn_count, info.user_id) == (6, 3, "u1")
        middle = await store.messages_by_seq(sid, first_seq=2, last_seq=4, limit=10, replica=True)
        assert [m.content for m in middle] == ["m2", "m3", "m4"]
        stored, row = await store.get_summary(sid, replica=True)
        assert stored is not None
        assert row is not None
        assert (stored.text, stored.covered_turns, row.message_count) == ("they said six things", 3, 6)

        assert outcomes == ["replica"] * 4
        # Counted as the replica's, and asked of it: its server ran the SELECTs.
        assert _replica_selects(replication) - selects_before >= 4


async def test_a_lagging_replica_does_not_hide_this_stores_own_writes(
    replication: ReplicationPair, database: str
) -> None:
    """With the replica paused, the session this store wrote since is read on the primary and
    includes the newest messages (counted `primary`). A session another process wrote is read on
    the replica as the replica has it: stale by design, since this store knows no newer seq of it
    (the daemon passes the hot tier's counters for that, `known_seq`). Resumed and caught up, both
    are read on the replica again, whole."""
    primary, replica = replication.primary_url(database), replication.replica_url(database)
    async with (
        replicated_store(primary, replica) as (store, outcomes),
        replicated_store(primary, None) as (other, _),
    ):
        await store.migrate()
        mine, theirs = new_sid(), new_sid()
        await say(store, mine, 1, 4)
        await say(other, theirs, 1, 2)
        await caught_up(replication)
        replication.pause_replica()
        try:
            await say(store, mine, 5, 2)
            await say(other, theirs, 3, 2)

            assert await seqs(store, mine) == [1, 2, 3, 4, 5, 6]
            info = await store.get_session(mine, replica=True)
            assert info is not None
            assert info.message_count == 6
            assert outcomes == ["primary", "primary"]

            outcomes.clear()
            assert await seqs(store, theirs) == [1, 2]
            assert outcomes == ["replica"]
        finally:
            replication.resume_replica()
        await caught_up(replication)

        outcomes.clear()
        assert await seqs(store, mine) == [1, 2, 3, 4, 5, 6]
        assert await seqs(store, theirs) == [1, 2, 3, 4]
        assert outcomes == ["replica", "replica"]


async def test_a_replica_that_hangs_or_is_gone_falls_back_to_the_primary(
    replication: ReplicationPair, database: str
) -> None:
    """A replica whose process is stopped (it accepts connections and answers nothing) costs a read
    the replica's timeout, then the primary answers; one that refuses connections costs nothing.
    Neither fails a read; each is counted `primary`; a thawed replica answers again."""
    primary = replication.primary_url(database)
    clock = Clock()
    async with replicated_store(primary, replication.replica_url(database), replica_timeout_s=1.0, clock=clock) as (
        store,
        outcomes,
    ):
        await store.migrate()
        sid = new_sid()
        await say(store, sid, 1, 4)
        await caught_up(replication)
        assert await seqs(store, sid) == [1, 2, 3, 4]  # a pooled connection to the replica, then frozen

        with replication.frozen_replica():
            started = time.monotonic()
            assert await seqs(store, sid) == [1, 2, 3, 4]
            info = await store.get_session(sid, replica=True)
            took = time.monotonic() - started
        assert info is not None
        assert info.message_count == 4
        assert outcomes == ["replica", "primary", "primary"]
        # The first read waits the replica's timeout (1 s); the replica is then left alone for
        # its cool-down, and the second goes to the primary at once.
        assert 1.0 <= took < 2.5, took

        outcomes.clear()
        assert await seqs(store, sid) == [1, 2, 3, 4]
        assert outcomes == ["primary"]  # still cooling down
        clock.now += COOL_DOWN_S
        outcomes.clear()
        assert await seqs(store, sid) == [1, 2, 3, 4]
        assert outcomes == ["replica"]

    gone = f"mysql+aiomysql://root@127.0.0.1:{free_port()}/{database}?charset=utf8mb4"
    async with replicated_store(primary, gone, replica_timeout_s=3.0) as (store, outcomes):
        started = time.monotonic()
        assert await seqs(store, sid) == [1, 2, 3, 4]
        assert outcomes == ["primary"]
        assert time.monotonic() - started < 2.0  # refused at once: no replica timeout waited


async def test_a_change_that_keeps_the_seq_is_read_from_the_primary_until_the_replica_has_it(
    replication: ReplicationPair, database: str
) -> None:
    """A summary written, a session closed or deleted by this store while the replica is paused:
    the session's reads go to the primary (never the deleted session's messages back from the
    replica), for PIN_S after the change; then, caught up, to the replica again."""
    clock = Clock()
    async with replicated_store(replication.primary_url(database), replication.replica_url(database), clock=clock) as (
        store,
        outcomes,
    ):
        await store.migrate()
        kept, gone = new_sid(), new_sid()
        await say(store, kept, 1, 4)
        await say(store, gone, 1, 4)
        await caught_up(replication)
        replication.pause_replica()
        try:
            summary = Summary("v1", 2, 1, SummarySource.DETERMINISTIC, time.time(), time.time())
            assert await store.put_summary(kept, summary, user_id="u1", turn_count=2)
            assert await store.close_session(kept, reason="idle", now=time.time())
            await store.delete_session(gone)

            stored, info = await store.get_summary(kept, replica=True)
            assert stored is not None
            assert info is not None
            assert (stored.text, info.closed) == ("v1", True)
            assert await store.get_session(gone, replica=True) is None
            assert await seqs(store, gone) == []
            assert outcomes == ["primary"] * 3
        finally:
            replication.resume_replica()
        await caught_up(replication)
        clock.now += PIN_S
        outcomes.clear()
        stored, _ = await store.get_summary(kept, replica=True)
        assert stored is not None
        assert stored.text == "v1"
        assert outcomes == ["replica"]


async def test_the_daemon_reads_the_replica_and_its_own_writes_from_the_primary(
    replication: ReplicationPair, database: str, real_servers: RealServers, tmp_path: Path, make_daemon: MakeDaemon
) -> None:
    """End to end, with DATABASE_READ_URL: while the replica is paused, the context and the
    messages API show the messages just posted (the hot tier flushed, so SQL answers them: the
    primary), and the lag gauge says the replica is not replicating (-1: a stopped SQL thread has
    no Seconds_Behind_Master). Running but unable to apply while posts go on, it lags (> 0); let go
    and caught up, it is back to 0 and the reads to the replica."""
    d = await make_daemon(
        {
            "DATA_DIR": str(tmp_path / "data"),
            "SWEEP_INTERVAL_SECONDS": "3600",
            "SQL_TIMEOUT_MS": "15000",
            "REDIS_URL": real_servers.redis_url,
            "REDIS_KEY_PREFIX": f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}",
            "DATABASE_URL": replication.primary_url(database),
            "DATABASE_READ_URL": replication.replica_url(database),
            "AUTO_MIGRATE": "true",
        }
    )
    sid = new_sid()
    await play(d, sid, [("what is the capital of peru", "lima"), ("and of chile", "santiago")])
    await caught_up(replication)
    await d.flush_hot()
    context = await d.get(f"/v1/sessions/{sid}/context")
    assert "santiago" in _contents(context)
    assert (await _metrics(d))[REPLICA_READS, "replica"] > 0

    replication.pause_replica()
    try:
        await play(d, sid, [("and of bolivia", "sucre, or la paz")])
        await d.flush_hot()
        fell_back = (await _metrics(d))[REPLICA_READS, "primary"]
        context = await d.get(f"/v1/sessions/{sid}/context")
        assert "sucre, or la paz" in _contents(context)
        page = await d.get(f"/v1/sessions/{sid}/messages")
        assert [m["seq"] for m in page["messages"]] == [1, 2, 3, 4, 5, 6]
        assert page["messages"][-1]["content"] == "sucre, or la paz"
        assert (await _metrics(d))[REPLICA_READS, "primary"] > fell_back
        await _until_lag(d, "-1 (not replicating)", lambda lag: lag == -1)
    finally:
        replication.resume_replica()
    await caught_up(replication)

    with replication.held_replica():
        await play(d, sid, [("and of ecuador", "quito")])
        await _until_lag(d, "> 0", lambda lag: lag > 0, post=lambda n: d.post(sid, "user", f"still here {n}"))
    await caught_up(replication)
    await _until_lag(d, "0", lambda lag: lag == 0)

    replica_reads = (await _metrics(d))[REPLICA_READS, "replica"]
    await d.flush_hot()
    page = await d.get(f"/v1/sessions/{sid}/messages")
    assert page["messages"][7]["content"] == "quito"
    assert (await _metrics(d))[REPLICA_READS, "replica"] > replica_reads


async def _until_lag(
    d: Daemon, expected: str, holds: Callable[[float], bool], *, post: Callable[[int], Awaitable[object]] | None = None
) -> None:
    """Poll the daemon's replica-lag gauge until `holds` of it (posting meanwhile, if `post`);
    fails after _LAG_SEEN_S with the last value."""
    deadline = time.monotonic() + _LAG_SEEN_S
    n = 0
    while True:
        lag = (await _metrics(d))[REPLICA_LAG, ""]
        if holds(lag):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{REPLICA_LAG} is {lag}, expected {expected} within {_LAG_SEEN_S:.0f} s")
        if post is not None:
            await post(n)
            n += 1
        await asyncio.sleep(0.5)


async def _metrics(d: Daemon) -> dict[tuple[str, str], float]:
    """The replica's samples on the daemon's /metrics, by (name, outcome label or '')."""
    resp = await d.http.get("/metrics")
    assert resp.status == 200, await resp.text()
    found = {
        (sample.name, sample.labels.get("outcome", "")): sample.value
        for family in text_string_to_metric_families(await resp.text())
        for sample in family.samples
        if sample.name in (REPLICA_READS, REPLICA_LAG)
    }
    return {(REPLICA_READS, "replica"): 0.0, (REPLICA_READS, "primary"): 0.0} | found


def _contents(context: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in context["messages"])


def _replica_selects(pair: ReplicationPair) -> int:
    ((_, value),) = pair.rows(1, "SHOW GLOBAL STATUS LIKE 'Com_select'")
    return int(value)
