"""A tier that is down costs latency, never an acknowledged message or a 500."""

from __future__ import annotations

import pymysql
import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, TextWorkers, new_sid, play
from tests.helpers.servers import RealServers
from tiered_memory.errors import ConfigError
from tiered_memory.testing import ZH_12_TURNS, ZH_EARLY_EVIDENCE


async def test_sql_down_refuses_appends_with_retry_after(make_daemon: MakeDaemon) -> None:
    """With the SQL server unreachable an append is a 503 with Retry-After (nothing acknowledged),
    and /readyz reports the SQL tier degraded."""
    d = await make_daemon({"DATABASE_URL": "mysql+aiomysql://root@127.0.0.1:1/test", "SQL_TIMEOUT_MS": "1000"})
    resp = await d.http.post(f"/v1/sessions/{new_sid()}/messages", json={"role": "user", "content": "你好"})
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"
    assert (await resp.json())["error"]["code"] == "sql_unavailable"
    ready = await d.http.get("/readyz")
    assert ready.status == 503
    assert (await ready.json())["tiers"] == {"hot": "ok", "sql": "degraded"}
    summary = await d.get(f"/v1/sessions/{new_sid()}/summary")
    assert summary["tier"] == "none"


async def test_redis_down_falls_through_to_sql(real_servers: RealServers, make_daemon: MakeDaemon) -> None:
    """With Redis unreachable, appends still commit to SQL, summaries are still made and read
    from the warm tier, context comes from SQL, recall from postings the process keeps, and the
    failures are counted."""
    d = await make_daemon(
        {
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "REDIS_TIMEOUT_MS": "200",
            "DATABASE_URL": real_servers.mysql_url,
            "AUTO_MIGRATE": "true",
            "SWEEP_INTERVAL_SECONDS": "3600",
        }
    )
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    answer = await d.get(f"/v1/sessions/{sid}/summary")
    assert answer["tier"] == "warm"
    assert answer["covered_turns"] == 3
    for evidence in ZH_EARLY_EVIDENCE:
        assert evidence in answer["summary"]
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    assert ctx["summary_tier"] == "warm"
    assert ctx["messages"][-1]["content"] == ZH_12_TURNS[2][1]
    # Recall: the process keeps postings of its own, caught up from SQL.
    found = (await d.get(f"/v1/sessions/{sid}/recall?q=活力健"))["matches"]
    assert found
    assert any("活力健" in m["content"] for m in found[0]["messages"])
    ready = await d.http.get("/readyz")
    assert ready.status == 200
    assert (await ready.json())["tiers"] == {"hot": "degraded", "sql": "ok"}
    metrics = await (await d.http.get("/metrics")).text()
    assert 'tiered_memory_tier_errors_total{operation="append",tier="hot"} 6.0' in metrics


async def test_delete_with_redis_down_asks_for_a_retry(real_servers: RealServers, make_daemon: MakeDaemon) -> None:
    """DELETE clears SQL, and answers 503 when Redis could not be cleared, so a deleted
    conversation is never left readable from the cache behind a 204."""
    d = await make_daemon(
        {
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "REDIS_TIMEOUT_MS": "200",
            "DATABASE_URL": real_servers.mysql_url,
            "AUTO_MIGRATE": "true",
        }
    )
    sid = new_sid()
    await d.post(sid, "user", "你好")
    resp = await d.http.delete(f"/v1/sessions/{sid}")
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"
    # A fixed message: the driver's error text (the Redis address) stays in the log.
    assert (await resp.json())["error"] == {"code": "unavailable", "message": "the hot tier is unavailable; retry"}
    assert (await d.http.get(f"/v1/sessions/{sid}")).status == 404


async def test_unmigrated_database_stops_start_up(real_servers: RealServers, text_workers: TextWorkers) -> None:
    """On a reachable MySQL database without the schema (and AUTO_MIGRATE off) start-up stops with
    a message naming what to do, instead of answering 500 to every write."""
    db = f"tm_test_{real_servers.run_id}_nomig"
    admin = pymysql.connect(host="127.0.0.1", user="root", password="")
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
    try:
        d = Daemon({"DATABASE_URL": real_servers.mysql_url.rsplit("/", 1)[0] + f"/{db}"}, text_workers)
        with pytest.raises(ConfigError, match="run `tiered-memory migrate`"):
            await d.start()
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        admin.close()
