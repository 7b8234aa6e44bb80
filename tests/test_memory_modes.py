"""Memory strategies and context assembly over HTTP: modes, reply status, load-then-append,
framing, transcripts, token estimates, reconnect phrasing, and no turn lost between the summary
and the window. Each runs on the embedded backends and on real Redis + MariaDB."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, llm_env, memory_of, new_sid, play, rebuild
from tiered_memory.testing import ZH_12_TURNS, Behaviour, FakeLlm


def _contents(ctx: dict[str, Any]) -> list[str]:
    return [m["content"] for m in ctx["messages"]]


@pytest.mark.parametrize("mode", ["none", "window", "summary"])
async def test_the_three_modes_serve_the_same_recorded_session(
    backend_env: dict[str, str], mode: str, make_daemon: MakeDaemon
) -> None:
    """A session recorded in summary mode is served by each mode without migration: none gives no
    history, window the last KEEP_RECENT_TURNS turns only, summary the summary plus the window."""
    recorder = await make_daemon(backend_env)
    sid = new_sid()
    await play(recorder, sid, ZH_12_TURNS[:6])
    await recorder.settle()
    await recorder.stop()
    # The window's shape: the older turns do not fill the rest of the budget here.
    d = await make_daemon(backend_env | {"MEMORY_MODE": mode, "CONTEXT_OLDER_TURNS": "false"})
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    assert ctx["turn_count"] == 6
    if mode == "none":
        assert ctx["messages"] == []
    elif mode == "window":
        assert ctx["summary_tier"] == "none"
        assert [m["role"] for m in ctx["messages"]] == ["user", "assistant"] * 3
        assert _contents(ctx)[0] == ZH_12_TURNS[3][0]
    else:
        assert ctx["messages"][0]["role"] == "system"
        assert ctx["covered_turns"] == 6
        assert "活力健" in ctx["messages"][0]["content"]
        assert [m["role"] for m in ctx["messages"][1:]] == ["user", "assistant"] * 3
        assert _contents(ctx)[1] == ZH_12_TURNS[3][0]


async def test_window_mode_makes_no_summaries_and_summary_mode_catches_up(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """ENABLE_CONVERSATION_SUMMARY=false means window mode: no summary is scheduled or stored. Back
    in summary mode, the start-up sweep summarizes what was recorded meanwhile."""
    d = await make_daemon(backend_env | {"ENABLE_CONVERSATION_SUMMARY": "false"})
    sid = new_sid()
    replies = await play(d, sid, ZH_12_TURNS[:3])
    assert [r["summary_scheduled"] for r in replies] == [False, False, False]
    assert (await d.store.get_summary(sid))[0] is None
    await d.stop()
    d = await make_daemon(backend_env)
    for _ in range(300):
        await d.settle()
        if (await d.store.get_summary(sid))[0] is not None:
            break
        await asyncio.sleep(0.02)
    assert (await d.get(f"/v1/sessions/{sid}/summary"))["covered_turns"] == 3


async def test_an_unfinished_reply_leaves_the_question_alone(daemon: Daemon) -> None:
    """A stopped, failed or streaming assistant reply completes no turn, is kept in the cold tier,
    and is neither shown in the context nor summarized: the question stands alone."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    await daemon.post(sid, "user", "那价格呢？")
    for status in ("streaming", "stopped", "failed"):
        r = await daemon.post(sid, "assistant", f"活力健的价格是（{status}）", status=status)
        assert r["turn_count"] == 2
        assert r["summary_scheduled"] is False
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-1] == {"role": "user", "content": "那价格呢？"}
    assert not any("（stopped）" in c for c in _contents(ctx))
    done = await daemon.post(sid, "assistant", "活力健一盒398元。")
    assert done["turn_count"] == 3
    assert done["summary_scheduled"] is True
    await daemon.settle()
    summary = (await daemon.get(f"/v1/sessions/{sid}/summary"))["summary"]
    assert "398" in summary
    assert "（streaming）" not in summary
    assert await daemon.store.count_messages(sid) == 9
    bad = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "x", "status": "stopped"}
    )
    assert bad.status == 400


