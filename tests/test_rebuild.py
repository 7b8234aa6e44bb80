"""`POST …/summary/rebuild` as a job (rebuilds.py), on the embedded default and on real Redis +
MariaDB, with the LLM faked at the wire: answered 202 at once whatever the LLM does, one job per
session at a time, run within SUMMARY_CONCURRENCY beside the background summaries, its state read
from the hot tier by any replica, a job whose process died told apart from one running, and every
failure an ended job with a reason, never an error of the task."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
import uuid
from typing import Any

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, await_job, llm_env, new_sid, play
from tests.helpers.servers import RealServers
from tiered_memory.http.keys import HOT_KEY
from tiered_memory.model import JobState, RebuildJob
from tiered_memory.testing import ZH_12_TURNS, Behaviour, FakeLlm


async def started(d: Daemon, sid: str) -> tuple[dict[str, Any], str]:
    """POST …/summary/rebuild: the 202's job and its Location."""
    resp = await d.http.post(f"/v1/sessions/{sid}/summary/rebuild")
    assert resp.status == 202, await resp.text()
    return await resp.json(), resp.headers["Location"]


def running(job: dict[str, Any]) -> bool:
    return bool(job["state"] != "queued")


async def test_a_rebuild_is_answered_at_once_and_runs_once_per_session(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """With the LLM taking 1.5 s a call and a 1 s request deadline, the POST is a 202 at once with
    the job's URL; the job goes queued → running → done (past the request deadline: it is no
    request); a second POST meanwhile answers the same job and the LLM sees one rebuild's calls;
    the done job says what it made and leads to the paginated slices; the next POST starts anew."""
    d = await make_daemon(
        llm_env(backend_env, fake_llm, REQUEST_TIMEOUT_MS="1000", LLM_TIMEOUT_SECONDS="10", SUMMARY_FORMAT="text"),
        quiet=fake_llm,
    )
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:7])
    await d.settle()
    version = (await d.get(f"/v1/sessions/{sid}/summary"))["version"]
    fake_llm.requests.clear()
    fake_llm.behaviour = Behaviour(delay_s=1.5)
    began = time.monotonic()
    job, url = await started(d, sid)
    assert time.monotonic() - began < 1.0
    assert (job["state"], job["started"], job["result"], job["error"]) == ("queued", True, None, None)
    assert url == job["url"] == f"/v1/sessions/{sid}/summary/rebuild/{job['job_id']}"
    going = await await_job(d, url, until=running)
    assert going["state"] == "running"
    assert going["started_at"] >= going["queued_at"]
    again, again_url = await started(d, sid)
    assert (again["job_id"], again["started"], again_url) == (job["job_id"], False, url)
    done = await await_job(d, url)
    assert done["state"] == "done", done
    assert done["ended_at"] >= done["started_at"]
    assert done["result"] == {
        "version": version + 1,
        "covered_turns": 7,
        "source": "llm",
        "slice_count": 2,
        "slices_url": f"/v1/sessions/{sid}/slices",
    }
    # COMPRESSION_BATCH_TURNS (6) turns per call: one rebuild's two calls, not two rebuilds' four.
    assert len(fake_llm.requests) == 2
    slices = (await d.get(done["result"]["slices_url"]))["slices"]
    assert [(s["from_turn"], s["to_turn"], s["summary_version"]) for s in slices] == [
        (1, 6, version + 1),
        (7, 7, version + 1),
    ]
    fake_llm.behaviour = Behaviour()
    third, third_url = await started(d, sid)
    assert third["started"] is True
    assert third["job_id"] != job["job_id"]
    assert (await await_job(d, third_url))["result"]["version"] == version + 2
    # The first job is still there for whoever polls it.
    assert (await d.get(url))["result"]["version"] == version + 1


