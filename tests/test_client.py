"""tiered_memory.client against a running daemon (embedded and real Redis + MariaDB): every route,
typed answers, bearer tokens, the error tree, and retries that store a message exactly once."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, TextWorkers, base_url, llm_env, new_sid
from tests.helpers.faults import TcpProxy, proxied
from tests.helpers.servers import RealServers, sql_rows
from tiered_memory.client import (
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    RebuildOutcome,
    RebuildResult,
    Timeout,
    Unauthorized,
    Unavailable,
)
from tiered_memory.client._transport import Transport
from tiered_memory.prompt.kb_snippets import LABELS
from tiered_memory.testing import ZH_12_TURNS, Behaviour, FakeLlm, free_port

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "client-test-token-0123456789"
ACME = "acme-client-token-0123456789"
DURATION = "tiered_memory_request_duration_seconds_count"


def requests_seen(d: Daemon, route: str, method: str, status: int) -> float:
    """How many requests the daemon answered on `route` with `status` (its own histogram)."""
    labels = {"route": route, "method": method, "status": str(status)}
    return d.registry.get_sample_value(DURATION, labels) or 0.0


def routes_seen(d: Daemon) -> set[tuple[str, str]]:
    return {
        (s.labels["method"], s.labels["route"])
        for metric in d.registry.collect()
        for s in metric.samples
        if s.name == DURATION
    }


@pytest.fixture
async def authed(backend_env: dict[str, str], make_daemon: MakeDaemon) -> Daemon:
    return await make_daemon(backend_env | {"API_TOKENS": f"{TOKEN},acme:{ACME}", "SUMMARY_EVERY_N_TURNS": "3"})


async def test_every_route_through_the_async_client(authed: Daemon) -> None:
    """A gateway's whole life cycle of a session through AsyncClient with a bearer token: each
    answer typed and consistent with what the daemon stored, and every route of the OpenAPI
    document reached. The session id uses every punctuation mark a session id may hold."""
    sid = new_sid() + ":call_1.a-b"
    async with AsyncClient(base_url(authed), token=TOKEN) as mem:
        assert await mem.healthz() is True
        ready = await mem.readyz()
        assert (ready.ready, ready.tiers) == (True, {"hot": "ok", "sql": "ok"})
        for n, (user, assistant) in enumerate(ZH_12_TURNS[:6], start=1):
            turn = await mem.turn(sid, user, user_id="u-1", system_prompt="你是健康顾问。", max_chars=2000)
            assert (turn.created, turn.turn_count, turn.context.turn_count) == (True, n - 1, n - 1)
            assert turn.context.messages[-1].content == user
            assert turn.context.messages[0].role == "system"
            reply = await mem.append(sid, "assistant", assistant, user_id="u-1")
            assert (reply.created, reply.turn_count, reply.summary_scheduled) == (True, n, n % 3 == 0)
        await authed.settle()
        summary = await mem.summary(sid, user_id="u-1")
        assert summary.tier in ("hot", "warm")
        assert (summary.covered_turns, summary.lag_turns) == (6, 0)
        ctx = await mem.context(sid, max_chars=3000, question="还记得吗？")
        assert (ctx.turn_count, ctx.messages[-1].content) == (6, "还记得吗？")
        info = await mem.session(sid)
        assert (info.user_id, info.turn_count, info.message_count, info.closed) == ("u-1", 6, 12, False)
        stored = await mem.messages(sid, from_seq=3, to_seq=4)
        assert [(m.seq, m.role) for m in stored] == [(3, "user"), (4, "assistant")]
        everything = [m async for m in mem.iter_messages(sid)]
        assert [m.content for m in everything[::2]] == [u for u, _ in ZH_12_TURNS[:6]]
        slices = await mem.slices(sid)
        assert [(s.from_turn, s.to_turn) for s in slices] == [(1, 3), (4, 6)]
        found = await mem.recall(sid, "活力健", k=2)
        assert 0 < len(found) <= 2
        assert all(any("活力健" in m.content for m in match.messages) for match in found)
        assert found[0].slice is not None
        rebuilt = await mem.rebuild_summary(sid)
        assert (rebuilt.covered_turns, rebuilt.version) == (6, summary.version + 1)
        assert [(s.from_turn, s.to_turn, s.summary_version) for s in rebuilt.slices] == [(1, 6, rebuilt.version)]
        assert rebuilt.summary == (await mem.summary(sid)).summary
        assert rebuilt.job_id is not None
        job = await mem.rebuild_job(sid, rebuilt.job_id)
        assert (job.state, job.started, job.result) == ("done", None, rebuilt_outcome(rebuilt, sid))
        again = await mem.start_rebuild(sid)
        assert (again.started, again.state, again.error) == (True, "queued", None)
        assert again.job_id != rebuilt.job_id
        while not again.ended:
            again = await mem.rebuild_job(sid, again.job_id)
        mine = await mem.user_summaries("u-1", limit=5)
        assert [s.session_id for s in mine] == [sid]
        await mem.delete_summary(sid)
        # With no summary covering it, the first message can be corrected (before a read: a cold
        # read of a session whose summary is due schedules it again).
        first = everything[0]
        patched = await mem.patch_message(sid, first.message_id, content=first.content + "（更正）")
        assert (patched.changed, patched.message.seq, patched.turn_count) == (True, 1, 6)
        assert (await mem.summary(sid)).tier == "cold"
        imported = await mem.append_batch(
            sid + "-old", [{"role": "user", "content": "旧的问题"}, {"role": "assistant", "content": "旧的回答"}]
        )
        assert (imported.created, imported.turn_count, [m.seq for m in imported.messages]) == (True, 1, [1, 2])
        # The newest message taken back (no summary covers its turn): its turn is open again; a repeat is safe.
        assert await mem.delete_message(sid + "-old", imported.messages[-1].message_id) is True
        assert await mem.delete_message(sid + "-old", imported.messages[-1].message_id) is False
        taken_back = await mem.session(sid + "-old")
        assert (taken_back.turn_count, taken_back.message_count) == (0, 1)
        stored_state = await mem.put_state(sid, {"kb_topic": "活力健"}, if_match=0)
        assert stored_state.version == 1
        assert await mem.state(sid) == stored_state
        assert ((await mem.context(sid)).state, (await mem.context(sid)).state_version) == ({"kb_topic": "活力健"}, 1)
        with pytest.raises(Conflict) as stale:
            await mem.put_state(sid, {"kb_topic": "别的"}, if_match=0)
        assert (stale.value.status, stale.value.code) == (412, "precondition_failed")
        closed = await mem.close(sid, attempt_timeout=60)
        assert (closed.persisted, closed.turn_count) == (True, 6)
        assert (await mem.session(sid)).closed
        # The user's next session, carrying this one over; the user's profile and sessions.
        later = await mem.turn(sid + "-2", "上次说的剂量是多少？", user_id="u-1", user_memory="last_session")
        assert later.context.user_memory is not None
        assert (later.context.user_memory.mode, later.context.user_memory.session_id) == ("last_session", sid)
        assert (await mem.context(sid + "-2", user_memory="off")).user_memory is None
        profile = await mem.profile("u-1")
        assert profile.sessions >= 1
        assert "活力健" in profile.text["zh"]
        assert profile.topics
        assert all(t.topic and t.count >= 1 and t.text is None for t in profile.topics)
        assert [s.session_id async for s in mem.user_sessions("u-1")][:2] == [sid + "-2", sid]
        assert "tiered_memory_summary_loads_total" in await mem.metrics_text()
        document = await mem.openapi()
        await mem.delete(sid)
        with pytest.raises(NotFound):
            await mem.session(sid)
        erased = await mem.erase_user("u-1")
        assert (erased.state, erased.sessions >= 1) == ("finished", True)
        assert (await mem.erasure("u-1")).state == "finished"
        with pytest.raises(NotFound):
            await mem.profile("u-1")
    # The inspector's routes (tagged `inspector`) serve an operator's browser, not a gateway:
    # test_inspect.py and test_ui.py reach them.
    documented = {
        (m.upper(), p)
        for p, ops in document["paths"].items()
        for m, op in ops.items()
        if "inspector" not in op.get("tags", [])
    }
    assert documented <= routes_seen(authed), documented - routes_seen(authed)


def rebuilt_outcome(rebuilt: RebuildResult, sid: str) -> RebuildOutcome:
    """What the done job of `rebuilt` says it made."""
    return RebuildOutcome(
        version=rebuilt.version,
        covered_turns=rebuilt.covered_turns,
        source=rebuilt.source,
        slice_count=len(rebuilt.slices),
        slices_url=f"/v1/sessions/{sid}/slices",
    )


async def test_rebuild_summary_waits_for_its_job(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """rebuild_summary starts the job and polls it: past `wait_timeout` it raises Timeout while the
    job goes on (start_rebuild then answers that job); a job that fails raises by its code (one
    overtaken by another writer: Conflict); one that is done returns the summary and every slice."""
    env = llm_env(backend_env, fake_llm, SUMMARY_FORMAT="text")
    d = await make_daemon(env, quiet=fake_llm)
    sid = new_sid()
    for user, assistant in ZH_12_TURNS[:4]:
        await d.post(sid, "user", user)
        await d.post(sid, "assistant", assistant)
    await d.settle()
    fake_llm.behaviour = Behaviour(delay_s=2.0)
    try:
        async with AsyncClient(base_url(d)) as mem:
            with pytest.raises(Timeout):
                await mem.rebuild_summary(sid, wait_timeout=0.3, poll_interval=0.1)
            going = await mem.start_rebuild(sid)
            assert (going.started, going.ended) == (False, False)
            prev, info = await d.store.get_summary(sid)
            assert prev is not None
            assert info is not None
            newer = dataclasses.replace(prev, version=prev.version + 1)
            assert await d.store.put_summary(sid, newer, user_id=None, turn_count=info.turn_count)
            with pytest.raises(Conflict) as overtaken:
                await mem.rebuild_summary(sid, poll_interval=0.1)
            assert overtaken.value.code == "conflict"
            assert going.job_id in overtaken.value.message
            failed = await mem.rebuild_job(sid, going.job_id)
            assert (failed.state, failed.result, failed.error and failed.error["code"]) == ("failed", None, "conflict")
            fake_llm.behaviour = Behaviour(text="用户咨询活力健。")
            rebuilt = await mem.rebuild_summary(sid, poll_interval=0.1)
            assert (rebuilt.version, rebuilt.covered_turns, rebuilt.source) == (prev.version + 2, 4, "llm")
            assert rebuilt.summary == "用户咨询活力健。"
            assert [(s.from_turn, s.to_turn) for s in rebuilt.slices] == [(1, 4)]
            with pytest.raises(NotFound):
                await mem.rebuild_summary(new_sid())
    finally:
        fake_llm.behaviour = Behaviour()


async def test_errors_carry_the_servers_message_and_are_not_retried(authed: Daemon) -> None:
    """Each 4xx becomes its own exception with the daemon's code and message, after one attempt."""
    sid = new_sid()
    route = "/v1/sessions/{session_id}/messages"
    async with AsyncClient(base_url(authed), token=ACME, retries=3) as mem:
        with pytest.raises(InvalidRequest) as bad:
            await mem.append(sid, "robot", "你好")
        assert (bad.value.status, bad.value.code) == (400, "invalid_input")
        assert "role" in bad.value.message
        assert requests_seen(authed, route, "POST", 400) == 1
        await mem.append(sid, "user", "你好", message_id="m-1", user_id="u-1")
        with pytest.raises(Conflict) as conflict:
            await mem.append(sid, "user", "别的内容", message_id="m-1")
        assert "m-1" in conflict.value.message
        with pytest.raises(Forbidden):
            await mem.context(sid, user_id="u-2")
        with pytest.raises(NotFound):
            await mem.slices(new_sid())
    async with AsyncClient(base_url(authed), token="not-a-configured-token-000") as stranger:
        with pytest.raises(Unauthorized):
            await stranger.summary(sid)
    async with AsyncClient(base_url(authed), token=TOKEN, headers={"X-Tenant": "acme"}) as admin:
        with pytest.raises(Forbidden):
            # An unrestricted token in acme's namespace stating a user other than the owner is
            # refused too.
            await admin.append(sid, "user", "x", user_id="u-9")
    assert requests_seen(authed, route, "POST", 403) == 1
    assert requests_seen(authed, route, "POST", 409) == 1


