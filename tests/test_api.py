"""The HTTP API end to end, on the embedded default and on real Redis + MariaDB."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import event as sa_event
from yarl import URL

from tests.helpers.daemon import Daemon, MakeDaemon, memory_of, new_sid, play, sql_statements
from tiered_memory.http.keys import HOT_KEY
from tiered_memory.model import Caller, NewMessage, Role, SessionKey, Summary, SummarySource
from tiered_memory.testing import ZH_12_TURNS, ZH_EARLY_EVIDENCE
from tiered_memory.tiers.redis.keys import Keys

_JSON = {"Content-Type": "application/json"}


async def test_summaries_are_scheduled_every_third_turn(daemon: Daemon) -> None:
    """A 12-turn conversation schedules summaries at turns 3, 6, 9 and 12, and the summary ends
    up covering all 12 turns."""
    sid = new_sid()
    covered = []
    for i, (user, assistant) in enumerate(ZH_12_TURNS, start=1):
        r_user = await daemon.post(sid, "user", user)
        assert r_user["turn_count"] == i - 1
        assert r_user["summary_scheduled"] is False
        r = await daemon.post(sid, "assistant", assistant)
        assert r["turn_count"] == i
        assert r["summary_scheduled"] is (i % 3 == 0)
        await daemon.settle()
        answer = await daemon.get(f"/v1/sessions/{sid}/summary")
        covered.append((answer["tier"], answer["covered_turns"]))
    # Before the first summary, the cold extraction covers every turn so far.
    assert covered == [("cold", 1), ("cold", 2)] + [("hot", 3 * (i // 3)) for i in range(3, 13)]
    answer = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert answer["tier"] == "hot"
    assert answer["turn_count"] == 12
    for evidence in ZH_EARLY_EVIDENCE:
        assert evidence in answer["summary"]


async def test_tier_walk_hot_warm_hot_cold(daemon: Daemon) -> None:
    """Hot answers first; after the hot tier is lost the warm row answers and is backfilled, so
    the next read is hot again; with the warm row gone too, the cold extraction still carries the
    early entities; a session never seen answers none."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS)
    await daemon.settle()
    hot = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert hot["tier"] == "hot"

    await daemon.flush_hot()
    warm = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert warm["tier"] == "warm"
    assert warm["summary"] == hot["summary"]
    assert warm["covered_turns"] == 12
    again = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert again["tier"] == "hot"
    assert again["summary"] == hot["summary"]

    await daemon.store.delete_summary(sid)
    await daemon.flush_hot()
    cold = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert cold["tier"] == "cold"
    assert cold["turn_count"] == 12
    for evidence in ZH_EARLY_EVIDENCE:
        assert evidence in cold["summary"]

    none = await daemon.get(f"/v1/sessions/{new_sid()}/summary")
    assert none == none | {"tier": "none", "summary": None, "turn_count": 0}


async def test_restart_keeps_summary_and_context(daemon: Daemon) -> None:
    """A gateway reconnecting after a daemon restart gets the same summary and recent turns."""
    sid = new_sid()
    # Settled before turn 7: a summary started at turn 6 covers every turn completed by the time
    # it runs, so with turn 7 posted meanwhile it covered 7 turns on a slow machine, 6 on a fast one.
    await play(daemon, sid, ZH_12_TURNS[:6])
    await daemon.settle()
    await play(daemon, sid, ZH_12_TURNS[6:7])
    await daemon.settle()
    before = await daemon.get(f"/v1/sessions/{sid}/summary")
    ctx_before = await daemon.get(f"/v1/sessions/{sid}/context")
    await daemon.restart()
    after = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert after["summary"] == before["summary"]
    # The pass scheduled at turn 6 may start after turn 7 is committed and cover it too.
    assert after["covered_turns"] == before["covered_turns"] >= 6
    ctx_after = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx_after["messages"] == ctx_before["messages"]


async def test_context_is_prompt_ordered(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """The context is a system message with the summary, then the last KEEP_RECENT_TURNS turns
    alternating user/assistant from a user message; the same with the hot tier lost."""
    daemon = await make_daemon(backend_env | {"CONTEXT_OLDER_TURNS": "false"})
    await _prompt_ordered(daemon)


async def _prompt_ordered(daemon: Daemon) -> None:
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:8])
    await daemon.post(sid, "user", "还有别的推荐吗？")
    await daemon.settle()
    for attempt in ("hot", "after-flush"):
        ctx = await daemon.get(f"/v1/sessions/{sid}/context")
        msgs = ctx["messages"]
        assert msgs[0]["role"] == "system", attempt
        assert memory_of(msgs[0]["content"]).startswith("[历史对话摘要]"), attempt
        roles = [m["role"] for m in msgs[1:]]
        assert roles == ["user", "assistant"] * 3 + ["user"], attempt
        assert msgs[-1]["content"] == "还有别的推荐吗？"
        assert msgs[1]["content"] == ZH_12_TURNS[5][0]
        assert ctx["turn_count"] == 8
        await daemon.flush_hot()


async def test_context_respects_max_chars(daemon: Daemon) -> None:
    """max_chars bounds the total content; the newest turn is kept before older ones."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:6])
    await daemon.settle()
    ctx = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=120")
    total = sum(len(m["content"]) for m in ctx["messages"])
    assert total <= 120
    assert ctx["messages"][-1]["content"] == ZH_12_TURNS[5][1]
    bad = await daemon.http.get(f"/v1/sessions/{sid}/context?max_chars=abc")
    assert bad.status == 400
    assert "max_chars" in (await bad.json())["error"]["message"]


async def test_close_persists_to_both_tiers_once(daemon: Daemon) -> None:
    """Close summarizes uncovered turns, writes SQL and the hot tier, and a second close changes nothing."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:4])
    await daemon.settle()
    assert (await daemon.get(f"/v1/sessions/{sid}/summary"))["covered_turns"] == 3
    resp = await daemon.http.post(f"/v1/sessions/{sid}/close")
    assert resp.status == 200
    assert await resp.json() == {"session_id": sid, "persisted": True, "cached": True, "turn_count": 4}
    hot = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert hot["tier"] == "hot"
    assert hot["covered_turns"] == 4
    warm, _info = await daemon.store.get_summary(sid)
    assert warm is not None
    assert warm.covered_turns == 4
    assert warm.version == hot["version"]

    again = await daemon.http.post(f"/v1/sessions/{sid}/close")
    assert await again.json() == {"session_id": sid, "persisted": True, "cached": True, "turn_count": 4}
    warm2, _ = await daemon.store.get_summary(sid)
    assert warm2 == warm
    info = await daemon.get(f"/v1/sessions/{sid}")
    assert info["closed"] is True
    assert info["turn_count"] == 4


