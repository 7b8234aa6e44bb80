"""OpenAI Agents SDK adapter: a session whose history the daemon keeps
(`pip install 'tiered-memory-daemon[openai-agents]'`).

    async with AsyncClient(URL, token=TOKEN) as client:
        session = TieredMemorySession("chat-42", client, user_id="u-7")
        result = await Runner.run(agent, "What does Vitality cost?", session=session)

`TieredMemorySession` implements the SDK's `Session` protocol (`agents.memory.Session`: the SDK
asks libraries to implement the protocol rather than subclass its internal `SessionABC`):
`get_items(limit)`, `add_items(items)`, `pop_item()`, `clear_session()`, and `session_settings`
(its `limit` is `get_items`'s default).

The daemon keeps chat-completions messages, which it summarizes and hands back as a budgeted
context; the SDK keeps Responses-API items, and compares them exactly (it fingerprints them to
resume a run whose session write failed, or to rewind a retried one). Each item is one message:
- a message with one text (the user's input, the model's reply, a system or developer message)
  → a `user`, `assistant` or `system` message of that text (`system` is the daemon's note: shown
  under `[Events]`, summarized as an event);
- a `function_call` → an `assistant` message with that one tool call; a `function_call_output` →
  the `tool` message answering it (named after its call when the call came in the same `add_items`);
- anything else (reasoning, a hosted tool's call, a message with an image, a file or a refusal, a
  tool output the daemon has no open call for) → kept verbatim, as JSON, in an `assistant` message
  of status `stopped`: a reply that never reached the user, which the daemon stores and never shows
  in a context or summarizes (the model's hidden reasoning is not conversation to remember).
An item's fields that a message has no place for (its `id`, `type`, `status`, an output text's
empty annotations and logprobs) go into the message's id, `<32 hex>:<shape>[:<item id>]`, which
the daemon stores and never shows. Before it is stored, each item is rebuilt from what would be
stored and compared with itself; one that would not come back equal is kept verbatim instead. So
`get_items` returns exactly the items added. Messages other clients wrote read as plain items
(`{"role", "content"}`, a function call per tool call, a function call output per tool result).

`pop_item` removes the newest message (`DELETE …/messages/{message_id}`) while no summary covers
its turn. Once one does (the daemon summarizes every SUMMARY_EVERY_N_TURNS completed turns, in the
background) it raises the client's Conflict, code `already_summarized`: the memory holds that turn.
`clear_session` deletes the session (its messages, summary and state). The client is the caller's
to close; its retries reuse each message's id, so an item is stored once however often a request
is retried.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory import SessionSettings
from agents.memory.session_settings import resolve_session_limit

from tiered_memory.client import AsyncClient, Conflict, NotFound, StoredMessage, new_message_id

__all__ = ["TieredMemorySession"]

# What the daemon accepts as a message id and as a tool's name, and a batch's size at most.
_MESSAGE_ID = re.compile(r"[\x21-\x7e]{1,128}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BATCH = 500
# An item's message id: a nonce, the item's shape, its own id. The shape is a kind (m: a text
# message, f: a function call, r: a function call output, x: verbatim) and what the item has
# beside what the message holds: t its `type`, s `"status": "completed"`, d the developer role,
# i / o its text as one input_text / output_text part, a and l that part's empty annotations and
# logprobs.
_OWN_ID = re.compile(r"([0-9a-f]{32}):([mfrx])([adilost]*)(?::(.+))?")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class TieredMemorySession:
    """The items of daemon session `session_id`, through `client`, as `user_id` when given
    (X-User-ID: the daemon checks it against the session's owner)."""

    def __init__(
        self,
        session_id: str,
        client: AsyncClient,
        *,
        user_id: str | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self.user_id = user_id
        self._client = client

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first; with `limit` (default: session_settings.limit), the
        newest `limit` of them. [] for a session the daemon does not know."""
        limit = resolve_session_limit(limit, self.session_settings)
        try:
            if limit is None:
                stored = [m async for m in self._client.iter_messages(self.session_id, user_id=self.user_id)]
                return [item for m in stored for item in _items(m)]
            return await self._newest(limit)
        except NotFound:
            return []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append `items` in order, one message each, in one batch (per 500) stored all or none."""
        plain = [cast(Mapping[str, Any], item) for item in items]
        # A tool result is named after its call, for the daemon's memory ("ticket_lookup: seat 42").
        names = {
            i["call_id"]: i["name"]
            for i in plain
            if i.get("type") == "function_call"
            and isinstance(i.get("call_id"), str)
            and isinstance(i.get("name"), str)
            and _TOOL_NAME.fullmatch(i["name"])
        }
        for start in range(0, len(plain), _BATCH):
            chunk = plain[start : start + _BATCH]
            bodies = [_encode(item, names) for item in chunk]
            try:
                await self._client.append_batch(self.session_id, bodies, user_id=self.user_id)
            except Conflict as exc:
                if exc.code != "unknown_tool_call_id":
                    raise
                # An output whose call the daemon does not hold as an open tool call (it was
                # kept verbatim, or answered already): kept verbatim too. The refused batch
                # stored nothing.
                calls = {b["tool_calls"][0]["id"] for b in bodies if b.get("tool_calls")}
                bodies = [
                    _verbatim(item) if b["role"] == "tool" and b["tool_call_id"] not in calls else b
                    for item, b in zip(chunk, bodies, strict=True)
                ]
                await self._client.append_batch(self.session_id, bodies, user_id=self.user_id)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it; None when the session has none. Raises the
        client's Conflict (`already_summarized`) once a summary covers the newest item's turn.
        (A message another client wrote that reads as several items goes whole; its last is returned.)"""
        newest = await self._newest_message()
        if newest is None:
            return None
        # False means gone already: this call's own retry after a commit whose answer was lost (a
        # 503 from the hot tier, a cut connection), or another pop. Either way it has left the
        # session, and taking the next newest as well would remove an item nobody popped.
        await self._client.delete_message(self.session_id, newest.message_id, user_id=self.user_id)
        items = _items(newest)
        return items[-1] if items else None

    async def clear_session(self) -> None:
        """Delete the session from the daemon: its messages, summary and state. Idempotent."""
        await self._client.delete(self.session_id, user_id=self.user_id)

    async def _newest(self, limit: int) -> list[TResponseInputItem]:
        """The newest `limit` items: the messages from seq message_count - limit + 1 on (one item
        each, or more for a message another client wrote), and earlier ones while too few."""
        if limit <= 0:
            return []
        info = await self._client.session(self.session_id, user_id=self.user_id)
        items: list[TResponseInputItem] = []
        last = info.message_count
        while last >= 1 and len(items) < limit:
            first = max(1, last - (limit - len(items)) + 1)
            items = [item for m in await self._range(first, last) for item in _items(m)] + items
            last = first - 1
        return items[-limit:]

    async def _range(self, first: int, last: int) -> list[StoredMessage]:
        """The stored messages of seqs first..last, a page at a time."""
        out: list[StoredMessage] = []
        while first <= last:
            page = await self._client.messages(self.session_id, user_id=self.user_id, from_seq=first, to_seq=last)
            if not page:
                break
            out.extend(page)
            first = page[-1].seq + 1
        return out

    async def _newest_message(self) -> StoredMessage | None:
        try:
            count = (await self._client.session(self.session_id, user_id=self.user_id)).message_count
            if count == 0:
                return None
            page = await self._client.messages(self.session_id, user_id=self.user_id, from_seq=count, to_seq=count)
        except NotFound:
            return None
        return page[0] if page else None


def _encode(item: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """`item` as an item of the daemon's batch append: as a message of its own text when it comes
    back from that exactly, verbatim otherwise."""
    native = _native(item, names)
    return native if native is not None else _verbatim(item)


# What an item of one kind is as a message: its id's shape, the flags of what the item has beside
# what the message holds (but its status, which any kind may have), and the message's fields.
_Fields = tuple[str, str, dict[str, Any]]


def _native(item: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any] | None:
    """`item` as a message of its own text (and its id's shape), or None when it is none of the
    kinds a message holds, or would not come back from one exactly."""
    kind = item.get("type", "message" if "role" in item else None)
    fields: _Fields | None
    if kind == "message":
        fields = _message_fields(item)
    elif kind == "function_call":
        fields = _call_fields(item)
    elif kind == "function_call_output":
        fields = _output_fields(item, names)
    else:
        return None
    if fields is None:
        return None
    shape, flags, body = fields
    flags += "s" if item.get("status") == "completed" else ""
    message_id = f"{new_message_id()}:{shape}{''.join(sorted(flags))}"
    if "id" in item:
        message_id += f":{item['id']}"
    own = _OWN_ID.fullmatch(message_id)
    if own is None or not _MESSAGE_ID.fullmatch(message_id):
        return None  # an item id the daemon cannot hold in a message id
    if _rebuilt(own, body["role"], body["content"] or "", body.get("tool_calls"), body.get("tool_call_id")) != item:
        return None
    return {**body, "message_id": message_id}


def _message_fields(item: Mapping[str, Any]) -> _Fields | None:
    """A message item of one text, as a user, assistant or system message; None for another."""
    role, text = item.get("role"), item.get("content")
    flags = ("t" if "type" in item else "") + ("d" if role == "developer" else "")
    if isinstance(text, list) and len(text) == 1 and isinstance(text[0], Mapping):
        part = text[0]
        part_flag = {"input_text": "i", "output_text": "o"}.get(str(part.get("type")))
        if part_flag is None:
            return None
        flags += part_flag + ("a" if "annotations" in part else "") + ("l" if "logprobs" in part else "")
        text = part.get("text")
    if role not in _ROLES or not isinstance(text, str) or not text.strip():
        return None
    return "m", flags, {"role": _ROLES[str(role)], "content": text}


def _call_fields(item: Mapping[str, Any]) -> _Fields | None:
    """A function call, as an assistant message of that one tool call."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    named = isinstance(name, str) and _TOOL_NAME.fullmatch(name) is not None
    if not (_is_id(call_id) and named and isinstance(arguments, str)):
        return None
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return "f", "", {"role": "assistant", "content": None, "tool_calls": [call]}


def _output_fields(item: Mapping[str, Any], names: Mapping[str, str]) -> _Fields | None:
    """A function call's output, as the tool message answering it, named after its call when
    `names` (the calls of the same `add_items`) has it."""
    call_id, output = item.get("call_id"), item.get("output")
    if not (_is_id(call_id) and isinstance(output, str) and output.strip()):
        return None
    body: dict[str, Any] = {"role": "tool", "content": output, "tool_call_id": call_id}
    if call_id in names:
        body["name"] = names[str(call_id)]
    return "r", "", body


def _is_id(value: object) -> bool:
    """A call id the daemon holds (1-128 printable ASCII characters)."""
    return isinstance(value, str) and _MESSAGE_ID.fullmatch(value) is not None


def _verbatim(item: Mapping[str, Any]) -> dict[str, Any]:
    """The item as JSON in a reply that never reached the user (stored, never shown or
    summarized). Raises TypeError for an item JSON does not carry exactly."""
    text = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    if json.loads(text) != item:
        raise TypeError(f"a session item must be JSON (it comes back as {text[:200]})")
    return {"role": "assistant", "content": text, "status": "stopped", "message_id": f"{new_message_id()}:x"}


def _rebuilt(
    own: re.Match[str],
    role: str,
    content: str,
    tool_calls: Sequence[Mapping[str, Any]] | None,
    tool_call_id: str | None,
) -> dict[str, Any]:
    """The item a message of this adapter's holds, from its id's match and its stored fields."""
    _, kind, flags, item_id = own.groups()
    if kind == "x":
        return cast(dict[str, Any], json.loads(content))
    item: dict[str, Any] = {}
    if item_id is not None:
        item["id"] = item_id
    if "s" in flags:
        item["status"] = "completed"
    if kind == "f" and tool_calls:
        function = tool_calls[0]["function"]
        call = {"call_id": tool_calls[0]["id"], "name": function["name"], "arguments": function["arguments"]}
        return item | {"type": "function_call"} | call
    if kind == "r":
        return item | {"type": "function_call_output", "call_id": tool_call_id, "output": content}
    if "t" in flags:
        item["type"] = "message"
    item["role"] = "developer" if "d" in flags else role
    if "i" in flags or "o" in flags:
        part: dict[str, Any] = {"type": "input_text" if "i" in flags else "output_text", "text": content}
        if "a" in flags:
            part["annotations"] = []
        if "l" in flags:
            part["logprobs"] = []
        item["content"] = [part]
    else:
        item["content"] = content
    return item


def _items(m: StoredMessage) -> list[TResponseInputItem]:
    """The items a stored message holds: the one this adapter stored, or for a message another
    client wrote, its plain reading."""
    own = _OWN_ID.fullmatch(m.message_id)
    if own is not None:
        try:
            return [cast(TResponseInputItem, _rebuilt(own, m.role, m.content, m.tool_calls, m.tool_call_id))]
        except (ValueError, KeyError, IndexError, TypeError):
            pass  # an id that only looks like ours: read it plainly
    if m.role == "tool":
        return [
            cast(TResponseInputItem, {"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content})
        ]
    out: list[dict[str, Any]] = [{"role": m.role, "content": m.content}] if m.content else []
    for call in m.tool_calls or []:
        function = call.get("function", {})
        out.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments"),
            }
        )
    return [cast(TResponseInputItem, item) for item in out]
