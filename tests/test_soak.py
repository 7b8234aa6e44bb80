"""A short run of `python -m bench.soak` in CI: concurrent sessions against a daemon process on real
Redis and MariaDB while a private Redis is killed, restarted and flushed and the LLM fails. The
script checks from SQL that every acknowledged message is stored exactly once and in order and
that every closed session has its final summary; its exit status says whether all of it held.
(The longer runs recorded in docs/RELIABILITY.md use the same script with its defaults.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.helpers.servers import RealServers

_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_short_soak_with_faults_loses_nothing(real_servers: RealServers, tmp_path: Path) -> None:
    url = urlparse(real_servers.mysql_url)
    server = url._replace(path="/").geturl()  # the soak makes a database of its own there
    report = tmp_path / "soak.json"
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "bench.soak"),
            *("--duration", "24", "--sessions", "8", "--turns", "5", "--concurrency", "6"),
            *("--mysql-url", server, "--seed", "7", "--json", str(report)),
        ],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "VERDICT: PASS" in done.stdout
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["passed"] is True
    assert set(result["verdict"].values()) == {0}
    assert result["sql"]["acknowledged"] > 0
    assert result["sql"]["acknowledged"] == result["sql"]["stored"]
    assert [f["fault"] for f in result["faults"]].count("redis_restart") == 2