async def test_rebuilds_and_summaries_share_summary_concurrency(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """With SUMMARY_CONCURRENCY=1, two sessions' rebuilds and a third's background summary never
    have more than one LLM call in flight at once, and all of them are done."""
    env = llm_env(backend_env, fake_llm, SUMMARY_CONCURRENCY="1", COMPRESSION_BATCH_TURNS="3", SUMMARY_FORMAT="text")
    d = await make_daemon(env | {"SUMMARY_EVERY_N_TURNS": "3"}, quiet=fake_llm)
    first, second, third = new_sid(), new_sid(), new_sid()
    for sid in (first, second):
        await play(d, sid, ZH_12_TURNS[:6])
    await play(d, third, ZH_12_TURNS[:2])
    await d.settle()
    fake_llm.requests.clear()
    fake_llm.max_in_flight = 0
    fake_llm.behaviour = Behaviour(delay_s=0.2)
    urls = [(await started(d, sid))[1] for sid in (first, second)]
    # The third session's cadence point: a background summary beside the rebuilds.
    await play(d, third, ZH_12_TURNS[2:3])
    jobs = [await await_job(d, url) for url in urls]
    await d.settle()
    assert [j["state"] for j in jobs] == ["done", "done"], jobs
    assert [j["result"]["slice_count"] for j in jobs] == [2, 2]
    assert (await d.get(f"/v1/sessions/{third}/summary"))["covered_turns"] == 3
    # Two calls a rebuild, and the third session's summary.
    assert len(fake_llm.requests) == 5
    assert fake_llm.max_in_flight == 1


async def test_a_job_whose_process_died_reads_lost(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """A job whose record says running but whose lease nobody renews (its process died) is the
    session's live job while the lease lasts, then reads `failed` with reason `lost`; the next
    POST starts a new job, which is done."""
    d = await make_daemon(backend_env)
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:2])
    assert d.app is not None
    now = time.time()
    dead = RebuildJob(secrets.token_hex(16), JobState.RUNNING, queued_at=now, started_at=now)
    assert await d.app[HOT_KEY].jobs.start(sid, dead, lease_s=0.5, ttl_s=60) is None
    url = f"/v1/sessions/{sid}/summary/rebuild/{dead.job_id}"
    assert (await d.get(url))["state"] == "running"
    job, _ = await started(d, sid)
    assert (job["job_id"], job["started"]) == (dead.job_id, False)
    await asyncio.sleep(0.7)
    lost = await d.get(url)
    assert (lost["state"], lost["ended_at"], lost["result"]) == ("failed", None, None)
    assert lost["error"]["code"] == "lost"
    fresh, fresh_url = await started(d, sid)
    assert fresh["started"] is True
    assert fresh["job_id"] != dead.job_id
    assert (await await_job(d, fresh_url))["state"] == "done"


