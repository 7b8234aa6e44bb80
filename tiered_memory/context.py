"""Assembling what a gateway sends its model: the summary, then the recent turns, within a budget.

Pure functions over model objects: the service fetches, this module decides what fits and in
which order. Models attend best to a system message carrying the long-term memory followed by the
raw recent turns, alternating user/assistant and starting with a user message.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tiered_memory.model import Message, Role

SUMMARY_PREFIX = "[历史对话摘要] "


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


def window_start_turn(turn_count: int, keep_recent_turns: int) -> int:
    """The first turn of the raw window: the last `keep_recent_turns` completed turns, plus the
    turn in progress (a user message still waiting for its reply) when there is one."""
    return max(1, turn_count - keep_recent_turns + 1)


def hot_window_complete(
    recent: Sequence[Message], *, message_count: int | None, turn_count: int | None, keep_recent_turns: int
) -> bool:
    """Whether the hot recent list holds the whole raw window, so SQL need not be asked.

    It must be contiguous by seq, end at the message count SQL last reported, and reach back to
    the window's first turn (or to the session's first message).
    """
    if message_count is None or turn_count is None:
        return False
    if message_count == 0:
        return True
    if not recent or recent[-1].seq != message_count:
        return False
    if any(b.seq != a.seq + 1 for a, b in itertools.pairwise(recent)):
        return False
    return recent[0].seq == 1 or recent[0].turn < window_start_turn(turn_count, keep_recent_turns)


def window(messages: Sequence[Message], *, turn_count: int, keep_recent_turns: int) -> list[Message]:
    """The messages of the raw window, oldest first."""
    if keep_recent_turns <= 0:
        return []
    first = window_start_turn(turn_count, keep_recent_turns)
    return [m for m in messages if m.turn >= first]


def alternate(messages: Sequence[Message]) -> list[ChatMessage]:
    """Chat messages alternating user/assistant, starting with a user message: leading assistant
    messages are dropped and consecutive messages of one role are joined."""
    out: list[ChatMessage] = []
    for m in messages:
        if not out and m.role is Role.ASSISTANT:
            continue
        if out and out[-1].role == m.role.value:
            out[-1] = ChatMessage(m.role.value, out[-1].content + "\n" + m.content)
        else:
            out.append(ChatMessage(m.role.value, m.content))
    return out


def assemble(summary: str | None, recent: Sequence[ChatMessage], *, max_chars: int) -> list[ChatMessage]:
    """Fit the summary and the recent turns into max_chars of content.

    The newest turns matter most for the next reply, the summary for everything older: the summary
    is guaranteed up to half the budget, the recent messages take what they need of the rest
    (newest first, whole messages; the newest is cut only when it alone exceeds the room), and the
    summary may then grow into whatever the recent turns left unused.
    """
    summary_full = SUMMARY_PREFIX + summary if summary else ""
    reserved = min(len(summary_full), max_chars // 2)
    room = max_chars - reserved
    kept: list[ChatMessage] = []
    for m in reversed(recent):
        if len(m.content) <= room:
            kept.append(m)
            room -= len(m.content)
        elif not kept and room > 0:
            kept.append(ChatMessage(m.role, m.content[-room:]))
            room = 0
            break
        else:
            break
    kept.reverse()
    while kept and kept[0].role != Role.USER.value:
        kept.pop(0)
    used = sum(len(m.content) for m in kept)
    out: list[ChatMessage] = []
    if summary_full:
        out.append(ChatMessage("system", summary_full[: max(0, max_chars - used)]))
    out.extend(kept)
    return out
