"""A reply's reasoning (`thinking_content`, `thinking_duration`): accepted on assistant messages
only and refused with a 400 that names the field otherwise, stored in the cold tier and returned
with the message where stored messages are read (the listing, a PATCH's answer, an export), part
of what a retry must repeat, and never in a context, a summary, the recall index or a profile.
Each runs on the embedded backends, real Redis + MariaDB and real Redis + PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, llm_env, new_sid
from tests.helpers.servers import backend_environment
from tiered_memory.ops.importer import BadLine, _lines
from tiered_memory.testing import Behaviour, FakeLlm

# In the reasoning only: wherever memory shows or keeps the conversation, it must not appear.
_SECRET = "quokkazephyr"
_THINKING = f"The user wants the dose. Maybe {_SECRET} applies? No: the label says twice a day, after meals."
_LONG_TURNS = [
    ("How often do I take Vitality?", "Twice a day, one sachet each time."),
    ("Before or after meals?", "After meals, about half an hour."),
    ("Can children take it?", "Children over six can take half a sachet."),
    ("Where do I buy it?", "At the pharmacy on Baker Street, or online."),
]


@pytest.fixture(params=["embedded", "real", "postgres"])
def backend_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The daemon's environment on the embedded default, Redis + MariaDB or Redis + PostgreSQL."""
    return backend_environment(request.param, request, tmp_path)


