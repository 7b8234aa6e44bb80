"""The daemon under evaluation: one started here as a child process (embedded default, or on given
Redis and SQL URLs under a key prefix of its own), or one already running at a URL.

A reconnect probe needs a restart and a lost hot tier: a child is stopped (SIGTERM) and started
again on the same SQL, after this run's own Redis keys are deleted. Nothing else in Redis is
touched, and a daemon given by URL cannot be restarted (its reconnect probes are skipped).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import redis


class DaemonFailed(RuntimeError):
    """The child daemon did not start or stop as it should."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# Only these pass from the caller's environment: the daemon is configured by the run alone.
_PASSED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


class Target:
    """A daemon reachable at `base`; `restartable` when a reconnect can be staged."""

    base: str
    restartable: bool
    summary_every: int

    async def start(self, http: aiohttp.ClientSession) -> None: ...

    async def restart(self, http: aiohttp.ClientSession) -> None:
        raise DaemonFailed("a daemon given by URL cannot be restarted")

    async def stop(self) -> None: ...


class RunningDaemon(Target):
    def __init__(self, base: str, *, summary_every: int = 3) -> None:
        self.base = base.rstrip("/")
        self.restartable = False
        self.summary_every = summary_every


class ChildDaemon(Target):
    """`python -m tiered_memory serve` on a free port, with this run's settings only."""

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        database_url: str | None = None,
        run_id: str,
        extra_env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix=f"tm-eval-{run_id}-")
        port = _free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.restartable = True
        self.redis_url = redis_url
        self.prefix = f"tmeval{run_id}"
        env = {k: os.environ[k] for k in _PASSED if k in os.environ}
        env |= {"HOST": "127.0.0.1", "PORT": str(port), "DATA_DIR": self._tmp.name, "LOG_LEVEL": "WARNING"}
        env |= {"LOG_FORMAT": "json", "SWEEP_INTERVAL_SECONDS": "3600"}
        if redis_url:
            env |= {"REDIS_URL": redis_url, "REDIS_KEY_PREFIX": self.prefix}
        if database_url:
            env |= {"DATABASE_URL": database_url, "AUTO_MIGRATE": "true"}
        env |= extra_env or {}
        self.summary_every = int(env.get("SUMMARY_EVERY_N_TURNS", "3"))
        self._env = env
        self._log_path = log_path or Path(self._tmp.name) / "daemon.log"
        self._proc: subprocess.Popen[bytes] | None = None

    async def start(self, http: aiohttp.ClientSession) -> None:
        with self._log_path.open("ab") as log:
            self._proc = subprocess.Popen(  # noqa: ASYNC220 - started once, waited for below
                [sys.executable, "-m", "tiered_memory", "serve"], env=self._env, stderr=log, stdout=log
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                async with http.get(self.base + "/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if self._proc.poll() is not None:
                raise DaemonFailed(f"daemon exited with {self._proc.returncode} at start-up; see {self._log_path}")
            await asyncio.sleep(0.1)
        raise DaemonFailed("daemon was not ready within 60 s")

    async def restart(self, http: aiohttp.ClientSession) -> None:
        """Stop, lose this run's Redis keys (the in-process cache dies with the process), start."""
        await self._terminate()
        self.flush_hot()
        await self.start(http)

    def flush_hot(self) -> int:
        if not self.redis_url:
            return 0
        r = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(r.scan_iter(match=f"{self.prefix}:*", count=1000))
            return int(r.delete(*keys)) if keys else 0
        finally:
            r.close()

    async def _terminate(self) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self._proc.wait, 60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    async def stop(self) -> None:
        await self._terminate()
        self.flush_hot()
        self._tmp.cleanup()
