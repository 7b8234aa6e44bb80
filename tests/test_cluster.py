"""The daemon on a real Redis Cluster (3 masters, 3 replicas, private processes): every operation
works with a session's keys on one node, and a master killed under load costs nothing acknowledged."""

from __future__ import annotations

import uuid

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, new_sid, play
from tests.helpers.failover import kill_master_under_load
from tests.helpers.gateway import Gateway
from tests.helpers.servers import RealServers, sql_rows
from tests.helpers.topologies import RedisClusterProcesses
from tiered_memory.testing import ZH_12_TURNS, ZH_EARLY_EVIDENCE
from tiered_memory.tiers.redis.keys import Keys

pytestmark = [pytest.mark.real, pytest.mark.slow]


def _env(servers: RealServers, cluster: RedisClusterProcesses, prefix: str) -> dict[str, str]:
    return {
        "REDIS_URL": cluster.url,
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "SWEEP_INTERVAL_SECONDS": "3600",
        # Generous for a loaded machine; a dead node costs this until the breaker opens.
        "REDIS_TIMEOUT_MS": "500",
        "REDIS_BREAKER_RESET_SECONDS": "0.5",
    }


@pytest.fixture
async def cluster_daemon(
    real_servers: RealServers, redis_cluster: RedisClusterProcesses, make_daemon: MakeDaemon
) -> Daemon:
    return await make_daemon(_env(real_servers, redis_cluster, f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"))


async def test_every_operation_works_on_a_cluster(
    cluster_daemon: Daemon, redis_cluster: RedisClusterProcesses, real_servers: RealServers
) -> None:
    """Appends, hot reads, summaries, close and delete on a cluster; the session's keys live in
    one slot, on one master, and delete removes every one of them."""
    d = cluster_daemon
    keys = Keys(d.settings.redis_key_prefix)
    sids = [new_sid() for _ in range(6)]
    for sid in sids:
        await play(d, sid, ZH_12_TURNS)
    await d.settle()
    for sid in sids:
        summary = await d.get(f"/v1/sessions/{sid}/summary")
        assert summary["tier"] == "hot"
        ctx = await d.get(f"/v1/sessions/{sid}/context")
        assert ctx["summary_tier"] == "hot"
        assert ctx["messages"][-1]["content"] == ZH_12_TURNS[-1][1]
        masters = {redis_cluster.master_of_key(k).port for k in keys.all_of(sid)}
        assert len(masters) == 1
    # Sessions land on more than one master: the cluster really spreads them.
    assert len({redis_cluster.master_of_key(keys.state(sid)).port for sid in sids}) > 1

    # Losing the hot copy falls through to SQL and refills the cluster.
    for sid in sids[:2]:
        for key in keys.all_of(sid):
            with redis_cluster.master_of_key(key).client() as r:
                r.delete(key)
        assert (await d.get(f"/v1/sessions/{sid}/summary"))["tier"] == "warm"
        assert (await d.get(f"/v1/sessions/{sid}/summary"))["tier"] == "hot"

    closed = await d.http.post(f"/v1/sessions/{sids[0]}/close")
    assert closed.status == 200
    body = await closed.json()
    assert body["persisted"] is True
    assert body["cached"] is True
    text = (await d.get(f"/v1/sessions/{sids[0]}/summary"))["summary"]
    assert any(e in text for e in ZH_EARLY_EVIDENCE)

    deleted = await d.http.delete(f"/v1/sessions/{sids[0]}")
    assert deleted.status in (200, 204)
    # Only the recall postings' floor stays (a time, no content), in the session's slot.
    assert redis_cluster.count_keys(f"{keys.prefix}:{{{sids[0]}}}:*") == 1
    assert redis_cluster.count_keys(keys.recall_floor(sids[0])) == 1
    assert sql_rows(real_servers.mysql_url, "SELECT COUNT(*) FROM messages WHERE session_id=%s", sids[0]) == [(0,)]
    assert redis_cluster.count_keys(f"{keys.prefix}:*") > 0


async def test_killed_master_fails_over_and_loses_nothing(
    cluster_daemon: Daemon, redis_cluster: RedisClusterProcesses, real_servers: RealServers
) -> None:
    """SIGKILL of the master holding most of the sessions, mid-load: its replica is promoted, the
    daemon finds the new master by itself, reads answer from SQL meanwhile, every acknowledged
    message is in SQL exactly once, and the hot tier serves every session again."""
    d = cluster_daemon
    keys = Keys(d.settings.redis_key_prefix)
    first = new_sid()
    victim = redis_cluster.master_of_key(keys.state(first))
    replica = redis_cluster.replica_of(victim)
    assert replica is not None
    on_victim = [first]
    elsewhere: list[str] = []
    while len(on_victim) < 6 or len(elsewhere) < 2:
        sid = new_sid()
        if redis_cluster.master_of_key(keys.state(sid)) is victim:
            on_victim.append(sid)
        elif len(elsewhere) < 2:
            elsewhere.append(sid)
    gateways = [Gateway(sid) for sid in on_victim[:6] + elsewhere]

    def kill() -> None:
        victim.kill()
        redis_cluster.wait_promoted(replica)

    try:
        seen = await kill_master_under_load(d, real_servers, gateways, kill)
    finally:
        # The next test gets a whole cluster again: the old master rejoins as a replica.
        if not victim.alive:
            redis_cluster.restart(victim)
    assert any(t in ("warm", "cold") for t in seen.during), seen.during
    assert seen.after
