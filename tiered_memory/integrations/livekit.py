"""LiveKit Agents adapter: the daemon's memory in an agent's chat context, and a session's committed
conversation recorded in the daemon (`pip install 'tiered-memory-daemon[livekit]'`).

    memory = TieredMemory(client, call_id, user_id=caller)
    agent = Agent(instructions=RULES)
    await memory.load_into(agent)  # or in Agent.on_enter
    memory.attach(session)  # records every committed item, closes the daemon session on "close"
    ctx.add_shutdown_callback(memory.aclose)  # lets the last appends and the close finish
    await session.start(agent, room=ctx.room)

The memory is the daemon's context as it stands (its leading system message, then the recent turns)
put after the agent's own instructions: LiveKit keeps the instructions in a system message of their
own (`update_instructions` replaces only that one), so the memory is a second system message, and
a provider that takes one system prompt gets both joined, rules first, as the daemon lays them out.
A tool call and its result come back as a FunctionCall and its FunctionCallOutput; LiveKit keeps
them only in an agent that has that tool (`Agent.update_chat_ctx` drops the others).

Recording follows `conversation_item_added`, which LiveKit emits once an item is committed to the
history: a user's transcript, or a reply with only the part that was spoken (`interrupted` when the
user cut in); and `function_tools_executed`, which it emits once a reply's function calls have run
(or ended with the turn a user cut): each call as an assistant message with that one call in
`tool_calls`, then each output as the `tool` message answering it, named after the function. A
call whose output is empty (a tool that returned nothing, or asked for silence) is left out with
it: the daemon stores no empty message, and a call without its result never reaches a context.
Each is appended with the item's id as its message_id, so a retry is stored once; the appends wait
in a queue drained by one task, in commit order, and never hold up the agent. A failed call to the
daemon is logged and dropped: memory degrades, the conversation goes on. An async tool's later
updates (`ctx.update`, a deferred result) go into the history without an event and are not stored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Final, Literal

import structlog
from livekit.agents import Agent, AgentSession, CloseEvent, ConversationItemAddedEvent, FunctionToolsExecutedEvent, llm

from tiered_memory.client import AsyncClient, ClientError, Context
from tiered_memory.client import ChatMessage as MemoryMessage
from tiered_memory.integrations._tool_calls import call_of, tool_name

__all__ = ["ITEM_PREFIX", "TieredMemory", "chat_items", "with_memory"]

log = structlog.get_logger("tiered_memory.integrations.livekit")

# Every chat item loaded from the daemon has an id under this prefix, so a reload replaces them.
ITEM_PREFIX: Final = "tiered_memory."
# The roles of the daemon's context messages that are LiveKit chat messages (a `tool` result is not).
_ROLES: Final[dict[str, llm.ChatRole]] = {"system": "system", "user": "user", "assistant": "assistant"}
# A committed item that is recorded: words said, a function call, or a call's output.
_Item = llm.ChatMessage | llm.FunctionCall | llm.FunctionCallOutput


def chat_items(context: Context, *, now: float | None = None) -> list[llm.ChatItem]:
    """The daemon's context as LiveKit chat items, in its order: the memory as a system message,
    the recent turns as messages, a tool call and its result as a FunctionCall and its output.
    Items get ids `tiered_memory.<n>` and creation times just before `now` (default: the clock),
    so that LiveKit, which orders a chat context by creation time, keeps them ahead of what follows."""
    base = time.time() if now is None else now
    items: list[llm.ChatItem] = []
    for message in context.messages:
        items.extend(_items_of(message))
    for n, item in enumerate(items):
        item.id = f"{ITEM_PREFIX}{n}"
        # A millisecond apart, the last one a millisecond before `base`.
        item.created_at = base - (len(items) - n) / 1000
    return items


def _items_of(message: MemoryMessage) -> list[llm.ChatItem]:
    if message.role == "tool":
        call_id = message.tool_call_id or ""
        return [
            llm.FunctionCallOutput(
                call_id=call_id, name=message.name or "", output=message.content or "", is_error=False
            )
        ]
    out: list[llm.ChatItem] = []
    role = _ROLES.get(message.role)
    if message.content and role is not None:
        out.append(llm.ChatMessage(role=role, content=[message.content]))
    for call in message.tool_calls or []:
        function = call.get("function") or {}
        out.append(
            llm.FunctionCall(
                call_id=str(call.get("id", "")),
                name=str(function.get("name", "")),
                arguments=str(function.get("arguments", "")),
            )
        )
    return out


def with_memory(chat_ctx: llm.ChatContext, items: list[llm.ChatItem]) -> llm.ChatContext:
    """A copy of `chat_ctx` with the memory `items` in place of any loaded before: after its leading
    system messages (the agent's instructions), ahead of the conversation."""
    kept = [item for item in chat_ctx.items if not item.id.startswith(ITEM_PREFIX)]
    lead = 0
    while lead < len(kept) and _is_instructions(kept[lead]):
        lead += 1
    return llm.ChatContext([*kept[:lead], *items, *kept[lead:]])


def _is_instructions(item: llm.ChatItem) -> bool:
    return isinstance(item, llm.ChatMessage) and item.role in ("system", "developer")


class TieredMemory:
    """The daemon's memory of one LiveKit AgentSession (`session_id`, owned by `user_id`).

    - `channel`: how the conversation reaches the daemon (`voice`, the default, or `chat`).
    - `max_chars`, `user_memory`: passed to the context read (`AsyncClient.context`).

    One instance serves one AgentSession, once: after the session's close it records nothing more.
    """

    def __init__(
        self,
        client: AsyncClient,
        session_id: str,
        *,
        user_id: str | None = None,
        channel: Literal["voice", "chat"] = "voice",
        max_chars: int | None = None,
        user_memory: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self._client = client
        self._channel = channel
        self._max_chars = max_chars
        self._user_memory = user_memory
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._drain: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._session: AgentSession[Any] | None = None

    @property
    def closing(self) -> bool:
        """True once the close has begun (the AgentSession closed, or `aclose` was called)."""
        return self._closing is not None

    # --- the memory in, at the start -------------------------------------------------------

    async def load_into(self, agent: Agent) -> Context | None:
        """Read the daemon's context of the session and put it in `agent`'s chat context, after the
        agent's instructions (replacing what an earlier call loaded). Call it before
        `session.start(agent)` or from `Agent.on_enter`. Returns the context read; None when the
        daemon failed (logged), and then the agent starts without memory."""
        try:
            context = await self._client.context(
                self.session_id, user_id=self.user_id, max_chars=self._max_chars, user_memory=self._user_memory
            )
        except ClientError as exc:
            log.warning("livekit.context_failed", session_id=self.session_id, error=repr(exc))
            return None
        await agent.update_chat_ctx(with_memory(agent.chat_ctx, chat_items(context)))
        return context

    # --- the conversation out, as it is committed -------------------------------------------

    def attach(self, session: AgentSession[Any]) -> None:
        """Record `session`'s committed conversation in the daemon, and close the daemon session when
        `session` closes. Call it from a running event loop, before `session.start`."""
        if self._session is not None:
            raise RuntimeError("TieredMemory is attached to an AgentSession already")
        self._session = session
        self._drain = asyncio.get_running_loop().create_task(self._store_all(), name="tiered_memory.livekit.drain")
        session.on("conversation_item_added", self._on_item_added)
        session.on("function_tools_executed", self._on_tools_executed)
        session.on("close", self._on_close)

    async def flush(self) -> None:
        """Wait until every item committed so far is stored (or failed, logged)."""
        await self._queue.join()

    async def aclose(self) -> None:
        """Store what is queued, then close the daemon session (persisting its final summary); a
        failure is logged, never raised. The AgentSession's close starts this; awaiting it again
        waits for that same close."""
        # Shielded: a caller that gives up waiting (a job's shutdown timeout) leaves the close running.
        await asyncio.shield(self._start_close())

    def _on_item_added(self, event: ConversationItemAddedEvent) -> None:
        item = event.item
        # Handoffs between agents and system notes are LiveKit's bookkeeping, not conversation.
        if not isinstance(item, llm.ChatMessage) or item.role not in ("user", "assistant"):
            return
        self._record([item])

    def _on_tools_executed(self, event: FunctionToolsExecutedEvent) -> None:
        # The calls, then their outputs: the order LiveKit commits them to the history in.
        ran = [(call, output) for call, output in event.zipped() if output.output.strip()]
        self._record([call for call, _ in ran] + [output for _, output in ran])

    def _record(self, items: Sequence[_Item]) -> None:
        if items and self._closing is not None:
            log.warning("livekit.item_after_close", session_id=self.session_id, message_id=items[0].id)
            return
        for item in items:
            self._queue.put_nowait(item)

    def _on_close(self, event: CloseEvent) -> None:
        # An event handler cannot await: the close runs as a task (`aclose` waits for it).
        self._start_close()

    def _start_close(self) -> asyncio.Task[None]:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close(), name="tiered_memory.livekit.close")
        return self._closing

    async def _store_all(self) -> None:
        while (item := await self._queue.get()) is not None:
            try:
                await self._store(item)
            except Exception:  # a malformed answer or a bug: logged, and the rest is still recorded
                log.exception("livekit.append_error", session_id=self.session_id, message_id=item.id)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    async def _store(self, item: _Item) -> None:
        if isinstance(item, llm.FunctionCall):
            call = call_of(item.call_id, item.name, item.arguments)
            await self._append(item.id, "assistant", None, tool_calls=[call])
        elif isinstance(item, llm.FunctionCallOutput):
            await self._append(item.id, "tool", item.output, tool_call_id=item.call_id, name=tool_name(item.name))
        else:
            # `text_content` is what was said: LiveKit's expressive markup stripped from a reply.
            text = item.text_content
            if not text or not text.strip():
                return
            status = None if item.role == "user" else ("interrupted" if item.interrupted else "completed")
            await self._append(item.id, item.role, text, status=status)

    async def _append(
        self,
        message_id: str,
        role: str,
        content: str | None,
        *,
        status: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
    ) -> None:
        try:
            await self._client.append(
                self.session_id,
                role,
                content,
                message_id=message_id,
                user_id=self.user_id,
                channel=self._channel,
                status=status,
                tool_calls=tool_calls,
                tool_call_id=tool_call_id,
                name=name,
            )
        except ClientError as exc:
            log.warning(
                "livekit.append_failed", session_id=self.session_id, message_id=message_id, role=role, error=repr(exc)
            )

    async def _close(self) -> None:
        if self._session is not None:
            self._session.off("conversation_item_added", self._on_item_added)
            self._session.off("function_tools_executed", self._on_tools_executed)
            self._session.off("close", self._on_close)
        if self._drain is not None:
            self._queue.put_nowait(None)
            await self._drain
        try:
            await self._client.close(self.session_id, user_id=self.user_id)
        except ClientError as exc:
            log.warning("livekit.close_failed", session_id=self.session_id, error=repr(exc))
        except Exception:  # nobody may await a close the AgentSession started: logged here, or lost
            log.exception("livekit.close_error", session_id=self.session_id)
