"""WORKERS=2: two serving processes on one port under a supervisor, on real Redis and MariaDB."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.daemon import new_sid
from tests.helpers.servers import RealServers
from tiered_memory.errors import ConfigError
from tiered_memory.settings import Settings
from tiered_memory.testing import DaemonProcess, processes

pytestmark = [pytest.mark.real, pytest.mark.slow]


def _children(pid: int) -> set[int]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    kids = set()
    for child in map(int, text.split()):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                kids.add(child)
        except FileNotFoundError:
            continue
    return kids


async def _until_children(pid: int, count: int, exclude: set[int] | None = None) -> set[int]:
    for _ in range(300):
        kids = _children(pid)
        if len(kids) == count and not (exclude and kids & exclude):
            return kids
        await asyncio.sleep(0.1)
    raise AssertionError(f"expected {count} workers, have {_children(pid)}")


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening on `port` (state 0A is LISTEN in /proc/net/tcp)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
                inodes.add(fields[9])
    return inodes


def _holds_one_of(pid: int, inodes: set[str]) -> bool:
    try:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except FileNotFoundError:
        return False
    return any(link.startswith("socket:[") and link[8:-1] in inodes for link in links)


async def _until_listening(workers: set[int], port: int) -> None:
    """Wait until every worker has its own socket listening: the daemon answers ready when the
    first worker does, and the kernel spreads connections only over sockets already bound."""
    for _ in range(300):
        inodes = _listening_inodes(port)
        if all(_holds_one_of(pid, inodes) for pid in workers):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not every worker of {workers} listens on {port}")


async def _appends_served(http: aiohttp.ClientSession, base: str) -> int:
    """The appends answered 201 by the worker that answers this scrape."""
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "tiered_memory_request_duration_seconds_count"
                and labels.get("route") == "/v1/sessions/{session_id}/messages"
                and (labels.get("method"), labels.get("status")) == ("POST", "201")
            ):
                return int(sample.value)
    return 0


async def test_two_workers_share_a_port_restart_a_dead_one_and_stop_on_sigterm(
    real_servers: RealServers, tmp_path: Path
) -> None:
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    env = {
        "WORKERS": "2",
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "LOG_FORMAT": "json",
    }
    daemon = DaemonProcess(env, tmp_path / "daemon.log")
    base = daemon.url
    # A new connection per request, so the kernel spreads them over both workers.
    async with processes(daemon), aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        workers = await _until_children(daemon.pid, 2)
        await _until_listening(workers, daemon.port)
        sid = new_sid()
        for turn in range(1, 11):
            for role in ("user", "assistant"):
                body = {"role": role, "content": f"第{turn}轮 {role}", "message_id": f"{turn}-{role}"}
                async with http.post(f"{base}/v1/sessions/{sid}/messages", json=body) as resp:
                    assert resp.status == 201, await resp.text()
        async with http.get(f"{base}/v1/sessions/{sid}") as resp:
            info = await resp.json()
        assert (info["turn_count"], info["message_count"]) == (10, 20)
        # Each worker counts the appends it served in its own registry. Any scrape showing a
        # part of the twenty means both served (one worker alone would show 20, the other 0).
        served = {await _appends_served(http, base) for _ in range(12)}
        assert any(0 < n < 20 for n in served), served

        victim = next(iter(workers))
        os.kill(victim, signal.SIGKILL)
        await _until_children(daemon.pid, 2, exclude={victim})
        async with http.get(f"{base}/v1/sessions/{sid}/context") as resp:
            assert (await resp.json())["messages"][-1]["content"] == "第10轮 assistant"

        assert await daemon.shutdown() == 0


def test_several_workers_need_redis_and_a_sql_server() -> None:
    with pytest.raises(ConfigError, match="WORKERS"):
        Settings.from_env({"WORKERS": "2"})
    with pytest.raises(ConfigError, match="WORKERS"):
        Settings.from_env({"WORKERS": "2", "REDIS_URL": "redis://127.0.0.1:6379/0"})
