"""A reply's reasoning: `thinking_content` (the model's chain of thought, as the gateway got it)
and `thinking_duration` (how long it thought, in seconds), on assistant messages only.

It is the gateway's record, not the conversation: kept with its message in the cold tier and
returned wherever the client reads stored messages (`GET …/messages`, a PATCH's answer, an
export), and nowhere else. A model never sees it again (contexts, `/turns`), and no summary,
recall posting or user profile is made of it: reasoning restates, hedges and rejects, so a fact
drawn from it may be one the reply turned down.

Where that holds: the hot tier keeps no reasoning (its records stay as small as the context needs;
the Redis codec never writes it, the in-process tier drops it), and the SQL reads that feed a
context, a summary or the recall index do not select its columns. Only `messages_by_seq(...,
reasoning=True)`, the API's and the export's read, brings it back.

Pure functions over model objects.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tiered_memory.model import Message

# The longest reasoning a reply states, in seconds: a day. Deep-research models think for minutes
# to an hour; a larger value is a unit mistake (milliseconds), refused rather than stored.
THINKING_DURATION_MAX = 86_400


def reasoning_fields(m: Message) -> dict[str, Any]:
    """A message's reasoning as the API shows it, only the fields it has."""
    out: dict[str, Any] = {}
    if m.thinking_content is not None:
        out["thinking_content"] = m.thinking_content
    if m.thinking_duration is not None:
        out["thinking_duration"] = m.thinking_duration
    return out


def without_reasoning(m: Message) -> Message:
    """`m` as the hot tier keeps it: without its reasoning."""
    if m.thinking_content is None and m.thinking_duration is None:
        return m
    return dataclasses.replace(m, thinking_content=None, thinking_duration=None)
