"""The daemon under evaluation: one started here as a child process (embedded default, or on given
Redis and SQL URLs under a key prefix of its own), or one already running at a URL.

A reconnect probe needs a restart and a lost hot tier: a child is stopped (SIGTERM) and started
again on the same SQL, after this run's own Redis keys are deleted. Nothing else in Redis is
touched, and a daemon given by URL cannot be restarted (its reconnect probes are skipped).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import aiohttp
import redis

from tiered_memory.testing import DaemonProcess


class DaemonFailed(RuntimeError):
    """A daemon given by URL was asked to restart. (A child daemon that does not start raises
    tiered_memory.testing.ChildFailed.)"""


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
        self.restartable = True
        self.redis_url = redis_url
        self.prefix = f"tmeval{run_id}"
        env = {"HOST": "127.0.0.1", "DATA_DIR": self._tmp.name, "LOG_LEVEL": "WARNING"}
        env |= {"LOG_FORMAT": "json", "SWEEP_INTERVAL_SECONDS": "3600"}
        if redis_url:
            env |= {"REDIS_URL": redis_url, "REDIS_KEY_PREFIX": self.prefix}
        if database_url:
            env |= {"DATABASE_URL": database_url, "AUTO_MIGRATE": "true"}
        env |= extra_env or {}
        self.summary_every = int(env.get("SUMMARY_EVERY_N_TURNS", "3"))
        self._process = DaemonProcess(
            env,
            log_path or Path(self._tmp.name) / "daemon.log",
            environ={k: os.environ[k] for k in _PASSED if k in os.environ},
        )
        self.base = self._process.base

    async def start(self, http: aiohttp.ClientSession) -> None:
        """Start it and wait until /readyz answers 200 (within 60 s, else ChildFailed)."""
        await self._process.start(http)

    async def restart(self, http: aiohttp.ClientSession) -> None:
        """Stop, lose this run's Redis keys (the in-process cache dies with the process), start."""
        await self._process.shutdown()
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

    async def stop(self) -> None:
        await self._process.shutdown()
        self.flush_hot()
        self._tmp.cleanup()
