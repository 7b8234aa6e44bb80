"""Faults injected against real servers: Redis killed, hung, slow or flushed; SQL (MariaDB, and
PostgreSQL) cut or slow; the LLM down, slow or answering garbage. Each test fails if an
acknowledged message is lost or stored twice, if a read answers wrong, or if a breaker keeps
paying a dead dependency's timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, llm_env, new_sid, play
from tests.helpers.faults import RedisProcess, TcpProxy, proxied
from tests.helpers.servers import RealServers, sql_rows
from tiered_memory.testing import ZH_12_TURNS, ZH_EARLY_EVIDENCE, FakeLlm

pytestmark = pytest.mark.real


@pytest.fixture
def redis_proxy(private_redis: RedisProcess) -> Iterator[TcpProxy]:
    with proxied("127.0.0.1", private_redis.port) as proxy:
        yield proxy


@pytest.fixture(params=["mariadb", "postgres"])
def sql_url(request: pytest.FixtureRequest, real_servers: RealServers) -> str:
    """The SQL server a fault is injected in front of: this run's MariaDB or PostgreSQL database."""
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return real_servers.mysql_url


@pytest.fixture
def sql_proxy(sql_url: str) -> Iterator[TcpProxy]:
    url = urlparse(sql_url)
    with proxied(url.hostname or "127.0.0.1", url.port or 3306) as proxy:
        yield proxy


def _via(sql_url: str, port: int) -> str:
    """The same database, reached through the proxy on `port`."""
    url = urlparse(sql_url)
    userinfo = url.netloc.rpartition("@")[0]
    return url._replace(netloc=f"{userinfo}@127.0.0.1:{port}").geturl()


def _env(real_servers: RealServers, **extra: str) -> dict[str, str]:
    env = {
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": f"tmt{real_servers.run_id}{new_sid()[2:8]}",
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "SWEEP_INTERVAL_SECONDS": "3600",
        "REDIS_TIMEOUT_MS": "200",
        # A loaded CI machine's MariaDB has stalled a plain commit for 1.6 to 3.8 s, which a
        # short bound turns into a 503 where no fault was injected. A proxy's cut fails at once
        # whatever the bound; a test that times SQL out sets its own.
        "SQL_TIMEOUT_MS": "15000",
    }
    return env | extra


