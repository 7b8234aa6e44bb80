"""One daemon process for every integration test of a run: the framework adapters, the MCP
server and the TypeScript client all talk to a real daemon over HTTP, as a gateway does. It is
the embedded default (in-process hot cache + SQLite, deterministic summaries) with tokens on, so
the adapters' token and tenant options are exercised; each test uses its own session ids."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.live import LiveDaemon
from tiered_memory.testing import DaemonProcess

# The operator's unrestricted token, and a token restricted to the tenant "acme".
OPERATOR_TOKEN = "op-integrations-0123456789abcdef"
TENANT = "acme"
TENANT_TOKEN = "acme-integrations-0123456789abcd"


@pytest.fixture(scope="session")
def live_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDaemon]:
    """`python -m tiered_memory serve` on a free port, started once per run."""
    root = tmp_path_factory.mktemp("live-daemon")
    env = {
        "DATA_DIR": str(root / "data"),
        "API_TOKENS": f"{OPERATOR_TOKEN},{TENANT}:{TENANT_TOKEN}",
        "LOG_FORMAT": "json",
        # Summaries every 2 turns (the recent window may not be longer), so a short scripted
        # conversation already has one.
        "SUMMARY_EVERY_N_TURNS": "2",
        "KEEP_RECENT_TURNS": "2",
    }
    log_path = root / "daemon.log"
    daemon = DaemonProcess(env, log_path)
    try:
        daemon.start_blocking()
        yield LiveDaemon(daemon.url, TENANT_TOKEN, OPERATOR_TOKEN, TENANT, log_path)
    finally:
        daemon.stop(timeout_s=30)
