"""The OpenAI Agents SDK session against a real daemon: the Session contract (items come back
exactly, newest `limit` in order, pop and clear), what the daemon's memory makes of the items, and
two turns of the SDK's own Runner with its ScriptedModel, the second turn's model input holding
the first turn as the daemon kept it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.items import TResponseInputItem
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

from tests.helpers.live import LiveDaemon
from tiered_memory.client import AsyncClient, Conflict
from tiered_memory.integrations.openai_agents import TieredMemorySession


def _turn() -> list[TResponseInputItem]:
    """One turn as the Runner stores it: the user's input, the model's reasoning, a function call
    and its output, and the reply (a Responses output message, with its id and empty annotations)."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "Which seat do I have on ticket 4711?"},
        {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "Look the ticket up."}],
            "encrypted_content": "gAAAAB-opaque",
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "ticket_lookup",
            "arguments": '{"ticket":4711}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"seat": 42, "train": "9:40 to Leeds"}'},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "You have seat 42 on the 9:40.", "annotations": [], "logprobs": []}
            ],
        },
    ]
    return cast(list[TResponseInputItem], items)


def _sid() -> str:
    return f"it-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def client(live_daemon: LiveDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(live_daemon.url, token=live_daemon.token) as c:
        yield c


async def test_items_come_back_exactly_and_the_memory_reads_their_text(client: AsyncClient) -> None:
    """get_items returns the items exactly as added; in the daemon the turn is a user message, a
    tool call with its named result and the reply, which complete one turn; the reasoning is
    stored but never shown: the context holds the conversation's text and none of it."""
    sid = _sid()
    session: Session = TieredMemorySession(sid, client, user_id="u-7")
    items = _turn()
    await session.add_items(items)
    assert await session.get_items() == items
    stored = await client.messages(sid, user_id="u-7")
    assert [(m.role, m.status) for m in stored] == [
        ("user", "completed"),
        ("assistant", "stopped"),
        ("assistant", "completed"),
        ("tool", "completed"),
        ("assistant", "completed"),
    ]
    assert (stored[2].tool_calls or [{}])[0]["function"]["name"] == "ticket_lookup"
    assert (stored[3].tool_call_id, stored[3].name) == ("call_1", "ticket_lookup")
    assert (await client.session(sid, user_id="u-7")).turn_count == 1
    context = json.dumps([m.to_dict() for m in (await client.context(sid, user_id="u-7")).messages])
    assert "seat 42 on the 9:40" in context
    assert "ticket_lookup" in context
    assert "gAAAAB" not in context
    assert "Look the ticket up" not in context


async def test_limit_pop_and_clear(client: AsyncClient) -> None:
    """get_items(limit) is the newest `limit` in order (session_settings.limit by default);
    pop_item removes and returns the newest, taking its completed turn back; clear_session
    empties the session; an unknown session has no items."""
    sid = _sid()
    session = TieredMemorySession(sid, client, session_settings=SessionSettings(limit=3))
    assert await session.get_items() == []
    assert await session.pop_item() is None
    items = _turn()
    await session.add_items(items)
    assert await session.get_items() == items[-3:]
    assert await session.get_items(limit=2) == items[-2:]
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=100) == items
    assert await session.pop_item() == items[-1]
    assert (await client.session(sid)).turn_count == 0
    assert await session.pop_item() == items[-2]
    assert await session.get_items(limit=10) == items[:-2]
    await session.add_items(items[-2:])
    assert await session.get_items(limit=10) == items
    assert (await client.session(sid)).turn_count == 1
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.clear_session()


async def test_an_output_without_a_stored_call_is_kept_verbatim(client: AsyncClient) -> None:
    """A function_call_output whose call the daemon does not hold (it came in an earlier session,
    or was kept verbatim) still comes back exactly."""
    session = TieredMemorySession(_sid(), client)
    orphan = cast(TResponseInputItem, {"type": "function_call_output", "call_id": "call_9", "output": "done"})
    await session.add_items([orphan])
    assert await session.get_items() == [orphan]
    assert await session.pop_item() == orphan


async def test_a_summarized_turn_cannot_be_popped(client: AsyncClient) -> None:
    """Once the daemon's summary covers the newest item's turn (every 2 turns here), pop_item
    raises Conflict `already_summarized` and removes nothing."""
    sid = _sid()
    session = TieredMemorySession(sid, client)
    items: list[TResponseInputItem] = []
    for user, reply in [("Book seat 42.", "Seat 42 is booked."), ("On which train?", "On the 9:40 to Leeds.")]:
        items += [
            cast(TResponseInputItem, {"role": "user", "content": user}),
            cast(TResponseInputItem, {"role": "assistant", "content": reply}),
        ]
    await session.add_items(items)
    for _ in range(400):  # the summary is made in the background: 20 s at most
        stored = await client.summary(sid)
        # Until it is stored, the cold tier answers one made on the read, which covers nothing.
        if stored.tier in ("hot", "warm") and stored.covered_turns == 2:
            break
        await asyncio.sleep(0.05)
    assert (stored.tier, stored.covered_turns) in {("hot", 2), ("warm", 2)}
    with pytest.raises(Conflict) as refused:
        await session.pop_item()
    assert refused.value.code == "already_summarized"
    assert await session.get_items() == items


@function_tool
def ticket_lookup(ticket: int) -> str:
    """The seat and train booked on a ticket."""
    return json.dumps({"ticket": ticket, "seat": 42, "train": "9:40 to Leeds"})


async def test_a_second_run_sees_the_first_turn_from_the_daemon(live_daemon: LiveDaemon) -> None:
    """Runner.run over two turns with the SDK's ScriptedModel; the second turn runs with a new
    client and session object, so what its model input holds of the first turn (the question, the
    tool call, its output, the reply) came from the daemon, exactly as the Runner stored it."""
    sid = _sid()
    model = ScriptedModel(
        [
            [function_call("ticket_lookup", {"ticket": 4711}, call_id="call_1", item_id="fc_1")],
            [assistant_message("You have seat 42 on the 9:40 to Leeds.", item_id="msg_1")],
            [assistant_message("Your ticket number is 4711.", item_id="msg_2")],
        ]
    )
    agent = Agent(name="rail", instructions="You are Acme Rail.", model=model, tools=[ticket_lookup])
    config = RunConfig(tracing_disabled=True)
    async with AsyncClient(live_daemon.url, token=live_daemon.token) as first:
        session = TieredMemorySession(sid, first, user_id="u-7")
        one = await Runner.run(agent, "Which seat do I have on ticket 4711?", session=session, run_config=config)
        assert one.final_output == "You have seat 42 on the 9:40 to Leeds."
        stored = await session.get_items()
    assert [item.get("type", "message") for item in stored] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    async with AsyncClient(live_daemon.url, token=live_daemon.token) as second:
        session = TieredMemorySession(sid, second, user_id="u-7")
        two = await Runner.run(agent, "What was my ticket number?", session=session, run_config=config)
        assert two.final_output == "Your ticket number is 4711."
        last_input = model.calls[-1].input
        assert last_input == [*stored, {"role": "user", "content": "What was my ticket number?"}]
        assert len(await session.get_items()) == len(stored) + 2
        assert (await second.session(sid, user_id="u-7")).turn_count == 2
    model.assert_complete()
