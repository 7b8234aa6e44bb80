"""Query-aware recall over HTTP: `GET …/recall` and `GET …/context?question=…`, and the context
that fills its budget with older raw turns. Each runs on the embedded backends and on real Redis +
MariaDB."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, new_sid, play, sql_statements
from tests.helpers.lane_calls import slow_call
from tiered_memory.http.keys import HOT_KEY, TEXT_KEY
from tiered_memory.model import SessionKey
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.lane import Ticket
from tiered_memory.testing import ZH_12_TURNS
from tiered_memory.tiers.postings import STALE, pack

# Chit-chat that pushes the facts of ZH_12_TURNS far out of the raw window.
_DRIFT = [(f"第{i}个闲聊问题，随便聊聊天气和路况？", f"第{i}个回答：今天路上车不多，天气也还行。") for i in range(30)]
_LABEL = "[早前对话片段]"


def _text(ctx: dict[str, Any]) -> str:
    return "\n".join(m["content"] for m in ctx["messages"])


async def _long_session(daemon: Daemon) -> SessionKey:
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


async def test_a_question_does_not_wait_for_postings_to_catch_up(daemon: Daemon) -> None:
    """After the hot tier lost a session's postings, a question waits for their catch-up from SQL
    QUESTION_WAIT_S at most (here not at all): the context comes without the earlier turns, is
    counted, and the catch-up goes on in the background, so that the next question has them."""
    sid = await _long_session(daemon)
    await daemon.flush_hot()
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


async def test_a_question_does_not_wait_for_the_indexing_of_its_window(daemon: Daemon) -> None:
    """The postings that lack only messages inside the context's window (appended just now, their
    words still queued behind every tenant's background text work) answer at once: the turns a
    context searches are those before its window, and the window's are in it raw."""
    sid = await _long_session(daemon)
    await _indexed(daemon, sid)
    history = daemon.service._history
    history._question_wait_s = 0.0
    assert daemon.app is not None
    text = daemon.app[TEXT_KEY]
    # The indexer's calls for the next appends queue behind another tenant's background call
    # that lasts while this test asks (background work has one worker of the two).
    held = asyncio.create_task(text.call(Ticket("other", 1), slow_call, "held", 3.0))
    deadline = time.monotonic() + 5
    while not text.busy:  # taken by its worker at once, once the task runs
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    try:
        await play(daemon, sid, [("再来一个问题。", "好的，请说。")])
        postings = daemon.app[HOT_KEY].postings
        assert (await postings.read(sid, ())).last_seq < await daemon.store.count_messages(sid)
        question = "刚才那个活力健一盒多少钱？"
        asked = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=600&question={question}")
        assert "398元" in _text(asked)
        assert daemon.registry.get_sample_value("tiered_memory_questions_unindexed_total") in (None, 0)
    finally:
        await held


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


async def test_a_lagging_summary_never_cuts_the_questions_matches(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """With no summary yet, every turn the context does not show is in the lagging digest; beside
    a question's matches the digest takes only the room left, so the match that answers the
    question is there whole, within max_chars."""
    d = await make_daemon(backend_env | {"SUMMARY_EVERY_N_TURNS": "1000", "COMPRESSION_BATCH_TURNS": "1000"})
    sid = new_sid()
    await play(d, sid, [*ZH_12_TURNS[:3], *_DRIFT])
    await _indexed(d, sid)
    question = "刚才那个活力健一盒多少钱？"
    for budget in (300, 600):
        asked = await d.get(f"/v1/sessions/{sid}/context?max_chars={budget}&question={question}")
        memory = [m["content"] for m in asked["messages"]]
        memory[-1] = memory[-1].removesuffix(question).removesuffix("\n")
        assert sum(len(m) for m in memory) <= budget
        snippets = memory[0][memory[0].index(_LABEL) :]
        assert "398元" in snippets, (budget, memory[0])
        assert not snippets.removesuffix("\n</memory>").endswith("…"), (budget, memory[0])


async def _indexed(daemon: Daemon, sid: SessionKey) -> None:
    """Wait until the session's postings hold every message (they are added in the background)."""
    assert daemon.app is not None
    postings = daemon.app[HOT_KEY].postings
    count = await daemon.store.count_messages(sid)
    for _ in range(200):
        if (await postings.read(sid, ())).last_seq == count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the postings did not catch up")


@pytest.mark.parametrize("backend_env", ["real"], indirect=True)
async def test_every_process_reads_the_same_postings(daemon: Daemon, make_daemon: MakeDaemon) -> None:
    """On Redis the postings are every replica's: a process that never saw the session's appends
    (the daemon restarted) answers its first question from them at once, reading no message
    from SQL, and a
    message appended through one replica is found by the next question to another."""
    sid = await _long_session(daemon)
    await _indexed(daemon, sid)
    await daemon.restart()
    history = daemon.service._history
    history._question_wait_s = 0.0
    question = "刚才那个活力健一盒多少钱？"
    with sql_statements(daemon.store) as statements:
        asked = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=600&question={question}")
    # (The start-up sweep may read the sessions table meanwhile.)
    assert [s for s in statements if "messages" in s] == []
    assert not history._builds
    assert _LABEL in _text(asked)
    assert "398元" in _text(asked)
    assert not daemon.registry.get_sample_value("tiered_memory_questions_unindexed_total")
    other = await make_daemon(daemon.env)
    other.service._history._question_wait_s = 0.0
    await play(other, sid, [("我还想买一副羽毛球拍。", "推荐碳素羽毛球拍，单支299元。"), *_DRIFT[:4]])
    await _indexed(other, sid)
    found = (await daemon.get(f"/v1/sessions/{sid}/recall?q=羽毛球拍"))["matches"]
    assert "299元" in " ".join(m["content"] for m in found[0]["messages"])
    assert not history._builds


async def test_postings_left_by_a_deleted_session_are_dropped(daemon: Daemon) -> None:
    """A catch-up that read a session's messages before it was deleted is refused when it adds
    them after (the delete set the postings' floor). One that gets in anyway (a replica whose
    clock runs ahead) is caught by the next question: it finds another message under a seq it
    knows, shows none of the old turns, and drops them; the session's own postings catch up."""
    sid = await _long_session(daemon)
    old = await daemon.store.messages_by_seq(sid, first_seq=1, last_seq=200, limit=200)
    read_at = time.time()
    assert (await daemon.http.delete(f"/v1/sessions/{sid}")).status == 204
    assert daemon.app is not None
    postings = daemon.app[HOT_KEY].postings
    terms = Extractor().search_terms_of([m.content for m in old])
    assert await postings.add(sid, pack(old, terms, read_at=read_at)) == STALE
    await play(daemon, sid, [("新的会话，问问天气。", "今天晴。"), ("明天呢？", "明天有雨。")])
    await postings.forget(sid)
    await postings.add(sid, pack(old, terms, read_at=time.time() + 1))
    question = "刚才那个活力健一盒多少钱？"
    asked = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=600&question={question}")
    assert "398元" not in _text(asked)
    assert (await postings.read(sid, ())).last_seq != len(old)
    await _indexed(daemon, sid)
    assert (await daemon.get(f"/v1/sessions/{sid}/recall?q=活力健"))["matches"] == []