def _marked(sid: str, turns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The turns with «sid» in each question, so that the fake LLM tells this session's calls
    from those for the other sessions in a shared database (a start-up or idle sweep does
    them too)."""
    return [(f"{user} «{sid}»", assistant) for user, assistant in turns]


def _calls_for(fake_llm: FakeLlm, sid: str) -> int:
    return sum(f"«{sid}»" in str(r["body"]["messages"][-1]["content"]) for r in fake_llm.requests)


def _gauge(d: Daemon, name: str, **labels: str) -> float | None:
    return d.registry.get_sample_value(name, labels)


async def _eventually(check: Any, *, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _quiet(proxy: TcpProxy) -> None:
    """Wait (at most 2 s) until the proxy has read nothing more from the daemon for 0.3 s: what
    was sent before the breaker opened (held back by a slow proxy) is then counted."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        before = proxy.sent
        await asyncio.sleep(0.3)
        if proxy.sent == before:
            return


# --- Redis ------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["killed", "hung", "slow"])
async def test_redis_fault_falls_through_breaker_opens_and_hot_refills(
    real_servers: RealServers, private_redis: RedisProcess, redis_proxy: TcpProxy, fault: str, make_daemon: MakeDaemon
) -> None:
    """While Redis is down (killed), hung (accepts, never answers) or slower than REDIS_TIMEOUT_MS,
    appends commit to SQL and reads answer from SQL with the right content; after a few
    failures the breaker opens and Redis is no longer called on every request; when Redis is
    back, a probe closes the breaker and backfill refills the hot tier."""
    # Longer than ten reads from SQL take, so that normally no probe falls in that window.
    reset_s = 3.0
    d = await make_daemon(
        _env(
            real_servers,
            REDIS_URL=f"redis://127.0.0.1:{redis_proxy.port}/0",
            REDIS_BREAKER_FAILURES="3",
            REDIS_BREAKER_RESET_SECONDS=str(reset_s),
        )
    )
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    assert (await d.get(f"/v1/sessions/{sid}/summary"))["tier"] == "hot"
    sent_before = redis_proxy.sent
    assert (await d.get(f"/v1/sessions/{sid}/context"))["summary_tier"] == "hot"
    one_read = redis_proxy.sent - sent_before
    assert one_read > 0

    if fault == "killed":
        private_redis.kill()
    elif fault == "hung":
        redis_proxy.blackhole()
    else:
        redis_proxy.delay_s = 0.5
    faulted, dialled = time.monotonic(), redis_proxy.accepted  # the breaker opens after this
    await play(d, sid, ZH_12_TURNS[3:5])
    assert _gauge(d, "tiered_memory_breaker_state", dependency="redis") == 2
    if fault == "hung":
        # The connection that went silent was dropped and another dialled: a client that
        # kept waiting on it would stall every call behind the first.
        assert redis_proxy.accepted > dialled

    # Open: ten requests (twenty Redis calls without a breaker), and only the probes, one
    # per reset period, reach Redis: none at all when the ten take less than a period. A
    # probe may reconnect, and send one read and a backfill.
    await _quiet(redis_proxy)
    started, accepted_before, sent_before = time.monotonic(), redis_proxy.accepted, redis_proxy.sent
    for _ in range(10):
        ctx = await d.get(f"/v1/sessions/{sid}/context")
        assert ctx["messages"][-1]["content"] == ZH_12_TURNS[4][1]
        assert ctx["summary_tier"] == "warm"
        assert ctx["turn_count"] == 5
    probes_allowed = int((time.monotonic() - started) / reset_s) + 1
    assert redis_proxy.accepted - accepted_before <= probes_allowed * 4
    probes_since_open = int((time.monotonic() - faulted) / reset_s)
    assert redis_proxy.sent - sent_before <= probes_since_open * (4 * one_read + 4096)
    assert (_gauge(d, "tiered_memory_breaker_rejections_total", dependency="redis") or 0) >= 10

    if fault == "killed":
        private_redis.start()
    else:
        redis_proxy.heal()
    await asyncio.sleep(reset_s + 0.1)

    async def closed() -> bool:
        # A probe on the connection that hung times out once and replaces it; the next
        # probe, a reset period later, gets through.
        ctx = await d.get(f"/v1/sessions/{sid}/context")
        assert ctx["messages"][-1]["content"] == ZH_12_TURNS[4][1]
        return _gauge(d, "tiered_memory_breaker_state", dependency="redis") == 0

    await _eventually(closed, timeout_s=4 * reset_s)
    # Backfill put the session back: the recent list and the summary are in Redis again.
    with private_redis.client() as r:
        assert r.llen(f"{d.settings.redis_key_prefix}:{{{sid}}}:recent") > 0
    assert (await d.get(f"/v1/sessions/{sid}/summary"))["tier"] == "hot"
    stored = sql_rows(real_servers.mysql_url, "SELECT COUNT(*) FROM messages WHERE session_id=%s", sid)
    assert stored == [(10,)]


async def test_redis_slower_than_usual_but_within_timeout_still_answers_hot(
    real_servers: RealServers, redis_proxy: TcpProxy, make_daemon: MakeDaemon
) -> None:
    d = await make_daemon(_env(real_servers, REDIS_URL=f"redis://127.0.0.1:{redis_proxy.port}/0"))
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    redis_proxy.delay_s = 0.02
    assert (await d.get(f"/v1/sessions/{sid}/summary"))["tier"] == "hot"
    assert (await d.get(f"/v1/sessions/{sid}/context"))["summary_tier"] == "hot"
    assert _gauge(d, "tiered_memory_breaker_state", dependency="redis") == 0


async def test_redis_flushed_answers_warm_then_hot_again(
    real_servers: RealServers, private_redis: RedisProcess, make_daemon: MakeDaemon
) -> None:
    """A FLUSHALL (or a Redis restart without persistence) loses nothing: the next read answers
    from the warm row with the whole recent window from SQL, and refills Redis."""
    d = await make_daemon(_env(real_servers, REDIS_URL=private_redis.url))
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:4])
    await d.settle()
    with private_redis.client() as r:
        r.flushall()
    answer = await d.get(f"/v1/sessions/{sid}/summary")
    assert answer["tier"] == "warm"
    for evidence in ZH_EARLY_EVIDENCE:
        assert evidence in answer["summary"]
    assert (await d.get(f"/v1/sessions/{sid}/summary"))["tier"] == "hot"
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-1]["content"] == ZH_12_TURNS[3][1]
    assert ctx["turn_count"] == 4