async def test_an_interrupted_reply_answers_and_is_shown_cut(daemon: Daemon) -> None:
    """A reply the user barged into is stored as sent with `status: interrupted`; it completes
    its turn, and the context and the summary show it marked as cut in its own language, so
    that the model neither repeats it nor takes it for a whole answer."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    await daemon.post(sid, "user", "那价格呢？")
    cut = await daemon.post(sid, "assistant", "活力健一盒398元，如果您买两盒", status="interrupted")
    assert cut["turn_count"] == 3
    assert cut["summary_scheduled"] is True
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-1] == {"role": "assistant", "content": "活力健一盒398元，如果您买两盒（被打断）"}
    assert "（被打断）" in ctx["recent_transcript"]
    assert "活力健一盒398元，如果您买两盒（被打断）" in ctx["planning_history"]
    await daemon.post(sid, "user", "What about shipping?")
    await daemon.post(sid, "assistant", "Shipping is free above two boxes, and", status="interrupted")
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"][-1]["content"] == "Shipping is free above two boxes, and (interrupted)"
    await daemon.settle()
    summary = (await daemon.get(f"/v1/sessions/{sid}/summary"))["summary"]
    assert "398" in summary
    stored = (await daemon.get(f"/v1/sessions/{sid}/messages"))["messages"]
    assert [(m["content"], m["status"]) for m in stored[5:6]] == [("活力健一盒398元，如果您买两盒", "interrupted")]
    bad = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "x", "status": "interrupted"}
    )
    assert bad.status == 400
    assert "interrupted" in (await bad.json())["error"]["message"]
    assert await daemon.store.count_messages(sid) == 8


async def test_load_then_append_returns_the_context_before_the_message(daemon: Daemon) -> None:
    """POST /turns answers the context as it was before the user's message, with that message as
    the closing question exactly once, then records it; a retry does not repeat the question."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    body = {"content": "那价格呢？", "message_id": "t-3", "system_prompt": "你是健康顾问。"}
    resp = await daemon.http.post(f"/v1/sessions/{sid}/turns", json=body)
    assert resp.status == 201
    first = await resp.json()
    assert first["turn_count"] == 2
    assert first["message_id"] == "t-3"
    msgs = first["messages"]
    assert msgs[0]["role"] == "system"
    assert msgs[0]["content"].startswith("你是健康顾问。")
    assert msgs[-1] == {"role": "user", "content": "那价格呢？"}
    assert sum(m["content"].count("那价格呢？") for m in msgs) == 1
    retry = await daemon.http.post(f"/v1/sessions/{sid}/turns", json=body)
    assert retry.status == 200
    again = await retry.json()
    assert sum(m["content"].count("那价格呢？") for m in again["messages"]) == 1
    assert await daemon.store.count_messages(sid) == 5
    wrong = await daemon.http.post(f"/v1/sessions/{sid}/turns", json={"role": "assistant", "content": "x"})
    assert wrong.status == 400


