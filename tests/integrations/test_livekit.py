"""The LiveKit Agents adapter against a real daemon, driven by livekit-agents' own AgentSession
without a room (text turns with `session.run`) and a scripted LLM: the memory reaches the model,
committed items are stored once and in order, function calls and their outputs with them, a
barge-in is stored as interrupted, and the AgentSession's close closes the daemon session after the
last append."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, Never

import pytest
from livekit.agents import (
    Agent,
    AgentSession,
    AgentStateChangedEvent,
    ConversationItemAddedEvent,
    FunctionToolsExecutedEvent,
    RunResult,
    function_tool,
    llm,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions, NotGivenOr

from tests.helpers.live import LiveDaemon
from tiered_memory.client import AsyncClient, Context, StoredMessage
from tiered_memory.integrations.livekit import ITEM_PREFIX, TieredMemory

RULES = "You are the support line of Acme Rail. Answer briefly."
USER = "caller-7"
EARLIER_TURNS = [
    ("My name is Ada Lovelace and my ticket number is 4711.", "Thank you Ada, I found ticket 4711."),
    ("I want to travel to Leeds on Friday morning.", "There is a train to Leeds at 9:40 on Friday."),
    ("Is there a seat by the window?", "Yes, seat 42 by the window is free."),
    ("Please book seat 42 then.", "Seat 42 is booked on the 9:40 to Leeds."),
]


# A scripted reply: its words, or its words and then a function call.
Reply = str | tuple[str, llm.FunctionToolCall]


class ScriptedLLM(llm.LLM[Never]):
    """An LLM that answers each chat with the next scripted reply, word by word, and keeps every
    chat context it was sent. Reply number `hold` (from 0) stops after its first chunk until
    cancelled: a reply the user interrupts while it is being spoken."""

    def __init__(self, replies: list[Reply], *, hold: int | None = None) -> None:
        super().__init__()
        self.replies = list(replies)
        self.hold = hold
        self.seen: list[llm.ChatContext] = []

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, Any]] = NOT_GIVEN,
    ) -> llm.LLMStream:
        hold = self.hold == len(self.seen)
        self.seen.append(chat_ctx.copy())
        reply = self.replies.pop(0)
        text, call = reply if isinstance(reply, tuple) else (reply, None)
        return ScriptedStream(
            self, text, call, hold=hold, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options
        )


class ScriptedStream(llm.LLMStream):
    def __init__(
        self, scripted: ScriptedLLM, text: str, call: llm.FunctionToolCall | None, *, hold: bool, **kwargs: Any
    ) -> None:
        super().__init__(scripted, **kwargs)
        self._text = text
        self._call = call
        self._hold = hold

    async def _run(self) -> None:
        words = self._text.split(" ")
        chunks = [words[0], *(f" {w}" for w in words[1:])]
        for n, chunk in enumerate(chunks):
            self._event_ch.send_nowait(
                llm.ChatChunk(id="scripted", delta=llm.ChoiceDelta(role="assistant", content=chunk))
            )
            if self._hold and n == 0:
                await asyncio.Event().wait()  # until the interruption cancels the generation
        if self._call is not None:
            delta = llm.ChoiceDelta(role="assistant", tool_calls=[self._call])
            self._event_ch.send_nowait(llm.ChatChunk(id="scripted", delta=delta))


def new_sid() -> str:
    return f"it-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def client(live_daemon: LiveDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(live_daemon.url, token=live_daemon.token, retries=0, timeout=5) as c:
        yield c


async def stored(client: AsyncClient, sid: str) -> list[StoredMessage]:
    return [m async for m in client.iter_messages(sid, user_id=USER)]


def texts(chat_ctx: llm.ChatContext) -> list[tuple[str, str]]:
    return [(m.role, m.text_content or "") for m in chat_ctx.messages()]


class RememberingAgent(Agent):
    """An agent that loads its memory as it enters the session (`Agent.on_enter`)."""

    def __init__(self, memory: TieredMemory) -> None:
        super().__init__(instructions=RULES)
        self.memory = memory
        self.context: Context | None = None
        self.entered = asyncio.Event()

    async def on_enter(self) -> None:
        self.context = await self.memory.load_into(self)
        self.entered.set()


@pytest.mark.parametrize("when", ["before_start", "on_enter"])
async def test_memory_of_earlier_turns_is_in_the_agent_and_reaches_the_llm(client: AsyncClient, when: str) -> None:
    """Turns stored before the session starts are loaded after the agent's instructions, before
    `session.start` or in `Agent.on_enter`: the agent's chat context holds the daemon's context
    (its memory block, then the latest turn raw), and the LLM's first request carries it between
    the rules and the new question."""
    sid = new_sid()
    for question, answer in EARLIER_TURNS:
        await client.append(sid, "user", question, user_id=USER)
        await client.append(sid, "assistant", answer, user_id=USER)
    # A budget too small for every turn: the older ones go into the memory block.
    memory = TieredMemory(client, sid, user_id=USER, max_chars=200)
    scripted = ScriptedLLM(["It leaves at 9:40 from platform 3."])
    agent = RememberingAgent(memory)
    if when == "before_start":
        agent.context = await memory.load_into(agent)
        agent.entered.set()

    async with AgentSession[None](llm=scripted) as session:
        memory.attach(session)
        await session.start(agent)
        await asyncio.wait_for(agent.entered.wait(), 5)
        assert agent.context is not None
        expected = [(m.role, m.content or "") for m in agent.context.messages]
        assert texts(agent.chat_ctx) == [("system", RULES), *expected]
        result: RunResult[None] = await session.run(user_input="When does my train leave?")
        result.expect.next_event().is_message(role="assistant")
    await memory.aclose()

    assert expected[0][0] == "system"
    assert "<memory>\n" in expected[0][1]
    assert "4711" in expected[0][1]
    # The latest turn raw (one more, when the summary of the first two is not written yet).
    assert expected[-2:] == [("user", EARLIER_TURNS[-1][0]), ("assistant", EARLIER_TURNS[-1][1])]
    assert texts(scripted.seen[0]) == [("system", RULES), *expected, ("user", "When does my train leave?")]
    # The memory loaded into the agent is not recorded again: only the new turn was appended.
    messages = await stored(client, sid)
    assert [m.content for m in messages] == [
        *(text for turn in EARLIER_TURNS for text in turn),
        "When does my train leave?",
        "It leaves at 9:40 from platform 3.",
    ]


async def test_turns_are_stored_in_order_once_with_the_llm_text(client: AsyncClient) -> None:
    """Two turns: user, assistant, user, assistant, each stored once under the LiveKit item's id,
    the replies with the scripted text and status completed."""
    sid = new_sid()
    memory = TieredMemory(client, sid, user_id=USER)
    scripted = ScriptedLLM(["The next train leaves at 9:40.", "Platform 3, a ten minute walk."])
    async with AgentSession[None](llm=scripted) as session:
        memory.attach(session)
        await session.start(Agent(instructions=RULES))
        await session.run(user_input="When is the next train to Leeds?")
        await session.run(user_input="Which platform?")
        history = [m for m in session.history.messages() if m.role in ("user", "assistant")]
    await memory.aclose()

    messages = await stored(client, sid)
    assert [(m.role, m.content, m.status) for m in messages] == [
        ("user", "When is the next train to Leeds?", "completed"),
        ("assistant", "The next train leaves at 9:40.", "completed"),
        ("user", "Which platform?", "completed"),
        ("assistant", "Platform 3, a ten minute walk.", "completed"),
    ]
    assert [m.message_id for m in messages] == [m.id for m in history]
    assert all(m.channel == "voice" for m in messages)


async def test_a_committed_item_seen_twice_is_stored_once(client: AsyncClient) -> None:
    """The item's id is the message_id: the same committed item recorded again stores nothing."""
    sid = new_sid()
    memory = TieredMemory(client, sid, user_id=USER)
    async with AgentSession[None](llm=ScriptedLLM(["Yes, bikes travel free."])) as session:
        memory.attach(session)
        await session.start(Agent(instructions=RULES))
        await session.run(user_input="Can I bring my bike?")
        await memory.flush()
        reply = session.history.messages()[-1]
        session.emit("conversation_item_added", ConversationItemAddedEvent(item=reply))
        await memory.flush()
    await memory.aclose()

    messages = await stored(client, sid)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[-1].message_id == reply.id


