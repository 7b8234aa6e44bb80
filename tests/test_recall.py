"""Query-aware recall over HTTP: `GET …/recall` and `GET …/context?question=…`, and the context
that fills its budget with older raw turns. Each runs on the embedded backends and on real Redis +
MariaDB."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import Daemon, new_sid, play
from tests.conversations import ZH_12_TURNS
from tiered_memory.model import Message, Role
from tiered_memory.recall import RecallIndex, SessionIndex

# Chit-chat that pushes the facts of ZH_12_TURNS far out of the raw window.
_DRIFT = [(f"第{i}个闲聊问题，随便聊聊天气和路况？", f"第{i}个回答：今天路上车不多，天气也还行。") for i in range(30)]
_LABEL = "[早前对话片段]"


def _text(ctx: dict[str, Any]) -> str:
    return "\n".join(m["content"] for m in ctx["messages"])


async def _long_session(daemon: Daemon) -> str:
    sid = new_sid()
    await play(daemon, sid, [*ZH_12_TURNS[:3], *_DRIFT])
    await daemon.settle()
    return sid


async def test_recall_returns_the_matching_turn_with_its_slice(daemon: Daemon) -> None:
    """A search finds the early turn that states the price, with its raw messages and the slice
    that covers it; k bounds the number of matches."""
    sid = await _long_session(daemon)
    body = await daemon.get(f"/v1/sessions/{sid}/recall?q=活力健价格多少&k=3")
    assert body["session_id"] == sid
    assert 0 < len(body["matches"]) <= 3
    best = body["matches"][0]
    assert best["turn"] in (1, 2, 3)
    assert any("活力健" in m["content"] for m in best["messages"])
    assert {m["turn"] for m in best["messages"]} == {best["turn"]}
    assert best["slice"]["from_turn"] <= best["turn"] <= best["slice"]["to_turn"]
    assert best["score"] > 0
    texts = " ".join(m["content"] for match in body["matches"] for m in match["messages"])
    assert "398元" in texts


async def test_recall_follows_appends_and_restarts(daemon: Daemon) -> None:
    """The index grows with appends (a message said after the first search is found) and is
    rebuilt from SQL by a new process."""
    sid = await _long_session(daemon)
    assert (await daemon.get(f"/v1/sessions/{sid}/recall?q=羽毛球拍"))["matches"] == []
    await play(daemon, sid, [("我还想买一副羽毛球拍。", "推荐碳素羽毛球拍，单支299元。")])
    found = (await daemon.get(f"/v1/sessions/{sid}/recall?q=羽毛球拍"))["matches"]
    assert found
    assert "299元" in " ".join(m["content"] for m in found[0]["messages"])
    await daemon.restart()
    again = (await daemon.get(f"/v1/sessions/{sid}/recall?q=羽毛球拍"))["matches"]
    assert [m["seq"] for m in again] == [m["seq"] for m in found]


async def test_recall_of_a_deleted_session_finds_nothing(daemon: Daemon) -> None:
    """Deleting a session drops its index: the same id, reused, finds only its own messages."""
    sid = await _long_session(daemon)
    assert (await daemon.get(f"/v1/sessions/{sid}/recall?q=活力健"))["matches"]
    assert (await daemon.http.delete(f"/v1/sessions/{sid}")).status == 204
    await play(daemon, sid, [("新的会话，问问天气。", "今天晴。")])
    assert (await daemon.get(f"/v1/sessions/{sid}/recall?q=活力健"))["matches"] == []


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("", 400),
        ("q=", 400),
        ("q=%20%20", 400),
        ("q=x&k=0", 400),
        ("q=x&k=51", 400),
        ("q=x&k=two", 400),
        ("q=x&q=y", 400),
        ("q=x&limit=3", 400),
    ],
)
async def test_recall_refuses_bad_input(daemon: Daemon, query: str, status: int) -> None:
    """A missing or blank q, a k outside 1-50, a repeated or unknown parameter: 400, naming it."""
    sid = await _long_session(daemon)
    resp = await daemon.http.get(f"/v1/sessions/{sid}/recall?{query}")
    assert resp.status == status
    assert (await resp.json())["error"]["code"] == "invalid_input"


async def test_recall_of_an_unknown_session_is_404(daemon: Daemon) -> None:
    resp = await daemon.http.get(f"/v1/sessions/{new_sid()}/recall?q=活力健")
    assert resp.status == 404


async def test_context_with_a_question_brings_back_the_matching_earlier_turn(daemon: Daemon) -> None:
    """With a question, the earlier turn that answers it is in the context as a labelled snippet,
    within max_chars; without one the context has no snippet."""
    sid = await _long_session(daemon)
    plain = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=600")
    assert _LABEL not in _text(plain)
    question = "刚才那个活力健一盒多少钱？"
    asked = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=600&question={question}")
    memory = [m["content"] for m in asked["messages"]]
    assert memory[-1].endswith(question)
    memory[-1] = memory[-1].removesuffix(question)
    assert sum(len(m) for m in memory) <= 600
    assert _LABEL in memory[0]
    assert "398元" in memory[0][memory[0].index(_LABEL) :]


async def test_a_question_does_not_wait_for_a_whole_index_build(daemon: Daemon) -> None:
    """A question whose session this process has not indexed waits for the build QUESTION_WAIT_S
    at most (here not at all): the context comes without the earlier turns, is counted, and the
    build goes on in the background, so that the next question has them."""
    sid = await _long_session(daemon)
    history = daemon.service._history
    history._question_wait_s = 0.0
    question = "刚才那个活力健一盒多少钱？"
    first = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=600&question={question}")
    assert _LABEL not in _text(first)
    assert daemon.registry.get_sample_value("tiered_memory_questions_unindexed_total") == 1
    for _ in range(200):
        if not history._builds:
            break
        await asyncio.sleep(0.02)
    second = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=600&question={question}")
    assert _LABEL in _text(second)
    assert "398元" in _text(second)
    assert daemon.registry.get_sample_value("tiered_memory_questions_unindexed_total") == 1


async def test_context_fills_its_budget_with_older_raw_turns(daemon: Daemon) -> None:
    """Beyond the window, the raw turns before it fill what the summary leaves of the budget (the
    oldest dropped first), and the whole stays within max_chars."""
    sid = await _long_session(daemon)
    for budget in (300, 1000, 2500):
        ctx = await daemon.get(f"/v1/sessions/{sid}/context?max_chars={budget}")
        turns = [m for m in ctx["messages"] if m["role"] != "system"]
        assert sum(len(m["content"]) for m in ctx["messages"]) <= budget
        assert turns[0]["role"] == "user"
        if budget >= 1000:
            assert len(turns) > 2 * 3, budget  # more than KEEP_RECENT_TURNS turns
    whole = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=100000")
    assert whole["messages"][0]["role"] == "user"  # everything fits raw: no summary
    assert whole["messages"][0]["content"] == ZH_12_TURNS[0][0]


def test_the_recall_indexes_are_bounded_by_messages_not_sessions() -> None:
    """Many short sessions stay indexed together; past the bound the least recently asked go
    first, and the count follows appends and forgets."""
    indexes = RecallIndex(str.split, max_messages=10)
    for n in range(5):
        index = SessionIndex()
        index.add(Message(f"s{n}", 1, 1, Role.USER, "a b", "m1", 0.0), ["a", "b"])
        indexes.put(f"s{n}", index)
    assert (len(indexes), indexes.messages) == (5, 5)
    indexes.get("s0")  # s0 is now the most recently asked
    indexes.appended(Message("s0", 2, 1, Role.ASSISTANT, "c d", "m2", 0.0), ["c", "d"])
    assert indexes.messages == 6
    big = SessionIndex()
    for seq in range(1, 7):
        big.add(Message("big", seq, seq, Role.USER, "x", f"m{seq}", 0.0), ["x"])
    indexes.put("big", big)
    assert indexes.messages <= 10
    assert indexes.get("s1") is None  # the least recently asked went first
    assert indexes.get("s0") is not None
    assert indexes.get("big") is not None
    indexes.forget("big")
    assert indexes.messages == sum(len(i.docs) for i in (indexes.get(f"s{n}") for n in range(5)) if i is not None)
