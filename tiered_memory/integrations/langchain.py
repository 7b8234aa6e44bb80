"""LangChain adapter: a chat message history kept by the daemon (`pip install 'tiered-memory-daemon[langchain]'`).

    with Client(URL, token=TOKEN) as client:
        history = TieredMemoryChatHistory("chat-42", client=client, user_id="u-7")
        history.add_messages([HumanMessage("What does Vitality cost?"), AIMessage("398 yuan a box.")])
        history.messages                                   # every stored message, oldest first
        llm.invoke(history.context_messages(question="And the dose?", max_chars=2000))

`TieredMemoryChatHistory` is a `BaseChatMessageHistory` (langchain-core 1.6.4 marks it, like
RunnableWithMessageHistory, deprecated for removal in 2.0, pointing to its short-term memory
documentation; a subclass warns nothing). Both of LangChain's faces are real: the sync methods
(`messages`, `add_messages`, `clear`) call the blocking `Client`, the async ones (`aget_messages`,
`aadd_messages`, `aclear`) the `AsyncClient`; give the one your code uses, or both. Without an
`AsyncClient` the async methods run the sync ones in an executor (LangChain's default).

What each message becomes in the daemon:
- HumanMessage → `user`; AIMessage → `assistant`, its `tool_calls` in the chat-completions shape
  (arguments as JSON text) and read back as `tool_calls`; ToolMessage → `tool` with its
  `tool_call_id` and `name` (its `status` and `artifact` are not kept); SystemMessage → `system`,
  which in the daemon is a gateway's event of what happened: the context lists it under `[Events]`
  in its leading system message and summaries record it as an event; it is never the model's
  instructions (give those as `system_prompt`). Read back, each is the message class it came from.
- Content is text: a list of text blocks is stored as one string; an image, audio or file block is
  refused (ValueError, nothing stored), except on an AIMessage, whose non-text blocks (its
  reasoning, a tool call block that `tool_calls` repeats) are left out: the daemon keeps what was
  said. `invalid_tool_calls` are left out too (never run, they have no result to pair with).
- Each message is appended under its `id` when it has one (hashed into one the daemon accepts when
  it is not 1-128 printable ASCII characters), or a fresh one, which the client reuses on its
  retries: adding the same messages (with ids) again stores nothing twice. `add_messages` is one
  batch, stored all or none.
- `clear()` deletes the session from the daemon: its messages, summary and state.

`context_messages` is the point of the daemon: the conversation's memory within a character budget
(summary, recalled earlier turns, the recent turns raw) as the messages to send the model, ending
with the `question`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.runnables.config import run_in_executor

from tiered_memory.client import AsyncClient, ChatMessage, Client, NotFound, StoredMessage, new_message_id

__all__ = ["TieredMemoryChatHistory"]

# What the daemon accepts as a message_id, and how many messages one batch holds at most.
_MESSAGE_ID = re.compile(r"[\x21-\x7e]{1,128}")
_BATCH = 500
_ROLES: dict[type[BaseMessage], str] = {
    HumanMessage: "user",
    AIMessage: "assistant",
    ToolMessage: "tool",
    SystemMessage: "system",
}


class TieredMemoryChatHistory(BaseChatMessageHistory):
    """The messages of daemon session `session_id`, written and read through `client` (blocking)
    or `async_client`, as `user_id` when given (X-User-ID: the daemon checks it against the
    session's owner). The clients are the caller's to close."""

    def __init__(
        self,
        session_id: str,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        user_id: str | None = None,
    ) -> None:
        if client is None and async_client is None:
            raise ValueError("TieredMemoryChatHistory: give a `client` (blocking), an `async_client`, or both")
        super().__init__()
        self.session_id = session_id
        self.user_id = user_id
        self._client = client
        self._async = async_client

    # --- sync -----------------------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # LangChain declares it an attribute; it is a read
        """Every stored message, oldest first ([] for a session the daemon does not know)."""
        try:
            return [_from_stored(m) for m in self._blocking().iter_messages(self.session_id, user_id=self.user_id)]
        except NotFound:
            return []

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append `messages` in order, in one batch (per 500), stored all or none."""
        for batch in _batches([_to_daemon(m) for m in messages]):
            self._blocking().append_batch(self.session_id, batch, user_id=self.user_id)

    def clear(self) -> None:
        """Delete the session from the daemon (messages, summary, state); idempotent."""
        self._blocking().delete(self.session_id, user_id=self.user_id)

    def context_messages(
        self,
        *,
        question: str | None = None,
        max_chars: int | None = None,
        system_prompt: str | None = None,
        user_memory: str | None = None,
    ) -> list[BaseMessage]:
        """The daemon's context as the messages to send the model: one SystemMessage (the
        `system_prompt` and the memory, within `max_chars`; CONTEXT_MAX_CHARS by default), the
        recent turns, then `question` as a HumanMessage. `user_memory` as the daemon takes it."""
        ctx = self._blocking().context(
            self.session_id,
            user_id=self.user_id,
            max_chars=max_chars,
            system_prompt=system_prompt,
            question=question,
            user_memory=user_memory,
        )
        return [_from_chat(m) for m in ctx.messages]

    # --- async ----------------------------------------------------------------------------

    async def aget_messages(self) -> list[BaseMessage]:
        if self._async is None:
            return await super().aget_messages()
        try:
            return [_from_stored(m) async for m in self._async.iter_messages(self.session_id, user_id=self.user_id)]
        except NotFound:
            return []

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self._async is None:
            await super().aadd_messages(messages)
            return
        for batch in _batches([_to_daemon(m) for m in messages]):
            await self._async.append_batch(self.session_id, batch, user_id=self.user_id)

    async def aclear(self) -> None:
        if self._async is None:
            await super().aclear()
            return
        await self._async.delete(self.session_id, user_id=self.user_id)

    async def acontext_messages(
        self,
        *,
        question: str | None = None,
        max_chars: int | None = None,
        system_prompt: str | None = None,
        user_memory: str | None = None,
    ) -> list[BaseMessage]:
        """`context_messages`, through the AsyncClient (or the blocking one in an executor)."""
        if self._async is None:
            return await run_in_executor(
                None,
                lambda: self.context_messages(
                    question=question, max_chars=max_chars, system_prompt=system_prompt, user_memory=user_memory
                ),
            )
        ctx = await self._async.context(
            self.session_id,
            user_id=self.user_id,
            max_chars=max_chars,
            system_prompt=system_prompt,
            question=question,
            user_memory=user_memory,
        )
        return [_from_chat(m) for m in ctx.messages]

    def _blocking(self) -> Client:
        if self._client is None:
            raise RuntimeError("TieredMemoryChatHistory: the sync methods need a blocking `client`")
        return self._client


def _batches(items: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [items[i : i + _BATCH] for i in range(0, len(items), _BATCH)]


def _message_id(message: BaseMessage) -> str:
    """The message's own id when the daemon takes it; else a digest of it, so that adding the same
    message again is still recognised; a fresh id for a message without one."""
    if message.id is None:
        return new_message_id()
    if _MESSAGE_ID.fullmatch(message.id):
        return message.id
    return "lc-" + hashlib.sha256(message.id.encode()).hexdigest()[:40]


def _text(message: BaseMessage) -> str:
    """The message's text. Raises ValueError for a block the daemon cannot store as text (an
    image, audio, a file), except on an AIMessage, whose other blocks are left out."""
    if isinstance(message.content, str):
        return message.content
    parts: list[str] = []
    for block in message.content:
        if isinstance(block, str):
            parts.append(block)
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif not isinstance(message, AIMessage):
            raise ValueError(
                f"{type(message).__name__}: the daemon stores text, and this message has a {block.get('type')!r} block"
            )
    return "".join(parts)


def _to_daemon(message: BaseMessage) -> dict[str, Any]:
    """`message` as an item of the daemon's batch append."""
    # A streamed reply arrives as an AIMessageChunk, a subclass of its message's class.
    role = next((r for cls, r in _ROLES.items() if isinstance(message, cls)), None)
    if role is None:
        raise ValueError(f"{type(message).__name__}: expected a Human, AI, Tool or System message")
    body: dict[str, Any] = {"role": role, "content": _text(message), "message_id": _message_id(message)}
    if isinstance(message, AIMessage) and message.tool_calls:
        body["tool_calls"] = [_call(c) for c in message.tool_calls]
    if isinstance(message, ToolMessage):
        body["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            body["name"] = message.name
    return body


def _call(call: ToolCall) -> dict[str, Any]:
    if call["id"] is None:
        raise ValueError(f"tool call {call['name']!r}: the daemon needs its id, to pair it with its result")
    arguments = json.dumps(call["args"], ensure_ascii=False)
    return {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": arguments}}


def _from_stored(m: StoredMessage) -> BaseMessage:
    """A stored message as LangChain's; an assistant reply that did not complete (stopped,
    failed, streaming, interrupted) says so in `response_metadata["status"]`."""
    message = _message(m.role, m.content, m.tool_calls, m.tool_call_id, m.name, m.message_id)
    if isinstance(message, AIMessage) and m.status != "completed":
        message.response_metadata["status"] = m.status
    return message


def _from_chat(m: ChatMessage) -> BaseMessage:
    return _message(m.role, m.content or "", m.tool_calls, m.tool_call_id, m.name, None)


def _message(
    role: str,
    content: str,
    tool_calls: list[dict[str, Any]] | None,
    tool_call_id: str | None,
    name: str | None,
    message_id: str | None,
) -> BaseMessage:
    if role == "user":
        return HumanMessage(content, id=message_id)
    if role == "tool":
        return ToolMessage(content, tool_call_id=tool_call_id or "", name=name, id=message_id)
    if role == "system":
        return SystemMessage(content, id=message_id)
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for raw in tool_calls or []:
        try:
            parsed = parse_tool_call(raw, return_id=True)
        except OutputParserException as exc:
            invalid.append(make_invalid_tool_call(raw, str(exc)))
            continue
        if parsed is not None:
            calls.append(ToolCall(name=parsed["name"], args=parsed["args"], id=parsed["id"], type="tool_call"))
    return AIMessage(content, tool_calls=calls, invalid_tool_calls=invalid, id=message_id)