async def test_a_retry_after_a_cut_connection_stores_the_message_once(daemon: Daemon) -> None:
    """The first attempt reaches the daemon and is committed, but its answer is cut on the way
    back: the client retries with the same generated message_id, gets the original result (200,
    created False) and the message is stored exactly once."""
    target = urlparse(base_url(daemon))
    sid = new_sid()
    with proxied(target.hostname or "127.0.0.1", target.port or 80) as proxy:
        async with AsyncClient(f"http://127.0.0.1:{proxy.port}", retries=3, backoff=0.05) as mem:
            await mem.append(sid, "user", "第一句")
            # Every chunk now waits in the proxy: the request reaches the daemon, and its answer
            # is still held when the connection is cut.
            proxy.delay_s = 1.0
            sent = asyncio.create_task(mem.append(sid, "assistant", "回答"))
            for _ in range(1000):
                if await daemon.store.count_messages(sid) == 2:
                    break
                await asyncio.sleep(0.01)
            assert await daemon.store.count_messages(sid) == 2, "the first attempt never reached SQL"
            assert not sent.done()
            proxy.cut()
            proxy.heal()
            result = await asyncio.wait_for(sent, timeout=60)
    assert (result.created, result.turn_count) == (False, 1)
    assert await daemon.store.count_messages(sid) == 2
    stored = await daemon.store.messages_by_seq(sid, first_seq=1, last_seq=10, limit=10)
    assert [(m.content, m.message_id) for m in stored][1] == ("回答", result.message_id)
    # The retry reached the daemon once and was recognised: one 200 (the original answer).
    assert requests_seen(daemon, "/v1/sessions/{session_id}/messages", "POST", 200) == 1


