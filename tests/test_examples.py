"""The programs in examples/ run as they are, against a real daemon (served by this test on
loopback, with a token): the Python gateway on tiered_memory.client, and the TypeScript client's
gateway under Node, the client installed beside it as a gateway installs it. Each leaves a
closed session of two turns, its summary persisted."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, new_sid
from tests.helpers.skips import required_tool
from tiered_memory.client import AsyncClient

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TS_PACKAGE = ROOT / "clients" / "typescript"
TOKEN = "examples-token-0123456789abcdef"


@pytest.fixture
async def served(tmp_path: Path, make_daemon: MakeDaemon) -> Daemon:
    return await make_daemon(
        {"DATA_DIR": str(tmp_path / "data"), "API_TOKENS": TOKEN, "SWEEP_INTERVAL_SECONDS": "3600"}
    )


async def _run_example(argv: list[str], daemon: Daemon, cwd: Path) -> str:
    """`argv` pointed at `daemon` by the environment variables the examples read; its stdout."""
    url = str(daemon.http.make_url("")).rstrip("/")
    env = os.environ | {"TIERED_MEMORY_URL": url, "TIERED_MEMORY_TOKEN": TOKEN}
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, out.decode() + err.decode()
    return out.decode()


async def _assert_closed_after_two_turns(daemon: Daemon, sid: str, output: str, *, true: str) -> None:
    """`output` tells two turns and the close (`true` is the language's spelling of it)."""
    assert output.splitlines() == [
        "turn 1: the model saw 2 messages",
        "turn 2: the model saw 4 messages",
        f"closed {sid}: 2 turns, summary persisted: {true}",
    ], output
    url = str(daemon.http.make_url("")).rstrip("/")
    async with AsyncClient(url, token=TOKEN) as memory:
        info = await memory.session(sid, user_id="u-7")
    assert (info.turn_count, info.message_count, info.closed, info.covered_turns) == (2, 4, True, 2)


async def test_the_python_gateway_example_runs(served: Daemon) -> None:
    """examples/gateway.py: two turns, each context holding what came before, then the close."""
    sid = new_sid()
    output = await _run_example([sys.executable, str(EXAMPLES / "gateway.py"), sid], served, ROOT)
    await _assert_closed_after_two_turns(served, sid, output, true="True")


def _built_client() -> None:
    """clients/typescript's dist/, built when missing or older than its sources (npm ci first
    when node_modules is older than the lockfile), as its own suite does."""
    npm = required_tool("npm", "apt-get install npm")
    installed = TS_PACKAGE / "node_modules" / ".package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < (TS_PACKAGE / "package-lock.json").stat().st_mtime:
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=TS_PACKAGE, check=True, capture_output=True, timeout=100
        )
    built = TS_PACKAGE / "dist" / "index.js"
    sources = max(p.stat().st_mtime for p in (TS_PACKAGE / "src").glob("*.ts"))
    if not built.is_file() or built.stat().st_mtime < sources:
        subprocess.run([npm, "run", "build"], cwd=TS_PACKAGE, check=True, capture_output=True, timeout=100)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_typescript_gateway_example_runs(served: Daemon, tmp_path: Path) -> None:
    """examples/gateway.mjs under Node, in a folder whose node_modules holds the client (linked, as
    `npm install <tgz>` would put it there): the same two turns and close."""
    node = required_tool("node", "apt-get install nodejs")
    await asyncio.to_thread(_built_client)
    gateway = tmp_path / "gateway"
    (gateway / "node_modules" / "@tiered-memory").mkdir(parents=True)
    (gateway / "node_modules" / "@tiered-memory" / "client").symlink_to(TS_PACKAGE, target_is_directory=True)
    shutil.copy(EXAMPLES / "gateway.mjs", gateway / "gateway.mjs")
    sid = new_sid()
    output = await _run_example([node, "gateway.mjs", sid], served, gateway)
    await _assert_closed_after_two_turns(served, sid, output, true="true")