async def test_an_interrupted_reply_is_stored_as_interrupted_with_the_spoken_part(client: AsyncClient) -> None:
    """The user cuts in while the reply is spoken (`session.interrupt()`): LiveKit commits the part
    that was spoken with `interrupted` set, and the daemon stores it so."""
    sid = new_sid()
    memory = TieredMemory(client, sid, user_id=USER)
    scripted = ScriptedLLM(["Refunds take about fourteen days to arrive."], hold=0)
    async with AgentSession[None](llm=scripted) as session:
        speaking = asyncio.Event()

        def on_state(event: AgentStateChangedEvent) -> None:
            if event.new_state == "speaking":
                speaking.set()

        session.on("agent_state_changed", on_state)
        memory.attach(session)
        await session.start(Agent(instructions=RULES))
        run: RunResult[None] = session.run(user_input="How long does a refund take?")
        await asyncio.wait_for(speaking.wait(), 5)
        await session.interrupt()
        await run
    await memory.aclose()

    messages = await stored(client, sid)
    assert [(m.role, m.content, m.status) for m in messages] == [
        ("user", "How long does a refund take?", "completed"),
        ("assistant", "Refunds", "interrupted"),
    ]


async def test_closing_the_agent_session_closes_the_daemon_session_after_the_last_append(
    client: AsyncClient,
) -> None:
    """`AgentSession.aclose()` starts the close; it stores every queued append before closing the
    daemon session (none is stored after its close)."""
    sid = new_sid()
    memory = TieredMemory(client, sid, user_id=USER)
    session = AgentSession[None](llm=ScriptedLLM(["Lost items go to the office at platform 1.", "Until 8 pm."]))
    memory.attach(session)
    await session.start(Agent(instructions=RULES))
    await session.run(user_input="I left my umbrella on the train.")
    await session.run(user_input="When is it open?")

    await session.aclose()

    assert memory.closing
    await memory.aclose()
    info = await client.session(sid, user_id=USER)
    messages = await stored(client, sid)
    assert info.closed
    assert info.closed_at is not None
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert max(m.created_at for m in messages) <= info.closed_at


