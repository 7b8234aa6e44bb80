"""The operator's commands as a subprocess with env vars, against the embedded default and real
Redis + MariaDB: inspect, rebuild (one session, every stale one), export (streamed, with
progress), purge (batched, hot keys too) and the daemon's scheduled purge (RETENTION_DAYS)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.helpers.daemon import Daemon, MakeDaemon, new_sid, play
from tests.helpers.processes import cli
from tests.helpers.servers import backend_environment, own_database
from tiered_memory.model import NewMessage, Role
from tiered_memory.testing import ZH_12_TURNS, free_port
from tiered_memory.tiers.sql.maintenance import SqlMaintenance
from tiered_memory.tiers.sql.schema import sessions

pytestmark = pytest.mark.slow


@pytest.fixture(params=["embedded", "real", "postgres"])
def backend_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The daemon's environment on the embedded default, Redis + MariaDB or Redis + PostgreSQL,
    with a database of this test's own: purge, its dry run and `rebuild --all-stale` work on
    every session of a database, and other suites' sessions (some written with timestamps decades
    old) must not be counted, whatever order the tests run in."""
    env = backend_environment(request.param, request, tmp_path)
    url = env.get("DATABASE_URL")
    if not url:
        yield env
        return
    with own_database(url) as own:
        yield env | {"DATABASE_URL": own}