async def test_transcripts_and_token_estimates(daemon: Daemon) -> None:
    """recent_transcript caps each line and keeps the newest within its budget; answer_transcript
    holds the user's words only; estimated_tokens compares the context with the whole history."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:5])
    await daemon.post(sid, "user", "长" * 500)
    await daemon.settle()
    ctx = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=800")
    lines = ctx["recent_transcript"].split("\n")
    assert lines[-1].startswith("用户：")
    assert len(lines[-1]) <= 3 + 160
    assert len(ctx["recent_transcript"]) <= 2200
    assert ZH_12_TURNS[4][1] in ctx["recent_transcript"]
    assert ZH_12_TURNS[4][1] not in ctx["answer_transcript"]
    assert ZH_12_TURNS[4][0] in ctx["answer_transcript"]
    tokens = ctx["estimated_tokens"]
    assert 0 < tokens["context"] <= 400
    history_chars = sum(len(u) + len(a) for u, a in ZH_12_TURNS[:5]) + 500
    assert tokens["full_history"] == -(-history_chars // 2)


async def test_reconnect_after_a_gap_says_how_long_ago(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """After more than RECONNECT_GAP_SECONDS of silence the summary message says how long ago the
    conversation was; within the gap it is the plain summary prefix."""
    d = await make_daemon(backend_env | {"RECONNECT_GAP_SECONDS": "1", "CONTEXT_OLDER_TURNS": "false"})
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:5])
    await d.settle()
    # Activity just now (the first summary may have taken a while to load jieba).
    await d.post(sid, "user", "还有别的吗？")
    fresh = await d.get(f"/v1/sessions/{sid}/context")
    assert memory_of(fresh["messages"][0]["content"]).startswith("[历史对话摘要]")
    await asyncio.sleep(1.2)
    later = await d.get(f"/v1/sessions/{sid}/context")
    assert memory_of(later["messages"][0]["content"]).startswith("用户上次（1分钟前）的对话摘要：")


async def test_no_turn_falls_between_a_lagging_summary_and_the_window(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """While a slow LLM holds the summary back, the turns it does not cover yet and that left the
    window are still in the context: raw when they fit, as a deterministic digest when not."""
    fake_llm.behaviour = Behaviour(text="用户王小明咨询了活力健。")
    env = backend_env | {
        "LLM_BASE_URL": fake_llm.url,
        "SUMMARY_MODEL": "m",
        "LLM_TIMEOUT_SECONDS": "10",
        "SUMMARY_FORMAT": "text",
        "CONTEXT_OLDER_TURNS": "false",
    }
    d = await make_daemon(env)
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    fake_llm.behaviour = Behaviour(delay_s=3.0, text="later")
    await play(d, sid, ZH_12_TURNS[3:11])
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    assert ctx["covered_turns"] == 3
    assert ctx["turn_count"] == 11
    text = "\n".join(_contents(ctx))
    assert "用户王小明咨询了活力健。" in text
    for user, _assistant in ZH_12_TURNS[3:11]:
        assert user in text
    tight = await d.get(f"/v1/sessions/{sid}/context?max_chars=500")
    assert sum(len(c) for c in _contents(tight)) <= 500
    tight_text = "\n".join(_contents(tight))
    assert "王小明" in tight_text
    assert "18度" in tight_text
    assert ZH_12_TURNS[10][1] in tight_text


async def test_user_summaries_newest_first(daemon: Daemon) -> None:
    """GET /v1/users/{user_id}/summaries lists that user's session summaries, newest first, and
    only theirs."""
    user = f"u-{new_sid()}"
    sids = [new_sid() for _ in range(3)]
    for sid in sids:
        for u, a in ZH_12_TURNS[:3]:
            await daemon.post(sid, "user", u, user_id=user)
            await daemon.post(sid, "assistant", a)
        await daemon.settle()
    other = new_sid()
    for u, a in ZH_12_TURNS[:3]:
        await daemon.post(other, "user", u, user_id="someone-else")
        await daemon.post(other, "assistant", a)
    await daemon.settle()
    listed = await daemon.get(f"/v1/users/{user}/summaries?limit=2")
    assert [s["session_id"] for s in listed["summaries"]] == [sids[2], sids[1]]
    assert listed["summaries"][0]["covered_turns"] == 3
    everything = await daemon.get(f"/v1/users/{user}/summaries")
    assert {s["session_id"] for s in everything["summaries"]} == set(sids)
    assert (await daemon.http.get(f"/v1/users/{user}/summaries?limit=0")).status == 400


async def test_reset_summary_keeps_the_messages(daemon: Daemon) -> None:
    """DELETE /v1/sessions/{sid}/summary forgets the summary in both tiers; the messages stay, so
    the cold tier answers, and the next sweep rebuilds the summary."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:3])
    await daemon.settle()
    assert (await daemon.get(f"/v1/sessions/{sid}/summary"))["tier"] == "hot"
    assert (await daemon.http.delete(f"/v1/sessions/{sid}/summary")).status == 204
    assert (await daemon.get(f"/v1/sessions/{sid}/summary"))["tier"] == "cold"
    assert await daemon.store.count_messages(sid) == 6
    await daemon.service.sweep()
    await daemon.settle()
    rebuilt = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert rebuilt["tier"] == "hot"
    assert rebuilt["covered_turns"] == 3
    assert (await daemon.http.delete(f"/v1/sessions/{new_sid()}/summary")).status == 404


async def test_topic_keywords_come_first(backend_env: dict[str, str], tmp_path: Path, make_daemon: MakeDaemon) -> None:
    """Keywords from TOPIC_KEYWORDS_FILE found in a conversation lead its topic tags, on stored
    summaries and on the cold extraction alike."""
    keywords = tmp_path / "topics.txt"
    keywords.write_text("# products\n产品: 活力健, 基础三合一\n地点: 香山\n", encoding="utf-8")
    d = await make_daemon(backend_env | {"TOPIC_KEYWORDS_FILE": str(keywords)})
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:2])
    cold = await d.get(f"/v1/sessions/{sid}/summary")
    assert cold["tier"] == "cold"
    assert cold["topics"][0] == "活力健"
    await play(d, sid, ZH_12_TURNS[2:6])
    await d.settle()
    hot = await d.get(f"/v1/sessions/{sid}/summary")
    assert hot["topics"][:2] == ["活力健", "香山"]
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    assert ctx["topics"] == hot["topics"]


