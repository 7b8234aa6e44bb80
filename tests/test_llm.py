"""The LLM path against a local chat-completions server: success, every failure, and never blocking."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.conftest import Daemon, new_sid, play
from tests.conversations import ZH_12_TURNS, ZH_EARLY_EVIDENCE
from tests.fake_llm import Behaviour, FakeLlm
from tiered_memory.errors import LlmFailed
from tiered_memory.model import Message, Role
from tiered_memory.summarize.llm import LlmSummarizer, default_prompt


def _messages() -> list[Message]:
    out = []
    for i, (u, a) in enumerate(ZH_12_TURNS[:3], start=1):
        out.append(Message("s", 2 * i - 1, i, Role.USER, u, f"u{i}", 0.0))
        out.append(Message("s", 2 * i, i, Role.ASSISTANT, a, f"a{i}", 0.0))
    return out


async def _summarize(llm: FakeLlm, previous: str | None = None, timeout_s: float = 2.0) -> str:
    async with aiohttp.ClientSession() as session:
        client = LlmSummarizer(
            session,
            base_url=llm.url,
            api_key="sk-test",
            model="summary-model",
            max_tokens=120,
            timeout_s=timeout_s,
            prompt=default_prompt(),
            max_chars=50,
        )
        return await client.summarize(previous, _messages())


async def test_request_follows_the_protocol(fake_llm: FakeLlm) -> None:
    """The request carries the model, max_tokens, the default prompt, the previous summary and
    only the new turns; the bearer key is sent; the reply is trimmed to max_chars."""
    fake_llm.behaviour = Behaviour(text="摘" * 80)
    text = await _summarize(fake_llm, previous="之前的摘要")
    assert text == "摘" * 50
    req = fake_llm.requests[-1]
    body = req["body"]
    assert body["model"] == "summary-model"
    assert body["max_tokens"] == 120
    assert body["messages"][0]["role"] == "system"
    assert "对话摘要助手" in body["messages"][0]["content"]
    prompt = fake_llm.last_user_prompt()
    assert "之前的摘要" in prompt
    assert "用户：你好，我叫王小明" in prompt
    assert req["headers"]["Authorization"] == "Bearer sk-test"


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        (Behaviour(mode="status", status=500), "http_error"),
        (Behaviour(mode="status", status=429), "http_error"),
        (Behaviour(mode="malformed"), "malformed"),
        (Behaviour(mode="no_choices"), "malformed"),
        (Behaviour(mode="empty"), "empty"),
        (Behaviour(delay_s=3.0), "timeout"),
    ],
)
async def test_failures_raise_llm_failed(fake_llm: FakeLlm, behaviour: Behaviour, reason: str) -> None:
    """Every way the LLM can fail becomes LlmFailed with a reason the metrics can count."""
    fake_llm.behaviour = behaviour
    # A timeout well below the 3 s delay, and well above what an immediate answer needs even on a
    # loaded CI machine: a 0.3 s timeout once turned an immediate bad answer into "timeout".
    with pytest.raises(LlmFailed) as info:
        await _summarize(fake_llm, timeout_s=1.0)
    assert info.value.reason == reason


async def test_unreachable_llm_is_a_transport_failure() -> None:
    """A connection refused is LlmFailed('transport')."""
    unreachable = FakeLlm(url="http://127.0.0.1:1/v1")
    with pytest.raises(LlmFailed) as info:
        await _summarize(unreachable)
    assert info.value.reason == "transport"


def _llm_env(env: dict[str, str], llm: FakeLlm, timeout: str = "5") -> dict[str, str]:
    # Plain-text summaries here; the structured format has its own tests.
    return env | {
        "LLM_BASE_URL": llm.url,
        "SUMMARY_MODEL": "summary-model",
        "LLM_TIMEOUT_SECONDS": timeout,
        "SUMMARY_FORMAT": "text",
    }


async def test_llm_summary_is_stored_with_its_source(backend_env: dict[str, str], fake_llm: FakeLlm) -> None:
    """With a working LLM the stored summary is the LLM's text, source llm, and the next
    summarization sends the previous summary plus only the turns it has not covered."""
    fake_llm.behaviour = Behaviour(text="用户王小明咨询活力健，每天2次每次1条，398元。")
    d = Daemon(_llm_env(backend_env, fake_llm))
    await d.start()
    try:
        sid = new_sid()
        for user, assistant in ZH_12_TURNS[:6]:
            await d.post(sid, "user", user)
            await d.post(sid, "assistant", assistant)
            await d.settle()
        answer = await d.get(f"/v1/sessions/{sid}/summary")
        assert answer["source"] == "llm"
        assert answer["summary"] == fake_llm.behaviour.text
        assert answer["covered_turns"] == 6
        assert len(fake_llm.requests) == 2
        second = fake_llm.last_user_prompt()
        assert "已有摘要：用户王小明咨询活力健" in second
        assert ZH_12_TURNS[3][0] in second
        assert ZH_12_TURNS[0][0] not in second
    finally:
        await d.stop()


@pytest.mark.parametrize("behaviour", [Behaviour(delay_s=3.0), Behaviour(mode="status", status=500)])
async def test_failed_llm_leaves_a_deterministic_summary(
    backend_env: dict[str, str], fake_llm: FakeLlm, behaviour: Behaviour
) -> None:
    """An LLM that times out or answers 500 still leaves a deterministic summary with the early facts,
    and the fallback is counted."""
    fake_llm.behaviour = behaviour
    d = Daemon(_llm_env(backend_env, fake_llm, timeout="1"))
    await d.start()
    try:
        sid = new_sid()
        await play(d, sid, ZH_12_TURNS[:3])
        await d.settle()
        answer = await d.get(f"/v1/sessions/{sid}/summary")
        assert answer["tier"] == "hot"
        assert answer["source"] == "deterministic"
        for evidence in ZH_EARLY_EVIDENCE:
            assert evidence in answer["summary"]
        metrics = await (await d.http.get("/metrics")).text()
        reason = "timeout" if behaviour.delay_s else "http_error"
        assert f'tiered_memory_llm_failures_total{{reason="{reason}"}} 1.0' in metrics
    finally:
        await d.stop()


async def test_append_does_not_wait_for_a_slow_llm(backend_env: dict[str, str], fake_llm: FakeLlm) -> None:
    """The append that triggers a summary is acknowledged while the 2-second LLM call is still
    in flight: summarization is never on the request path."""
    fake_llm.behaviour = Behaviour(delay_s=2.0)
    d = Daemon(_llm_env(backend_env, fake_llm))
    await d.start()
    try:
        sid = new_sid()
        replies = await play(d, sid, ZH_12_TURNS[:3])
        assert replies[-1]["summary_scheduled"] is True
        for _ in range(500):
            if fake_llm.in_flight:
                break
            await asyncio.sleep(0.01)
        # The summary call is in flight, yet the next turn is accepted and read at once.
        await d.post(sid, "user", ZH_12_TURNS[3][0])
        ctx = await d.get(f"/v1/sessions/{sid}/context")
        assert fake_llm.in_flight == 1
        assert fake_llm.completed == 0
        assert ctx["messages"][-1]["content"] == ZH_12_TURNS[3][0]
        await d.settle()
        assert fake_llm.completed == 1
        assert (await d.get(f"/v1/sessions/{sid}/summary"))["source"] == "llm"
    finally:
        await d.stop()


async def test_delete_during_a_summary_leaves_nothing_behind(backend_env: dict[str, str], fake_llm: FakeLlm) -> None:
    """A session deleted while its summary is being made keeps no summary in any tier, and a new
    session under the same id starts empty."""
    fake_llm.behaviour = Behaviour(delay_s=1.0, text="旧会话的摘要：用户张三。")
    d = Daemon(_llm_env(backend_env, fake_llm))
    await d.start()
    try:
        sid = new_sid()
        for user, assistant in ZH_12_TURNS[:3]:
            await d.post(sid, "user", user, user_id="alice")
            await d.post(sid, "assistant", assistant)
        for _ in range(500):
            if fake_llm.in_flight:
                break
            await asyncio.sleep(0.01)
        assert fake_llm.in_flight == 1
        assert (await d.http.delete(f"/v1/sessions/{sid}")).status == 204
        await d.settle()
        assert (await d.get(f"/v1/sessions/{sid}/summary"))["tier"] == "none"
        assert await d.store.get_summary(sid) == (None, None)
        await d.post(sid, "user", "我叫李四，想买X200耳机。", user_id="bob")
        await d.post(sid, "assistant", "好的李四，X200耳机售价599元。")
        fresh = await d.get(f"/v1/sessions/{sid}/summary")
        assert fresh["tier"] == "cold"
        assert "李四" in fresh["summary"]
        assert "张三" not in fresh["summary"]
    finally:
        await d.stop()
