"""The daemon process every integration test of a run talks to (the `live_daemon` fixture of
tests/integrations/conftest.py), as a test sees it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LiveDaemon:
    url: str
    token: str  # restricted to TENANT: what a tenant's gateway holds
    operator_token: str
    tenant: str
    log_path: Path
