"""Child processes of the benchmark: the daemon and the servers of bench.benchkit.servers, started like
an operator would start them (tiered_memory.testing's launcher), waited for on /healthz, measured
through /proc, and stopped."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import aiohttp

from tiered_memory.testing import ChildFailed, ChildProcess, command, free_port

# The checkout that holds bench/ (this file is bench/benchkit/procs.py).
_CHECKOUT = Path(__file__).resolve().parents[2]


class BenchFailed(ChildFailed):
    """The benchmark cannot go on: a child did not start, or answered what it must not."""


def rss_kib(pid: int) -> int:
    """VmRSS of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchFailed(f"no VmRSS for pid {pid}")


def listening(pid: int, port: int) -> bool:
    """Whether process `pid` itself holds a socket listening on `port` (with SO_REUSEPORT several
    do, and /healthz may be answered by another one)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{f[9]}]")
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        return any(os.readlink(fd) in inodes for fd in fds.iterdir())
    return False


class Child(ChildProcess):
    """One child process serving HTTP on `port`, ready once it answers /healthz; `argv` runs it,
    `env` is added to ours; `cwd` is where it runs (ours when None)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        port: int,
        env: dict[str, str] | None = None,
        workers: int = 1,
        cwd: Path | None = None,
    ) -> None:
        super().__init__(argv, port=port, env=env, name=name, ready_path="/healthz", cwd=cwd)
        # With several workers the supervisor serves nothing itself: start() waits until each of
        # its children listens on the port (any one of them may answer /healthz first).
        self.workers = workers

    async def start(self, http: aiohttp.ClientSession | None = None, *, log_dir: Path | None = None) -> None:
        """Start it with its output in `log_dir`, and wait until it answers /healthz."""
        if log_dir is not None:
            self.log_path = log_dir / f"{self.name.replace(' ', '-')}-{self.port}.log"
        await super().start(http)

    def also_ready(self) -> bool:
        if self.workers == 1:
            return True
        # Not every child is a worker (multiprocessing's spawn adds a resource tracker).
        return sum(listening(pid, self.port) for pid in children(self.pid)) >= self.workers


def daemon(env: dict[str, str], *, name: str = "daemon") -> Child:
    """`tiered-memory serve` with `env` (PORT among it; with WORKERS=n, n processes on that port)."""
    workers = int(env.get("WORKERS", "1"))
    return Child(name, command("serve"), port=int(env["PORT"]), env=env, workers=workers)


def children(pid: int) -> list[int]:
    """The child processes of `pid` (a WORKERS supervisor's workers)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def server(kind: str, *args: str) -> Child:
    """One of bench.benchkit.servers' apps on a free port, run from the checkout: `-m` finds the
    bench folder there, which is not installed."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.benchkit.servers", kind, "--port", str(port), *args]
    return Child(kind, argv, port=port, cwd=_CHECKOUT)
