"""One daemon process for every integration test of a run: the framework adapters, the MCP
server and the TypeScript client all talk to a real daemon over HTTP, as a gateway does. It is
the embedded default (in-process hot cache + SQLite, deterministic summaries) with tokens on, so
the adapters' token and tenant options are exercised; each test uses its own session ids."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults import free_port

# The operator's unrestricted token, and a token restricted to the tenant "acme".
OPERATOR_TOKEN = "op-integrations-0123456789abcdef"
TENANT = "acme"
TENANT_TOKEN = "acme-integrations-0123456789abcd"


@dataclass(frozen=True)
class LiveDaemon:
    url: str
    token: str  # restricted to TENANT: what a tenant's gateway holds
    operator_token: str
    tenant: str
    log_path: Path


@pytest.fixture(scope="session")
def live_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDaemon]:
    """`python -m tiered_memory serve` on a free port, started once per run."""
    root = tmp_path_factory.mktemp("live-daemon")
    port = free_port()
    env = os.environ | {
        "PORT": str(port),
        "DATA_DIR": str(root / "data"),
        "API_TOKENS": f"{OPERATOR_TOKEN},{TENANT}:{TENANT_TOKEN}",
        "LOG_FORMAT": "json",
        # Summaries every 2 turns (the recent window may not be longer), so a short scripted
        # conversation already has one.
        "SUMMARY_EVERY_N_TURNS": "2",
        "KEEP_RECENT_TURNS": "2",
    }
    log_path = root / "daemon.log"
    url = f"http://127.0.0.1:{port}"
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tiered_memory", "serve"], env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                # An http:// URL built above, never a caller's.
                with urllib.request.urlopen(f"{url}/readyz", timeout=1) as resp:  # noqa: S310
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"daemon did not become ready:\n{log_path.read_text()}")
            time.sleep(0.05)
        yield LiveDaemon(url, TENANT_TOKEN, OPERATOR_TOKEN, TENANT, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