async def test_a_close_locked_out_by_another_writer_caches_what_it_wrote(daemon: Daemon) -> None:
    """Another process holds the summary lock and has written SQL, not yet Redis, when close
    gives up waiting for it: close still answers `cached` like every later close, because it
    copies SQL's summary into the hot tier (which keeps whatever newer version that writer
    caches after)."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:4])
    await daemon.settle()
    assert daemon.app is not None
    hot = daemon.app[HOT_KEY]
    token = await hot.try_lock(sid, 30)
    assert token
    try:
        prev, info = await daemon.store.get_summary(sid)
        assert prev is not None
        assert info is not None
        theirs = dataclasses.replace(prev, version=prev.version + 1, covered_turns=info.turn_count)
        assert await daemon.store.put_summary(sid, theirs, user_id=None, turn_count=info.turn_count)
        first = await (await daemon.http.post(f"/v1/sessions/{sid}/close")).json()
    finally:
        await hot.unlock(sid, token)
    assert first == {"session_id": sid, "persisted": True, "cached": True, "turn_count": 4}
    cached = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert (cached["tier"], cached["version"]) == ("hot", theirs.version)
    again = await (await daemon.http.post(f"/v1/sessions/{sid}/close")).json()
    assert again == first


async def test_close_of_a_short_session_persists_nothing(daemon: Daemon) -> None:
    """Below SUMMARY_MIN_TURNS_TO_PERSIST (2) turns, close marks the session closed and stores no summary."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:1])
    body = await (await daemon.http.post(f"/v1/sessions/{sid}/close")).json()
    assert body == {"session_id": sid, "persisted": False, "cached": False, "turn_count": 1}
    summary, _ = await daemon.store.get_summary(sid)
    assert summary is None
    missing = await daemon.http.post(f"/v1/sessions/{new_sid()}/close")
    assert missing.status == 404


async def test_append_is_idempotent_by_message_id(daemon: Daemon) -> None:
    """A retry with the same message_id answers 200 with the first result and stores nothing twice;
    the same id with other content is a 409."""
    sid = new_sid()
    first = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "你好", "message_id": "m-1"}
    )
    assert first.status == 201
    retry = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "你好", "message_id": "m-1"}
    )
    assert retry.status == 200
    assert await retry.json() == await first.json()
    clash = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "别的", "message_id": "m-1"}
    )
    assert clash.status == 409
    assert await daemon.store.count_messages(sid) == 1
    info = await daemon.get(f"/v1/sessions/{sid}")
    assert info["message_count"] == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "moderator", "content": "x"}, "role"),
        ({"role": "user", "content": ""}, "content"),
        ({"role": "user", "content": 5}, "content"),
        ({"role": "user"}, "content"),
        ({"role": "user", "content": "x", "channel": "fax"}, "channel"),
        ({"role": "user", "content": "x", "colour": "red"}, "colour"),
        ({"role": "user", "content": "x", "message_id": "has space"}, "message_id"),
        ({"role": "user", "content": "x", "message_id": "trailing-newline\n"}, "message_id"),
        ({"role": "user", "content": "x", "user_id": ""}, "user_id"),
        ({"role": "user", "content": "x", "user_id": "victim "}, "user_id"),
        ({"role": "user", "content": "x", "user_id": " victim"}, "user_id"),
        ({"role": "user", "content": "x", "user_id": "vic\u0007tim"}, "user_id"),
        (["not", "an", "object"], "body"),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(daemon: Daemon, body: Any, field: str) -> None:
    """Malformed appends get a 400 naming the field, and no session is created."""
    sid = new_sid()
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages", json=body)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "invalid_input"
    assert field in error["message"]
    assert (await daemon.http.get(f"/v1/sessions/{sid}")).status == 404


async def test_bad_session_id_and_non_json(daemon: Daemon) -> None:
    """A session id that could break key hash tags or that names a path segment (. and ..), or a
    body that is not JSON, is a 400."""
    resp = await daemon.http.post("/v1/sessions/a{b}/messages", json={"role": "user", "content": "x"})
    assert resp.status == 400
    assert "session_id" in (await resp.json())["error"]["message"]
    resp = await daemon.http.post(f"/v1/sessions/{new_sid()}/messages", data=b"{oops", headers=_JSON)
    assert resp.status == 400
    for dots in ("%2E", "%2E%2E"):
        # Percent-encoded: written plainly, the segment is normalized away before routing.
        url = URL(f"/v1/sessions/{dots}/messages", encoded=True)
        resp = await daemon.http.post(url, json={"role": "user", "content": "x"})
        assert resp.status == 400, dots
        assert "session_id" in (await resp.json())["error"]["message"]
    resp = await daemon.http.get("/v1/nothing-here")
    assert resp.status == 404
    assert "error" in await resp.json()


async def test_other_user_is_forbidden(daemon: Daemon) -> None:
    """A session belongs to the user_id that created it; another user_id cannot append to it."""
    sid = new_sid()
    await daemon.post(sid, "user", "hello", user_id="alice")
    resp = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "hi", "user_id": "mallory"}
    )
    assert resp.status == 403
    assert (await daemon.get(f"/v1/sessions/{sid}"))["message_count"] == 1