@pytest.mark.real
async def test_a_503_is_retried_after_its_retry_after(real_servers: RealServers, text_workers: TextWorkers) -> None:
    """With SQL cut the daemon answers 503 with Retry-After: 1; the client waits that long and
    retries; SQL is back by then, and the message is stored once. Without SQL for good, the
    client gives up with Unavailable(status=503)."""
    mysql = urlparse(real_servers.mysql_url)
    with proxied(mysql.hostname or "127.0.0.1", mysql.port or 3306) as sql:
        userinfo = mysql.netloc.rpartition("@")[0]
        env = {
            "DATABASE_URL": mysql._replace(netloc=f"{userinfo}@127.0.0.1:{sql.port}").geturl(),
            "REDIS_URL": real_servers.redis_url,
            "REDIS_KEY_PREFIX": f"tmt{real_servers.run_id}{new_sid()[2:8]}",
            "AUTO_MIGRATE": "true",
            "SWEEP_INTERVAL_SECONDS": "3600",
            # The cut fails statements at once; the bound only has to outlast a loaded machine's
            # slow commit (CI's MariaDB has stalled one for 3.8 s).
            "SQL_TIMEOUT_MS": "15000",
            "SQL_BREAKER_RESET_SECONDS": "0.5",
        }
        d = Daemon(env, text_workers)
        await d.start()
        try:
            sid = new_sid()
            route = "/v1/sessions/{session_id}/messages"
            async with AsyncClient(base_url(d), retries=2, backoff=0.01, max_backoff=5) as mem:
                sql.cut()
                sent = asyncio.create_task(mem.append(sid, "user", "你好"))
                for _ in range(2000):
                    if requests_seen(d, route, "POST", 503) >= 1:
                        break
                    await asyncio.sleep(0.005)
                assert requests_seen(d, route, "POST", 503) >= 1
                sql.heal()
                result = await asyncio.wait_for(sent, timeout=60)
                assert result.created
                rows = sql_rows(real_servers.mysql_url, "SELECT COUNT(*) FROM messages WHERE session_id=%s", sid)
                assert rows == [(1,)]
                sql.cut()
                started = time.monotonic()
                with pytest.raises(Unavailable) as gave_up:
                    await mem.append(sid, "user", "再说一句")
                assert (gave_up.value.status, gave_up.value.retry_after) == (503, 1.0)
                # Two retries, each after the 503's Retry-After of 1 s (the backoff alone would
                # have waited at most 0.01 and 0.02 s).
                assert time.monotonic() - started >= 2.0
        finally:
            sql.heal()
            await d.stop()


