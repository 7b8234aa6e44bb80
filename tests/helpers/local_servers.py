"""Pieces shared by the fixtures that start servers of their own (Redis topologies, a Galera
cluster, a MariaDB primary and replica): finding a binary, tying a child's life to the test
process, and a fresh MariaDB data directory."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
from pathlib import Path


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the thread that started it ends, so that no
    server outlives the run however the test process dies (a SIGKILLed pytest runs no
    teardown). A server meant to outlive one step must be started from a long-lived thread:
    one started from a short-lived thread (`asyncio.to_thread`) would die with it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def binary(name: str) -> str:
    """The path of a server binary: on PATH, or in /usr/sbin where Debian puts mariadbd."""
    path = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin")
    if path is None:
        raise RuntimeError(f"{name} is not installed")
    return path


def missing_binary(*names: str) -> str | None:
    """Why one of `names` cannot be run, or None when all are installed."""
    for name in names:
        try:
            binary(name)
        except RuntimeError as exc:
            return str(exc)
    return None


def install_mariadb(datadir: Path, *, timeout_s: float) -> None:
    """A fresh, small MariaDB data directory at `datadir`: root logs in from 127.0.0.1 without a
    password (the normal authentication method), no test database."""
    subprocess.run(
        [
            binary("mariadb-install-db"),
            "--no-defaults",
            f"--datadir={datadir}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--innodb-log-file-size=16M",
            "--innodb-buffer-pool-size=32M",
        ],
        check=True,
        capture_output=True,
        timeout=timeout_s,
    )
