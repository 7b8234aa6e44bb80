"""Tool traffic and gateway events in a stored conversation: what a provider accepts of it, and the
text memory reads of it.

A provider refuses a chat whose assistant message with `tool_calls` is not followed at once by a
result for every call, or that has a tool result without its call before it. A stored conversation
may hold both (a result that came after the user spoke again, a call whose results never came, a
window that starts between a call and its results), so every raw stretch memory shows is put in
provider order first, and the budget then treats a call and its results as one unit: it keeps or
drops them together. A gateway's events (`system` messages) are never shown as messages of their
own: the context lists them inside its one leading system message.

Pure functions over model objects.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from tiered_memory.model import Message, Role

# How deep a tool result's JSON is read for text; deeper values are shown as they were sent.
_FLAT_DEPTH = 4


def is_call(m: Message) -> bool:
    """An assistant message that calls tools."""
    return m.role is Role.ASSISTANT and bool(m.tool_calls)


def tool_calls(m: Message) -> list[dict[str, Any]]:
    """An assistant message's tool calls, as the gateway sent them; [] for none."""
    if not m.tool_calls:
        return []
    calls = json.loads(m.tool_calls)
    return calls if isinstance(calls, list) else []


def tool_fields(tool_calls: str, tool_call_id: str | None, name: str | None) -> dict[str, Any]:
    """A message's tool fields as the API shows them, only those it has: `tool_calls` (the calls
    as the gateway sent them), `tool_call_id`, `name`."""
    out: dict[str, Any] = {}
    if tool_calls:
        out["tool_calls"] = json.loads(tool_calls)
    if tool_call_id is not None:
        out["tool_call_id"] = tool_call_id
    if name is not None:
        out["name"] = name
    return out


def provider_order(messages: Sequence[Message]) -> list[Message]:
    """`messages` (oldest first) as a provider accepts them: each assistant message with tool calls
    followed at once by the results of all its calls, in call order; a call message whose results
    are not all there left out with those it has (the boundary moves past it), a result without
    its call left out, and the gateway's events left out (the context lists them apart)."""
    if _plain(messages):
        return list(messages)  # what nearly every context reads: nothing to reorder (a context's hot path)
    results: dict[str | None, list[Message]] = {}
    for m in messages:
        if m.role is Role.TOOL:
            results.setdefault(m.tool_call_id, []).append(m)
    out: list[Message] = []
    for m in messages:
        if m.role in (Role.TOOL, Role.SYSTEM):
            continue
        if is_call(m):
            # Each call takes the first result of its id after it (a gateway may reuse an id).
            answers = [_first_after(results.get(str(call.get("id")), []), m.seq) for call in tool_calls(m)]
            if all(answers):
                out.append(m)
                out.extend(a for a in answers if a is not None)
            continue
        out.append(m)
    return out


def _first_after(results: list[Message], seq: int) -> Message | None:
    """The first of `results` (in order) after `seq`, taken out of the list."""
    for i, m in enumerate(results):
        if m.seq > seq:
            return results.pop(i)
    return None


def shown_and_events(messages: Sequence[Message], covered_turns: int) -> tuple[list[Message], list[Message]]:
    """`messages` in provider order, and apart from them the gateway's events after turn
    `covered_turns` (those the summary does not hold yet)."""
    if _plain(messages):
        return list(messages), []
    return provider_order(messages), [m for m in events(messages) if m.turn > covered_turns]


def _plain(messages: Sequence[Message]) -> bool:
    """Whether `messages` are only users' and assistants' words: no tool traffic, no events."""
    return all(m.role is Role.USER or (m.role is Role.ASSISTANT and not m.tool_calls) for m in messages)


def units(messages: Sequence[Message]) -> list[list[Message]]:
    """`messages` in provider order, cut into what a budget keeps or drops whole: a call message
    with the results after it, or a single message."""
    if _plain(messages):
        return [[m] for m in messages]
    out: list[list[Message]] = []
    for m in messages:
        if m.role is Role.TOOL and out and (is_call(out[-1][0])):
            out[-1].append(m)
        else:
            out.append([m])
    return out


def joins(a: Message, b: Message) -> bool:
    """Whether two messages in a row go out as one (a newline between them): two of one role, user
    or assistant, the first without tool calls (a reply followed by a call message becomes the
    call message's content: a provider takes no two assistant messages in a row). A tool result
    stays apart, with its call id."""
    return a.role is b.role and a.role in (Role.USER, Role.ASSISTANT) and not a.tool_calls


def events(messages: Sequence[Message]) -> list[Message]:
    """The gateway's events among `messages` (call transferred, on hold, DTMF entered)."""
    return [m for m in messages if m.role is Role.SYSTEM]


def flat(text: str) -> str:
    """A tool result as text memory reads: its JSON's keys and values in order ("order id: A123,
    total: 59.9"), so that the numbers, dates and names in it read as facts; text that is not a
    JSON object or array, as it was sent."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return _flat(value, _FLAT_DEPTH) if isinstance(value, dict | list) else text


def _flat(value: object, depth: int) -> str:
    if depth == 0:
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        parts = (f"{str(k).replace('_', ' ')}: {_flat(v, depth - 1)}" for k, v in value.items() if v not in (None, ""))
        return ", ".join(parts)
    if isinstance(value, list):
        return ", ".join(_flat(v, depth - 1) for v in value)
    return str(value)


def readable(m: Message) -> str:
    """The text memory reads of a message: a tool result's as `name: flat result`; a call
    message's content with each call as `→ name: flat arguments`; another's content."""
    if m.role is Role.TOOL:
        body = flat(m.content)
        return f"{m.name}: {body}" if m.name else body
    if not m.tool_calls:
        return m.content
    said = [
        f"→ {call.get('function', {}).get('name', '')}: {flat(str(call.get('function', {}).get('arguments', '')))}"
        for call in tool_calls(m)
    ]
    return " ".join([m.content, *said] if m.content else said)


def for_summary(messages: Sequence[Message]) -> list[Message]:
    """`messages` as the summarizers read them: tool results and calls as their readable text (the
    order numbers, prices and dates a tool returned are facts like any the user said), events as
    they are (the summarizers record them as events)."""
    return [dataclasses.replace(m, content=readable(m)) if m.role is Role.TOOL or m.tool_calls else m for m in messages]