async def test_the_retry_delay_honours_retry_after_within_the_bound() -> None:
    """The wait before a retry: jittered within the doubling backoff, at least a 503's
    Retry-After, and never past max_backoff."""
    transport = Transport(
        "http://127.0.0.1:1",
        token=None,
        timeout=1.0,
        retries=2,
        backoff=0.1,
        max_backoff=5.0,
        session=None,
        headers=None,
    )
    for attempt in range(4):
        assert 0 <= transport.delay(attempt, None) <= 0.1 * 2**attempt
        assert 1.0 <= transport.delay(attempt, 1.0) <= 5.0
        assert transport.delay(attempt, 30.0) == 5.0
    assert transport.delay(10, None) <= 5.0


async def test_unreachable_and_hung_daemons() -> None:
    """Connection refused is retried, then Unavailable without a status; a daemon that accepts
    and never answers is a Timeout after one attempt (it may still be working on the request)."""
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", retries=2, backoff=0.01) as mem:
        with pytest.raises(Unavailable) as refused:
            await mem.summary("s-1")
        assert refused.value.status is None
    proxy = TcpProxy("127.0.0.1", free_port()).start()
    try:
        proxy.blackhole()
        async with AsyncClient(f"http://127.0.0.1:{proxy.port}", timeout=0.5, retries=3) as mem:
            with pytest.raises(Timeout):
                await mem.append("s-1", "user", "你好")
        assert proxy.accepted == 1
    finally:
        proxy.stop()