async def _hot_keys(daemon: Daemon, sid: SessionKey) -> list[str]:
    """The hot tier's keys of a session: Redis keys, or the parts of the in-process entry."""
    if daemon.settings.redis_url:
        r = redis.Redis.from_url(daemon.settings.redis_url)
        try:
            return sorted(k.decode() for k in r.scan_iter(match=f"{daemon.settings.redis_key_prefix}:{{{sid}}}:*"))
        finally:
            r.close()
    assert daemon.app is not None
    tier = daemon.app[HOT_KEY]
    hot = await tier.read_session(sid)
    indexed = (await tier.postings.read(sid, ())).last_seq
    parts = {
        "summary": hot.summary,
        "recent": hot.recent or None,
        "state": hot.message_count,
        Keys().recall(sid).rsplit(":", 1)[-1]: indexed or None,  # named as on Redis
    }
    return sorted(name for name, value in parts.items() if value is not None)


async def test_delete_removes_every_tier(daemon: Daemon) -> None:
    """DELETE removes messages, the summary row, its slices and every hot key; reads then find
    nothing; repeating it is still a 204."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:3])
    await daemon.settle()
    assert len(await daemon.store.slices(sid)) == 1
    assert (await daemon.store.get_summary(sid))[0] is not None
    # The recall postings are added in the background, after the appends are answered.
    for _ in range(100):
        if len(await _hot_keys(daemon, sid)) == 4:
            break
        await asyncio.sleep(0.02)
    assert sorted(k.rsplit(":", 1)[-1] for k in await _hot_keys(daemon, sid)) == [
        "recall-s2",
        "recent",
        "state",
        "summary",
    ]
    assert (await daemon.http.delete(f"/v1/sessions/{sid}")).status == 204
    # What stays is the postings' floor (a time, no content): it refuses a catch-up that read the
    # deleted messages before the delete, for HISTORY_TTL_SECONDS.
    assert await _hot_keys(daemon, sid) in ([], [f"{daemon.settings.redis_key_prefix}:{{{sid}}}:recall-floor"])
    assert await daemon.store.get_summary(sid) == (None, None)
    assert await daemon.store.slices(sid) == []
    assert await daemon.store.count_messages(sid) == 0
    assert (await daemon.http.get(f"/v1/sessions/{sid}")).status == 404
    assert (await daemon.get(f"/v1/sessions/{sid}/summary"))["tier"] == "none"
    assert (await daemon.get(f"/v1/sessions/{sid}/context"))["messages"] == []
    assert (await daemon.http.delete(f"/v1/sessions/{sid}")).status == 204
    # What stays is the postings' floor (a time, no content): it refuses a catch-up that read the
    # deleted messages before the delete, for HISTORY_TTL_SECONDS.
    assert await _hot_keys(daemon, sid) in ([], [f"{daemon.settings.redis_key_prefix}:{{{sid}}}:recall-floor"])


async def test_health_ready_and_metrics(daemon: Daemon) -> None:
    """healthz answers, readyz reports both tiers ok, and /metrics exports the documented families."""
    assert (await daemon.get("/healthz"))["status"] == "ok"
    ready = await daemon.get("/readyz")
    assert ready == {"status": "ok", "tiers": {"hot": "ok", "sql": "ok"}}
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:3])
    await daemon.settle()
    await daemon.get(f"/v1/sessions/{sid}/summary")
    text = await (await daemon.http.get("/metrics")).text()
    for name in (
        "tiered_memory_request_duration_seconds_bucket",
        'tiered_memory_summary_loads_total{tier="hot"}',
        'tiered_memory_summarizations_total{outcome="ok",source="deterministic"}',
        "tiered_memory_summarization_duration_seconds_bucket",
        "tiered_memory_summary_lag_turns_bucket",
        "tiered_memory_pending_summarizations",
        'tiered_memory_appends_total{result="created",role="user"}',
    ):
        assert name in text, name
    assert 'route="/v1/sessions/{session_id}/messages"' in text


async def test_idle_sessions_are_closed_by_the_sweeper(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """A session nobody closes is closed (and its summary persisted) after SESSION_IDLE_CLOSE_SECONDS."""
    d = await make_daemon(backend_env | {"SESSION_IDLE_CLOSE_SECONDS": "1", "SWEEP_INTERVAL_SECONDS": "0.2"})
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:2])
    for _ in range(200):
        info = await d.get(f"/v1/sessions/{sid}")
        if info["closed"]:
            break
        await asyncio.sleep(0.05)
    assert info["closed"] is True
    assert info["covered_turns"] == 2


async def test_due_summaries_are_done_at_start_up(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """Turns committed while no summarizer ran (a crash) are summarized by the next start-up."""
    d = await make_daemon(backend_env | {"ENABLE_CONVERSATION_SUMMARY": "false"})
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:6])
    await d.stop()
    restarted = await make_daemon(backend_env | {"SWEEP_INTERVAL_SECONDS": "3600"})
    assert (await _stored_summary(restarted, sid))["covered_turns"] == 6


async def _stored_summary(d: Daemon, sid: str) -> dict[str, Any]:
    for _ in range(300):
        await d.settle()
        answer = await d.get(f"/v1/sessions/{sid}/summary")
        if answer["tier"] in ("hot", "warm"):
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError(f"no stored summary after restart: {answer}")


async def test_greetings_and_split_replies_complete_no_turn(daemon: Daemon) -> None:
    """Only an assistant message answering a user message completes a turn: a greeting before any
    question, or a second part of a reply, does not count and schedules nothing."""
    sid = new_sid()
    greeting = await daemon.post(sid, "assistant", "您好，我是小助手，请问有什么可以帮您？")
    assert greeting["turn_count"] == 0
    assert greeting["summary_scheduled"] is False
    counts = []
    for user, assistant in ZH_12_TURNS[:3]:
        counts.append((await daemon.post(sid, "user", user))["turn_count"])
        counts.append((await daemon.post(sid, "assistant", assistant))["turn_count"])
        counts.append((await daemon.post(sid, "assistant", "还有其他问题吗？"))["turn_count"])
    assert counts == [0, 1, 1, 1, 2, 2, 2, 3, 3]
    await daemon.settle()
    answer = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert answer["covered_turns"] == 3
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][0] == {"role": "user", "content": ZH_12_TURNS[0][0]}


async def test_context_is_hot_again_after_a_hot_loss(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """After the hot tier is lost, the first context read refills it from SQL (summary, recent
    turns and counters) and the next one is answered by the hot tier without any SQL statement
    (when the budget leaves no room for the older turns, which only SQL has)."""
    daemon = await make_daemon(backend_env | {"CONTEXT_OLDER_TURNS": "false"})
    await _hot_again(daemon)


async def _hot_again(daemon: Daemon) -> None:
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:7])
    await daemon.settle()
    expected = await daemon.get(f"/v1/sessions/{sid}/context")
    await daemon.flush_hot()
    with sql_statements(daemon.store) as statements:
        first = await daemon.get(f"/v1/sessions/{sid}/context")
        assert first["summary_tier"] == "warm"
        assert statements
        statements.clear()
        second = await daemon.get(f"/v1/sessions/{sid}/context")
        summary = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert statements == []
    assert second["summary_tier"] == "hot"
    assert summary["tier"] == "hot"
    assert summary["turn_count"] == 7
    assert first["messages"] == second["messages"] == expected["messages"]


async def test_more_bad_input_is_a_400(daemon: Daemon) -> None:
    """A lone surrogate in content, a non-ASCII digit budget, a query string that is not UTF-8 and
    absurdly nested JSON are 400s."""
    sid = new_sid()
    resp = await daemon.http.post(
        f"/v1/sessions/{sid}/messages",
        data=b'{"role": "user", "content": "bad \\ud800 text"}',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 400
    assert "content" in (await resp.json())["error"]["message"]
    resp = await daemon.http.get(f"/v1/sessions/{sid}/context?max_chars=%C2%B2")
    assert resp.status == 400
    # Query text that is not UTF-8 once percent-decoded, where aiohttp would put U+FFFD.
    await daemon.post(sid, "user", "你好")
    for query in ("context?question=%FF%FE", "context?system_prompt=%C3", "recall?q=%FFab", "context?%FF=1"):
        resp = await daemon.http.get(URL(f"/v1/sessions/{sid}/{query}", encoded=True))
        assert resp.status == 400, query
        assert "UTF-8" in (await resp.json())["error"]["message"], query
    assert (await daemon.get(f"/v1/sessions/{sid}/context?question=%E4%BD%A0%E5%A5%BD"))["messages"]
    # A percent sign that starts no escape, which yarl would keep as it is.
    for query in ("context?question=100%", "context?question=%ZZ", "recall?q=%4", "context?max_chars=1%30%"):
        resp = await daemon.http.get(URL(f"/v1/sessions/{sid}/{query}", encoded=True))
        assert resp.status == 400, query
        assert "percent escape" in (await resp.json())["error"]["message"], query
    await daemon.http.delete(f"/v1/sessions/{sid}")
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages", data=b"[" * 100_000 + b"]" * 100_000, headers=_JSON)
    assert resp.status == 400
    assert (await daemon.http.get(f"/v1/sessions/{sid}")).status == 404


async def test_message_size_is_counted_in_utf8_bytes(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """MAX_MESSAGE_BYTES bounds the UTF-8 bytes of content, system_prompt and question: 100 CJK
    characters (300 bytes) fit a 300-byte limit, 101 do not (and the 400 names both sizes)."""
    d = await make_daemon(backend_env | {"MAX_MESSAGE_BYTES": "300"})
    sid = new_sid()
    await d.post(sid, "user", "汉" * 100)
    resp = await d.http.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "汉" * 101})
    assert resp.status == 400
    message = (await resp.json())["error"]["message"]
    assert message.startswith("content: expected at most 300 bytes")
    assert "got 303" in message
    resp = await d.http.post(f"/v1/sessions/{sid}/turns", json={"content": "好", "system_prompt": "规" * 101})
    assert resp.status == 400
    assert "system_prompt" in (await resp.json())["error"]["message"]
    resp = await d.http.get(f"/v1/sessions/{sid}/context", params={"question": "问" * 101})
    assert resp.status == 400
    assert "question" in (await resp.json())["error"]["message"]
    assert (await d.get(f"/v1/sessions/{sid}"))["message_count"] == 1


async def test_the_body_limit_follows_the_message_limit(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """A body beyond 12 × MAX_MESSAGE_BYTES + 64 KiB is a 413 in the JSON error shape and stores
    nothing; the largest message still fits even when every byte needs a JSON escape."""
    d = await make_daemon(backend_env | {"MAX_MESSAGE_BYTES": "100"})
    sid = new_sid()
    body = json.dumps({"role": "user", "content": "a" * (12 * 100 + 64 * 1024)})
    resp = await d.http.post(f"/v1/sessions/{sid}/messages", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 413
    assert await resp.json() == {
        "error": {
            "code": "request_entity_too_large",
            "message": f"body: expected at most {12 * 100 + 64 * 1024} bytes",
        }
    }
    assert (await d.http.get(f"/v1/sessions/{sid}")).status == 404
    escaped = json.dumps({"content": "\x01" * 100, "system_prompt": "\x02" * 100})
    resp = await d.http.post(f"/v1/sessions/{sid}/turns", data=escaped, headers={"Content-Type": "application/json"})
    assert resp.status == 201, await resp.text()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sessions/{sid}/summary?colour=red"),
        ("GET", "/v1/sessions/{sid}/context?max_chars=100&colour=red"),
        ("GET", "/v1/sessions/{sid}/messages?from_seq=1&colour=red"),
        ("GET", "/v1/sessions/{sid}/slices?colour=red"),
        ("GET", "/v1/sessions/{sid}?colour=red"),
        ("GET", "/v1/users/u1/summaries?limit=5&colour=red"),
        ("POST", "/v1/sessions/{sid}/turns?maxchars=100&colour=red"),
        ("POST", "/v1/sessions/{sid}/close?colour=red"),
        ("DELETE", "/v1/sessions/{sid}?colour=red"),
    ],
)
async def test_unknown_query_parameters_are_refused(daemon: Daemon, method: str, path: str) -> None:
    """A query parameter the route does not read (a misspelt one, say) is a 400 naming the ones
    it reads (not the one sent: an error echoes nothing), and changes nothing."""
    sid = new_sid()
    await daemon.post(sid, "user", "你好")
    body = {"content": "再问"} if method == "POST" else None
    resp = await daemon.http.request(method, path.format(sid=sid), json=body)
    assert resp.status == 400
    message = (await resp.json())["error"]["message"]
    assert re.match(r"[12] unknown query parameter\(s\): this route reads \w", message), message
    assert "colour" not in message
    assert (await daemon.get(f"/v1/sessions/{sid}"))["message_count"] == 1


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/sessions/{sid}/context?max_chars=0", "max_chars"),
        ("/v1/sessions/{sid}/context?max_chars=-1", "max_chars"),
        ("/v1/sessions/{sid}/context?max_chars=1000001", "max_chars"),
        ("/v1/sessions/{sid}/context?max_chars=1e3", "max_chars"),
        ("/v1/sessions/{sid}/context?max_chars=10&max_chars=20", "max_chars"),
        ("/v1/sessions/{sid}/messages?from_seq=0", "from_seq"),
        ("/v1/sessions/{sid}/messages?from_seq=-1", "from_seq"),
        ("/v1/sessions/{sid}/messages?to_seq=2147483648", "to_seq"),
        ("/v1/sessions/{sid}/messages?to_seq=abc", "to_seq"),
        ("/v1/sessions/{sid}/messages?limit=0", "limit"),
        ("/v1/sessions/{sid}/messages?limit=1001", "limit"),
        ("/v1/users/u1/summaries?limit=0", "limit"),
        ("/v1/users/u1/summaries?limit=101", "limit"),
        ("/v1/users/u1/summaries?limit=-5", "limit"),
    ],
)
async def test_numbers_out_of_range_are_refused(daemon: Daemon, path: str, name: str) -> None:
    """Zero, negative, absurd, non-integer or repeated numbers are a 400 naming the parameter."""
    sid = new_sid()
    await daemon.post(sid, "user", "你好")
    resp = await daemon.http.get(path.format(sid=sid))
    assert resp.status == 400
    assert (await resp.json())["error"]["message"].startswith(f"{name}: expected")


async def test_ids_with_a_trailing_newline_are_refused(daemon: Daemon) -> None:
    """`$` matches before a final newline, so "s-1\n" once passed the session id check and was
    stored as a session of its own; it is a 400 on every session route now."""
    sid = new_sid()
    resp = await daemon.http.post(f"/v1/sessions/{sid}%0A/messages", json={"role": "user", "content": "x"})
    assert resp.status == 400
    assert "session_id" in (await resp.json())["error"]["message"]
    for path in (f"/v1/sessions/{sid}%0A", f"/v1/sessions/{sid}%0A/summary", f"/v1/sessions/{sid}%0A/context"):
        assert (await daemon.http.get(path)).status == 400, path
    assert (await daemon.http.get(f"/v1/sessions/{sid}")).status == 404


async def test_huge_integer_query_parameters_are_a_400(daemon: Daemon) -> None:
    """Query integers of more digits than int() converts (4300) are out of range, a 400 naming
    the parameter rather than a 500; leading zeros still parse."""
    sid = new_sid()
    await daemon.post(sid, "user", "你好", user_id="u-huge")
    huge = "9" * 5000
    for path, name in (
        (f"/v1/sessions/{sid}/context?max_chars={huge}", "max_chars"),
        (f"/v1/sessions/{sid}/turns?max_chars={huge}", "max_chars"),
        (f"/v1/sessions/{sid}/messages?from_seq={huge}", "from_seq"),
        (f"/v1/sessions/{sid}/messages?to_seq={huge}", "to_seq"),
        (f"/v1/sessions/{sid}/messages?limit={huge}", "limit"),
        (f"/v1/users/u-huge/summaries?limit={huge}", "limit"),
    ):
        if "/turns" in path:
            resp = await daemon.http.post(path, json={"content": "再问一次"})
        else:
            resp = await daemon.http.get(path)
        assert resp.status == 400, path
        assert name in (await resp.json())["error"]["message"], path
    body = await daemon.get(f"/v1/sessions/{sid}/messages?from_seq={'0' * 5000}1&limit=0010")
    assert [m["seq"] for m in body["messages"]] == [1]
    assert (await daemon.get(f"/v1/sessions/{sid}"))["message_count"] == 1


async def test_unreadable_bodies_are_a_400(daemon: Daemon) -> None:
    """A charset Python does not know, or a body whose Content-Encoding does not decode, is a
    400 like any other malformed body (it was a 500), and nothing is stored. A broken body stream
    ends the connection, and the reply says so: the same client's next request succeeds."""
    sid = new_sid()
    body = b'{"role": "user", "content": "x"}'
    for headers in (
        {"Content-Type": "application/json; charset=no-such-charset"},
        {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        {"Content-Type": "application/json", "Content-Encoding": "deflate"},
    ):
        for route in ("messages", "turns"):
            resp = await daemon.http.post(f"/v1/sessions/{sid}/{route}", data=body, headers=headers)
            assert resp.status == 400, (headers, route)
            error = (await resp.json())["error"]
            assert error["code"] == "invalid_input"
            assert error["message"].startswith("body:"), (headers, route)
            if "Content-Encoding" in headers:
                assert resp.headers["Connection"] == "close"
    # An encoding aiohttp does not decode would be read as identity: refused, never guessed.
    for encoding in ("compress", "x-custom", "gzip, br"):
        headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
        for route in ("messages", "turns"):
            resp = await daemon.http.post(f"/v1/sessions/{sid}/{route}", data=body, headers=headers)
            assert resp.status == 415, (encoding, route)
            assert (await resp.json())["error"]["code"] == "unsupported_media_type"
    assert (await daemon.http.get(f"/v1/sessions/{sid}")).status == 404
    ok = await daemon.http.post(
        f"/v1/sessions/{sid}/messages",
        data=body,
        headers={"Content-Type": "application/json", "Content-Encoding": "identity"},
    )
    assert ok.status == 201


async def test_method_not_allowed_keeps_its_allow_header(daemon: Daemon) -> None:
    """A 405 is in the JSON error shape and still says which methods the path allows (RFC 9110
    requires Allow; the error mapping used to drop it)."""
    resp = await daemon.http.patch(f"/v1/sessions/{new_sid()}", json={})
    assert resp.status == 405
    assert (await resp.json())["error"]["code"] == "method_not_allowed"
    assert {m.strip() for m in resp.headers["Allow"].split(",")} >= {"GET", "DELETE"}


async def _long_cold_session(daemon: Daemon) -> str:
    """A session of 400 turns without any summary, written to SQL only: a name and a product in
    its opening, an order in its last two turns, filler between."""
    sid = new_sid()
    filler = [("嗯，我再想想。", "好的，您慢慢考虑。")] * 397
    opening = ("你好，我叫王小明，想了解一下活力健。", "您好王小明，活力健每盒398元。")
    ending = ("那我决定买3盒，寄到杭州市西湖区。", "好的，3盒共1194元，寄往杭州市西湖区。")
    for i, (user, assistant) in enumerate([opening, *filler, ending, ending], start=1):
        await daemon.store.append(NewMessage(sid, Role.USER, user, f"u{i}"), now=float(i))
        await daemon.store.append(NewMessage(sid, Role.ASSISTANT, assistant, f"a{i}"), now=float(i) + 0.5)
    return sid


@contextlib.contextmanager
def message_reads(daemon: Daemon) -> Iterator[list[tuple[str, int]]]:
    """Each SQL statement on the messages table while the block runs, with the rows it returned
    (SQLite's cursors do not count what a SELECT returned: -1; MariaDB's do)."""
    reads: list[tuple[str, int]] = []

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "FROM messages" in statement:
            reads.append((statement, cursor.rowcount))

    engine = daemon.store._engine.sync_engine
    sa_event.listen(engine, "after_cursor_execute", count)
    try:
        yield reads
    finally:
        sa_event.remove(engine, "after_cursor_execute", count)


async def test_cold_read_of_a_long_session_reads_its_opening_and_its_end(daemon: Daemon) -> None:
    """The cold answer on the request path reads the opening and the latest messages, at most 88
    rows of the 800, and shows them raw: the user's first words, then the newest turns."""
    sid = await _long_cold_session(daemon)
    with message_reads(daemon) as reads:
        cold = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert cold["tier"] == "cold"
    assert cold["turn_count"] == 400
    assert reads
    assert all("LIMIT" in statement for statement, _ in reads)
    rows_read = sum(max(0, rows) for _, rows in reads)
    assert rows_read <= 88
    if daemon.store.dialect == "mysql":
        assert rows_read == 88
    lines = cold["summary"].split("\n")
    assert lines[0] == "用户：你好，我叫王小明，想了解一下活力健。"
    assert lines[-1] == "助手：好的，3盒共1194元，寄往杭州市西湖区。"


async def test_a_cold_context_shows_the_turns_before_its_window_raw(daemon: Daemon) -> None:
    """A context of the same session leaves its window out of the cold answer, and reads no older
    turns to condense on the request path (up to 400 rows, about 0.25 ms each): the cold answer
    holds the newest of them raw, until the summary the read scheduled lands."""
    sid = await _long_cold_session(daemon)
    with message_reads(daemon) as reads:
        ctx = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=400")
    assert ctx["summary_tier"] == "cold"
    assert ctx["messages"][-1]["content"] == "好的，3盒共1194元，寄往杭州市西湖区。"
    assert "王小明" in ctx["summary"]
    assert "1194" not in ctx["summary"]  # turns 399 and 400 are the window's
    # The request's reads are bounded (LIMIT); the summary job the read scheduled may start
    # reading every turn before the answer arrives.
    bounded = [rows for statement, rows in reads if "LIMIT" in statement]
    assert len(bounded) <= 2  # the cold answer's and the window's
    if daemon.store.dialect == "mysql":
        assert sum(bounded) <= 88 + 64


async def test_a_state_written_while_a_cold_context_reads_is_not_hidden_by_it(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `PUT …/state` that commits while a cold context reads, before that read made the
    session's hot entry, finds no entry to cache its state in. The next context shows the new
    state: the read, which took the older state from SQL with the session's row, does not cache
    it when it makes the entry (the PUT left its version as the session's state floor)."""
    sid = await _long_cold_session(daemon)
    key = SessionKey(sid)
    await daemon.store.put_state(key, {"step": "checkout"}, if_match=None, now=1.0)
    read_cold = daemon.store.summary_state_or_ends

    async def put_after(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(daemon.store, "summary_state_or_ends", read_cold)
        found = await read_cold(*args, **kwargs)
        await daemon.service.put_state(key, {"step": "paid"}, if_match=None, caller=Caller())
        return found

    monkeypatch.setattr(daemon.store, "summary_state_or_ends", put_after)
    first = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=400")
    assert first["summary_tier"] == "cold"
    after = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=400")
    assert (after["state"], after["state_version"]) == ({"step": "paid"}, 2)


async def test_a_stranger_asking_with_a_user_is_refused_before_any_message_is_read(daemon: Daemon) -> None:
    """A caller that states a user is answered by SQL's owner first: a stranger's session, not
    in the hot tier, is refused after one statement, its messages unread."""
    other = new_sid()
    await daemon.store.append(NewMessage(other, Role.USER, "我是小李。", "u1", "li"), now=1.0)
    await daemon.store.append(NewMessage(other, Role.ASSISTANT, "您好小李。", "a1", "li"), now=1.5)
    with sql_statements(daemon.store) as statements:
        refused = await daemon.http.get(f"/v1/sessions/{other}/summary", headers={"X-User-Id": "wang"})
    assert refused.status == 403, await refused.text()
    assert len(statements) == 1, statements


async def test_a_cold_read_of_a_due_session_schedules_its_summary(daemon: Daemon) -> None:
    """A session whose summary is due but missing from both tiers (here: written straight to SQL,
    as a bulk import or a failed job leaves it) is extracted on the first read and summarized in
    the background at once, so the reads after it are hot, not extracted again until a sweep. A
    session read cold before its first cadence point gets no summary ahead of its cadence."""
    due, early = new_sid(), new_sid()
    for sid, turns in ((due, ZH_12_TURNS), (early, ZH_12_TURNS[:2])):
        for i, (user, assistant) in enumerate(turns, start=1):
            await daemon.store.append(NewMessage(sid, Role.USER, user, f"u{i}"), now=float(i))
            await daemon.store.append(NewMessage(sid, Role.ASSISTANT, assistant, f"a{i}"), now=float(i) + 0.5)
    first = await daemon.get(f"/v1/sessions/{due}/summary")
    assert first["tier"] == "cold"
    await daemon.settle()
    again = await daemon.get(f"/v1/sessions/{due}/summary")
    assert again["tier"] == "hot"
    assert again["covered_turns"] == len(ZH_12_TURNS)
    assert (await daemon.get(f"/v1/sessions/{early}/summary"))["tier"] == "cold"
    await daemon.settle()
    assert (await daemon.get(f"/v1/sessions/{early}/summary"))["tier"] == "cold"


def _terse_turns(n: int) -> list[tuple[str, str]]:
    """n turns of about 20 characters a message, each with its own names and numbers."""
    cities = ["Lisbon", "Osaka", "Denver", "Nairobi", "Tallinn", "Recife", "Hobart"]
    return [(f"Day {i}: {cities[i % 7]}, {2 + i % 4} nights.", f"Booked TR-{1000 + 7 * i}.") for i in range(n)]


async def test_a_long_terse_session_is_read_hot(daemon: Daemon) -> None:
    """The Redis list keeps the newest messages by characters (twice the default budget), not by
    count: a session of 250 terse turns, more than a default context's older-turn fill holds in
    any fixed number of messages, is answered without SQL, and after Redis lost it the first
    context refills what the next ones read."""
    sid = new_sid()
    await play(daemon, sid, _terse_turns(250))
    await daemon.settle()
    with sql_statements(daemon.store) as statements:
        first = await daemon.get(f"/v1/sessions/{sid}/context")
        small = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=1000")
    if daemon.settings.redis_url:
        assert statements == []
    assert first["summary_tier"] == "hot"
    assert "Day 249" in first["messages"][-2]["content"]
    assert sum(len(m["content"]) for m in first["messages"]) > 3000
    await daemon.flush_hot()
    await daemon.get(f"/v1/sessions/{sid}/context")
    with sql_statements(daemon.store) as statements:
        again = await daemon.get(f"/v1/sessions/{sid}/context")
        small_again = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=1000")
    if daemon.settings.redis_url:
        assert statements == []
    assert (again["messages"], small_again["messages"]) == (first["messages"], small["messages"])


async def test_a_young_session_that_fits_is_answered_without_sql(daemon: Daemon) -> None:
    """Before its first summary, a session whose messages all fit the budget is answered from the
    hot tier alone: the summary walk (warm row, cold extraction) is skipped, since the whole
    conversation is shown raw. At a budget it does not fit, no extraction runs on the request
    either while the hot list holds it whole (the policy condenses its raw turns); once Redis
    lost it, the cold answer leaves out the window's turns, which here are all of them."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    with sql_statements(daemon.store) as statements:
        ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert statements == []
    assert ctx["summary_tier"] == "none"
    assert [m["content"] for m in ctx["messages"]] == [text for turn in ZH_12_TURNS[:2] for text in turn]
    tight = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=60")
    assert tight["summary_tier"] == "none"
    assert sum(len(m["content"]) for m in tight["messages"]) <= 60
    await daemon.flush_hot()
    cold = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=60")
    assert cold["summary_tier"] == "none"
    assert sum(len(m["content"]) for m in cold["messages"]) <= 60


async def test_older_turns_read_from_sql_are_kept_hot(daemon: Daemon) -> None:
    """After the hot tier lost a session, the first context reads the older turns it fills its
    budget with from SQL and puts them back in Redis: the next context reads no SQL at all. (The
    embedded cache keeps only the window; its SQL is a local file.)"""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS)
    await daemon.settle()
    await daemon.flush_hot()
    with sql_statements(daemon.store) as statements:
        first = await daemon.get(f"/v1/sessions/{sid}/context")
        assert any("FROM messages" in s for s in statements)
        statements.clear()
        second = await daemon.get(f"/v1/sessions/{sid}/context")
    assert first["messages"] == second["messages"]
    assert next(m["content"] for m in second["messages"] if m["role"] == "user") == ZH_12_TURNS[0][0]
    if daemon.settings.redis_url:
        assert statements == []


async def test_a_load_then_append_keeps_the_older_turns_it_read_hot(daemon: Daemon) -> None:
    """A gateway that only calls `…/turns` after the hot tier lost a session: its first turn reads
    the older turns from SQL and puts them back, as a context read does, so that the turns after
    it read none (they read them from SQL on every turn before). A retried turn, whose message is
    stored already, writes nothing back."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS)
    await daemon.settle()
    await daemon.flush_hot()
    for attempt in range(2):  # the second is the gateway's retry of the same turn
        resp = await daemon.http.post(f"/v1/sessions/{sid}/turns", json={"content": "还有别的吗？", "message_id": "q1"})
        assert resp.status == (201 if attempt == 0 else 200), await resp.text()
    await daemon.post(sid, "assistant", "没有了。")
    with sql_statements(daemon.store) as statements:
        ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert next(m["content"] for m in ctx["messages"] if m["role"] == "user") == ZH_12_TURNS[0][0]
    if daemon.settings.redis_url:
        assert not [s for s in statements if "FROM messages" in s]


async def test_the_older_turns_kept_hot_leave_no_hole_behind_a_lagging_summary(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """A summary that holds the first 5 of 24 turns: a context after the hot tier lost the session
    reads from SQL the turns the summary does not hold (before the window) and the older ones it
    chooses from: the list it writes back is one stretch (the older turns alone, in front of the
    window, left a hole that sent the next read to SQL again), so the next context reads no SQL."""
    d = await make_daemon(backend_env | {"SUMMARY_EVERY_N_TURNS": "1000", "COMPRESSION_BATCH_TURNS": "1000"})
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS + ZH_12_TURNS)
    lagging = Summary("用户王小明想了解活力健。", 5, 1, SummarySource.DETERMINISTIC, 10.0, 10.0)
    assert await d.store.put_summary(SessionKey(sid), lagging, user_id=None, turn_count=24)
    await d.flush_hot()
    await d.get(f"/v1/sessions/{sid}/context")
    assert d.app is not None
    seqs = [m.seq for m in (await d.app[HOT_KEY].read_session(SessionKey(sid))).recent]
    assert seqs == list(range(seqs[0], seqs[-1] + 1)) if seqs else True, seqs
    if d.settings.redis_url:
        assert seqs[0] < 40, seqs  # the older turns are there, not only the window
        with sql_statements(d.store) as statements:
            await d.get(f"/v1/sessions/{sid}/context")
        assert not [s for s in statements if "FROM messages" in s]


async def test_a_voice_call_continues_in_chat(daemon: Daemon) -> None:
    """One session id, a voice call then a chat: the call's turns are stored as voice and
    summarized when it closes; the chat gateway's first `…/turns` answers with that summary and a
    memory that holds the call's names and numbers and its last turn within the budget, and
    records the chat message as chat."""
    sid = new_sid()
    for user, assistant in ZH_12_TURNS:
        await daemon.post(sid, "user", user, channel="voice")
        await daemon.post(sid, "assistant", assistant, channel="voice")
    assert (await daemon.http.post(f"/v1/sessions/{sid}/close")).status == 200
    await daemon.settle()
    question = "我在网页上接着问：活力健能和降压药一起吃吗？"
    resp = await daemon.http.post(
        f"/v1/sessions/{sid}/turns?max_chars=300", json={"content": question, "channel": "chat"}
    )
    assert resp.status == 201, await resp.text()
    ctx = await resp.json()
    assert ctx["covered_turns"] == len(ZH_12_TURNS)
    shown = "\n".join(m["content"] for m in ctx["messages"])
    assert sum(len(m["content"]) for m in ctx["messages"][:-1]) <= 300
    for evidence in ZH_EARLY_EVIDENCE:
        assert evidence in ctx["summary"]
        assert evidence in shown
    assert ctx["messages"][-2]["content"] == ZH_12_TURNS[-1][1]
    assert ctx["messages"][-1]["content"].endswith(question)
    stored = (await daemon.get(f"/v1/sessions/{sid}/messages"))["messages"]
    assert [m["channel"] for m in stored] == ["voice"] * 2 * len(ZH_12_TURNS) + ["chat"]


async def test_no_summary_before_summary_start_turns(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """SUMMARY_START_TURNS=6 with a cadence of 3: the third turn schedules nothing and the session
    has no summary; the sixth does, and the summary covers six turns."""
    d = await make_daemon(backend_env | {"SUMMARY_START_TURNS": "6", "SUMMARY_EVERY_N_TURNS": "3"})
    sid = new_sid()
    scheduled = []
    for user, assistant in ZH_12_TURNS[:6]:
        await d.post(sid, "user", user)
        scheduled.append((await d.post(sid, "assistant", assistant))["summary_scheduled"])
        await d.settle()
        if len(scheduled) == 3:
            assert (await d.get(f"/v1/sessions/{sid}"))["covered_turns"] == 0
    assert scheduled == [False] * 5 + [True]
    summary = await d.get(f"/v1/sessions/{sid}/summary")
    assert (summary["tier"], summary["covered_turns"]) == ("hot", 6)


async def test_a_context_says_whether_it_applied_the_summary(daemon: Daemon) -> None:
    """`compressions` counts the merges into the session's summary and `compression_applied` says
    whether this context's memory holds the summary's text: a short session shown whole applies
    none; a summarized one read at a budget it does not fit applies it."""
    young, old = new_sid(), new_sid()
    await play(daemon, young, ZH_12_TURNS[:1])
    await play(daemon, old, ZH_12_TURNS)
    await daemon.settle()
    whole = await daemon.get(f"/v1/sessions/{young}/context")
    assert (whole["compressions"], whole["compression_applied"]) == (0, False)
    tight = await daemon.get(f"/v1/sessions/{old}/context?max_chars=300&explain=true")
    assert tight["compressions"] >= 1
    assert tight["compression_applied"] is True
    assert {"summary", "salient", "subject"} & {p["origin"] for p in tight["explain"]["memory"]}
