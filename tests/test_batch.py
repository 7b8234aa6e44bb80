"""Bulk import over HTTP: `POST /v1/sessions/{sid}/messages/batch` stores up to 500 messages in one
transaction, all or none, idempotent per message_id, with turns and summaries as if appended one
by one; and `tiered-memory import FILE.jsonl`, resumable. Each runs on the embedded backends and
on real Redis + MariaDB."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import Daemon, new_sid
from tests.helpers.processes import cli
from tiered_memory.testing import ZH_12_TURNS, ZH_EARLY_EVIDENCE


def _messages(turns: list[tuple[str, str]], prefix: str = "m") -> list[dict[str, Any]]:
    out = []
    for n, (user, assistant) in enumerate(turns, start=1):
        out.append({"role": "user", "content": user, "message_id": f"{prefix}-{n}u", "channel": "voice"})
        out.append({"role": "assistant", "content": assistant, "message_id": f"{prefix}-{n}a", "channel": "voice"})
    return out


async def _batch(daemon: Daemon, sid: str, body: dict[str, Any], status: int) -> dict[str, Any]:
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages/batch", json=body)
    assert resp.status == status, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


async def test_a_batch_is_stored_as_if_appended_one_by_one(daemon: Daemon) -> None:
    """Six turns in one batch: numbered in order, six turns counted, a summary made at its
    cadence, the context hot; the same batch again stores nothing (200, every message a
    duplicate), and a batch that goes on from there stores only its new messages."""
    sid = new_sid()
    body = {"messages": _messages(ZH_12_TURNS[:6])}
    stored = await _batch(daemon, sid, body, 201)
    assert [(m["seq"], m["turn"], m["duplicate"]) for m in stored["messages"][:3]] == [
        (1, 1, False),
        (2, 1, False),
        (3, 2, False),
    ]
    assert (stored["turn_count"], stored["summary_scheduled"]) == (6, True)
    await daemon.settle()
    summary = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert summary["covered_turns"] == 6
    for evidence in ZH_EARLY_EVIDENCE:
        assert evidence in summary["summary"]
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-1]["content"] == ZH_12_TURNS[5][1]
    again = await _batch(daemon, sid, body, 200)
    assert all(m["duplicate"] for m in again["messages"])
    assert await daemon.store.count_messages(sid) == 12
    more = await _batch(daemon, sid, {"messages": _messages(ZH_12_TURNS[:7])}, 201)
    assert [m["duplicate"] for m in more["messages"]] == [True] * 12 + [False, False]
    assert more["turn_count"] == 7
    stored_messages = (await daemon.get(f"/v1/sessions/{sid}/messages"))["messages"]
    assert [m["channel"] for m in stored_messages] == ["voice"] * 14


@pytest.mark.parametrize(
    ("messages", "status", "code"),
    [
        ([{"role": "user", "content": f"第{i}句"} for i in range(501)], 400, "invalid_input"),
        ([], 400, "invalid_input"),
        ([{"role": "user", "content": "好"}, {"role": "robot", "content": "x"}], 400, "invalid_input"),
        (
            [
                {"role": "user", "content": "好", "message_id": "d"},
                {"role": "assistant", "content": "x", "message_id": "d"},
            ],
            400,
            "invalid_input",
        ),
        (
            [
                {"role": "user", "content": "好", "message_id": "n-1"},
                {"role": "user", "content": "改了", "message_id": "m-1u"},
            ],
            409,
            "conflict",
        ),
    ],
)
async def test_a_bad_batch_stores_nothing(
    daemon: Daemon, messages: list[dict[str, Any]], status: int, code: str
) -> None:
    """501 messages, none, a bad message (named by its index), a message_id twice in the batch:
    400; a message_id stored before with other content: 409. Nothing of the batch is stored."""
    sid = new_sid()
    await _batch(daemon, sid, {"messages": _messages(ZH_12_TURNS[:1])}, 201)
    answer = await _batch(daemon, sid, {"messages": messages}, status)
    assert answer["error"]["code"] == code
    if status == 400 and len(messages) == 2 and messages[1]["role"] == "robot":
        assert answer["error"]["message"].startswith("messages[1].role")
    assert await daemon.store.count_messages(sid) == 2


async def test_import_a_jsonl_file_resumably(daemon: Daemon, tmp_path: Path) -> None:
    """`tiered-memory import` stores a JSON Lines file of several sessions' messages (a line
    without a message_id gets one derived from its place and content); run again it stores
    nothing twice; a bad line stops it with the line's number, after what came before."""
    a, b = new_sid(), new_sid()
    lines = [{"session_id": a, **m} for m in _messages(ZH_12_TURNS[:3], "a")]
    lines += [
        {"session_id": b, "role": "user", "content": "你好"},
        {"session_id": b, "role": "assistant", "content": "您好。"},
    ]
    path = tmp_path / "history.jsonl"
    path.write_text("\n".join(json.dumps(line, ensure_ascii=False) for line in lines) + "\n", encoding="utf-8")
    code, out, err = await asyncio.to_thread(cli, "import", str(path), env=daemon.env)
    assert code == 0, err
    assert json.loads(out) == {"lines": 8, "stored": 8, "duplicates": 0, "sessions": 2}
    assert await daemon.store.count_messages(a) == 6
    assert (await daemon.store.get_session(b)) is not None
    code, out, err = await asyncio.to_thread(cli, "import", str(path), env=daemon.env)
    assert code == 0, err
    assert json.loads(out) == {"lines": 8, "stored": 0, "duplicates": 8, "sessions": 2}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"session_id": a, "role": "user", "content": "还有"}) + "\n{not json\n", encoding="utf-8")
    code, out, err = await asyncio.to_thread(cli, "import", str(bad), env=daemon.env)
    assert code == 1
    assert "line 2" in err
    assert await daemon.store.count_messages(a) == 7
