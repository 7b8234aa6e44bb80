"""A framework's function call and its result in the shape the daemon's append API takes: the call
in an assistant message's `tool_calls`, the result as a `tool` message. Shared by the voice
adapters (pipecat, LiveKit), which see calls and results as events of their own and not as
chat-completions messages; it needs no framework."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final

# What the daemon accepts as a message id (and a call id), and as a tool's name (http/input.py).
_MESSAGE_ID: Final = re.compile(r"[\x21-\x7e]{1,128}")
_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def call_of(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One entry of an assistant message's `tool_calls` (`arguments`: the arguments as JSON text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_name(name: str) -> str | None:
    """`name` as a `tool` message's `name`, or None when the daemon would refuse it: the name is
    only what memory reads the result under, so a message without it is better than none."""
    return name if _TOOL_NAME.fullmatch(name) else None


def derived_message_id(kind: str, call_id: str) -> str:
    """The message_id of the `kind` message (a call, its result) of call `call_id`: the same for
    the same call each time, so a message stored again (a retry, an event seen twice) is stored
    once. The call id itself when it fits in a message_id, else its digest."""
    message_id = f"{kind}.{call_id}"
    if _MESSAGE_ID.fullmatch(message_id):
        return message_id
    return f"{kind}.sha256-{hashlib.sha256(call_id.encode()).hexdigest()[:40]}"