# --- SQL --------------------------------------------------------------------------------


async def test_an_append_past_its_deadline_still_reaches_the_hot_tier(
    real_servers: RealServers, sql_url: str, sql_proxy: TcpProxy, make_daemon: MakeDaemon
) -> None:
    """A commit slower than REQUEST_TIMEOUT_MS: the request is answered 504, but the write runs
    whole, its hot half too; the next hot context shows the message instead of a hot list that
    stops short of SQL (what a write cut after its commit left)."""
    d = await make_daemon(
        _env(
            real_servers,
            DATABASE_URL=_via(sql_url, sql_proxy.port),
            SQL_TIMEOUT_MS="5000",
            REQUEST_TIMEOUT_MS="300",
        )
    )
    sid = new_sid()
    # The set-up turn as a gateway sends it: under a 300 ms deadline the first commits (a new
    # connection through the proxy) may take longer on a busy machine and answer 504, a write
    # that may have committed: retried with the same message_id until acknowledged.
    for role, text in zip(("user", "assistant"), ZH_12_TURNS[0], strict=True):
        body = {"role": role, "content": text, "message_id": f"setup-{role}"}
        for _ in range(20):
            resp = await d.http.post(f"/v1/sessions/{sid}/messages", json=body)
            if resp.status != 504:
                break
        assert resp.status in (200, 201), await resp.text()
    sql_proxy.delay_s = 0.6
    resp = await d.http.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "还在吗？"})
    assert resp.status == 504, await resp.text()
    sql_proxy.delay_s = 0.0
    for _ in range(100):
        ctx = await d.get(f"/v1/sessions/{sid}/context")
        if ctx["messages"][-1]["content"] == "还在吗？":
            break
        await asyncio.sleep(0.05)
    assert ctx["messages"][-1]["content"] == "还在吗？"
    assert await d.store.count_messages(sid) == 3


@pytest.mark.parametrize("fault", ["cut", "slow"])
async def test_sql_fault_refuses_writes_serves_hot_reads_and_loses_nothing(
    real_servers: RealServers, sql_url: str, sql_proxy: TcpProxy, fault: str, make_daemon: MakeDaemon
) -> None:
    """With SQL cut off or slower than SQL_TIMEOUT_MS: an append (or a turn) answers 503 with
    Retry-After and is not stored; reads answer from Redis (tier hot); /readyz says SQL is degraded. Afterwards
    the gateway's retry with the same message_id stores the message exactly once."""
    reset_s = 0.5
    d = await make_daemon(
        _env(
            real_servers,
            DATABASE_URL=_via(sql_url, sql_proxy.port),
            SQL_BREAKER_FAILURES="3",
            SQL_BREAKER_RESET_SECONDS=str(reset_s),
            # Bounds the slow proxy's statements; long enough that a commit the machine's load
            # stalls during the set-up is not yet a fault.
            SQL_TIMEOUT_MS="3000",
        )
    )
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    if fault == "cut":
        sql_proxy.cut()
    else:
        sql_proxy.delay_s = 3.5
    for attempt in range(4):
        # A plain append and a load-then-append turn alike.
        route = "messages" if attempt % 2 == 0 else "turns"
        resp = await d.http.post(
            f"/v1/sessions/{sid}/{route}", json={"role": "user", "content": "还在吗？", "message_id": "m-outage"}
        )
        assert resp.status == 503, (route, await resp.text())
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["code"] == "sql_unavailable"
    assert _gauge(d, "tiered_memory_breaker_state", dependency="sql") == 2

    summary = await d.get(f"/v1/sessions/{sid}/summary")
    assert summary["tier"] == "hot"
    assert summary["covered_turns"] == 3
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    assert ctx["summary_tier"] == "hot"
    assert ctx["messages"][-1]["content"] == ZH_12_TURNS[2][1]
    ready = await d.http.get("/readyz")
    assert ready.status == 503
    assert (await ready.json())["tiers"] == {"hot": "ok", "sql": "degraded"}

    sql_proxy.heal()
    await asyncio.sleep(reset_s + 0.1)

    async def retried() -> bool:
        resp = await d.http.post(f"/v1/sessions/{sid}/turns", json={"content": "还在吗？", "message_id": "m-outage"})
        return resp.status in (200, 201)

    await _eventually(retried, timeout_s=15)
    rows = sql_rows(
        sql_url,
        "SELECT COUNT(*) FROM messages WHERE session_id=%s AND message_id=%s",
        sid,
        "m-outage",
    )
    assert rows == [(1,)]
    assert sql_rows(sql_url, "SELECT COUNT(*) FROM messages WHERE session_id=%s", sid) == [(7,)]
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-1]["content"] == "还在吗？"
    assert (await d.http.get("/readyz")).status == 200


