"""The daemon as a real process: the scripted walkthrough, SIGTERM, restart, and `check`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.servers import RealServers
from tiered_memory.testing import DaemonProcess, command

ROOT = Path(__file__).resolve().parent.parent


def _walk(args: list[str]) -> list[dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.walkthrough", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,  # under the test's own 120 s, so that this one says what hung
        check=False,
    )
    steps = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return steps


@pytest.mark.slow
def test_walkthrough_on_the_embedded_default() -> None:
    """A 12-turn conversation over HTTP against a daemon process shows hot → warm → hot → cold,
    close persists once, and SIGTERM then restart keeps the summary."""
    steps = _walk([])
    by_name = {s["step"]: s for s in steps}
    assert by_name["hot tier lost"] == {"step": "hot tier lost", "tier": "warm", "then": "hot"}
    assert by_name["warm row deleted too"]["tier"] == "cold"
    assert by_name["restart"]["exit_code"] == 0
    assert steps[-1] == {"step": "ok", "backend": "embedded"}


@pytest.mark.slow
def test_walkthrough_on_real_redis_and_mariadb(real_servers: RealServers) -> None:
    """The same walkthrough on real Redis and MariaDB."""
    steps = _walk(["--redis-url", real_servers.redis_url, "--database-url", real_servers.mysql_url])
    by_name = {s["step"]: s for s in steps}
    assert by_name["hot tier lost"] == {"step": "hot tier lost", "tier": "warm", "then": "hot"}
    assert by_name["restart"]["tier"] == "hot"
    assert steps[-1] == {"step": "ok", "backend": "redis+mysql"}


@pytest.mark.slow
def test_walkthrough_on_real_redis_and_postgresql(real_servers: RealServers, postgres_url: str) -> None:
    """The same walkthrough on real Redis and PostgreSQL."""
    steps = _walk(["--redis-url", real_servers.redis_url, "--database-url", postgres_url])
    by_name = {s["step"]: s for s in steps}
    assert by_name["hot tier lost"] == {"step": "hot tier lost", "tier": "warm", "then": "hot"}
    assert by_name["warm row deleted too"]["tier"] == "cold"
    assert by_name["restart"]["tier"] == "hot"
    assert steps[-1] == {"step": "ok", "backend": "redis+postgresql"}


@pytest.mark.slow
def test_check_command_and_graceful_sigterm(tmp_path: Path) -> None:
    """`tiered-memory check --http` exits 0 while the daemon answers and 1 once it has stopped;
    SIGTERM stops the daemon cleanly with exit status 0."""
    log_path = tmp_path / "daemon.log"
    # Waited for on /healthz only: /readyz is `check --ready`'s to ask.
    daemon = DaemonProcess({"DATA_DIR": str(tmp_path), "LOG_FORMAT": "json"}, log_path, ready_path="/healthz")
    env = os.environ | daemon.env
    try:
        daemon.start_blocking()
        assert subprocess.run(command("check", "--http"), env=env, capture_output=True, check=False).returncode == 0
        assert subprocess.run(command("check", "--ready"), env=env, capture_output=True, check=False).returncode == 0
    finally:
        code = daemon.stop(timeout_s=30)
    err = log_path.read_text(encoding="utf-8")
    assert code == 0, err
    events = [json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]
    assert "schema_ready" in events
    stopped = subprocess.run(command("check", "--http", "--timeout", "1"), env=env, capture_output=True, check=False)
    assert stopped.returncode == 1