def log_records(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


async def age(d: Daemon, sid: str, days: float) -> None:
    """Make a session look inactive for `days` days."""

    async def body(conn: AsyncConnection) -> None:
        await conn.execute(
            sessions.update().where(sessions.c.session_id == sid).values(last_activity=time.time() - days * 86_400)
        )

    await d.store.transaction(body)


def hot_keys(d: Daemon, sid: str) -> list[bytes]:
    """The session's Redis keys that hold anything of it: not the recall postings' floor, a time
    a delete leaves for HISTORY_TTL_SECONDS."""
    if not d.settings.redis_url:
        return []
    r = redis.Redis.from_url(d.settings.redis_url)
    try:
        keys = r.scan_iter(match=f"{d.settings.redis_key_prefix}:{{{sid}}}:*")
        return [k for k in keys if not k.endswith(b":recall-floor")]
    finally:
        r.close()


async def test_inspect_rebuild_and_export_a_session(daemon: Daemon) -> None:
    """inspect shows every tier, the summary, its versions, its watermark, slices and lag; rebuild recomputes
    the summary as a new version; export writes every message, the summary and the slices; an
    unknown session is exit status 1 for each."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:6])
    await daemon.post(sid, "user", "还有一个问题")
    await daemon.settle()
    env = daemon.env

    code, out, err = await asyncio.to_thread(cli, "inspect", sid, env=env)
    assert code == 0, err
    report = json.loads(out)
    assert (report["turn_count"], report["message_count"], report["covered_turns"], report["lag_turns"]) == (
        6,
        13,
        6,
        0,
    )
    assert report["tiers"]["warm"] == {"present": True}
    assert report["tiers"]["cold"] == {"present": True, "messages": 13}
    assert report["tiers"]["hot"]["visible"] is bool(daemon.settings.redis_url)
    if daemon.settings.redis_url:
        assert report["tiers"]["hot"]["summary_version"] == report["summary"]["version"]
    assert [(s["from_turn"], s["to_turn"]) for s in report["slices"]] == [(1, 3), (4, 6)]
    assert report["summary"]["text"]
    assert [v["version"] for v in report["versions"]] == list(range(report["summary"]["version"], 0, -1))
    assert report["versions"][0]["text"] == report["summary"]["text"]

    code, out, err = await asyncio.to_thread(cli, "rebuild", sid, env=env)
    assert code == 0, err
    rebuilt = json.loads(out)
    assert (rebuilt["covered_turns"], rebuilt["version"]) == (6, report["summary"]["version"] + 1)
    stored_summary, _ = await daemon.store.get_summary(sid)
    assert stored_summary is not None
    assert stored_summary.version == rebuilt["version"]
    if daemon.settings.redis_url:
        # Redis is shared: the daemon answers the rebuilt summary at once. (The embedded daemon's
        # in-process cache is its own: it answers the rebuilt one once its copy expires.)
        assert (await daemon.get(f"/v1/sessions/{sid}/summary"))["version"] == rebuilt["version"]

    target = Path(daemon.env["DATA_DIR"]).parent / "export.json"
    code, out, err = await asyncio.to_thread(cli, "export", sid, "--output", str(target), env=env)
    assert code == 0, err
    document = json.loads(target.read_text(encoding="utf-8"))
    stored = [m for pair in ZH_12_TURNS[:6] for m in pair] + ["还有一个问题"]
    assert [m["content"] for m in document["messages"]] == stored
    assert [m["seq"] for m in document["messages"]] == list(range(1, 14))
    assert document["summary"]["version"] == rebuilt["version"]
    assert document["session"]["turn_count"] == 6
    assert len(document["slices"]) == rebuilt["slices"]

    for command in ("inspect", "rebuild", "export"):
        code, out, err = await asyncio.to_thread(cli, command, new_sid(), env=env)
        assert (code, out) == (1, ""), command
        assert "does not exist" in err


async def test_export_of_a_long_session_is_streamed_with_progress(daemon: Daemon) -> None:
    """A session of 1,200 messages (more than two pages) exports whole, in order, to stdout; off a
    terminal progress is `progress` log lines ending with done = total, on one a redrawn bar."""
    sid = new_sid()
    for i in range(600):
        for role in (Role.USER, Role.ASSISTANT):
            new = NewMessage(sid, role, f"{role.value} {i}", f"m-{i}-{role.value}", "u-long")
            await daemon.store.append(new, now=time.time())
    code, out, err = await asyncio.to_thread(cli, "export", sid, env=daemon.env)
    assert code == 0, err
    document = json.loads(out)
    assert [m["seq"] for m in document["messages"]] == list(range(1, 1201))
    assert document["messages"][-1]["content"] == "assistant 599"
    progress = [r for r in log_records(err) if r["event"] == "progress"]
    assert progress[-1] | {"rate_per_s": 0, "elapsed_s": 0} == {
        **progress[-1],
        "operation": "export",
        "done": 1200,
        "total": 1200,
        "final": True,
        "rate_per_s": 0,
        "elapsed_s": 0,
    }
    code, out, err = await asyncio.to_thread(cli, "export", sid, env=daemon.env, stderr_tty=True)
    assert code == 0
    assert len(json.loads(out)["messages"]) == 1200
    assert "\rexport [##############################] 1200/1200" in err


async def test_rebuild_all_stale_catches_up_every_lagging_summary(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """Sessions recorded while summaries were off (window mode) lag behind; `rebuild --all-stale`
    summarizes each of them, and a second run finds nothing to do."""
    window = await make_daemon(backend_env | {"MEMORY_MODE": "window"})
    sids = [new_sid() for _ in range(3)]
    for sid in sids:
        await play(window, sid, ZH_12_TURNS[:4])
    await window.stop()
    code, out, err = await asyncio.to_thread(cli, "rebuild", "--all-stale", env=backend_env)
    assert code == 0, err
    result = json.loads(out)
    assert result["outcomes"].get("written", 0) >= 3
    d = await make_daemon(backend_env)
    for sid in sids:
        summary = await d.get(f"/v1/sessions/{sid}/summary")
        assert (summary["tier"], summary["covered_turns"]) in (("hot", 4), ("warm", 4))
    await d.stop()
    progress = [r for r in log_records(err) if r["event"] == "progress"]
    assert progress[-1]["final"] is True
    assert progress[-1]["done"] == progress[-1]["total"] == result["sessions"]
    code, out, err = await asyncio.to_thread(cli, "rebuild", "--all-stale", env=backend_env)
    assert (code, json.loads(out)) == (0, {"sessions": 0, "outcomes": {}})


async def test_purge_removes_inactive_sessions_in_batches(daemon: Daemon) -> None:
    """`purge --older-than 5` deletes the messages, summary, slices, session row and hot keys of
    the sessions inactive for more than 5 days, a few rows per transaction, and nothing else;
    `--dry-run` only counts."""
    old, older, fresh = new_sid(), new_sid(), new_sid()
    for sid in (old, older, fresh):
        await play(daemon, sid, ZH_12_TURNS[:3])
    await daemon.settle()
    assert hot_keys(daemon, old) or not daemon.settings.redis_url
    await age(daemon, old, 6)
    await age(daemon, older, 30)

    code, out, err = await asyncio.to_thread(cli, "purge", "--older-than", "5", "--dry-run", env=daemon.env)
    assert code == 0, err
    assert json.loads(out) | {"before": 0} == {"dry_run": True, "sessions": 2, "messages": 12, "before": 0}
    assert await daemon.store.count_messages(old) == 6

    code, out, err = await asyncio.to_thread(cli, "purge", "--older-than", "5", "--batch", "2", env=daemon.env)
    assert code == 0, err
    report = json.loads(out)
    assert (report["sessions"], report["messages"], report["slices"], report["reactivated"]) == (2, 12, 2, 0)
    for sid in (old, older):
        assert await daemon.store.get_summary(sid) == (None, None)
        assert await daemon.store.count_messages(sid) == 0
        assert await daemon.store.slices(sid) == []
        assert hot_keys(daemon, sid) == []
    assert await daemon.store.count_messages(fresh) == 6
    assert (await daemon.get(f"/v1/sessions/{fresh}/summary"))["covered_turns"] == 3
    progress = [r for r in log_records(err) if r["event"] == "progress"]
    assert (progress[-1]["done"], progress[-1]["total"]) == (2, 2)

    code, _out, err = await asyncio.to_thread(cli, "purge", "--older-than", "0", env=daemon.env)
    assert code == 2
    assert "greater than 0" in err


async def test_a_session_active_again_part_way_through_its_purge_is_kept(daemon: Daemon) -> None:
    """An append that lands between two batches of a purge stops it: the session keeps its row,
    its summary and its newer messages (only its oldest, older than the cutoff, are gone)."""
    sid = new_sid()
    for i in range(150):
        await daemon.store.append(NewMessage(sid, Role.USER, f"问题{i}", f"m-{i}"), now=time.time())
    await age(daemon, sid, 10)
    maintenance = SqlMaintenance(daemon.store, batch=1)
    purging = asyncio.create_task(maintenance.purge_session(sid, before=time.time() - 86_400))
    for _ in range(3000):
        if await daemon.store.count_messages(sid) < 150:
            break
        await asyncio.sleep(0.001)
    else:
        raise AssertionError("the purge deleted nothing within 3000 looks")
    await daemon.post(sid, "user", "我又回来了", message_id="m-back")
    done = await purging
    assert not done.complete
    info = await daemon.get(f"/v1/sessions/{sid}")
    assert info["message_count"] == 151
    left = await daemon.store.count_messages(sid)
    assert 1 <= left < 151
    newest = await daemon.store.messages_by_seq(sid, first_seq=151, last_seq=151, limit=1)
    assert [m.content for m in newest] == ["我又回来了"]


async def test_the_daemon_purges_on_schedule_with_retention_days(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """With RETENTION_DAYS=7 the daemon's first retention pass (at start-up) deletes a session
    inactive for 8 days and keeps one inactive for 6."""
    d = await make_daemon(backend_env)
    stale, recent = new_sid(), new_sid()
    for sid in (stale, recent):
        await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    await age(d, stale, 8)
    await age(d, recent, 6)
    await d.stop()
    kept = await make_daemon(backend_env | {"RETENTION_DAYS": "7"})
    for _ in range(600):
        if await kept.store.get_session(stale) is None:
            break
        await asyncio.sleep(0.05)
    assert await kept.store.get_session(stale) is None
    assert await kept.store.count_messages(stale) == 0
    assert hot_keys(kept, stale) == []
    assert await kept.store.count_messages(recent) == 6


async def test_one_replica_purges_at_a_time(daemon: Daemon) -> None:
    """The scheduled pass skips while another replica holds the retention lock, and purges once
    the lock is free."""
    from tiered_memory.core.retention import _LOCK_ID, RetentionJob
    from tiered_memory.http.keys import HOT_KEY

    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    await age(daemon, sid, 3)
    assert daemon.app is not None
    hot = daemon.app[HOT_KEY]
    job = RetentionJob(SqlMaintenance(daemon.store), hot, days=2)
    token = await hot.try_lock(_LOCK_ID, 60)
    assert token is not None
    await job.run()
    assert await daemon.store.count_messages(sid) == 4
    await hot.unlock(_LOCK_ID, token)
    await job.run()
    assert await daemon.store.get_session(sid) is None


def test_the_retention_lock_is_not_a_session_lock() -> None:
    """The scheduled purge's lock id can never be a session's: session ids exclude '#'."""
    from tiered_memory.core.retention import _LOCK_ID
    from tiered_memory.http.input import SESSION_ID as _SESSION_ID

    assert not _SESSION_ID.fullmatch(_LOCK_ID)


async def test_check_reports_each_store(daemon: Daemon, tmp_path: Path) -> None:
    """`tiered-memory check` asks the stores themselves: 0 when the hot tier and SQL answer and
    the schema is current; 1, saying which, when Redis is unreachable or the database was never
    migrated."""
    code, out, err = await asyncio.to_thread(cli, "check", env=daemon.env)
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] is True
    assert report["hot"]["status"] == report["sql"]["status"] == "ok"
    assert report["sql"]["schema_version"] == report["sql"]["expected_version"]

    unmigrated = daemon.env | {"DATABASE_URL": "", "DATA_DIR": str(tmp_path / "empty"), "AUTO_MIGRATE": "false"}
    code, out, _ = await asyncio.to_thread(cli, "check", env=unmigrated)
    assert code == 1
    assert json.loads(out)["sql"]["status"] in ("schema_behind", "unavailable")

    if daemon.settings.redis_url:
        no_redis = daemon.env | {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
        code, out, _ = await asyncio.to_thread(cli, "check", env=no_redis)
        assert code == 1
        report = json.loads(out)
        assert report["hot"]["status"] == "unavailable"
        assert report["sql"]["status"] == "ok"