async def test_summary_lost_to_an_sql_outage_is_retried(
    real_servers: RealServers, sql_url: str, sql_proxy: TcpProxy, fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """A summarization whose SQL write fails is not dropped: the sweeper finds the session due
    again once SQL is back, and the summary gets written."""
    fake_llm.behaviour.delay_s = 1.0
    d = await make_daemon(
        _env(
            real_servers,
            DATABASE_URL=_via(sql_url, sql_proxy.port),
            LLM_BASE_URL=fake_llm.url,
            SUMMARY_MODEL="fake",
            SUMMARY_FORMAT="text",
            SWEEP_INTERVAL_SECONDS="0.5",
            SQL_BREAKER_RESET_SECONDS="0.5",
        )
    )
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])

    async def llm_called() -> bool:
        return fake_llm.in_flight == 1

    await _eventually(llm_called)
    sql_proxy.cut()

    async def failed() -> bool:
        return (_gauge(d, "tiered_memory_summarizations_total", source="llm", outcome="failed") or 0) >= 1

    await _eventually(failed)
    query = "SELECT covered_turns FROM conversation_summaries WHERE session_id=%s"
    # The failed pass wrote nothing: what SQL holds after healing is the retry's.
    assert sql_rows(sql_url, query, sid) == []
    sql_proxy.heal()

    async def written() -> bool:
        return sql_rows(sql_url, query, sid) == [(3,)]

    await _eventually(written)
    await d.settle()  # the pass that wrote SQL also caches it in Redis, right after
    answer = await d.get(f"/v1/sessions/{sid}/summary")
    assert (answer["tier"], answer["covered_turns"], answer["source"]) == ("hot", 3, "llm")


# --- LLM --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["status", "malformed", "timeout"])
async def test_llm_breaker_stops_calling_a_failing_llm(
    backend_env: dict[str, str], fake_llm: FakeLlm, mode: str, make_daemon: MakeDaemon
) -> None:
    """An LLM answering 500s, garbage, or nothing in time is called LLM_BREAKER_FAILURES times,
    then not at all while the breaker is open; every summary meanwhile is deterministic and
    still holds what was said."""
    if mode == "timeout":
        fake_llm.behaviour.delay_s = 2.0
    else:
        fake_llm.behaviour.mode = mode
    d = await make_daemon(
        llm_env(
            backend_env, fake_llm, LLM_TIMEOUT_SECONDS="0.3", LLM_BREAKER_FAILURES="2", LLM_BREAKER_RESET_SECONDS="600"
        ),
        quiet=fake_llm,
    )
    sid = new_sid()
    for start in range(0, 12, 3):
        await play(d, sid, ZH_12_TURNS[start : start + 3])
        await d.settle()
    assert len(fake_llm.requests) == 2
    assert _gauge(d, "tiered_memory_breaker_state", dependency="llm") == 2
    assert _gauge(d, "tiered_memory_llm_failures_total", reason="circuit_open") == 2
    slices = (await d.get(f"/v1/sessions/{sid}/slices"))["slices"]
    assert [s["source"] for s in slices] == ["deterministic"] * 4
    answer = await d.get(f"/v1/sessions/{sid}/summary")
    assert answer["covered_turns"] == 12
    for evidence in ZH_EARLY_EVIDENCE:
        assert evidence in answer["summary"]


