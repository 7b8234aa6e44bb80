"""The command line's manners toward a person at a terminal: `--version`, a busy port told in one
line, and a reader that closes the pipe early (`inspect … | head`) ending the command quietly."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

import tiered_memory
from tiered_memory.testing import command


def _cli(*args: str, env: dict[str, str], stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args), env=os.environ | env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=100, check=False
    )


def test_version_prints_the_package_version() -> None:
    """`tiered-memory --version` prints the package's version and exits 0, without settings."""
    done = _cli("--version", env={})
    assert (done.returncode, done.stdout) == (0, f"tiered-memory {tiered_memory.__version__}\n"), done.stderr


@pytest.mark.slow
def test_a_busy_port_stops_start_up_in_one_line(tmp_path: Path) -> None:
    """A daemon asked to listen where another process already does (a second `scripts/serve`)
    exits 2 with one line naming the address and the settings, and no traceback."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _cli("serve", env={"DATA_DIR": str(tmp_path), "PORT": str(port), "LOG_FORMAT": "json"})
    assert done.returncode == 2, done.stderr
    plain = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert plain == [
        f"tiered-memory: configuration error: cannot listen on 127.0.0.1:{port} (HOST, PORT): address already in use"
    ], done.stderr


@pytest.mark.parametrize("args", [("config",), ("inspect", "call-1")])
def test_a_closed_pipe_ends_a_printing_command_quietly(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Its stdout a pipe nobody reads any more (`| head` that has exited): no BrokenPipeError
    traceback, and the status a tool killed by SIGPIPE has (141), as `cat` gives. (`inspect` is
    asked about a session imported first (into a schema migrated first), so that it has a report to print.)"""
    env = {"DATA_DIR": str(tmp_path / "data"), "LOG_FORMAT": "json"}
    history = tmp_path / "history.jsonl"
    history.write_text('{"session_id": "call-1", "role": "user", "content": "hello"}\n', encoding="utf-8")
    assert _cli("migrate", env=env).returncode == 0
    imported = _cli("import", str(history), env=env)
    assert imported.returncode == 0, imported.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = _cli(*args, env=env, stdout=write_end)
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141, done.stderr