async def test_a_daemon_failure_never_breaks_the_agent() -> None:
    """With the daemon unreachable the agent starts without memory, answers, and closes."""
    sid = new_sid()
    async with AsyncClient("http://127.0.0.1:9", retries=0, timeout=1) as unreachable:
        memory = TieredMemory(unreachable, sid, user_id=USER)
        agent = Agent(instructions=RULES)
        assert await memory.load_into(agent) is None
        async with AgentSession[None](llm=ScriptedLLM(["Still here."])) as session:
            memory.attach(session)
            await session.start(agent)
            result: RunResult[None] = await session.run(user_input="Hello?")
            reply = result.expect.next_event().is_message(role="assistant").event().item
        await memory.aclose()

    assert reply.text_content == "Still here."


LOOKUP = llm.FunctionToolCall(name="find_booking", arguments='{"code": "ZX-42"}', call_id="call_zx42")
BOOKING = "Flight TP1351, seat 14C."


class BookingAgent(Agent):
    """An agent with one function tool, which looks a booking up."""

    def __init__(self) -> None:
        super().__init__(instructions=RULES)

    @function_tool
    async def find_booking(self, code: str) -> str:
        """Look a booking up by its code."""
        assert code == "ZX-42"
        return BOOKING


# A stored message's tool traffic: (role, content, tool_calls, tool_call_id, name).
Traffic = tuple[str, str, list[dict[str, Any]] | None, str | None, str | None]


def traffic(messages: list[StoredMessage]) -> list[Traffic]:
    return [(m.role, m.content, m.tool_calls, m.tool_call_id, m.name) for m in messages]


def recorded(item: llm.ChatItem) -> bool:
    """Whether the adapter records `item` (LiveKit's history holds its own bookkeeping too)."""
    if isinstance(item, llm.ChatMessage):
        return item.role in ("user", "assistant")
    return isinstance(item, (llm.FunctionCall, llm.FunctionCallOutput))


