"""The daemon on a Sentinel-managed Redis (master, replica, three sentinels; private processes):
a killed master is replaced by its replica and the daemon follows by itself, losing nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import MakeDaemon, new_sid
from tests.helpers.failover import kill_master_under_load
from tests.helpers.gateway import Gateway
from tests.helpers.servers import RealServers
from tests.helpers.topologies import SentinelGroup

pytestmark = [pytest.mark.real, pytest.mark.slow]


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel")).start()
    try:
        yield group
    finally:
        group.stop()


async def test_killed_master_is_replaced_and_nothing_acknowledged_is_lost(
    real_servers: RealServers, sentinel_group: SentinelGroup, tmp_path: Path, make_daemon: MakeDaemon
) -> None:
    """SIGKILL of the master mid-load: the sentinels promote the replica, the daemon asks them for
    the new master by itself, reads answer from SQL meanwhile, every acknowledged message is in
    SQL exactly once, and the hot tier (now the new master) serves every session again."""
    d = await make_daemon(
        {
            "REDIS_URL": sentinel_group.url,
            "REDIS_KEY_PREFIX": f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}",
            "DATABASE_URL": real_servers.mysql_url,
            "AUTO_MIGRATE": "true",
            "SWEEP_INTERVAL_SECONDS": "3600",
            "REDIS_TIMEOUT_MS": "500",
            "REDIS_BREAKER_RESET_SECONDS": "0.5",
        }
    )
    # Before the fault the daemon writes to the master the sentinels name.
    assert sentinel_group.master_port() == sentinel_group.master.port
    gateways = [Gateway(new_sid()) for _ in range(6)]

    def kill() -> None:
        sentinel_group.master.kill()
        sentinel_group.wait_failover()

    seen = await kill_master_under_load(d, real_servers, gateways, kill)
    assert any(t in ("warm", "cold") for t in seen.during), seen.during
    assert seen.after
    # The hot copies are on the promoted replica now.
    with sentinel_group.replica.client() as r:
        assert r.exists(f"{d.settings.redis_key_prefix}:{{{gateways[0].sid}}}:summary") == 1
