"""`PATCH /v1/sessions/{sid}/messages/{message_id}`: a streaming reply finalized, a reply cut by a
barge-in, a transcript corrected, while no summary covers the message; bad patches change
nothing. Each runs on the embedded backends and on real Redis + MariaDB."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.daemon import Daemon, new_sid, play
from tiered_memory.testing import ZH_12_TURNS


async def _patch(daemon: Daemon, sid: str, mid: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    resp = await daemon.http.patch(f"/v1/sessions/{sid}/messages/{mid}", json=body)
    assert resp.status == status, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


async def test_a_streaming_reply_is_finalized_and_completes_its_turn(daemon: Daemon) -> None:
    """A reply stored while streaming completes no turn; patched to completed with its final
    text it completes the turn (a summary at its cadence point), the context shows it, and the
    same patch again answers the same with nothing changed."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    await daemon.post(sid, "user", "价格多少？")
    await daemon.post(sid, "assistant", "活力健一盒", status="streaming", message_id="r-3")
    assert (await daemon.get(f"/v1/sessions/{sid}"))["turn_count"] == 2
    body = {"content": "活力健一盒398元。", "status": "completed"}
    done = await _patch(daemon, sid, "r-3", body)
    assert (done["turn_count"], done["changed"], done["summary_scheduled"]) == (3, True, True)
    assert (done["message"]["content"], done["message"]["status"], done["message"]["seq"]) == (
        "活力健一盒398元。",
        "completed",
        6,
    )
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-1] == {"role": "assistant", "content": "活力健一盒398元。"}
    again = await _patch(daemon, sid, "r-3", body)
    assert (again["turn_count"], again["changed"], again["summary_scheduled"]) == (3, False, False)
    await daemon.settle()
    assert "398" in (await daemon.get(f"/v1/sessions/{sid}/summary"))["summary"]
    assert await daemon.store.count_messages(sid) == 6


async def test_a_reply_cut_by_a_barge_in_and_a_corrected_transcript(daemon: Daemon) -> None:
    """A completed reply becomes the part actually spoken, interrupted (its turn stays
    completed); a user transcript is corrected: the context, the stored message and recall all
    follow, and the old words are found nowhere."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:1])
    await daemon.post(sid, "user", "我想订三张去航州的票", message_id="u-2")
    await daemon.post(sid, "assistant", "好的，三张去杭州的票，请问哪天出发？我们有早班和晚班", message_id="r-2")
    assert (await daemon.get(f"/v1/sessions/{sid}/recall?q=航州"))["matches"]
    cut = await _patch(daemon, sid, "r-2", {"content": "好的，三张去杭州的票，请问哪天", "status": "interrupted"})
    assert (cut["turn_count"], cut["changed"]) == (2, True)
    fixed = await _patch(daemon, sid, "u-2", {"content": "我想订三张去杭州的票"})
    assert fixed["message"]["content"] == "我想订三张去杭州的票"
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-2:] == [
        {"role": "user", "content": "我想订三张去杭州的票"},
        {"role": "assistant", "content": "好的，三张去杭州的票，请问哪天（被打断）"},
    ]
    stored = await daemon.stored(sid)
    assert [(m["content"], m["status"]) for m in stored[2:]] == [
        ("我想订三张去杭州的票", "completed"),
        ("好的，三张去杭州的票，请问哪天", "interrupted"),
    ]
    assert (await daemon.get(f"/v1/sessions/{sid}/recall?q=航州"))["matches"] == []
    found = (await daemon.get(f"/v1/sessions/{sid}/recall?q=杭州"))["matches"]
    assert found
    assert found[0]["turn"] == 2
    info = await daemon.get(f"/v1/sessions/{sid}")
    assert info["turn_count"] == 2


async def test_a_summarized_message_cannot_be_changed(daemon: Daemon) -> None:
    """Once a summary covers a message's turn, a patch is 409 `already_summarized` and changes
    nothing; the newer turns the summary does not cover can still be corrected."""
    sid = new_sid()
    for n, (user, assistant) in enumerate(ZH_12_TURNS[:4], start=1):
        await daemon.post(sid, "user", user, message_id=f"u-{n}")
        await daemon.post(sid, "assistant", assistant, message_id=f"r-{n}")
    await daemon.settle()
    assert (await daemon.get(f"/v1/sessions/{sid}/summary"))["covered_turns"] == 3
    refused = await _patch(daemon, sid, "u-1", {"content": "改过的话"}, status=409)
    assert refused["error"]["code"] == "already_summarized"
    assert (await daemon.stored(sid))[0]["content"] == ZH_12_TURNS[0][0]
    assert (await _patch(daemon, sid, "u-4", {"content": "改过的第四句"}))["changed"] is True


@pytest.mark.parametrize(
    ("mid", "body", "status", "code"),
    [
        ("u-1", {}, 400, "invalid_input"),
        ("u-1", {"content": "x", "role": "assistant"}, 400, "invalid_input"),
        ("u-1", {"content": "  "}, 400, "invalid_input"),
        ("u-1", {"status": "interrupted"}, 400, "invalid_input"),
        ("r-1", {"status": "paused"}, 400, "invalid_input"),
        ("r-1", {"status": "streaming"}, 409, "conflict"),
        ("r-0", {"status": "completed"}, 409, "conflict"),
        ("nope", {"content": "x"}, 404, "not_found"),
    ],
)
async def test_bad_patches_change_nothing(
    daemon: Daemon, mid: str, body: dict[str, Any], status: int, code: str
) -> None:
    """A patch with no field, an unknown field, blank content or an unknown status is 400; a
    user message is never interrupted; a reply that answered cannot be taken back, and a
    streaming reply that is no longer the newest message cannot complete its turn (409); an
    unknown message is 404. None of them changes what is stored."""
    sid = new_sid()
    await daemon.post(sid, "user", ZH_12_TURNS[0][0], message_id="u-1")
    await daemon.post(sid, "assistant", "活力健是", status="streaming", message_id="r-0")
    await daemon.post(sid, "assistant", ZH_12_TURNS[0][1], message_id="r-1")
    await daemon.post(sid, "user", ZH_12_TURNS[1][0], message_id="u-2")
    before = await daemon.stored(sid)
    answer = await _patch(daemon, sid, mid, body, status=status)
    assert answer["error"]["code"] == code
    assert await daemon.stored(sid) == before
    assert (await daemon.get(f"/v1/sessions/{sid}"))["turn_count"] == 1


async def test_a_patch_of_an_unknown_session_or_another_users_is_refused(daemon: Daemon) -> None:
    sid = new_sid()
    await daemon.post(sid, "user", "你好", message_id="u-1", user_id="alice")
    await _patch(daemon, new_sid(), "u-1", {"content": "x"}, status=404)
    resp = await daemon.http.patch(
        f"/v1/sessions/{sid}/messages/u-1", json={"content": "x"}, headers={"X-User-ID": "bob"}
    )
    assert resp.status == 403
    assert (await daemon.stored(sid))[0]["content"] == "你好"
