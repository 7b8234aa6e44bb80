"""The daemon as real processes on real Redis and MariaDB: killed with SIGKILL mid-work, stopped
with SIGTERM while summarizing, and run twice side by side on the same stores.

Each gateway here is what a real one is: sequential within its conversation, a client-chosen
message_id on every message, and a retry of whatever was not acknowledged. The checks read SQL
directly: the stored messages of a session, in seq order, must be exactly the acknowledged ones.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from tests.helpers.daemon import new_sid
from tests.helpers.gateway import Gateway, covered_turns, crash_env, stored_ids, turn_count
from tests.helpers.servers import RealServers, sql_rows
from tiered_memory.testing import DaemonProcess, FakeLlm, processes

pytestmark = [pytest.mark.real, pytest.mark.slow]


async def _until(check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


def _cleanup(real_servers: RealServers, prefix: str) -> None:
    r = redis.Redis.from_url(real_servers.redis_url)
    try:
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
    finally:
        r.close()


async def test_sigkill_mid_work_loses_nothing_and_stores_nothing_twice(
    real_servers: RealServers, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    """SIGKILL while appends and summarizations are in flight. After a restart and the gateways'
    retries, every session's stored messages are exactly its acknowledged ones, in order; every
    due summary gets done; and the hot tier serves each session's true last message."""
    fake_llm.behaviour.delay_s = 0.4
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    daemon = DaemonProcess(crash_env(real_servers, prefix, fake_llm), tmp_path / "daemon.log")
    gateways = [Gateway(new_sid()) for _ in range(8)]

    async def converse(g: Gateway, http: aiohttp.ClientSession, first_turn: int, last_turn: int) -> None:
        for turn in range(first_turn, last_turn + 1):
            for role in ("user", "assistant"):
                if not await g.send(http, daemon.url, g.message(turn, role)):
                    return  # the daemon is gone; the retry comes after the restart

    try:
        async with processes(daemon), aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            tasks = [asyncio.create_task(converse(g, http, 1, 40)) for g in gateways]
            await _until(lambda: fake_llm.in_flight >= 1 and sum(len(g.acked) for g in gateways) >= 60)
            daemon.kill()
            await asyncio.gather(*tasks)
            acked_before_kill = sum(len(g.acked) for g in gateways)

            await daemon.start()
            for g in gateways:
                if g.pending is not None:
                    assert await g.send(http, daemon.url, g.pending)
            # Each conversation goes on from where it stopped, a few turns more.
            for g in gateways:
                last = g.acked[-1]
                turn, role = int(last.split("-")[-2]), last.split("-")[-1]
                if role == "user":
                    assert await g.send(http, daemon.url, g.message(turn, "assistant"))
                await converse(g, http, turn + 1, turn + 2)

            for g in gateways:
                assert stored_ids(real_servers, g.sid) == g.acked, g.sid
            assert sum(len(g.acked) for g in gateways) > acked_before_kill
            for g in gateways:
                turns = turn_count(real_servers, g.sid)
                await _until(lambda g=g, turns=turns: covered_turns(real_servers, g.sid) >= turns - turns % 3)
                async with http.get(f"{daemon.url}/v1/sessions/{g.sid}/context") as resp:
                    ctx = await resp.json()
                assert ctx["messages"][-1]["content"] == g.message(turns, "assistant")[2]
    finally:
        _cleanup(real_servers, prefix)


async def _sigterm_while_summarizing(
    daemon: DaemonProcess, g: Gateway, http: aiohttp.ClientSession, llm: FakeLlm
) -> tuple[int, float]:
    """Three turns (a summary is due), then SIGTERM while its LLM call is in flight: the exit
    status and how long the exit took."""
    for turn in range(1, 4):
        for role in ("user", "assistant"):
            assert await g.send(http, daemon.url, g.message(turn, role))
    await _until(lambda: llm.in_flight == 1)
    started = time.monotonic()
    code = await daemon.shutdown()
    return code, time.monotonic() - started


