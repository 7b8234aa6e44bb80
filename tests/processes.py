"""The daemon as a real child process (`python -m tiered_memory serve`), for tests that kill it, and
its command line run beside a daemon under test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.faults import free_port


class DaemonProcess:
    """`python -m tiered_memory serve` as a child process on a free port."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.env = os.environ | env | {"PORT": str(self.port), "LOG_FORMAT": "json"}
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tiered_memory", "serve", env=self.env, stdout=log, stderr=log
            )
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{self.url}/readyz") as resp:
                        if resp.status == 200:
                            return
                assert self.proc.returncode is None, self.log_path.read_text()
                await asyncio.sleep(0.05)
        raise AssertionError(f"daemon did not become ready:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()

    async def terminate(self) -> tuple[int, float]:
        """SIGTERM; the exit status and how long the exit took."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), timeout=60)
        return code, time.monotonic() - started

    async def wait(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@contextlib.asynccontextmanager
async def processes(*daemons: DaemonProcess) -> AsyncIterator[None]:
    try:
        for d in daemons:
            await d.start()
        yield
    finally:
        for d in daemons:
            await d.wait()


async def run_cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """The command line, run while the daemon under test goes on serving (its loop keeps running:
    it may hold the embedded database's write lock a moment)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tiered_memory",
        *args,
        env={**os.environ, **env, "LOG_FORMAT": "json"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
