"""The daemon as a child process, started and stopped as an operator would: for the scripts that
drive it over HTTP (walkthrough, soak). Imported from scripts/, which is sys.path[0] when a script
in it runs."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp


class ChildFailed(Exception):
    """The daemon did not start, or stopped when it should not have."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ChildDaemon:
    """`python -m tiered_memory serve` with `env` on top of this process's environment; its stderr
    (the JSON log) goes to `log_path`, or nowhere. With `cwd`, the package is the one in that
    folder (another checkout: `python -m` puts the working directory first on the path)."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path | None = None,
        *,
        ready_timeout_s: float = 60,
        cwd: Path | None = None,
    ) -> None:
        self.env = env
        self.cwd = cwd
        self.base = f"http://127.0.0.1:{env['PORT']}"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._ready_timeout = ready_timeout_s

    async def start(self, http: aiohttp.ClientSession) -> None:
        """Start it and wait until /readyz answers 200."""
        cmd = [sys.executable, "-m", "tiered_memory", "serve"]
        if self.log_path is None:
            self.proc = subprocess.Popen(cmd, env=os.environ | self.env, stderr=subprocess.DEVNULL, cwd=self.cwd)
        else:
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(cmd, env=os.environ | self.env, stderr=log, cwd=self.cwd)
        deadline = time.monotonic() + self._ready_timeout
        while time.monotonic() < deadline:
            try:
                async with http.get(self.base + "/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if self.proc.poll() is not None:
                where = f"; see {self.log_path}" if self.log_path else ""
                raise ChildFailed(f"daemon exited with {self.proc.returncode} at start-up{where}")
            await asyncio.sleep(0.1)
        raise ChildFailed(f"daemon was not ready within {self._ready_timeout:.0f} s")

    def stop(self) -> int:
        """SIGTERM, and its exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self.proc = None
        return code
