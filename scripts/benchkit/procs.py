"""Child processes of the benchmark: the daemon and the servers of benchkit.servers, started like
an operator would start them, waited for on /healthz, measured through /proc, and stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

SCRIPTS = Path(__file__).resolve().parent.parent


class BenchFailed(Exception):
    """The benchmark cannot go on: a child did not start, or answered what it must not."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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


class Child:
    """One child process serving HTTP on `port`; `argv` runs it, `env` is added to ours."""

    def __init__(
        self, name: str, argv: list[str], *, port: int, env: dict[str, str] | None = None, workers: int = 1
    ) -> None:
        self.name = name
        self.log: Path | None = None
        # With several workers the supervisor serves nothing itself: start() waits until each of
        # its children listens on the port (any one of them may answer /healthz first).
        self.workers = workers
        self.argv = argv
        self.port = port
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, http: aiohttp.ClientSession, *, log_dir: Path, timeout_s: float = 60) -> None:
        """Start it with its output in `log_dir`, and wait until it answers /healthz."""
        env = os.environ | {"PYTHONPATH": f"{SCRIPTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"} | self.env
        self.log = log_dir / f"{self.name.replace(' ', '-')}-{self.port}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, env=env, stderr=out, stdout=out)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                async with http.get(self.base + "/healthz") as r:
                    if r.status == 200 and self._all_listening():
                        return
            except aiohttp.ClientError:
                pass
            if self.proc.poll() is not None:
                raise BenchFailed(f"{self.name} exited with {self.proc.returncode} at start-up:\n{self.tail()}")
            await asyncio.sleep(0.05)
        raise BenchFailed(f"{self.name} did not answer /healthz within {timeout_s:.0f} s")

    def _all_listening(self) -> bool:
        if self.workers == 1:
            return True
        assert self.proc is not None
        # Not every child is a worker (multiprocessing's spawn adds a resource tracker).
        return sum(listening(pid, self.port) for pid in children(self.proc.pid)) >= self.workers

    def tail(self, lines: int = 20) -> str:
        """The end of its output, for a report of why it stopped."""
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        """Raise BenchFailed, with the end of its output, if it exited on its own."""
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchFailed(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def terminate(self) -> None:
        """Ask the child to stop (SIGTERM: the daemon drains and exits); `stop` waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        if self.proc is None:
            return 0
        self.terminate()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code


def daemon(env: dict[str, str], *, name: str = "daemon") -> Child:
    """`tiered-memory serve` with `env` (PORT among it; with WORKERS=n, n processes on that port)."""
    workers = int(env.get("WORKERS", "1"))
    return Child(
        name, [sys.executable, "-m", "tiered_memory", "serve"], port=int(env["PORT"]), env=env, workers=workers
    )


def children(pid: int) -> list[int]:
    """The child processes of `pid` (a WORKERS supervisor's workers)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def server(kind: str, *args: str) -> Child:
    """One of benchkit.servers' apps on a free port."""
    port = free_port()
    return Child(kind, [sys.executable, "-m", "benchkit.servers", kind, "--port", str(port), *args], port=port)