def lookup_and_result() -> list[Traffic]:
    call = {"id": LOOKUP.call_id, "type": "function", "function": {"name": LOOKUP.name, "arguments": LOOKUP.arguments}}
    return [("assistant", "", [call], None, None), ("tool", BOOKING, None, LOOKUP.call_id, LOOKUP.name)]


async def test_a_function_call_and_its_output_are_stored_in_commit_order(client: AsyncClient) -> None:
    """The LLM says a few words and calls a tool, then answers with its output: the daemon stores
    the words, the call (an assistant message with tool_calls) and its output (the tool message
    answering it), then the answer, each once under its LiveKit item's id; a new agent loading the
    session gets the call and its output back as LiveKit's own items, after the words before it."""
    sid = new_sid()
    memory = TieredMemory(client, sid, user_id=USER)
    scripted = ScriptedLLM([("Let me look that up.", LOOKUP), "You fly TP1351, seat 14C."])
    async with AgentSession[None](llm=scripted) as session:
        memory.attach(session)
        await session.start(BookingAgent())
        await session.run(user_input="Which flight is booking ZX-42?")
        await memory.flush()
        items = [i for i in session.history.items if recorded(i)]
        calls = [i for i in items if isinstance(i, llm.FunctionCall)]
        outputs = [i for i in items if isinstance(i, llm.FunctionCallOutput)]
        # The same calls recorded again (an event seen twice) are stored once.
        again = FunctionToolsExecutedEvent(function_calls=calls, function_call_outputs=outputs)
        session.emit("function_tools_executed", again)
        await memory.flush()
    await memory.aclose()

    messages = await stored(client, sid)
    assert traffic(messages) == [
        ("user", "Which flight is booking ZX-42?", None, None, None),
        ("assistant", "Let me look that up.", None, None, None),
        *lookup_and_result(),
        ("assistant", "You fly TP1351, seat 14C.", None, None, None),
    ]
    assert all(m.status == "completed" for m in messages)
    assert [m.message_id for m in messages] == [i.id for i in items]

    # An agent with the tool: LiveKit drops a loaded call of a tool the agent does not have.
    agent = BookingAgent()
    await TieredMemory(client, sid, user_id=USER).load_into(agent)
    loaded = [i for i in agent.chat_ctx.items if i.id.startswith(ITEM_PREFIX)]
    assert [i.type for i in loaded] == ["message", "message", "function_call", "function_call_output", "message"]
    call, output = loaded[2], loaded[3]
    assert isinstance(call, llm.FunctionCall)
    assert (call.call_id, call.name, call.arguments) == (LOOKUP.call_id, LOOKUP.name, LOOKUP.arguments)
    assert isinstance(output, llm.FunctionCallOutput)
    assert (output.call_id, output.name, output.output) == (LOOKUP.call_id, LOOKUP.name, BOOKING)


async def test_the_answer_to_a_function_call_cut_by_a_barge_in_is_stored_as_interrupted(client: AsyncClient) -> None:
    """The answer with a tool's output is cut by the user: the call and its output are stored
    before it, and it is stored `interrupted` with the part that was spoken."""
    sid = new_sid()
    memory = TieredMemory(client, sid, user_id=USER)
    scripted = ScriptedLLM([("", LOOKUP), "You fly TP1351 from gate 12."], hold=1)
    async with AgentSession[None](llm=scripted) as session:
        speaking = asyncio.Event()

        def on_state(event: AgentStateChangedEvent) -> None:
            if event.new_state == "speaking" and len(scripted.seen) == 2:
                speaking.set()

        session.on("agent_state_changed", on_state)
        memory.attach(session)
        await session.start(BookingAgent())
        run: RunResult[None] = session.run(user_input="Which flight is booking ZX-42?")
        await asyncio.wait_for(speaking.wait(), 5)
        await session.interrupt()
        await run
    await memory.aclose()

    messages = await stored(client, sid)
    assert traffic(messages) == [
        ("user", "Which flight is booking ZX-42?", None, None, None),
        *lookup_and_result(),
        ("assistant", "You", None, None, None),
    ]
    assert messages[-1].status == "interrupted"