async def test_llm_breaker_probes_and_recovers(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    fake_llm.behaviour.mode = "status"
    d = await make_daemon(
        llm_env(backend_env, fake_llm, SUMMARY_FORMAT="text", LLM_BREAKER_FAILURES="1", LLM_BREAKER_RESET_SECONDS="0.5")
    )
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    assert _gauge(d, "tiered_memory_breaker_state", dependency="llm") == 2
    fake_llm.behaviour.mode = "ok"
    await asyncio.sleep(0.6)
    await play(d, sid, ZH_12_TURNS[3:6])
    await d.settle()
    slices = (await d.get(f"/v1/sessions/{sid}/slices"))["slices"]
    assert [s["source"] for s in slices] == ["deterministic", "llm"]
    assert _gauge(d, "tiered_memory_breaker_state", dependency="llm") == 0


async def test_no_utterance_request_waits_on_a_slow_llm(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """With a summary call outstanding for seconds, appends, context and summary reads of the
    same session are answered meanwhile (the LLM call is still in flight when they return)."""
    fake_llm.behaviour.delay_s = 3.0
    d = await make_daemon(llm_env(backend_env, fake_llm, LLM_TIMEOUT_SECONDS="10"))
    sid = new_sid()
    replies = await play(d, sid, ZH_12_TURNS[:3])
    assert replies[-1]["summary_scheduled"] is True

    async def llm_called() -> bool:
        return fake_llm.in_flight == 1

    await _eventually(llm_called)
    await play(d, sid, ZH_12_TURNS[3:4])
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-1]["content"] == ZH_12_TURNS[3][1]
    resp = await d.http.post(f"/v1/sessions/{sid}/turns", json={"content": "好的"})
    assert resp.status == 201
    await d.get(f"/v1/sessions/{sid}/summary")
    assert fake_llm.in_flight == 1
    await d.settle()


async def test_close_never_waits_on_the_llm(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """With an LLM that takes seconds: a close merges the uncovered turns without calling it
    (persisted at once, the last slice deterministic); a close while a background pass waits on
    it answers at once with what SQL has and leaves the final pass to the background, which then
    covers every turn; the close after that reports it persisted."""
    fake_llm.behaviour.delay_s = 3.0
    d = await make_daemon(llm_env(backend_env, fake_llm, SUMMARY_FORMAT="text", LLM_TIMEOUT_SECONDS="10"))
    quiet = new_sid()
    await play(d, quiet, _marked(quiet, ZH_12_TURNS[:2]))  # below the cadence: no background pass
    resp = await d.http.post(f"/v1/sessions/{quiet}/close")
    assert resp.status == 200
    assert (await resp.json())["persisted"] is True
    assert _calls_for(fake_llm, quiet) == 0
    slices = (await d.get(f"/v1/sessions/{quiet}/slices"))["slices"]
    assert [(s["to_turn"], s["source"]) for s in slices] == [(2, "deterministic")]

    busy = new_sid()
    await play(d, busy, _marked(busy, ZH_12_TURNS[:3]))

    async def llm_called() -> bool:
        return fake_llm.in_flight_by_marker.get(busy) == 1

    await _eventually(llm_called)
    await play(d, busy, _marked(busy, ZH_12_TURNS[3:4]))
    resp = await d.http.post(f"/v1/sessions/{busy}/close")
    assert resp.status == 200
    assert ((await resp.json())["persisted"], fake_llm.in_flight_by_marker[busy]) == (False, 1)
    await d.settle()
    summary = await d.get(f"/v1/sessions/{busy}/summary")
    assert (summary["covered_turns"], summary["source"]) == (4, "llm")
    resp = await d.http.post(f"/v1/sessions/{busy}/close")
    assert (await resp.json())["persisted"] is True
    assert (await d.get(f"/v1/sessions/{busy}"))["closed"] is True


async def test_an_idle_close_still_asks_the_llm(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """The sweeper's idle close has nobody waiting on it: the last turns are summarized LLM first."""
    d = await make_daemon(
        llm_env(
            backend_env, fake_llm, SUMMARY_FORMAT="text", SESSION_IDLE_CLOSE_SECONDS="1", SWEEP_INTERVAL_SECONDS="0.2"
        )
    )
    sid = new_sid()
    await play(d, sid, _marked(sid, ZH_12_TURNS[:2]))  # below the cadence: only the close summarizes

    async def closed() -> bool:
        return bool((await d.get(f"/v1/sessions/{sid}"))["closed"])

    await _eventually(closed, timeout_s=15)
    slices = (await d.get(f"/v1/sessions/{sid}/slices"))["slices"]
    # (On a slow machine the sweeper may also have closed it after the first turn, before
    # the second reopened it: then that close summarized turn 1, with the LLM as well.)
    assert slices[-1]["to_turn"] == 2
    assert {s["source"] for s in slices} == {"llm"}
    assert _calls_for(fake_llm, sid) == len(slices)
