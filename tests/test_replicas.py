"""Several daemons on one Redis Cluster and one MariaDB: three processes behind nginx round-robin,
and WORKERS=3 on one port. A conversation whose turns land on different processes in turn keeps
its order, turn count and summary cadence (one summarization per session at a time, never an
older summary over a newer one), and close and delete behave as with one process. A replica
SIGKILLed mid-load costs nothing acknowledged, and the others do its due summaries."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis.cluster

from tests.helpers.daemon import new_sid
from tests.helpers.gateway import Gateway, covered_turns, stored_ids, turn_count
from tests.helpers.nginx import Nginx
from tests.helpers.servers import RealServers, sql_rows
from tests.helpers.skips import unreachable
from tests.helpers.topologies import RedisClusterProcesses
from tiered_memory.testing import DaemonProcess, FakeLlm, processes

pytestmark = [pytest.mark.real, pytest.mark.slow]

TURNS = 12


def _env(servers: RealServers, cluster: RedisClusterProcesses, prefix: str, llm: FakeLlm) -> dict[str, str]:
    return {
        "REDIS_URL": cluster.url,
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "LLM_BASE_URL": llm.url,
        "SUMMARY_MODEL": "fake",
        "SUMMARY_FORMAT": "text",
        "SUMMARY_EVERY_N_TURNS": "3",
        # The survivors' sweeps find a dead replica's due summaries soon after its lock expires
        # (lock TTL: LLM timeout + 2 SQL timeouts + 5 s = 12 s).
        "SWEEP_INTERVAL_SECONDS": "1",
        "LLM_TIMEOUT_SECONDS": "3",
        "SQL_TIMEOUT_MS": "2000",
        # Nine servers and the test share two cores: bounds generous enough not to trip on load.
        "REDIS_TIMEOUT_MS": "1000",
        "LOG_FORMAT": "json",
    }


async def _ack(g: Gateway, http: aiohttp.ClientSession, base: str, message: tuple[str, str, str]) -> None:
    """Send until acknowledged, as a gateway does (same message_id every time)."""
    for _ in range(300):
        if await g.send(http, base, message):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{message[0]} never acknowledged")


async def _converse(g: Gateway, http: aiohttp.ClientSession, base: str, turns: range) -> None:
    for turn in turns:
        for role in ("user", "assistant"):
            await _ack(g, http, base, g.message(turn, role))


async def _appends_served(http: aiohttp.ClientSession, daemon: DaemonProcess) -> float:
    """Messages this process stored (its own /metrics, asked directly, not through nginx)."""
    async with http.get(f"{daemon.url}/metrics") as resp:
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tiered_memory_appends_total{") and 'result="created"' in line
    )


def _hot_version(cluster: RedisClusterProcesses, key: str) -> int | None:
    master = cluster.master_of_key(key)
    with contextlib.closing(redis.Redis(port=master.port, socket_timeout=2)) as r:
        raw = r.get(key)
    return None if raw is None else int(json.loads(raw)["version"])


async def _check_sessions(
    servers: RealServers,
    cluster: RedisClusterProcesses,
    prefix: str,
    llm: FakeLlm,
    gateways: list[Gateway],
    http: aiohttp.ClientSession,
    base: str,
) -> None:
    """What one process would guarantee, checked in SQL, Redis and the fake LLM's record."""
    for g in gateways:
        assert stored_ids(servers, g.sid) == g.acked, g.sid
        assert turn_count(servers, g.sid) == TURNS
        deadline = time.monotonic() + 90
        while covered_turns(servers, g.sid) < TURNS:
            assert time.monotonic() < deadline, f"{g.sid}: summary stuck at {covered_turns(servers, g.sid)}"
            await asyncio.sleep(0.2)
        assert llm.max_in_flight_by_marker.get(g.sid, 0) == 1, g.sid
        async with http.get(f"{base}/v1/sessions/{g.sid}/slices") as resp:
            slices = (await resp.json())["slices"]
        assert slices[0]["from_turn"] == 1
        assert slices[-1]["to_turn"] == TURNS
        for before, after in itertools.pairwise(slices):
            assert after["from_turn"] == before["to_turn"] + 1, slices
            assert after["summary_version"] >= before["summary_version"], slices
        version = sql_rows(servers.mysql_url, "SELECT version FROM conversation_summaries WHERE session_id=%s", g.sid)
        hot = _hot_version(cluster, f"{prefix}:{{{g.sid}}}:summary")
        # Never an older summary over a newer one: the cache holds SQL's version, or nothing.
        assert hot in (None, version[0][0]), (hot, version)
        async with http.get(f"{base}/v1/sessions/{g.sid}/context") as resp:
            ctx = await resp.json()
        assert ctx["turn_count"] == TURNS
        assert ctx["messages"][-1]["content"] == g.message(TURNS, "assistant")[2]


@contextlib.asynccontextmanager
async def _replicas(
    servers: RealServers, cluster: RedisClusterProcesses, llm: FakeLlm, tmp_path: Path, count: int = 3
) -> AsyncIterator[tuple[list[DaemonProcess], Nginx, str]]:
    prefix = f"tmt{servers.run_id}{uuid.uuid4().hex[:6]}"
    daemons = []
    for i in range(count):
        # A key of its own per replica: the fake LLM's record says which process called it.
        env = _env(servers, cluster, prefix, llm) | {"LLM_API_KEY": f"replica-{i}"}
        daemons.append(DaemonProcess(env, tmp_path / f"replica-{i}.log"))
    nginx: Nginx | None = None
    try:
        balancer = Nginx(tmp_path / "nginx", [d.port for d in daemons])
    except RuntimeError as exc:
        # Like a server that is not there: a skip, or a failure under REQUIRE_REAL_BACKENDS=1.
        unreachable("nginx", exc)
    try:
        await asyncio.gather(*(d.start() for d in daemons))
        nginx = balancer.start()
        yield daemons, nginx, prefix
    finally:
        if nginx is not None:
            nginx.stop()
        for d in daemons:
            d.kill()