async def test_a_short_conversation_is_sent_raw_without_a_summary(daemon: Daemon) -> None:
    """While every turn fits in the window and the budget, the context carries them raw and no
    summary message repeating them."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:3])
    await daemon.settle()
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["summary_tier"] == "hot"
    assert [m["role"] for m in ctx["messages"]] == ["user", "assistant"] * 3
    # 110 characters: the three turns (114) no longer fit, and beside the last turn and the
    # memory block's tags (19) there is room for the subject line.
    tight = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=110")
    assert tight["messages"][0]["role"] == "system"


async def test_slices_lead_back_to_messages_and_rebuild_with_a_new_prompt(
    backend_env: dict[str, str], fake_llm: FakeLlm, tmp_path: Path, make_daemon: MakeDaemon
) -> None:
    """Every summarization records a slice (turn and message range, a digest, model and prompt);
    a slice's messages_url returns exactly its raw messages; rebuild after a prompt change
    recomputes every slice (COMPRESSION_BATCH_TURNS per slice) and the summary under the new prompt."""
    fake_llm.behaviour = Behaviour(text="用户王小明咨询活力健。")
    env = llm_env(backend_env, fake_llm, SUMMARY_MODEL="model-a", SUMMARY_FORMAT="text")
    d = await make_daemon(env)
    sid = new_sid()
    for user, assistant in ZH_12_TURNS[:7]:
        await d.post(sid, "user", user)
        await d.post(sid, "assistant", assistant)
        await d.settle()
    slices = (await d.get(f"/v1/sessions/{sid}/slices"))["slices"]
    assert [(s["from_turn"], s["to_turn"]) for s in slices] == [(1, 3), (4, 6)]
    assert [(s["first_seq"], s["last_seq"]) for s in slices] == [(1, 6), (7, 12)]
    assert {s["model"] for s in slices} == {"model-a"}
    old_prompt = slices[0]["prompt_id"]
    raw = await d.get(slices[1]["messages_url"])
    assert raw["messages"][0]["content"] == ZH_12_TURNS[3][0]
    assert len(raw["messages"]) == 6
    assert "活力健" in slices[0]["summary"]
    version = (await d.get(f"/v1/sessions/{sid}/summary"))["version"]
    await d.stop()
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Summarize in English.", encoding="utf-8")
    d = await make_daemon(env | {"SUMMARY_PROMPT_FILE": str(prompt), "SUMMARY_MODEL": "model-b"})
    rebuilt = (await rebuild(d, sid))["result"]
    assert rebuilt["covered_turns"] == 7
    assert rebuilt["version"] == version + 1
    # Rebuilt COMPRESSION_BATCH_TURNS (6) turns per slice.
    slices = (await d.get(rebuilt["slices_url"]))["slices"]
    assert rebuilt["slice_count"] == len(slices)
    assert [(s["from_turn"], s["to_turn"]) for s in slices] == [(1, 6), (7, 7)]
    assert {s["model"] for s in slices} == {"model-b"}
    assert old_prompt not in {s["prompt_id"] for s in slices}
    assert fake_llm.requests[-1]["body"]["messages"][0]["content"] == "Summarize in English."
    summary = await d.get(f"/v1/sessions/{sid}/summary")
    assert summary["version"] == version + 1
    assert summary["tier"] == "hot"
    assert (await d.http.post(f"/v1/sessions/{new_sid()}/summary/rebuild")).status == 404


@pytest.mark.parametrize("mode", ["none", "window", "summary"])
async def test_forty_turns_hold_budgets_lose_no_turn_and_cost_flat(
    backend_env: dict[str, str], fake_llm: FakeLlm, mode: str, make_daemon: MakeDaemon
) -> None:
    """A 40-turn conversation in each mode: every context stays within its budget; in summary mode
    every completed turn is in the summary or the raw window at every step, and the LLM input per
    summarization does not grow with the session (the summary is incremental)."""
    # The default, structured format: the LLM merges the previous payload with the new turns.
    fake_llm.behaviour = Behaviour(
        text=json.dumps(
            {
                "summary": "用户逐一询问了多个编号产品的情况和价格。",
                "conversation_goal": "了解各编号产品",
                "stable_facts": ["产品编号从001开始"],
                "user_preferences": [],
                "resolved_points": ["每个产品都有报价"],
                "pending_questions": [],
                "retrieval_hints": ["编号", "价格"],
            },
            ensure_ascii=False,
        )
    )
    env = llm_env(backend_env, fake_llm, MEMORY_MODE=mode)
    d = await make_daemon(env)
    sid = new_sid()
    budget = 700
    for turn in range(1, 41):
        await d.post(sid, "user", f"第{turn}个问题：{sid}编号{turn:03d}的产品怎么样？")
        # Long replies: three raw turns no longer fit next to the summary, so the budget binds.
        await d.post(sid, "assistant", f"编号{turn:03d}的产品很好，价格{turn * 10}元。" + "详细介绍" * 60)
        await d.settle()
        ctx = await d.get(f"/v1/sessions/{sid}/context?max_chars={budget}")
        used = sum(len(m["content"]) for m in ctx["messages"])
        assert used <= budget
        if mode != "none" and turn >= 3:
            # The budget binds: three raw turns (about 900 characters) do not fit in it, so
            # the older turns are carried by their key points or the summary instead.
            assert sum(1 for c in _contents(ctx) if c.startswith("第")) < 3, (turn, _contents(ctx))
        assert ctx["turn_count"] == turn
        if mode == "none":
            assert ctx["messages"] == []
            continue
        raw_turns = {int(c[1 : c.index("个")]) for c in _contents(ctx) if c.startswith("第")}
        assert max(raw_turns) == turn
        assert raw_turns == set(range(min(raw_turns), turn + 1))
        if mode == "window":
            assert min(raw_turns) >= turn - 2
            continue
        covered = ctx["covered_turns"]
        assert covered >= turn - turn % 3
        everything = "\n".join(_contents(ctx))
        for t in range(covered + 1, turn + 1):
            assert f"编号{t:03d}" in everything, (turn, t)
    if mode == "summary":
        # Only this session's calls (the start-up sweep may summarize other tests' sessions).
        prompts = [r["body"]["messages"][1]["content"] for r in fake_llm.requests]
        sizes = [len(p) for p in prompts if sid in p]
        assert len(sizes) == 13
        assert (await d.get(f"/v1/sessions/{sid}/summary"))["source"] == "llm"
        assert max(sizes[1:]) <= 1.2 * min(sizes[1:])
    else:
        assert not any(sid in r["body"]["messages"][1]["content"] for r in fake_llm.requests)


async def test_reconnect_phrasing_follows_the_summary_language(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """An English conversation gets the English reconnect template after the gap."""
    d = await make_daemon(backend_env | {"RECONNECT_GAP_SECONDS": "1", "CONTEXT_OLDER_TURNS": "false"})
    sid = new_sid()
    english = [
        ("Hi, I'm Sarah and I want the X200 headphones.", "The X200 costs $199 and comes in black."),
        ("Do they fold?", "Yes, the X200 folds flat."),
        ("What about battery life?", "About 30 hours per charge."),
        ("Any discount?", "There is 10% off this week."),
        ("Great, thanks.", "You're welcome, Sarah."),
    ]
    await play(d, sid, english)
    await d.settle()
    await asyncio.sleep(1.2)
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    memory = memory_of(ctx["messages"][0]["content"])
    assert memory.startswith("Summary of the user's previous conversation (1 minute ago): ")
    assert "X200" in ctx["messages"][0]["content"]


async def test_under_a_tight_budget_uncovered_turns_are_carried(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """With a long summary, a summary lagging behind a slow LLM and long replies, the turns it does
    not cover and that do not fit raw are carried in the system message (their key points, or a
    digest at its head); the budget cuts the older summary, not them."""
    long_summary = "用户早前咨询了活力健。" + "细节" * 600
    fake_llm.behaviour = Behaviour(text=long_summary)
    env = llm_env(backend_env, fake_llm, SUMMARY_FORMAT="text")
    d = await make_daemon(env)
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    fake_llm.behaviour = Behaviour(delay_s=5.0, text="later")
    for turn in range(4, 12):
        await d.post(sid, "user", f"第{turn}个问题：编号{turn:03d}的型号多少钱？")
        await d.post(sid, "assistant", f"编号{turn:03d}的型号售价{turn}99元。" + "说明" * 150)
    ctx = await d.get(f"/v1/sessions/{sid}/context?max_chars=2000")
    assert ctx["covered_turns"] == 3
    assert sum(len(c) for c in _contents(ctx)) <= 2000
    system = ctx["messages"][0]
    assert system["role"] == "system"
    everything = "\n".join(_contents(ctx))
    for turn in range(4, 12):
        assert f"{turn}99元" in everything, turn
    assert ctx["messages"][-2]["content"].startswith("第11个问题")


async def test_a_long_newest_reply_keeps_its_question(daemon: Daemon) -> None:
    """A newest reply longer than the budget is cut, and its question stays beside it."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:6])
    await daemon.post(sid, "user", "详细说说活力健？")
    await daemon.post(sid, "assistant", "活力健" + "很好" * 2000)
    await daemon.settle()
    ctx = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=2000")
    roles = [m["role"] for m in ctx["messages"]]
    assert roles[-2:] == ["user", "assistant"]
    assert ctx["messages"][-2]["content"] == "详细说说活力健？"
    assert sum(len(c) for c in _contents(ctx)) <= 2000
    assert sum(len(c) for c in _contents(ctx)) > 1500


