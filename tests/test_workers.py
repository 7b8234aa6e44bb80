"""WORKERS=2: two serving processes on one port under a supervisor, on real Redis and MariaDB."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import RealServers, new_sid
from tests.faults import free_port
from tiered_memory.errors import ConfigError
from tiered_memory.settings import Settings

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


async def test_two_workers_share_a_port_restart_a_dead_one_and_stop_on_sigterm(
    real_servers: RealServers, tmp_path: Path
) -> None:
    port = free_port()
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    env = os.environ | {
        "WORKERS": "2",
        "PORT": str(port),
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "LOG_FORMAT": "json",
    }
    log = (tmp_path / "daemon.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tiered_memory", "serve", env=env, stdout=log, stderr=log
    )
    base = f"http://127.0.0.1:{port}"
    try:
        workers = await _until_children(proc.pid, 2)
        sid = new_sid()
        # A new connection per request, so the kernel spreads them over both workers.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            for _ in range(300):
                try:
                    async with http.get(f"{base}/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            for turn in range(1, 11):
                for role in ("user", "assistant"):
                    body = {"role": role, "content": f"第{turn}轮 {role}", "message_id": f"{turn}-{role}"}
                    async with http.post(f"{base}/v1/sessions/{sid}/messages", json=body) as resp:
                        assert resp.status == 201, await resp.text()
            async with http.get(f"{base}/v1/sessions/{sid}") as resp:
                info = await resp.json()
            assert (info["turn_count"], info["message_count"]) == (10, 20)

            victim = next(iter(workers))
            os.kill(victim, signal.SIGKILL)
            await _until_children(proc.pid, 2, exclude={victim})
            async with http.get(f"{base}/v1/sessions/{sid}/context") as resp:
                assert (await resp.json())["messages"][-1]["content"] == "第10轮 assistant"

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()


def test_several_workers_need_redis_and_a_sql_server() -> None:
    with pytest.raises(ConfigError, match="WORKERS"):
        Settings.from_env({"WORKERS": "2"})
    with pytest.raises(ConfigError, match="WORKERS"):
        Settings.from_env({"WORKERS": "2", "REDIS_URL": "redis://127.0.0.1:6379/0"})