async def test_a_failed_rebuild_ends_failed_with_its_reason(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """A rebuild that another writer overtakes (a summary written without the lock, as a replica
    cut from Redis does) ends `failed` with `conflict` and the other writer's summary stands; one
    whose session is deleted meanwhile ends `not_found`. Each is counted by outcome."""
    d = await make_daemon(
        llm_env(backend_env, fake_llm, LLM_TIMEOUT_SECONDS="10", SUMMARY_FORMAT="text"), quiet=fake_llm
    )
    raced, deleted = new_sid(), new_sid()
    for sid in (raced, deleted):
        await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    fake_llm.behaviour = Behaviour(delay_s=1.0)
    _, url = await started(d, raced)
    await await_job(d, url, until=running)
    prev, info = await d.store.get_summary(raced)
    assert prev is not None
    assert info is not None
    newer = dataclasses.replace(prev, version=prev.version + 1)
    assert await d.store.put_summary(raced, newer, user_id=info.user_id, turn_count=info.turn_count)
    failed = await await_job(d, url)
    assert (failed["state"], failed["error"]["code"], failed["result"]) == ("failed", "conflict", None)
    assert "try again" in failed["error"]["message"]
    stored, _ = await d.store.get_summary(raced)
    assert stored == newer

    _, url = await started(d, deleted)
    await await_job(d, url, until=running)
    assert (await d.http.delete(f"/v1/sessions/{deleted}")).status == 204
    # The session is gone, so is the way to its job: read it from the hot tier.
    assert d.app is not None
    for _ in range(200):
        job, _live = await d.app[HOT_KEY].jobs.read(deleted, url.rsplit("/", 1)[1])
        if job is not None and job.state.ended:
            break
        await asyncio.sleep(0.05)
    assert job is not None
    assert (job.state, job.reason) == (JobState.FAILED, "not_found")
    metrics = await (await d.http.get("/metrics")).text()
    assert 'tiered_memory_rebuilds_total{outcome="conflict"} 1.0' in metrics
    assert 'tiered_memory_rebuilds_total{outcome="not_found"} 1.0' in metrics


async def test_shutdown_cancels_a_rebuild_and_lets_its_lock_go(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """What the app's cleanup does past SHUTDOWN_GRACE_SECONDS: a rebuild stuck on the LLM is
    cancelled, reads `failed` with `cancelled`, and its summary lock is free."""
    d = await make_daemon(
        llm_env(backend_env, fake_llm, LLM_TIMEOUT_SECONDS="30", SUMMARY_FORMAT="text"), quiet=fake_llm
    )
    try:
        sid = new_sid()
        await play(d, sid, ZH_12_TURNS[:2])
        await d.settle()
        fake_llm.behaviour = Behaviour(delay_s=20.0)
        _, url = await started(d, sid)
        await await_job(d, url, until=running)
        assert await d.service.rebuilds.drain(0.1) == 1
        job = await d.get(url)
        assert (job["state"], job["error"]["code"]) == ("failed", "cancelled")
        assert d.app is not None
        hot = d.app[HOT_KEY]
        token = await hot.try_lock(sid, 5)
        assert token is not None
        await hot.unlock(sid, token)
        assert d.service.rebuilds.pending == 0
    finally:
        fake_llm.behaviour = Behaviour()


async def test_bad_input_and_unknown_jobs_change_nothing(daemon: Daemon) -> None:
    """An unknown session is a 404 before anything is queued; a malformed job id a 400 that names
    it, an unknown one (or another session's) a 404, each in the house error shape; a query
    parameter the route does not take is a 400 and starts nothing."""
    assert daemon.app is not None
    jobs = daemon.app[HOT_KEY].jobs
    unknown = new_sid()
    resp = await daemon.http.post(f"/v1/sessions/{unknown}/summary/rebuild")
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "not_found"
    assert await jobs.holder(unknown) is None
    sid, other = new_sid(), new_sid()
    for s in (sid, other):
        await play(daemon, s, ZH_12_TURNS[:1])
    resp = await daemon.http.post(f"/v1/sessions/{sid}/summary/rebuild?wait=1")
    assert resp.status == 400
    assert "unknown query parameter" in (await resp.json())["error"]["message"]
    assert await jobs.holder(sid) is None
    for bad in ("xyz", "A" * 32, "0" * 33, "0" * 31 + "g"):
        resp = await daemon.http.get(f"/v1/sessions/{sid}/summary/rebuild/{bad}")
        assert resp.status == 400, bad
        error = (await resp.json())["error"]
        assert (error["code"], error["message"].split(":")[0]) == ("invalid_input", "job_id")
    resp = await daemon.http.get(f"/v1/sessions/{sid}/summary/rebuild/{uuid.uuid4().hex}")
    assert resp.status == 404
    assert set((await resp.json())["error"]) == {"code", "message"}
    _, url = await started(daemon, sid)
    assert (await await_job(daemon, url))["state"] == "done"
    for path in (url.replace(sid, other), url.replace(sid, unknown)):
        assert (await daemon.http.get(path)).status == 404


async def test_the_rebuilds_a_process_keeps_are_bounded(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """A job holds no request, so the jobs a process keeps queued or running are bounded as its
    requests are (MAX_INFLIGHT_REQUESTS): past it a POST for another session is 503 `overloaded`
    with Retry-After and starts nothing, while the session's own live job is still answered
    (MAX_INFLIGHT_REQUESTS=0: neither is bounded)."""
    d = await make_daemon(
        llm_env(backend_env, fake_llm, MAX_INFLIGHT_REQUESTS="1", LLM_TIMEOUT_SECONDS="10", SUMMARY_FORMAT="text"),
        quiet=fake_llm,
    )
    busy, waiting = new_sid(), new_sid()
    for sid in (busy, waiting):
        await play(d, sid, ZH_12_TURNS[:2])
    await d.settle()
    fake_llm.behaviour = Behaviour(delay_s=1.0)
    job, url = await started(d, busy)
    refused = await d.http.post(f"/v1/sessions/{waiting}/summary/rebuild")
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    assert (await refused.json())["error"]["code"] == "overloaded"
    assert d.app is not None
    assert await d.app[HOT_KEY].jobs.holder(waiting) is None
    same, _ = await started(d, busy)
    assert (same["job_id"], same["started"]) == (job["job_id"], False)
    await await_job(d, url)
    fake_llm.behaviour = Behaviour()
    _, url = await started(d, waiting)
    assert (await await_job(d, url))["state"] == "done"
    await d.stop()
    # MAX_INFLIGHT_REQUESTS=0 bounds neither.
    unbounded = await make_daemon(backend_env | {"MAX_INFLIGHT_REQUESTS": "0"})
    sid = new_sid()
    await play(unbounded, sid, ZH_12_TURNS[:1])
    _, url = await started(unbounded, sid)
    assert (await await_job(unbounded, url))["state"] == "done"


@pytest.fixture
def shared_env(real_servers: RealServers, tmp_path: Any) -> dict[str, str]:
    """Two daemons' environment on one Redis key prefix and one database: two replicas."""
    return {
        "DATA_DIR": str(tmp_path / "data"),
        "SWEEP_INTERVAL_SECONDS": "3600",
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}",
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
    }


async def test_a_jobs_state_is_read_through_another_replica(
    shared_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """Two daemons on one Redis and one database: a job one started is read running and done
    through the other, which answers a POST with it rather than starting a second; a job that
    its daemon's shutdown cancelled reads `cancelled` through the other."""
    env = llm_env(shared_env, fake_llm, LLM_TIMEOUT_SECONDS="30", SHUTDOWN_GRACE_SECONDS="0", SUMMARY_FORMAT="text")
    one = await make_daemon(env, quiet=fake_llm)
    two = await make_daemon(env, quiet=fake_llm)
    try:
        sid = new_sid()
        await play(one, sid, ZH_12_TURNS[:4])
        await one.settle()
        fake_llm.requests.clear()
        fake_llm.behaviour = Behaviour(delay_s=1.0)
        job, url = await started(one, sid)
        assert (await await_job(two, url, until=running))["state"] == "running"
        same, _ = await started(two, sid)
        assert (same["job_id"], same["started"]) == (job["job_id"], False)
        done = await await_job(two, url)
        assert (done["state"], done["result"]["covered_turns"]) == ("done", 4)
        assert done == await one.get(url)
        assert len(fake_llm.requests) == 1
        assert two.service.rebuilds.pending == 0

        fake_llm.behaviour = Behaviour(delay_s=20.0)
        _, url = await started(one, sid)
        await await_job(two, url, until=running)
        await one.stop()
        job = await two.get(url)
        assert (job["state"], job["error"]["code"]) == ("failed", "cancelled")
    finally:
        fake_llm.behaviour = Behaviour()


async def test_without_the_hot_tier_a_rebuild_is_refused(
    real_servers: RealServers, tmp_path: Any, make_daemon: MakeDaemon
) -> None:
    """With Redis unreachable no rebuild starts (the one-per-session guard and the state other
    replicas read live there): the POST is 503 `unavailable` with Retry-After, as other writes
    that need the hot tier answer, and so is a job's URL; the session is otherwise served."""
    d = await make_daemon(
        {
            "DATA_DIR": str(tmp_path / "data"),
            "SWEEP_INTERVAL_SECONDS": "3600",
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "REDIS_TIMEOUT_MS": "200",
            "DATABASE_URL": real_servers.mysql_url,
            "AUTO_MIGRATE": "true",
        }
    )
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:2])
    for method, path in (
        ("POST", f"/v1/sessions/{sid}/summary/rebuild"),
        ("GET", f"/v1/sessions/{sid}/summary/rebuild/{uuid.uuid4().hex}"),
    ):
        resp = await d.http.request(method, path)
        assert resp.status == 503, (method, await resp.text())
        assert resp.headers["Retry-After"] == "1"
        error = (await resp.json())["error"]
        assert error == {"code": "unavailable", "message": "the hot tier is unavailable; retry"}
    assert d.service.rebuilds.pending == 0
    assert (await d.get(f"/v1/sessions/{sid}"))["turn_count"] == 2


async def test_a_rebuild_is_charged_its_session_and_rated_per_tenant(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """A rebuild reads its whole session into the LLM again: it is charged the session's text
    against the tenant's RATE_LIMITS (here 130 KB, 32 units against a bucket of 20: the next
    request waits it out, 429), and past REBUILD_RATE_LIMIT another tenant's second rebuild is
    refused (429, Retry-After) while its first was started. Before, a rebuild cost one request
    and could be asked again at once."""
    d = await make_daemon(backend_env | {"RATE_LIMITS": "big=20/s", "REBUILD_RATE_LIMIT": "1/m"})
    sid = new_sid()
    big = {"X-Tenant": "big"}
    texts = ("我想了解一下活力健的成分和服用方法。" * 60, "活力健含有多种维生素和矿物质，每天两次。" * 60)
    batch = [{"role": ("user", "assistant")[i % 2], "content": texts[i % 2], "message_id": f"m{i}"} for i in range(40)]
    resp = await d.http.post(f"/v1/sessions/{sid}/messages/batch", json={"messages": batch}, headers=big)
    assert resp.status == 201, await resp.text()
    await asyncio.sleep(2.5)  # the bucket full again
    resp = await d.http.post(f"/v1/sessions/{sid}/summary/rebuild", headers=big)
    assert resp.status == 202, await resp.text()
    after = await d.http.get(f"/v1/sessions/{sid}", headers=big)
    assert after.status == 429
    other = {"X-Tenant": "other"}
    first, second = new_sid(), new_sid()
    for s in (first, second):
        await d.http.post(f"/v1/sessions/{s}/messages", json={"role": "user", "content": "你好"}, headers=other)
    assert (await d.http.post(f"/v1/sessions/{first}/summary/rebuild", headers=other)).status == 202
    refused = await d.http.post(f"/v1/sessions/{second}/summary/rebuild", headers=other)
    assert refused.status == 429
    assert "REBUILD_RATE_LIMIT" in (await refused.json())["error"]["message"]
    assert float(refused.headers["Retry-After"]) > 30
