"""The daemon's command line run beside a daemon under test (the daemon itself as a child process
is tiered_memory.testing's DaemonProcess)."""

from __future__ import annotations

import asyncio
import os

from tiered_memory.testing import command


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