async def test_three_replicas_behind_nginx_behave_as_one(
    real_servers: RealServers, redis_cluster: RedisClusterProcesses, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    fake_llm.behaviour.delay_s = 0.3
    async with (
        _replicas(real_servers, redis_cluster, fake_llm, tmp_path) as (daemons, nginx, prefix),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        # One conversation alone: round-robin sends its consecutive messages to each replica in turn.
        alone = Gateway(new_sid())
        before = [await _appends_served(http, d) for d in daemons]
        await _converse(alone, http, nginx.url, range(1, TURNS + 1))
        served = [await _appends_served(http, d) - b for d, b in zip(daemons, before, strict=True)]
        assert sum(served) == 2 * TURNS
        assert all(n >= 4 for n in served), served

        gateways = [Gateway(new_sid()) for _ in range(6)]
        await asyncio.gather(*(_converse(g, http, nginx.url, range(1, TURNS + 1)) for g in gateways))
        gateways.append(alone)
        await _check_sessions(real_servers, redis_cluster, prefix, fake_llm, gateways, http, nginx.url)

        # Close from whichever replica nginx picks, three times: the same answer each time.
        closes = []
        for _ in range(3):
            async with http.post(f"{nginx.url}/v1/sessions/{alone.sid}/close") as resp:
                assert resp.status == 200
                closes.append(await resp.json())
        assert all(c == closes[0] for c in closes), closes
        assert closes[0]["persisted"] is True

        async with http.delete(f"{nginx.url}/v1/sessions/{alone.sid}") as resp:
            assert resp.status in (200, 204)
        for d in daemons:
            async with http.get(f"{d.url}/v1/sessions/{alone.sid}") as resp:
                assert resp.status == 404
            async with http.get(f"{d.url}/v1/sessions/{alone.sid}/summary") as resp:
                assert (await resp.json())["tier"] == "none"
        # Only the recall postings' floor stays (a time, no content).
        assert redis_cluster.count_keys(f"{prefix}:{{{alone.sid}}}:*") == 1
        assert redis_cluster.count_keys(f"{prefix}:{{{alone.sid}}}:recall-floor") == 1


# Its load waits up to 240 s for the survivors: longer than the suite's 120 s per test.
@pytest.mark.timeout(300)
async def test_a_replica_killed_mid_load_costs_nothing(
    real_servers: RealServers, redis_cluster: RedisClusterProcesses, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    fake_llm.behaviour.delay_s = 0.5
    async with (
        _replicas(real_servers, redis_cluster, fake_llm, tmp_path) as (daemons, nginx, prefix),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        victim = daemons[1]
        gateways = [Gateway(new_sid()) for _ in range(8)]
        # The last turns wait for the kill, so load is still running when it lands: without the
        # gate a late summary call could come after every message was already acknowledged.
        killed = asyncio.Event()
        held = TURNS - 2

        async def converse(g: Gateway) -> None:
            await _converse(g, http, nginx.url, range(1, held + 1))
            await killed.wait()
            await _converse(g, http, nginx.url, range(held + 1, TURNS + 1))

        load = [asyncio.create_task(converse(g)) for g in gateways]

        def victim_calls() -> int:
            return sum(1 for r in fake_llm.requests if r["headers"].get("Authorization") == "Bearer replica-1")

        try:
            deadline = time.monotonic() + 120
            while sum(len(g.acked) for g in gateways) < 40:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            # Kill it while one of its summaries waits on the LLM (0.5 s per call).
            calls = victim_calls()
            while victim_calls() == calls:
                assert time.monotonic() < deadline, "the victim never summarized"
                await asyncio.sleep(0.02)
            victim.kill()
            acked_at_kill = sum(len(g.acked) for g in gateways)
            killed.set()
            await asyncio.wait_for(asyncio.gather(*load), timeout=240)
        finally:
            for task in load:
                task.cancel()
        assert sum(len(g.acked) for g in gateways) > acked_at_kill
        await _check_sessions(real_servers, redis_cluster, prefix, fake_llm, gateways, http, nginx.url)


async def test_workers_on_one_port_keep_the_same_guarantees(
    real_servers: RealServers, redis_cluster: RedisClusterProcesses, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    """WORKERS=3: the kernel spreads connections over three processes on one port; the same
    conversation checks hold."""
    fake_llm.behaviour.delay_s = 0.3
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    env = _env(real_servers, redis_cluster, prefix, fake_llm) | {"WORKERS": "3"}
    daemon = DaemonProcess(env, tmp_path / "workers.log", ready_timeout_s=100)
    # A new connection per request, so that every message may land on another worker.
    async with (
        processes(daemon),
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=60)
        ) as http,
    ):
        gateways = [Gateway(new_sid()) for _ in range(6)]
        await asyncio.gather(*(_converse(g, http, daemon.url, range(1, TURNS + 1)) for g in gateways))
        await _check_sessions(real_servers, redis_cluster, prefix, fake_llm, gateways, http, daemon.url)
        assert await daemon.shutdown() == 0
