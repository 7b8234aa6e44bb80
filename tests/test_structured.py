"""The structured summary payload over HTTP: limits enforced on what the LLM returns, rejected
replies counted with the rule-based merge standing in, planning fields, and batching."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.helpers.daemon import MakeDaemon, llm_env, new_sid, play
from tiered_memory.payload import check_text, looks_like_answer, newest_lines, planning_history
from tiered_memory.testing import ZH_12_TURNS, Behaviour, FakeLlm

_TEN = "甲乙丙丁戊己庚辛壬癸"


def _payload(**overrides: Any) -> str:
    doc = {
        "summary": "用户王小明咨询活力健的用法和价格，偏好不太甜的口味。",
        "conversation_goal": "了解活力健",
        # Ten facts, each grounded in the conversation: numbered 0-9 they would name numbers it never said.
        "stable_facts": [f"事实{c}" for c in _TEN],
        "user_preferences": ["不喜欢太甜" + "很" * 100],
        "resolved_points": ["每天2次，每次1条", "一盒398元"],
        "pending_questions": ["是否适合高血压人群"],
        "retrieval_hints": ["活力健", "剂量", "价格"],
    }
    return json.dumps(doc | overrides, ensure_ascii=False)


async def test_llm_payload_is_stored_with_limits_enforced(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """A JSON payload (even in a Markdown fence) is stored; lists are cut to 6 items of 80 chars;
    the summary text is the payload's `summary`; the context exposes planning fields."""
    fake_llm.behaviour = Behaviour(text="```json\n" + _payload() + "\n```")
    d = await make_daemon(llm_env(backend_env, fake_llm))
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:6])
    await d.settle()
    answer = await d.get(f"/v1/sessions/{sid}/summary")
    assert answer["source"] == "llm"
    assert answer["summary"].startswith("用户王小明咨询活力健")
    prompt = fake_llm.last_user_prompt()
    assert prompt.startswith("已有长期记忆：{")
    assert '"conversation_goal": "了解活力健"' in prompt
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    plan = ctx["planning"]
    assert plan["goal"] == "了解活力健"
    assert plan["facts"] == [f"事实{c}" for c in _TEN[:6]]
    assert plan["pending_questions"] == ["是否适合高血压人群"]
    assert plan["retrieval_hints"] == ["活力健", "剂量", "价格"]
    summary, _ = await d.store.get_summary(sid)
    assert summary is not None
    assert len(summary.structured["payload"]["user_preferences"][0]) == 80
    assert "目标：了解活力健" in ctx["planning_history"]
    assert len(ctx["planning_history"]) <= 1600


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("这不是JSON", "malformed"),
        ('{"summary": 5}', "malformed"),
        ('{"summary": "x", "stable_facts": "not a list"}', "malformed"),
        ('{"summary": "无需摘要"}', "empty"),
        ('{"summary": ""}', "empty"),
        ('{"summary": "您好！活力健每天2次，每次1条，您可以饭后服用。"}', "answer"),
    ],
)
async def test_rejected_replies_fall_back_to_the_rule_based_merge(
    backend_env: dict[str, str], fake_llm: FakeLlm, reply: str, reason: str, make_daemon: MakeDaemon
) -> None:
    """Malformed JSON, an empty or "nothing to summarize" reply, or one that answers the user is
    rejected and counted; the rule-based payload stands: previous summary plus batch highlights,
    goal from the latest turn, pending questions accumulated, retrieval hints from keywords."""
    fake_llm.behaviour = Behaviour(text=reply)
    d = await make_daemon(llm_env(backend_env, fake_llm))
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    answer = await d.get(f"/v1/sessions/{sid}/summary")
    assert answer["source"] == "deterministic"
    assert "398" in answer["summary"]
    ctx = await d.get(f"/v1/sessions/{sid}/context")
    plan = ctx["planning"]
    assert plan["goal"] == ZH_12_TURNS[2][0]
    assert ZH_12_TURNS[1][0] in plan["pending_questions"]
    assert plan["retrieval_hints"]
    assert "请问" not in plan["retrieval_hints"]
    metrics = await (await d.http.get("/metrics")).text()
    assert f'tiered_memory_llm_failures_total{{reason="{reason}"}} 1.0' in metrics


