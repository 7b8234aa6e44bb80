"""Tool calls, their results and the gateway's events: stored verbatim, shown to the model only in
sequences a chat-completions provider accepts (a call followed by all its results, never split by
the window or the budget), summarized as facts and events, and refused with a clear 4xx when
malformed. Each runs on the embedded backends and on real Redis + MariaDB."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.daemon import Daemon, MakeDaemon, llm_env, new_sid
from tests.helpers.tool_calls import ORDER, order_turn, send_message, tool_call
from tiered_memory.model import Message, Role, SessionKey
from tiered_memory.prompt.context import alternate, compose
from tiered_memory.prompt.policy import Candidates, choose
from tiered_memory.testing import Behaviour, FakeLlm
from tiered_memory.text.dialogue import shown_and_events, tool_fields
from tiered_memory.text.quoting import frame_chars


def _size(m: dict[str, Any]) -> int:
    """What a context message costs the budget: its content and its calls as stored (compact JSON)."""
    calls = json.dumps(m["tool_calls"], ensure_ascii=False, separators=(",", ":")) if "tool_calls" in m else ""
    return len(m["content"] or "") + len(calls)


def assert_provider_valid(messages: list[dict[str, Any]]) -> None:
    """What a chat-completions provider checks: at most one system message, first; the turns
    start with a user message; each assistant message with tool_calls is followed at once by one
    result per call, in call order, and a tool result appears nowhere else."""
    roles = [m["role"] for m in messages]
    assert "system" not in roles[1:], roles
    for a, b in itertools.pairwise(roles):
        assert not (a == b and a in ("user", "assistant")), f"two {a} messages in a row: {roles}"
    body = messages[1:] if roles[:1] == ["system"] else messages
    assert not body or body[0]["role"] == "user", roles
    i = 0
    while i < len(body):
        m = body[i]
        assert m["role"] != "tool", f"a tool result without its call before it: {roles}"
        if m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            results = body[i + 1 : i + 1 + len(ids)]
            assert [r.get("tool_call_id") for r in results] == ids, roles
            assert all(r["role"] == "tool" for r in results)
            i += 1 + len(ids)
        else:
            i += 1


async def test_a_tool_turn_is_stored_verbatim_and_shown_in_provider_order(daemon: Daemon) -> None:
    """The call and its result are stored as sent and come back in the context between the
    question and the reply; the tool traffic belongs to the turn the reply completes."""
    sid = new_sid()
    await order_turn(daemon, sid)
    stored = (await daemon.get(f"/v1/sessions/{sid}/messages"))["messages"]
    assert [(m["role"], m["turn"]) for m in stored] == [("user", 1), ("assistant", 1), ("tool", 1), ("assistant", 1)]
    assert stored[1]["tool_calls"] == [tool_call("call-1")]
    assert (stored[2]["tool_call_id"], stored[2]["name"], stored[2]["content"]) == ("call-1", "lookup_order", ORDER)
    assert "tool_calls" not in stored[0]
    assert "tool_call_id" not in stored[3]
    assert (await daemon.get(f"/v1/sessions/{sid}"))["turn_count"] == 1
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert ctx["messages"] == [
        {"role": "user", "content": "Where is my order A123? (1)"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call-1")]},
        {"role": "tool", "content": ORDER, "tool_call_id": "call-1", "name": "lookup_order"},
        {"role": "assistant", "content": "Your order A123 has shipped. (1)"},
    ]
    await daemon.flush_hot()  # the same from SQL
    assert (await daemon.get(f"/v1/sessions/{sid}/context"))["messages"] == ctx["messages"]


async def test_results_are_moved_next_to_their_call_and_a_call_without_results_is_held_back(daemon: Daemon) -> None:
    """Two parallel calls; the user speaks before the results come. Until both results are in, the
    call is not shown (a provider refuses it); then it is, with both results right after it, in
    call order, whatever order they were stored in."""
    sid = new_sid()
    await send_message(daemon, sid, {"role": "user", "content": "Book a table for 4 at Nopa and a taxi at 7pm"})
    calls = [tool_call("c-table", "book_table", '{"guests":4}'), tool_call("c-taxi", "book_taxi", '{"at":"19:00"}')]
    await send_message(daemon, sid, {"role": "assistant", "content": "One moment.", "tool_calls": calls})
    await send_message(daemon, sid, {"role": "tool", "tool_call_id": "c-taxi", "content": "taxi TX-88 at 19:00"})
    held = (await daemon.get(f"/v1/sessions/{sid}/context"))["messages"]
    assert [m["role"] for m in held] == ["user"]
    await send_message(daemon, sid, {"role": "user", "content": "Thanks, hurry please"})
    await send_message(daemon, sid, {"role": "tool", "tool_call_id": "c-table", "content": "table T-12 at 19:30"})
    await send_message(daemon, sid, {"role": "assistant", "content": "Table T-12 at 19:30 and taxi TX-88 at 19:00."})
    ctx = (await daemon.get(f"/v1/sessions/{sid}/context"))["messages"]
    assert_provider_valid(ctx)
    assert [(m["role"], m.get("tool_call_id")) for m in ctx] == [
        ("user", None),
        ("assistant", None),
        ("tool", "c-table"),
        ("tool", "c-taxi"),
        ("user", None),
        ("assistant", None),
    ]


async def test_no_window_or_budget_splits_a_call_from_its_results(daemon: Daemon) -> None:
    """Twelve turns, every other one using a tool: at every budget from 60 to 2,400 characters,
    and with a question, the context is a sequence a provider accepts."""
    sid = new_sid()
    for n in range(1, 13):
        if n % 2:
            await order_turn(daemon, sid, n)
        else:
            await daemon.post(sid, "user", f"And my other parcel B{n}77, when will it come?")
            await daemon.post(sid, "assistant", f"Parcel B{n}77 arrives on day {n} of next month, before noon.")
    seen_tools = 0
    for max_chars in (60, 150, 240, 333, 420, 600, 800, 1000, 1500, 2400):
        for question in ("", "&question=what%20was%20the%20tracking%20number"):
            ctx = await daemon.get(f"/v1/sessions/{sid}/context?max_chars={max_chars}{question}")
            assert_provider_valid(ctx["messages"])
            seen_tools += sum(m["role"] == "tool" for m in ctx["messages"])
            framing = len(question) + 1
            assert sum(_size(m) for m in ctx["messages"]) <= max_chars + framing
    assert seen_tools > 0  # the budgets that fit a tool turn show it


async def test_a_call_with_two_results_leaves_the_reply_its_room(daemon: Daemon) -> None:
    """A call message with two calls and their two results is one unit, kept or dropped whole: at
    a budget too small for it the reply keeps the room (it says what the tools found), at every
    budget the reply closes the context, and the sequence is one a provider accepts. (A second
    result taken for a unit of its own was kept at 60 characters, and the reply was dropped for it.)"""
    sid = new_sid()
    await send_message(daemon, sid, {"role": "user", "content": "Where are my orders A123 and B456?"})
    calls = [tool_call("call-a"), tool_call("call-b", arguments='{"order_id":"B456"}')]
    await send_message(daemon, sid, {"role": "assistant", "content": None, "tool_calls": calls})
    for call_id in ("call-a", "call-b"):
        await send_message(
            daemon, sid, {"role": "tool", "tool_call_id": call_id, "name": "lookup_order", "content": ORDER}
        )
    reply = "Both have shipped: A123 arrives on the 5th, B456 on the 7th."
    await send_message(daemon, sid, {"role": "assistant", "content": reply})
    for max_chars in (60, 80, 120, 200, 400, 2000):
        messages = (await daemon.get(f"/v1/sessions/{sid}/context?max_chars={max_chars}"))["messages"]
        assert_provider_valid(messages)
        assert messages[-1]["role"] == "assistant", max_chars
        assert messages[-1]["content"].startswith("Both have shipped"), (max_chars, messages)
        tools = [m for m in messages if m["role"] == "tool"]
        assert len(tools) in (0, 2), (max_chars, messages)


async def test_bad_tool_input_is_refused_and_changes_nothing(daemon: Daemon) -> None:
    """A result for a call the session never made (or already answered) is 409
    `unknown_tool_call_id`; a malformed call or misplaced tool field is 400 naming the field;
    none of them stores anything. A retried result is stored once."""
    sid = new_sid()
    await send_message(daemon, sid, {"role": "user", "content": "Where is A123?"})
    await send_message(daemon, sid, {"role": "assistant", "content": None, "tool_calls": [tool_call("call-1")]})
    unknown = await send_message(daemon, sid, {"role": "tool", "tool_call_id": "call-9", "content": "x"}, 409)
    assert unknown["error"]["code"] == "unknown_tool_call_id"
    assert "call-9" in unknown["error"]["message"]
    result = {"role": "tool", "tool_call_id": "call-1", "content": ORDER, "message_id": "res-1"}
    await send_message(daemon, sid, result)
    await send_message(daemon, sid, result, 200)  # a retry: stored already (the count below)
    twice = await send_message(daemon, sid, {**result, "message_id": "res-2"}, 409)
    assert twice["error"]["code"] == "unknown_tool_call_id"
    bad: list[tuple[dict[str, Any], str]] = [
        ({"role": "user", "content": "x", "tool_calls": [tool_call("c")]}, "tool_calls"),
        ({"role": "assistant", "content": None, "tool_calls": []}, "tool_calls"),
        ({"role": "assistant", "content": None, "tool_calls": {"id": "c"}}, "tool_calls"),
        ({"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}, "tool_calls[0].id"),
        (
            {"role": "assistant", "content": None, "tool_calls": [{**tool_call("c"), "type": "code"}]},
            "tool_calls[0].type",
        ),
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {}}]}, "function.name"),
        ({"role": "assistant", "tool_calls": [tool_call("c", arguments={"a": 1})]}, "function.arguments"),  # type: ignore[arg-type]
        ({"role": "assistant", "tool_calls": [tool_call("c"), tool_call("c")]}, "appears twice"),
        ({"role": "assistant", "content": None}, "content"),
        ({"role": "assistant", "tool_calls": [tool_call("c")], "status": "streaming"}, "status"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        ({"role": "user", "content": "x", "tool_call_id": "call-1"}, "tool_call_id"),
        ({"role": "assistant", "content": "x", "name": "lookup"}, "name"),
        ({"role": "tool", "tool_call_id": "call-1", "content": "x", "name": "no spaces"}, "name"),
        ({"role": "tool", "tool_call_id": "call-1", "content": ""}, "content"),
        ({"role": "system", "content": "on hold", "status": "interrupted"}, "status"),
        ({"role": "robot", "content": "x"}, "role"),
    ]
    for body, field in bad:
        answer = await send_message(daemon, sid, body, 400)
        assert field in answer["error"]["message"], (body, answer)
    assert await daemon.store.count_messages(sid) == 3
    fresh = new_sid()
    await send_message(daemon, fresh, {"role": "tool", "tool_call_id": "call-1", "content": "x"}, 409)
    assert (await daemon.http.get(f"/v1/sessions/{fresh}")).status == 404  # no session was made
    patched = await daemon.http.patch(f"/v1/sessions/{sid}/messages/res-1", json={"status": "interrupted"})
    assert patched.status == 400
    assert "tool message" in (await patched.json())["error"]["message"]


async def test_gateway_notes_are_listed_inside_the_one_system_message_and_summarized_as_events(
    daemon: Daemon,
) -> None:
    """`system` notes are stored, never shown as messages of their own, listed in the leading
    system message (with the caller's system prompt) until the summary holds them, and the
    summary records them as events."""
    sid = new_sid()
    await daemon.post(sid, "user", "I want to dispute a charge of 42.50 on my card")
    await daemon.post(sid, "system", "call transferred to billing")
    await daemon.post(sid, "assistant", "Billing here. Which charge, the 42.50 one from May 3?")
    await daemon.post(sid, "system", "caller on hold for 2 minutes")
    await daemon.post(sid, "user", "Yes that one")
    stored = (await daemon.get(f"/v1/sessions/{sid}/messages"))["messages"]
    assert [m["role"] for m in stored] == ["user", "system", "assistant", "system", "user"]
    assert (await daemon.get(f"/v1/sessions/{sid}"))["turn_count"] == 1
    ctx = await daemon.get(f"/v1/sessions/{sid}/context?system_prompt=Be%20brief")
    roles = [m["role"] for m in ctx["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    lead = ctx["messages"][0]["content"]
    assert lead.startswith("Be brief")
    assert "[Events]\ncall transferred to billing\ncaller on hold for 2 minutes" in lead
    assert await daemon.http.post(f"/v1/sessions/{sid}/close")
    await daemon.settle()
    summary = (await daemon.get(f"/v1/sessions/{sid}/summary"))["summary"]
    assert "Events: call transferred to billing" in summary, summary


async def test_what_a_tool_returned_is_in_the_summary(daemon: Daemon) -> None:
    """The tracking number and delivery date only the tool result said are facts the
    deterministic summary keeps."""
    sid = new_sid()
    await order_turn(daemon, sid)
    await daemon.post(sid, "user", "Great, thanks")
    await daemon.post(sid, "assistant", "You're welcome.")
    assert (await daemon.http.post(f"/v1/sessions/{sid}/close")).status == 200
    await daemon.settle()
    summary = (await daemon.get(f"/v1/sessions/{sid}/summary"))["summary"]
    assert "1Z999AA10123456784" in summary, summary
    assert "2026-12-05" in summary, summary


async def test_the_llm_reads_tool_results_and_events_labelled(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """The LLM's request names the tool's result and the gateway's event by their roles and says
    what to keep of them; the call shows as the function it called."""
    payload = {
        "summary": "The user asked about order A123, which shipped; tracking 1Z999AA10123456784.",
        "conversation_goal": "track order A123",
        "stable_facts": ["A123 shipped, tracking 1Z999AA10123456784, arrives 2026-12-05"],
        "user_preferences": [],
        "resolved_points": ["call transferred to billing"],
        "pending_questions": ["delivery address change"],
        "retrieval_hints": ["A123"],
    }
    fake_llm.behaviour = Behaviour(text=json.dumps(payload))
    daemon = await make_daemon(llm_env(backend_env, fake_llm), quiet=fake_llm)
    sid = new_sid()
    await order_turn(daemon, sid)
    await daemon.post(sid, "system", "call transferred to billing")
    await daemon.post(sid, "user", "Can I change the delivery address?")
    await daemon.post(sid, "assistant", "Billing cannot, but I can note it for the courier.")
    assert (await daemon.http.post(f"/v1/sessions/{sid}/close")).status == 200
    await daemon.settle()
    prompt = fake_llm.last_user_prompt()
    tool = '{"role": "tool", "text": "lookup_order: order id: A123, status: shipped, tracking: 1Z999AA10123456784'
    assert tool in prompt
    assert '{"role": "assistant", "text": "→ lookup_order: order id: A123"}' in prompt
    assert '{"role": "event", "text": "call transferred to billing"}' in prompt
    assert "keep its order numbers" in prompt
    summary = await daemon.get(f"/v1/sessions/{sid}/summary")
    assert summary["source"] == "llm"


async def test_a_batch_imports_tool_turns_all_or_none(daemon: Daemon) -> None:
    """A batch may hold calls and the results that answer them; one result for a call nobody
    made refuses the whole batch."""
    sid = new_sid()
    turn: list[dict[str, Any]] = [
        {"role": "user", "content": "Where is A123?", "message_id": "b-1"},
        {"role": "assistant", "tool_calls": [tool_call("call-1")], "message_id": "b-2"},
        {"role": "tool", "tool_call_id": "call-1", "content": ORDER, "message_id": "b-3"},
        {"role": "assistant", "content": "Shipped.", "message_id": "b-4"},
    ]
    bad = [*turn[:2], {**turn[2], "tool_call_id": "call-2"}, turn[3]]
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages/batch", json={"messages": bad})
    assert resp.status == 409, await resp.text()
    assert (await resp.json())["error"]["code"] == "unknown_tool_call_id"
    assert await daemon.store.count_messages(sid) == 0
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages/batch", json={"messages": turn})
    assert resp.status == 201, await resp.text()
    ctx = (await daemon.get(f"/v1/sessions/{sid}/context"))["messages"]
    assert [m["role"] for m in ctx] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(ctx[2]["content"])["tracking"] == "1Z999AA10123456784"


@pytest.mark.parametrize("window", ["1", "2"])
async def test_a_window_boundary_inside_tool_traffic_moves(
    backend_env: dict[str, str], window: str, make_daemon: MakeDaemon
) -> None:
    """A late result stored in a later turn than its call: once a summary covers the call's
    turn, a window that starts at the result's turn leaves the orphaned result out instead of
    sending it without its call; a window that reaches the call shows both, together."""
    daemon = await make_daemon(backend_env | {"KEEP_RECENT_TURNS": window, "CONTEXT_OLDER_TURNS": "false"})
    sid = new_sid()
    await send_message(daemon, sid, {"role": "user", "content": "Check A123"})
    await send_message(daemon, sid, {"role": "assistant", "tool_calls": [tool_call("late")]})
    await send_message(daemon, sid, {"role": "assistant", "content": "Still looking."})
    await send_message(daemon, sid, {"role": "user", "content": "Any news?"})
    await send_message(daemon, sid, {"role": "tool", "tool_call_id": "late", "content": ORDER})
    await send_message(daemon, sid, {"role": "assistant", "content": "It shipped."})
    assert (await daemon.http.post(f"/v1/sessions/{sid}/close")).status == 200
    await daemon.settle()
    ctx = await daemon.get(f"/v1/sessions/{sid}/context?max_chars=4000")
    assert ctx["covered_turns"] == 2
    assert_provider_valid(ctx["messages"])
    tools = [m for m in ctx["messages"] if m["role"] == "tool"]
    assert len(tools) == (1 if window == "2" else 0)
    assert ctx["messages"][-1] == {"role": "assistant", "content": "It shipped."}


def _dialogue(data: Any) -> list[Message]:
    """A stored session of random turns: some replies use one to three tools, some results come
    late (after the user spoke again) or never, and the gateway events things in between."""
    out: list[Message] = []
    turn = 0

    def add(role: Role, content: str, **tool: Any) -> None:
        out.append(Message(SessionKey("s"), len(out) + 1, max(turn, 1), role, content, f"m{len(out) + 1}", 0.0, **tool))

    late: list[str] = []
    for n in range(data.draw(st.integers(1, 8), label="turns")):
        turn = n + 1
        add(Role.USER, data.draw(st.sampled_from(["Where is A123?", "ok", "Book Nopa for 4 at 7pm please"])))
        for call_id in late:
            add(Role.TOOL, '{"late": true}', tool_call_id=call_id)
        late = []
        if data.draw(st.booleans(), label="tools"):
            ids = [f"c{n}-{i}" for i in range(data.draw(st.integers(1, 3)))]
            calls = json.dumps([tool_call(i) for i in ids])
            add(Role.ASSISTANT, data.draw(st.sampled_from(["", "One moment."])), tool_calls=calls)
            for call_id in ids:
                fate = data.draw(st.sampled_from(["now", "now", "late", "never"]))
                if fate == "now":
                    add(Role.TOOL, ORDER, tool_call_id=call_id, name="lookup_order")
                elif fate == "late":
                    late.append(call_id)
        if data.draw(st.booleans(), label="note"):
            add(Role.SYSTEM, "caller on hold")
        add(Role.ASSISTANT, data.draw(st.sampled_from(["Shipped on May 3, arrives 2026-12-05.", "Done."])))
    return out


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(st.data())
def test_any_budget_gives_a_sequence_a_provider_accepts(data: Any) -> None:
    """Whatever the tool traffic and the budget, the policy's choice, alternated and composed, is
    provider-valid and within the budget; a window starting anywhere changes nothing to that."""
    messages = _dialogue(data)
    start = data.draw(st.integers(0, len(messages) - 1), label="window start")
    max_chars = data.draw(st.integers(20, 1500), label="max_chars")
    shown, events = shown_and_events(messages[start:], 0)
    c = Candidates(messages=shown, whole=start == 0, lang="en", events=events, frame=frame_chars())
    sel = choose(c, max_chars)
    chat = compose(sel.system, alternate(sel.raw), max_chars=max_chars)
    assert_provider_valid(
        [{"role": m.role, "content": m.content, **tool_fields(m.tool_calls, m.tool_call_id, m.name)} for m in chat]
    )
    assert sum(m.size for m in chat) <= max_chars


async def test_a_reply_before_a_call_and_a_reused_call_id(daemon: Daemon) -> None:
    """A filler reply then a call: one assistant message goes out (the filler is the call
    message's content). A call id used again later is answered by the result after each call."""
    sid = new_sid()
    await send_message(daemon, sid, {"role": "user", "content": "查一下订单A123"})
    await send_message(daemon, sid, {"role": "assistant", "content": "好的，请稍等。"})
    await send_message(daemon, sid, {"role": "assistant", "tool_calls": [tool_call("c")]})
    await send_message(daemon, sid, {"role": "tool", "tool_call_id": "c", "content": '{"状态":"已发货"}'})
    await send_message(daemon, sid, {"role": "assistant", "content": "您的订单已发货。"})
    await send_message(daemon, sid, {"role": "user", "content": "再查一次"})
    await send_message(daemon, sid, {"role": "assistant", "tool_calls": [tool_call("c")]})
    await send_message(daemon, sid, {"role": "tool", "tool_call_id": "c", "content": '{"状态":"已签收"}'})
    await send_message(daemon, sid, {"role": "assistant", "content": "已签收。"})
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert_provider_valid(ctx["messages"])
    assert ctx["messages"][1] == {"role": "assistant", "content": "好的，请稍等。", "tool_calls": [tool_call("c")]}
    assert [m["content"] for m in ctx["messages"] if m["role"] == "tool"] == ['{"状态":"已发货"}', '{"状态":"已签收"}']
    # The transcript speaks the user's language, whatever the tools return.
    assert ctx["recent_transcript"].startswith("用户：")
