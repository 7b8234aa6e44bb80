"""The daemon's command line run beside a daemon under test (the daemon itself as a child process
is tiered_memory.testing's DaemonProcess)."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys

from tiered_memory.testing import command, read_terminal


async def run_cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """The command line, run while the daemon under test goes on serving (its loop keeps running:
    it may hold the embedded database's write lock a moment)."""
    proc = await asyncio.create_subprocess_exec(
        *command(*args),
        env={**os.environ, **env, "LOG_FORMAT": "json"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=100)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def cli(*args: str, env: dict[str, str], stderr_tty: bool = False) -> tuple[int, str, str]:
    """Run `tiered-memory ARGS` as a process; its exit status, stdout and stderr. With
    `stderr_tty`, stderr is a pseudo-terminal (where progress draws a bar)."""
    full_env = os.environ | env | {"LOG_FORMAT": "auto"}
    cmd = [sys.executable, "-m", "tiered_memory", *args]
    if not stderr_tty:
        done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=100, check=False)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    with subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=slave) as proc:
        os.close(slave)
        out = proc.stdout.read() if proc.stdout else b""
        err = read_terminal(master)
        proc.wait(300)
    os.close(master)
    return proc.returncode, out.decode(), err.decode(errors="replace")
