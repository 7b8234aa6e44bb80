"""The LangChain chat message history against a real daemon. langchain-tests has no standard
tests for chat message histories (its suites cover chat models, embeddings, retrievers, vector
stores, tools, caches and stores), so this is BaseChatMessageHistory's documented contract: the
messages come back in order as they were added (tool calls too), `clear` empties the history, the
async methods do the same through the AsyncClient; and the daemon's budgeted context comes back
as LangChain messages."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from tests.helpers.live import LiveDaemon
from tiered_memory.client import AsyncClient, Client
from tiered_memory.integrations.langchain import TieredMemoryChatHistory

CALL = {"name": "ticket_lookup", "args": {"ticket": 4711, "fields": ["seat", "train"]}, "id": "call-1"}
EARLIER = [
    ("My name is Ada Lovelace and my ticket number is 4711.", "Thank you Ada, I found ticket 4711."),
    ("I want to travel to Leeds on Friday morning.", "There is a train to Leeds at 9:40 on Friday."),
    ("Is there a seat by the window?", "Yes, seat 42 by the window is free."),
    ("Please book seat 42 then.", "Seat 42 is booked on the 9:40 to Leeds."),
    ("Will there be a trolley with coffee?", "Yes, a trolley with coffee and snacks passes every hour."),
]


def _sid() -> str:
    return f"it-{uuid.uuid4().hex[:12]}"


def _conversation() -> list[BaseMessage]:
    """A turn with a tool call and its result, each message with its own id."""
    return [
        HumanMessage("Which seat do I have on ticket 4711?", id="h-1"),
        AIMessage("", tool_calls=[CALL], id="a-1"),
        ToolMessage('{"seat": 42, "train": "9:40 to Leeds"}', tool_call_id="call-1", name="ticket_lookup", id="t-1"),
        AIMessage("You have seat 42 on the 9:40 to Leeds.", id="a-2"),
    ]


@pytest.fixture
def client(live_daemon: LiveDaemon) -> Iterator[Client]:
    with Client(live_daemon.url, token=live_daemon.token) as c:
        yield c


@pytest.fixture
async def aclient(live_daemon: LiveDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(live_daemon.url, token=live_daemon.token) as c:
        yield c


def test_messages_come_back_in_order_with_their_tool_calls(client: Client) -> None:
    """Added messages read back equal, in order: a tool call's arguments as the dict they were, the
    tool result with its call id and name, a system message as a SystemMessage; the next batch
    follows them."""
    history = TieredMemoryChatHistory(_sid(), client=client, user_id="u-7")
    assert history.messages == []
    conversation = _conversation()
    history.add_messages(conversation)
    assert history.messages == conversation
    assert history.messages[1].tool_calls == [{**CALL, "type": "tool_call"}]  # type: ignore[attr-defined]
    more = [SystemMessage("call transferred to billing", id="s-1"), HumanMessage("And the price?", id="h-2")]
    history.add_messages(more)
    history.add_user_message("Thanks.")
    stored = history.messages
    assert stored[:-1] == [*conversation, *more]
    assert (type(stored[-1]), stored[-1].content) == (HumanMessage, "Thanks.")
    assert stored[-1].id  # a message without an id gets one


def test_adding_the_same_messages_again_stores_nothing_twice(client: Client) -> None:
    """Messages are appended under their ids: adding them again (a retry of the whole call) is
    recognised and stores nothing; a message without an id is a new message each time."""
    history = TieredMemoryChatHistory(_sid(), client=client)
    conversation = _conversation()
    history.add_messages(conversation)
    history.add_messages(conversation)
    assert history.messages == conversation


def test_clear_deletes_the_session(client: Client) -> None:
    history = TieredMemoryChatHistory(_sid(), client=client)
    history.add_messages(_conversation())
    history.clear()
    assert history.messages == []
    history.clear()  # idempotent
    history.add_messages([HumanMessage("Hello again", id="h-9")])
    assert history.messages == [HumanMessage("Hello again", id="h-9")]


def test_content_blocks_are_stored_as_text_and_media_is_refused(client: Client) -> None:
    """Text blocks are stored as one string; an image is refused before anything is stored."""
    history = TieredMemoryChatHistory(_sid(), client=client)
    history.add_messages([HumanMessage([{"type": "text", "text": "Seat "}, {"type": "text", "text": "42?"}], id="h")])
    assert history.messages == [HumanMessage("Seat 42?", id="h")]
    image = {"type": "image", "url": "https://example.com/ticket.png"}
    with pytest.raises(ValueError, match="'image' block"):
        history.add_messages([HumanMessage("first", id="h-2"), HumanMessage([image], id="h-3")])
    assert history.messages == [HumanMessage("Seat 42?", id="h")]


def test_a_streamed_reply_is_stored_as_the_reply(client: Client) -> None:
    """A streamed reply reaches the history as the chunks joined (an AIMessageChunk, as
    RunnableWithMessageHistory's stream() adds it) and reads back as the AIMessage it is."""
    history = TieredMemoryChatHistory(_sid(), client=client)
    streamed = AIMessageChunk(content="Seat ", id="a-1") + AIMessageChunk(content="42 is booked.")
    history.add_messages([HumanMessage("Book seat 42.", id="h-1"), streamed])
    assert history.messages == [HumanMessage("Book seat 42.", id="h-1"), AIMessage("Seat 42 is booked.", id="a-1")]


async def test_the_async_methods_use_the_async_client(aclient: AsyncClient) -> None:
    """aadd_messages, aget_messages and aclear go through the AsyncClient (no blocking client is
    given, so a sync call fails loudly instead of blocking the loop)."""
    history = TieredMemoryChatHistory(_sid(), async_client=aclient)
    assert await history.aget_messages() == []
    conversation = _conversation()
    await history.aadd_messages(conversation)
    await history.aadd_messages([AIMessage("Anything else?", id="a-3")])
    assert await history.aget_messages() == [*conversation, AIMessage("Anything else?", id="a-3")]
    with pytest.raises(RuntimeError, match="blocking"):
        _ = history.messages
    await history.aclear()
    assert await history.aget_messages() == []


async def test_the_async_methods_fall_back_to_the_blocking_client(client: Client) -> None:
    history = TieredMemoryChatHistory(_sid(), client=client)
    await history.aadd_messages(_conversation())
    assert await history.aget_messages() == _conversation()
    await history.aclear()
    assert await history.aget_messages() == []


async def test_the_context_is_the_budgeted_memory(client: Client, aclient: AsyncClient) -> None:
    """context_messages hands back the daemon's memory within max_chars, as LangChain messages:
    one SystemMessage with the rules and the memory, fewer raw turns than were said, and the
    question last; the early fact the question asks for is still in it."""
    sid = _sid()
    history = TieredMemoryChatHistory(sid, client=client, async_client=aclient)
    for user, assistant in EARLIER:
        history.add_messages([HumanMessage(user), AIMessage(assistant)])
    said = sum(len(u) + len(a) for u, a in EARLIER)
    question = "What was my ticket number again?"
    # The blocking and the async call alike. Not compared with each other: a background summary
    # written between the two may change which parts of the memory fill the budget.
    for context in (
        history.context_messages(question=question, max_chars=300, system_prompt="You are Acme Rail."),
        await history.acontext_messages(question=question, max_chars=300, system_prompt="You are Acme Rail."),
    ):
        assert isinstance(context[0], SystemMessage)
        assert str(context[0].content).startswith("You are Acme Rail.")
        assert context[-1] == HumanMessage(question)
        assert all(isinstance(m, HumanMessage | AIMessage) for m in context[1:])
        shown = sum(len(str(m.content)) for m in context[1:-1])
        assert shown < said
        assert len(context) - 2 < 2 * len(EARLIER)
        assert "4711" in " ".join(str(m.content) for m in context[:-1])