async def test_a_backlog_is_merged_in_batches(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """Turns recorded while summaries were off are merged COMPRESSION_BATCH_TURNS at a time: one
    LLM call and one slice per batch, each call carrying only its batch's turns."""
    d = await make_daemon(backend_env | {"MEMORY_MODE": "window"})
    sid = new_sid()
    # Marked with the session id: other tests' sessions may be summarized by the same sweep.
    turns = [(f"{user}（{sid}）", assistant) for user, assistant in ZH_12_TURNS[:11]]
    await play(d, sid, turns)
    await d.stop()
    fake_llm.behaviour = Behaviour(text=_payload())
    d = await make_daemon(llm_env(backend_env, fake_llm, COMPRESSION_BATCH_TURNS="4", SUMMARY_EVERY_N_TURNS="3"))
    # The start-up sweep finds the backlog and summarizes it in the background, LLM first.
    # Waited for before the close: a close's own pass never calls the LLM, and one that took
    # the lock first would merge the backlog with the extractor.
    for _ in range(300):
        summary, _info = await d.store.get_summary(sid)
        if summary is not None:
            break
        await asyncio.sleep(0.1)
    await d.settle()
    await d.http.post(f"/v1/sessions/{sid}/close")
    await d.settle()
    slices = (await d.get(f"/v1/sessions/{sid}/slices"))["slices"]
    assert [(s["from_turn"], s["to_turn"]) for s in slices] == [(1, 4), (5, 8), (9, 11)]
    calls = [r["body"]["messages"][1]["content"] for r in fake_llm.requests]
    mine = [c for c in calls if sid in c]
    assert len(mine) == 3
    assert [sum(turn[0] in c for turn in turns) for c in mine] == [4, 4, 3]
    assert turns[0][0] in mine[0]
    assert turns[4][0] in mine[1]
    assert turns[8][0] in mine[2]
    assert (await d.get(f"/v1/sessions/{sid}/summary"))["covered_turns"] == 11


def test_answer_and_nothing_detection() -> None:
    """A reply addressed to the user is an answer; one about the user is a summary."""
    assert looks_like_answer("您好，活力健每天2次。")
    assert looks_like_answer("Sure! You can take it twice a day.")
    assert not looks_like_answer("用户询问活力健的用法，助手说明每天2次。")
    assert not looks_like_answer("The user asked about dosage; the assistant said twice a day.")
    for text in ("无", "没有可总结的内容", "Nothing to summarize."):
        with pytest.raises(Exception, match="nothing to summarize"):
            check_text(text)


def test_planning_history_split() -> None:
    """planning_history keeps about 65% for the newest transcript and the rest for structured facts."""
    payload = {
        "conversation_goal": "了解产品",
        "stable_facts": ["事实" * 100],
        "pending_questions": [],
        "retrieval_hints": [],
    }
    text = planning_history("旧" * 2000 + "新", payload, max_chars=1600)
    assert len(text) <= 1600
    assert text.endswith("新")
    assert text.startswith("目标：了解产品")
    recent = text.split("\n\n")[-1]
    assert len(recent) == 1040


def test_planning_history_keeps_whole_lines_with_their_speakers() -> None:
    """The transcript part of planning_history is its newest whole lines, each with its speaker,
    never a line's middle; a newest line alone too long keeps its speaker and its end, marked."""
    transcript = "\n".join(f"{who}: {'word ' * 20}{n}" for n in range(12) for who in ("User", "Assistant"))
    text = planning_history(transcript, None, max_chars=600)
    assert text
    assert len(text) <= 600
    assert all(line.startswith(("User: ", "Assistant: ")) for line in text.split("\n"))
    assert text.endswith("word 11")
    assert len(text) > 600 * 0.65 - 120  # as many whole lines as fit
    assert newest_lines("User: hi\nAssistant: " + "x" * 100 + "END", 30) == "Assistant: …" + "x" * 15 + "END"


@pytest.mark.parametrize("summary_format", ["structured", "text"])
async def test_invalid_unicode_from_the_llm_is_rejected(
    backend_env: dict[str, str], fake_llm: FakeLlm, summary_format: str, make_daemon: MakeDaemon
) -> None:
    """A reply with a lone surrogate is rejected as malformed and the rule-based merge stands,
    instead of crashing the summary job."""
    body = '{"summary": "用户\\ud800咨询活力健。"}' if summary_format == "structured" else "用户\ud800咨询活力健。"
    fake_llm.behaviour = Behaviour(text=body)
    d = await make_daemon(llm_env(backend_env, fake_llm, SUMMARY_FORMAT=summary_format))
    sid = new_sid()
    await play(d, sid, ZH_12_TURNS[:3])
    await d.settle()
    answer = await d.get(f"/v1/sessions/{sid}/summary")
    assert answer["tier"] == "hot"
    assert answer["source"] == "deterministic"
    metrics = await (await d.http.get("/metrics")).text()
    assert 'tiered_memory_llm_failures_total{reason="malformed"} 1.0' in metrics


async def test_a_fallback_after_an_llm_summary_keeps_it(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """When the LLM fails after it wrote the previous summary, the rule-based merge keeps that
    summary's text and list fields and adds the new batch; pending questions accumulate."""
    fake_llm.behaviour = Behaviour(
        text=_payload(
            summary="用户是糖尿病患者，对比了竞品ZQ-7。",
            stable_facts=["用户有糖尿病"],
            pending_questions=["ZQ-7和活力健哪个好"],
        )
    )
    d = await make_daemon(llm_env(backend_env, fake_llm))
    sid = new_sid()
    # The user names the rival product the LLM's summary keeps (an id: it must be in the turns).
    first = ("我有糖尿病，ZQ-7和活力健哪个好？", "两款成分不同，活力健每天2次，每次1条。")
    await play(d, sid, [first, *ZH_12_TURNS[1:3]])
    await d.settle()
    fake_llm.behaviour = Behaviour(text="not json")
    await play(d, sid, [("我想去爬山，香山人多吗？", "周末香山游客较多，建议早上七点前出发。")] * 1 + ZH_12_TURNS[6:8])
    await d.settle()
    answer = await d.get(f"/v1/sessions/{sid}/summary")
    assert answer["source"] == "deterministic"
    assert answer["covered_turns"] == 6
    assert "ZQ-7" in answer["summary"]
    assert "糖尿病" in answer["summary"]
    payload = answer["payload"]
    assert "用户有糖尿病" in payload["stable_facts"]
    assert payload["pending_questions"][0] == "ZQ-7和活力健哪个好"
    assert "我想去爬山，香山人多吗？" in payload["pending_questions"]