async def _send(daemon: Daemon, sid: str, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages", json=body)
    assert resp.status == status, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


async def _reasoned_conversation(daemon: Daemon, sid: str, **user: str) -> None:
    """Four turns; the second reply's reasoning holds _SECRET."""
    for n, (question, answer) in enumerate(_LONG_TURNS):
        await daemon.post(sid, "user", question, **user)
        thinking = {"thinking_content": _THINKING, "thinking_duration": 12} if n == 1 else {}
        await daemon.post(sid, "assistant", answer, **thinking)


async def test_reasoning_is_stored_and_listed_with_its_message(daemon: Daemon) -> None:
    """The reasoning comes back with its message from the listing, also once the hot tier lost
    the session, and a batch stores it as one append does; a message without any lists neither
    field; null and "" are no reasoning."""
    sid = new_sid()
    await daemon.post(sid, "user", "Is 91 prime?")
    await _send(
        daemon,
        sid,
        {
            "role": "assistant",
            "content": "No: 7 × 13.",
            "thinking_content": "试 7：7 × 13 = 91。",
            "thinking_duration": 0,
        },
    )
    await _send(daemon, sid, {"role": "assistant", "content": "Anything else?", "thinking_content": None})
    await _send(daemon, sid, {"role": "assistant", "content": "I am here.", "thinking_content": ""})
    batch = {
        "messages": [
            {"role": "user", "content": "And 97?", "message_id": "b-1"},
            {"role": "assistant", "content": "Prime.", "message_id": "b-2", "thinking_duration": 86_400},
        ]
    }
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages/batch", json=batch)
    assert resp.status == 201, await resp.text()
    await daemon.flush_hot()
    stored = await daemon.stored(sid)
    assert [(m.get("thinking_content"), m.get("thinking_duration")) for m in stored] == [
        (None, None),
        ("试 7：7 × 13 = 91。", 0),
        (None, None),
        (None, None),
        (None, None),
        (None, 86_400),
    ]
    assert "thinking_content" not in stored[0]
    assert "thinking_duration" not in stored[2]


async def test_a_retry_must_repeat_the_reasoning(daemon: Daemon) -> None:
    """The same message_id with the same reasoning is the same message (200, stored once); with
    other reasoning, or none, it is another message: 409, as for other content."""
    sid = new_sid()
    await daemon.post(sid, "user", "Is 91 prime?")
    reply = {
        "role": "assistant",
        "content": "No.",
        "message_id": "r-1",
        "thinking_content": "7 × 13",
        "thinking_duration": 3,
    }
    await _send(daemon, sid, reply)
    assert (await _send(daemon, sid, reply, 200))["message_id"] == "r-1"
    for changed in ({"thinking_content": "13 × 7"}, {"thinking_duration": 4}, {"thinking_content": None}):
        answer = await _send(daemon, sid, {**reply, **changed}, 409)
        assert answer["error"]["code"] == "conflict", answer
    stored = await daemon.stored(sid)
    assert [(m["message_id"], m.get("thinking_content"), m.get("thinking_duration")) for m in stored[1:]] == [
        ("r-1", "7 × 13", 3)
    ]


async def test_bad_reasoning_is_refused_naming_the_field_and_changes_nothing(daemon: Daemon) -> None:
    """Reasoning on a user, tool or system message, on a `/turns` message, of another type, with
    a lone surrogate, longer than MAX_MESSAGE_BYTES, a duration that is negative, a bool, a float,
    a string or past a day: 400 naming the field and saying what was expected; nothing stored."""
    sid = new_sid()
    await daemon.post(sid, "user", "Is 91 prime?")
    limit = daemon.settings.max_message_bytes
    reply = {"role": "assistant", "content": "No."}
    bad: list[tuple[dict[str, Any], str]] = [
        ({"role": "user", "content": "x", "thinking_content": "hmm"}, "thinking_content: expected on an 'assistant'"),
        ({"role": "system", "content": "x", "thinking_duration": 2}, "thinking_duration: expected on an 'assistant'"),
        ({"role": "user", "content": "x", "thinking_duration": 0}, "thinking_duration: expected on an 'assistant'"),
        ({**reply, "thinking_content": 42}, "thinking_content: expected a string"),
        ({**reply, "thinking_content": ["a"]}, "thinking_content: expected a string"),
        ({**reply, "thinking_content": "a\ud800b"}, "thinking_content: expected valid Unicode"),
        ({**reply, "thinking_content": "x" * (limit + 1)}, f"thinking_content: expected at most {limit} bytes"),
        ({**reply, "thinking_content": "é" * (limit // 2 + 1)}, "thinking_content: expected at most"),
        ({**reply, "thinking_duration": -1}, "thinking_duration: expected an integer number of seconds"),
        ({**reply, "thinking_duration": True}, "thinking_duration: expected an integer"),
        ({**reply, "thinking_duration": 1.5}, "thinking_duration: expected an integer"),
        ({**reply, "thinking_duration": 3.0}, "thinking_duration: expected an integer"),
        ({**reply, "thinking_duration": "12"}, "thinking_duration: expected an integer"),
        ({**reply, "thinking_duration": 86_401}, "0 to 86400"),
    ]
    for body, message in bad:
        answer = await _send(daemon, sid, body, 400)
        assert message in answer["error"]["message"], (body, answer)
    batch = {"messages": [reply, {"role": "user", "content": "x", "thinking_content": "hmm"}]}
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages/batch", json=batch)
    assert resp.status == 400
    assert (await resp.json())["error"]["message"].startswith("messages[1].thinking_content: expected on an")
    turn = await daemon.http.post(f"/v1/sessions/{sid}/turns", json={"content": "x", "thinking_content": "hmm"})
    assert turn.status == 400
    assert "thinking_content" in (await turn.json())["error"]["message"]
    assert await daemon.store.count_messages(sid) == 1
    assert (await daemon.get(f"/v1/sessions/{sid}"))["turn_count"] == 0


async def test_a_patch_keeps_the_reasoning_and_answers_with_it(daemon: Daemon) -> None:
    """A streaming reply stored with its reasoning, finalized by a PATCH: the answer's message
    and the listing still carry the reasoning."""
    sid = new_sid()
    await daemon.post(sid, "user", "Tell me a story.")
    start = {"role": "assistant", "content": "Once", "status": "streaming", "message_id": "s-1"}
    await _send(daemon, sid, {**start, "thinking_content": "A fox, then a crow.", "thinking_duration": 5})
    resp = await daemon.http.patch(
        f"/v1/sessions/{sid}/messages/s-1", json={"content": "Once upon a time.", "status": "completed"}
    )
    assert resp.status == 200, await resp.text()
    patched = (await resp.json())["message"]
    assert (patched["content"], patched["thinking_content"], patched["thinking_duration"]) == (
        "Once upon a time.",
        "A fox, then a crow.",
        5,
    )
    assert (await daemon.stored(sid))[1] == patched


async def test_reasoning_never_reaches_a_context_the_summary_recall_or_the_profile(daemon: Daemon) -> None:
    """A word said only in a reply's reasoning is in no context (from the hot tier, from SQL once
    the hot tier lost the session, a `/turns` answer, one that asks for it), in no summary or
    slice, in no recall match (asked for it, or for the reply whose reasoning holds it), and in
    no user profile; the listing does hold it."""
    sid = new_sid()
    user = "u-" + sid
    await _reasoned_conversation(daemon, sid, user_id=user)
    assert _SECRET in json.dumps(await daemon.stored(sid))
    asking = await daemon.get(f"/v1/sessions/{sid}/context?question=What+about+{_SECRET}%3F&max_chars=400")
    # The question is the caller's own, handed back as the last message: only the rest is memory.
    assert asking["messages"].pop()["content"] == f"What about {_SECRET}?"
    seen: list[Any] = [await daemon.get(f"/v1/sessions/{sid}/context"), asking]
    await daemon.flush_hot()
    seen.append(await daemon.get(f"/v1/sessions/{sid}/context?question=Before+or+after+meals%3F"))
    turn = await daemon.http.post(f"/v1/sessions/{sid}/turns", json={"content": "Remind me: before or after meals?"})
    assert turn.status == 201, await turn.text()
    seen.append(await turn.json())
    await daemon.post(sid, "assistant", "After meals.")
    assert (await daemon.http.post(f"/v1/sessions/{sid}/close")).status == 200
    await daemon.settle()
    summary = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert summary["covered_turns"] == 5, summary
    seen += [summary, await daemon.get(f"/v1/sessions/{sid}/slices")]
    matched = await daemon.get(f"/v1/sessions/{sid}/recall?q=meals+half+hour")
    assert any(m["content"] == _LONG_TURNS[1][1] for match in matched["matches"] for m in match["messages"])
    asked = await daemon.get(f"/v1/sessions/{sid}/recall?q={_SECRET}")
    assert asked["matches"] == []
    seen += [matched, await daemon.get(f"/v1/users/{user}/profile")]
    for answer in seen:
        assert _SECRET not in json.dumps(answer, ensure_ascii=False), answer


async def test_the_llm_summary_is_never_asked_about_reasoning(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """The LLM's summary prompt holds the reply, not its reasoning."""
    payload = {
        "summary": "The user asked how to take Vitality: twice a day after meals.",
        "conversation_goal": "take Vitality correctly",
        "stable_facts": ["Vitality: twice a day, after meals"],
        "user_preferences": [],
        "resolved_points": [],
        "pending_questions": [],
        "retrieval_hints": ["Vitality"],
    }
    fake_llm.behaviour = Behaviour(text=json.dumps(payload))
    daemon = await make_daemon(llm_env(backend_env, fake_llm), quiet=fake_llm)
    sid = new_sid()
    await _reasoned_conversation(daemon, sid)
    assert (await daemon.http.post(f"/v1/sessions/{sid}/close")).status == 200
    await daemon.settle()
    assert (await daemon.get(f"/v1/sessions/{sid}/summary"))["source"] == "llm"
    prompt = fake_llm.last_user_prompt()
    assert _LONG_TURNS[1][1] in prompt
    assert _SECRET not in json.dumps(fake_llm.requests, ensure_ascii=False, default=str)


def _export(sid: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tiered_memory", "export", sid],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


async def test_an_export_carries_the_reasoning(daemon: Daemon) -> None:
    """`tiered-memory export` writes each message with its reasoning."""
    sid = new_sid()
    await _reasoned_conversation(daemon, sid)
    document = await asyncio.to_thread(_export, sid, daemon.env)
    reasoned = [
        (m["seq"], m["thinking_content"], m["thinking_duration"])
        for m in document["messages"]
        if "thinking_content" in m
    ]
    assert reasoned == [(4, _THINKING, 12)]


def test_import_file_lines_take_reasoning(tmp_path: Path) -> None:
    """An import line is a message as the API takes it: its reasoning is checked alike."""
    good = tmp_path / "good.jsonl"
    good.write_text(
        json.dumps(
            {
                "session_id": "s-1",
                "role": "assistant",
                "content": "Hi",
                "thinking_content": "greet",
                "thinking_duration": 1,
            }
        )
        + "\n"
    )
    [(_, message)] = list(_lines(good, 1024))
    assert (message.thinking_content, message.thinking_duration) == ("greet", 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"session_id": "s-1", "role": "user", "content": "Hi", "thinking_duration": 1}) + "\n")
    with pytest.raises(BadLine, match="line 1: thinking_duration: expected on an 'assistant'"):
        list(_lines(bad, 1024))


async def test_reasoning_counts_in_what_a_session_stores(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """MAX_SESSION_BYTES=300: a short reply with 400 bytes of reasoning does not fit; one with 200
    does, and once it is taken back (DELETE of the newest) the session has room for it again."""
    daemon = await make_daemon(backend_env | {"MAX_SESSION_BYTES": "300"})
    sid = new_sid()
    await _send(daemon, sid, {"role": "user", "content": "hi", "message_id": "q"})
    big = {"role": "assistant", "content": "ok", "message_id": "a", "thinking_content": "x" * 400}
    refused = await _send(daemon, sid, big, status=409)
    assert refused["error"]["code"] == "session_full"
    fits = {"role": "assistant", "content": "ok", "message_id": "b", "thinking_content": "x" * 200}
    await _send(daemon, sid, fits)
    second = {"role": "user", "content": "again", "message_id": "q2"}
    third = {"role": "assistant", "content": "ok", "message_id": "c", "thinking_content": "y" * 200}
    await _send(daemon, sid, second)
    assert (await _send(daemon, sid, third, status=409))["error"]["code"] == "session_full"
    resp = await daemon.http.delete(f"/v1/sessions/{sid}/messages/q2")
    assert resp.status == 204, await resp.text()
    resp = await daemon.http.delete(f"/v1/sessions/{sid}/messages/b")
    assert resp.status == 204, await resp.text()
    await _send(daemon, sid, third)