async def test_the_blocking_client_from_several_threads(daemon: Daemon) -> None:
    """Client (blocking) serves calls from several threads at once on its own loop; its answers
    are AsyncClient's."""
    sid = new_sid()
    url = base_url(daemon)

    def gateway() -> list[int]:
        counts: list[int] = []
        with Client(url) as mem:

            def utterances(worker: int) -> None:
                for i in range(5):
                    mem.append(f"{sid}-{worker}", "user", f"问题{i}")
                    counts.append(mem.append(f"{sid}-{worker}", "assistant", f"回答{i}").turn_count)

            threads = [threading.Thread(target=utterances, args=(w,)) for w in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            turn = mem.turn(f"{sid}-0", "还有呢？")
            assert (turn.turn_count, turn.context.turn_count, turn.created) == (5, 5, True)
            assert [m.seq for m in mem.iter_messages(f"{sid}-0")] == list(range(1, 12))
            assert mem.close_session(f"{sid}-1").turn_count == 5
            rebuilt = mem.rebuild_summary(f"{sid}-2", poll_interval=0.1)
            assert (rebuilt.covered_turns, len(rebuilt.slices)) == (5, 1)
            job = mem.start_rebuild(f"{sid}-2")
            assert mem.rebuild_job(f"{sid}-2", job.job_id).job_id == job.job_id
            with pytest.raises(NotFound):
                mem.session(new_sid())
        with pytest.raises(RuntimeError):
            mem.healthz()
        return counts

    counts = await asyncio.to_thread(gateway)
    assert sorted(counts) == sorted([1, 2, 3, 4, 5] * 3)


async def test_a_reply_with_its_reasoning_through_both_clients(daemon: Daemon) -> None:
    """append sends a reply's reasoning, a batch item may carry it too, and the stored messages
    come back with it (None on a message without); the context has none of it."""
    sid = new_sid()
    async with AsyncClient(base_url(daemon)) as mem:
        await mem.append(sid, "user", "Is 91 prime?")
        await mem.append(sid, "assistant", "No: 7 x 13.", thinking_content="Try 7: 7 x 13 = 91.", thinking_duration=4)
        batch: list[dict[str, Any]] = [
            {"role": "user", "content": "And 97?"},
            {"role": "assistant", "content": "Prime.", "thinking_duration": 9},
        ]
        await mem.append_batch(sid, batch)
        stored = await mem.messages(sid)
        assert [(m.thinking_content, m.thinking_duration) for m in stored] == [
            (None, None),
            ("Try 7: 7 x 13 = 91.", 4),
            (None, None),
            (None, 9),
        ]
        assert "7 x 13 = 91" not in str(await mem.context(sid))

    def blocking() -> tuple[str | None, int | None]:
        with Client(base_url(daemon)) as mem:
            mem.append(sid, "user", "And 91 again?")
            mem.append(sid, "assistant", "Still 7 x 13.", thinking_content="Same as before.", thinking_duration=1)
            last = mem.messages(sid)[-1]
            return last.thinking_content, last.thinking_duration

    assert await asyncio.to_thread(blocking) == ("Same as before.", 1)


async def test_both_clients_send_kb_snippets(daemon: Daemon) -> None:
    """`kb_snippets` on `context` (repeated query parameters, in order) and on `turn` (the body),
    in the async and the blocking client: the messages show them and `kb_snippets_used` counts
    them; without any it is None."""
    sid = new_sid()
    snippets = ["第一条：活力健每日两次。", "第二条：饭后服用 & 多喝水?"]
    async with AsyncClient(base_url(daemon)) as mem:
        turn = await mem.turn(sid, "怎么吃？", kb_snippets=snippets)
        assert turn.context.kb_snippets_used == 2
        assert turn.context.messages[0].content == "\n".join(
            ["<reference>", LABELS["zh"], f"[1] {snippets[0]}", f"[2] {snippets[1]}", "</reference>", "怎么吃？"]
        )
        await mem.append(sid, "assistant", "每日两次。")
        ctx = await mem.context(sid, kb_snippets=snippets[::-1])
        assert ctx.kb_snippets_used == 2
        assert f"[1] {snippets[1]}\n[2] {snippets[0]}" in (ctx.messages[0].content or "")
        assert (await mem.context(sid)).kb_snippets_used is None

    def blocking() -> None:
        with Client(base_url(daemon)) as mem:
            ctx = mem.context(sid, kb_snippets=snippets[:1], question="还有吗？")
            assert ctx.kb_snippets_used == 1
            assert (ctx.messages[-1].content or "").endswith("还有吗？")
            turn = mem.turn(sid, "还有吗？", kb_snippets=snippets[1:])
            assert turn.context.kb_snippets_used == 1
            assert snippets[1] in (turn.context.messages[0].content or "")

    await asyncio.to_thread(blocking)


def test_the_client_imports_with_aiohttp_alone(tmp_path: Path) -> None:
    """A gateway installs the package for the client only: importing and using tiered_memory.client
    pulls in none of the daemon's dependencies (Redis, SQLAlchemy, pydantic, structlog, ...)."""
    script = textwrap.dedent(
        """
        import importlib.abc, sys
        BLOCKED = ("redis", "sqlalchemy", "aiomysql", "aiosqlite", "pydantic", "pydantic_settings",
                   "structlog", "prometheus_client", "jieba")
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked: {name}")
                return None
        sys.meta_path.insert(0, Block())
        import tiered_memory.client as c
        with c.Client("http://127.0.0.1:1", retries=0) as mem:
            try:
                mem.healthz()
            except c.Unavailable:
                print("ok")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False, env=os.environ.copy()
    )
    assert proc.stdout.strip() == "ok", proc.stderr