async def test_transcript_budgets_bind_from_the_oldest_end(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """With long turns, recent_transcript stays within RECENT_TRANSCRIPT_MAX_CHARS and
    answer_transcript within ANSWER_HISTORY_MAX_CHARS, both dropping the oldest lines first, and
    planning_history within PLANNING_HISTORY_MAX_CHARS with the newest transcript at its end."""
    d = await make_daemon(
        backend_env | {"KEEP_RECENT_TURNS": "12", "SUMMARY_EVERY_N_TURNS": "12", "COMPRESSION_BATCH_TURNS": "12"}
    )
    sid = new_sid()
    for turn in range(1, 13):
        await d.post(sid, "user", f"问题{turn:02d}：" + "问" * 150)
        await d.post(sid, "assistant", f"回答{turn:02d}：" + "答" * 400)
    await d.settle()
    ctx = await d.get(f"/v1/sessions/{sid}/context?max_chars=100000")
    recent, answers, plan = ctx["recent_transcript"], ctx["answer_transcript"], ctx["planning_history"]
    assert 1700 < len(recent) <= 2200
    assert recent.rstrip().endswith("…")
    assert "回答12" in recent
    assert "问题01" not in recent
    assert all(len(line) <= 3 + 320 for line in recent.split("\n"))
    assert 800 < len(answers) <= 1000
    assert "问题12" in answers
    assert "问题01" not in answers
    assert "回答" not in answers
    assert len(plan) <= 1600
    assert "回答12" in plan


async def test_a_late_reply_part_is_summarized_with_the_next_turn(daemon: Daemon) -> None:
    """A further part of a reply that arrives after its turn was summarized is not lost: it goes
    with the next turn, into the next summary and a slice, and every message is in some slice."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:3])
    await daemon.settle()
    late = await daemon.post(sid, "assistant", "补充一下：活力健的保质期是24个月。")
    assert late["turn_count"] == 3
    await play(daemon, sid, ZH_12_TURNS[3:6])
    await daemon.settle()
    answer = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert answer["covered_turns"] == 6
    assert "24个月" in answer["summary"]
    slices = (await daemon.get(f"/v1/sessions/{sid}/slices"))["slices"]
    seqs = [(s["first_seq"], s["last_seq"]) for s in slices]
    assert seqs == [(1, 6), (7, 13)]


async def test_the_product_named_in_turn_one_is_in_every_context_from_150_characters(daemon: Daemon) -> None:
    """The 12-turn test conversation (ZH_12_TURNS): 活力健 is named only in turn 1 (and by the assistant),
    and the context holds it at every budget of 150 characters or more, with the last turn raw."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:11])
    await daemon.post(sid, "user", "对了，那个产品适合高血压的人吗？")
    await daemon.post(sid, "assistant", "一般人群都可以服用，高血压患者建议先咨询医生。")
    await daemon.settle()
    for budget in (150, 200, 300, 600, 1000, 2000, 4000):
        ctx = await daemon.get(f"/v1/sessions/{sid}/context?max_chars={budget}")
        contents = _contents(ctx)
        assert sum(len(c) for c in contents) <= budget
        assert "活力健" in "\n".join(contents), (budget, contents)
        assert ctx["messages"][-1]["role"] == "assistant"
        assert ctx["messages"][-2]["content"].endswith("适合高血压的人吗？"), budget
