"""`DELETE /v1/sessions/{sid}/messages/{message_id}`: the session's newest message removed while no
summary covers its turn, its counters as if it had never been appended; anything else is refused
and changes nothing. Each runs on the embedded backends and on real Redis + MariaDB."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.helpers.daemon import Daemon, new_sid, play
from tiered_memory.client import AsyncClient, Conflict
from tiered_memory.testing import ZH_12_TURNS
from tiered_memory.tiers.sql.schema import sessions

_CALL = [{"id": "call-1", "type": "function", "function": {"name": "price", "arguments": '{"product": "活力健"}'}}]
# Each: the messages before, then the one deleted (role, content, extra fields).
_LAST: dict[str, tuple[list[tuple[str, str, dict[str, Any]]], tuple[str, str, dict[str, Any]]]] = {
    "a reply that completed its turn": ([("user", "活力健多少钱？", {})], ("assistant", "一盒398元。", {})),
    "a question": ([("user", "你好", {}), ("assistant", "您好！", {})], ("user", "活力健多少钱？", {})),
    "a second question": ([("user", "你好", {}), ("user", "在吗？", {})], ("user", "活力健多少钱？", {})),
    "a greeting": ([("system", "call started", {})], ("assistant", "您好，请问有什么可以帮您？", {})),
    "a second part of a reply": (
        [("user", "活力健多少钱？", {}), ("assistant", "一盒398元。", {})],
        ("assistant", "还有原味可选。", {}),
    ),
    "a streaming reply": ([("user", "活力健多少钱？", {})], ("assistant", "一盒", {"status": "streaming"})),
    "a tool call": ([("user", "活力健多少钱？", {})], ("assistant", "", {"content": None, "tool_calls": _CALL})),
    "a tool result": (
        [("user", "活力健多少钱？", {}), ("assistant", "", {"content": None, "tool_calls": _CALL})],
        ("tool", '{"price": 398}', {"tool_call_id": "call-1", "name": "price"}),
    ),
    "a note": ([("user", "活力健多少钱？", {})], ("system", "call transferred", {})),
}


async def _post(daemon: Daemon, sid: str, role: str, content: str, extra: dict[str, Any]) -> dict[str, Any]:
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages", json={"role": role, "content": content, **extra})
    assert resp.status in (200, 201), await resp.text()
    return dict(await resp.json())


async def _row(daemon: Daemon, sid: str) -> dict[str, Any]:
    """The session's counters as SQL holds them."""

    async def op(conn: AsyncConnection) -> dict[str, Any]:
        columns = ["turn_count", "message_count", "pending_user", "content_chars", "content_bytes", "open_tool_calls"]
        query = sa.select(*(sessions.c[c] for c in columns)).where(sessions.c.session_id == sid)
        return dict((await conn.execute(query)).one()._mapping)

    return await daemon.store.read(op)


async def _delete(daemon: Daemon, sid: str, mid: str, status: int = 204, **headers: str) -> dict[str, Any]:
    resp = await daemon.http.delete(f"/v1/sessions/{sid}/messages/{mid}", headers=headers)
    assert resp.status == status, await resp.text()
    return {} if status == 204 else dict(await resp.json())