async def test_sigterm_drains_a_running_summary_within_the_grace(
    real_servers: RealServers, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    """SIGTERM while a summary waits on the LLM: the summary finishes and is stored, then the
    process exits 0, within SHUTDOWN_GRACE_SECONDS."""
    fake_llm.behaviour.delay_s = 2.0
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    daemon = DaemonProcess(
        crash_env(real_servers, prefix, fake_llm, SHUTDOWN_GRACE_SECONDS="10", SWEEP_INTERVAL_SECONDS="3600"),
        tmp_path / "daemon.log",
    )
    g = Gateway(new_sid())
    try:
        async with processes(daemon), aiohttp.ClientSession() as http:
            code, elapsed = await _sigterm_while_summarizing(daemon, g, http, fake_llm)
        assert code == 0
        assert elapsed < 10
        assert covered_turns(real_servers, g.sid) == 3
        assert fake_llm.completed == 1
    finally:
        _cleanup(real_servers, prefix)


async def test_sigterm_past_the_grace_cancels_and_the_restart_finishes_it(
    real_servers: RealServers, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    """With the LLM slower than the grace, SIGTERM cancels the summary instead of waiting for it,
    and the next start-up's sweep does it."""
    fake_llm.behaviour.delay_s = 12.0
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    env = crash_env(real_servers, prefix, fake_llm, SHUTDOWN_GRACE_SECONDS="1", LLM_TIMEOUT_SECONDS="60")
    log_path = tmp_path / "daemon.log"
    daemon = DaemonProcess(env, log_path)
    g = Gateway(new_sid())
    try:
        async with processes(daemon), aiohttp.ClientSession() as http:
            code, elapsed = await _sigterm_while_summarizing(daemon, g, http, fake_llm)
            assert code == 0
            # The HTTP shutdown and the summary drain, each at most the 1 s grace, plus the
            # process's own start of shutdown and exit: never the LLM's 12 s.
            assert elapsed < 2 * 1 + 4
            assert covered_turns(real_servers, g.sid) == 0
            log_events = [json.loads(line)["event"] for line in log_path.read_text().splitlines() if line[:1] == "{"]
            assert "summaries_cancelled_at_shutdown" in log_events

            fake_llm.behaviour.delay_s = 0.0
            await daemon.start()
            await _until(lambda: covered_turns(real_servers, g.sid) == 3)
    finally:
        _cleanup(real_servers, prefix)


async def _settled(
    http: aiohttp.ClientSession, daemons: Sequence[DaemonProcess], llm: FakeLlm, sids: Sequence[str]
) -> None:
    """Until every session in `sids` has had an LLM call, none is in flight, and no summary is
    pending in `daemons` (30 s at most: then the assertions after it say what is missing)."""
    gauge = "tiered_memory_pending_summarizations "
    for _ in range(150):
        pending = 0.0
        for d in daemons:
            async with http.get(f"{d.url}/metrics") as resp:
                lines = (await resp.text()).splitlines()
            pending += sum(float(line.split()[-1]) for line in lines if line.startswith(gauge))
        called = all(llm.max_in_flight_by_marker.get(sid, 0) for sid in sids)
        if called and pending == 0 and not any(llm.in_flight_by_marker.values()):
            return
        await asyncio.sleep(0.2)


async def test_two_processes_share_sessions_without_losing_order_or_summaries(
    real_servers: RealServers, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    """Two daemons on the same Redis and MariaDB, every conversation's messages alternating
    between them: order and turn counts are exact, one summarization per session runs at a time,
    the summaries' slices tile the turns with increasing versions, the hot copy is the newest
    version, and close is idempotent from either process."""
    fake_llm.behaviour.delay_s = 0.3
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    a = DaemonProcess(crash_env(real_servers, prefix, fake_llm), tmp_path / "a.log")
    b = DaemonProcess(crash_env(real_servers, prefix, fake_llm), tmp_path / "b.log")
    gateways = [Gateway(new_sid()) for _ in range(6)]
    turns = 12

    async def converse(g: Gateway, http: aiohttp.ClientSession) -> None:
        # Each message goes to the other process, and so does each turn's closing reply (which
        # schedules the summaries), so both processes summarize every session.
        for turn in range(1, turns + 1):
            for role, target in (("user", (a, b)[turn % 2]), ("assistant", (a, b)[(turn + 1) % 2])):
                assert await g.send(http, target.url, g.message(turn, role))

    try:
        async with processes(a, b), aiohttp.ClientSession() as http:
            await asyncio.gather(*(converse(g, http) for g in gateways))
            # The passes the conversations scheduled run first: a client's close merges what they
            # have not covered with the extractor and takes the lock at once, without waiting for
            # a concurrency slot, and a session longer than COMPRESSION_BATCH_TURNS is not made
            # again by the LLM after it (service.py, summarize/job.py). On a loaded machine a
            # session whose passes were all still queued at its close had no LLM call at all.
            await _settled(http, (a, b), fake_llm, [g.sid for g in gateways])
            for g in gateways:
                # A pass still running (its LLM calls take 0.3 s) may outlast the second a close
                # waits for it: that close answers `persisted: false` and a later one true, as
                # documented. Once persisted, close is idempotent from either process.
                for _ in range(100):
                    async with http.post(f"{a.url}/v1/sessions/{g.sid}/close") as resp:
                        assert resp.status == 200
                        if (await resp.json())["persisted"]:
                            break
                    await asyncio.sleep(0.2)
                closes = []
                for d in (a, b, a):
                    async with http.post(f"{d.url}/v1/sessions/{g.sid}/close") as resp:
                        assert resp.status == 200
                        closes.append(await resp.json())
                assert all(c == closes[0] for c in closes), closes
                assert closes[0]["persisted"] is True

            # A close under load may answer with the extractor's summary, the LLM's pass still
            # queued: "the LLM makes it again in the background" (service.py). Read once every
            # session's LLM pass has run and nothing is left to summarize in either process.
            await _settled(http, (a, b), fake_llm, [g.sid for g in gateways])
            r = redis.Redis.from_url(real_servers.redis_url)
            try:
                for g in gateways:
                    assert stored_ids(real_servers, g.sid) == g.acked
                    assert turn_count(real_servers, g.sid) == turns
                    assert fake_llm.max_in_flight_by_marker.get(g.sid, 0) == 1, g.sid
                    async with http.get(f"{a.url}/v1/sessions/{g.sid}/slices") as resp:
                        slices = (await resp.json())["slices"]
                    assert slices[0]["from_turn"] == 1
                    assert slices[-1]["to_turn"] == turns
                    for before, after in itertools.pairwise(slices):
                        assert after["from_turn"] == before["to_turn"] + 1
                        assert after["summary_version"] >= before["summary_version"]
                    version = sql_rows(
                        real_servers.mysql_url, "SELECT version FROM conversation_summaries WHERE session_id=%s", g.sid
                    )[0][0]
                    cached = r.get(f"{prefix}:{{{g.sid}}}:summary")
                    assert cached is not None
                    assert json.loads(cached)["version"] == version
            finally:
                r.close()
    finally:
        _cleanup(real_servers, prefix)