async def _stored(daemon: Daemon, sid: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = (await daemon.get(f"/v1/sessions/{sid}/messages"))["messages"]
    return messages


@pytest.mark.parametrize("case", list(_LAST))
async def test_the_session_is_as_if_the_newest_message_was_never_appended(daemon: Daemon, case: str) -> None:
    """Whatever the newest message is, deleting it leaves the session (its messages, and its
    counters: turns, messages, a waiting question, characters, bytes, open tool calls) exactly as
    a session that never had it; and appending it anew, the two go on alike."""
    before, (role, content, extra) = _LAST[case]
    sid, twin = new_sid(), new_sid()
    for s in (sid, twin):
        for n, (r, c, e) in enumerate(before):
            await _post(daemon, s, r, c, {**e, "message_id": f"b-{n}"})
    await _post(daemon, sid, role, content, {**extra, "message_id": "last"})
    await _delete(daemon, sid, "last")
    assert await _row(daemon, sid) == await _row(daemon, twin)
    assert _plain(await _stored(daemon, sid)) == _plain(await _stored(daemon, twin))
    answers = [await _post(daemon, s, role, content, {**extra, "message_id": "last"}) for s in (sid, twin)]
    assert answers[0]["turn_count"] == answers[1]["turn_count"]
    assert await _row(daemon, sid) == await _row(daemon, twin)
    assert _plain(await _stored(daemon, sid)) == _plain(await _stored(daemon, twin))


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored messages without their time of storing."""
    return [{k: v for k, v in m.items() if k != "created_at"} for m in messages]


async def test_a_reply_taken_back_is_gone_from_memory_and_its_question_waits(daemon: Daemon) -> None:
    """The reply that completed the turn is deleted: the turn count goes back, the context and
    recall no longer hold it (the hot tier forgot the session), and the next reply completes the
    turn again. A repeat is 404."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:1])
    await daemon.post(sid, "user", "活力健多少钱？", message_id="u-2")
    await daemon.post(sid, "assistant", "活力健一盒999元。", message_id="r-2")
    assert (await daemon.get(f"/v1/sessions/{sid}/context"))["messages"][-1]["content"] == "活力健一盒999元。"
    await _delete(daemon, sid, "r-2")
    info = await daemon.get(f"/v1/sessions/{sid}")
    assert (info["turn_count"], info["message_count"]) == (1, 3)
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert "999" not in str(ctx["messages"])
    assert ctx["messages"][-1] == {"role": "user", "content": "活力健多少钱？"}
    assert (await daemon.get(f"/v1/sessions/{sid}/recall?q=999"))["matches"] == []
    assert (await _delete(daemon, sid, "r-2", status=404))["error"]["code"] == "not_found"
    again = await daemon.post(sid, "assistant", "活力健一盒398元。", message_id="r-2b")
    assert again["turn_count"] == 2
    found = (await daemon.get(f"/v1/sessions/{sid}/recall?q=398"))["matches"]
    assert [m["turn"] for m in found] == [2]


async def test_a_tool_call_and_its_result_taken_back(daemon: Daemon) -> None:
    """A tool result deleted leaves its call waiting (the result can be sent again); the call
    deleted too, a result for it is refused as answering no call."""
    sid = new_sid()
    await daemon.post(sid, "user", "活力健多少钱？")
    await _post(daemon, sid, "assistant", "", {"content": None, "tool_calls": _CALL, "message_id": "c-1"})
    await daemon.post(sid, "tool", '{"price": 398}', tool_call_id="call-1", name="price", message_id="t-1")
    await _delete(daemon, sid, "t-1")
    await daemon.post(sid, "tool", '{"price": 398}', tool_call_id="call-1", name="price", message_id="t-1")
    await _delete(daemon, sid, "t-1")
    await _delete(daemon, sid, "c-1")
    resp = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "tool", "content": "{}", "tool_call_id": "call-1"}
    )
    assert resp.status == 409
    assert (await resp.json())["error"]["code"] == "unknown_tool_call_id"


async def test_only_the_newest_unsummarized_message_can_be_deleted(daemon: Daemon) -> None:
    """An older message is 409 `conflict`, one in a turn the summary covers 409
    `already_summarized`; neither changes anything."""
    sid = new_sid()
    for n, (user, assistant) in enumerate(ZH_12_TURNS[:3], start=1):
        await daemon.post(sid, "user", user, message_id=f"u-{n}")
        await daemon.post(sid, "assistant", assistant, message_id=f"r-{n}")
    await daemon.settle()
    assert (await daemon.get(f"/v1/sessions/{sid}/summary"))["covered_turns"] == 3
    before, row = await _stored(daemon, sid), await _row(daemon, sid)
    assert (await _delete(daemon, sid, "u-3", status=409))["error"]["code"] == "conflict"
    assert (await _delete(daemon, sid, "r-3", status=409))["error"]["code"] == "already_summarized"
    assert (await _stored(daemon, sid), await _row(daemon, sid)) == (before, row)
    await daemon.post(sid, "user", ZH_12_TURNS[3][0], message_id="u-4")
    await _delete(daemon, sid, "u-4")
    assert await _row(daemon, sid) == row


async def test_unknown_and_other_users_messages_are_refused(daemon: Daemon) -> None:
    """An unknown session or message is 404, another user's session 403, a malformed id 400;
    nothing is deleted."""
    sid = new_sid()
    await daemon.post(sid, "user", "你好", message_id="u-1", user_id="alice")
    await _delete(daemon, new_sid(), "u-1", status=404)
    await _delete(daemon, sid, "nope", status=404)
    await _delete(daemon, sid, "u-1", status=403, **{"X-User-ID": "bob"})
    await _delete(daemon, sid, "u%201", status=400)
    assert [m["message_id"] for m in await _stored(daemon, sid)] == ["u-1"]


async def test_the_client_deletes_once_and_says_whether_it_did(daemon: Daemon) -> None:
    """AsyncClient.delete_message: True when it removed the message, False when it was gone
    already (a repeat is safe), Conflict when a summary covers it."""
    sid = new_sid()
    async with AsyncClient(str(daemon.http.make_url(""))) as client:
        await client.append(sid, "user", "你好", message_id="u-1")
        assert await client.delete_message(sid, "u-1") is True
        assert await client.delete_message(sid, "u-1") is False
        for n, (user, assistant) in enumerate(ZH_12_TURNS[:3], start=1):
            await client.append(sid, "user", user)
            done = await client.append(sid, "assistant", assistant, message_id=f"r-{n}")
        assert done.summary_scheduled
        await daemon.settle()
        with pytest.raises(Conflict) as refused:
            await client.delete_message(sid, "r-3")
        assert refused.value.code == "already_summarized"
