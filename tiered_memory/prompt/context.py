"""The shape of what a gateway sends its model: the raw window, provider-valid alternation, the
system message's frame and the transcripts. What fills the budget is prompt/policy.py's choice.

Pure functions over model objects. Models attend best to a system message carrying the long-term
memory followed by the raw recent turns, alternating user/assistant and starting with a user
message.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tiered_memory.model import Message, Role
from tiered_memory.text.dialogue import joins, provider_order, units
from tiered_memory.text.language import language_of
from tiered_memory.text.quoting import frame_chars, memory_block

SUMMARY_PREFIX = "[历史对话摘要] "
SUMMARY_PREFIXES = {"zh": SUMMARY_PREFIX, "en": "[Conversation summary] "}


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: str = ""
    """An assistant message's calls, the JSON array as stored; '' for none."""
    tool_call_id: str | None = None
    name: str | None = None

    @property
    def size(self) -> int:
        return len(self.content) + len(self.tool_calls)


# Characters of raw messages (window included) a context sizes its choice by at least, and older
# messages it reads at most (a huge budget is still one bounded read).
_OLDER_MIN_CHARS = 4000
OLDER_MAX_MESSAGES = 400


def older_chars(max_chars: int, window_chars: int) -> int:
    """Characters of raw messages from before the window that a context of `max_chars` chooses
    from, beside a window of `window_chars`: one and a half times what twice the budget leaves
    beside the window (condensing halves long messages, and key points are a small part of what
    they come from), twice the budget being at least _OLDER_MIN_CHARS."""
    return max(0, math.ceil(1.5 * (max(2 * max_chars, _OLDER_MIN_CHARS) - window_chars)))


def hot_list_chars(max_chars: int) -> int:
    """Characters of a session's newest messages that hold the window and the older messages of
    a context of `max_chars` (older_chars beside any window), so that it reads nothing else."""
    return older_chars(max_chars, 0)


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


def hot_list_whole(recent: Sequence[Message], *, message_count: int | None) -> bool:
    """Whether the hot recent list holds every message of the session."""
    return bool(recent) and recent[0].seq == 1 and recent[-1].seq == message_count == len(recent)


def content_chars(messages: Iterable[Message]) -> int:
    """Characters the messages cost a prompt (their content and tool calls)."""
    return sum(m.size for m in messages)


def window(messages: Sequence[Message], *, turn_count: int, keep_recent_turns: int) -> list[Message]:
    """The messages of the raw window, oldest first."""
    if keep_recent_turns <= 0:
        return []
    first = window_start_turn(turn_count, keep_recent_turns)
    return [m for m in messages if m.turn >= first]


def alternate(messages: Sequence[Message]) -> list[ChatMessage]:
    """Chat messages alternating user/assistant, starting with a user message: leading assistant
    messages (and tool calls with their results) are dropped, consecutive messages of one role
    are joined, a reply that was stopped, failed or is still streaming is left out (its question
    stands alone), and tool traffic is put in provider order (dialogue.provider_order): a call
    followed by all its results, between a question and the reply that used them."""
    out: list[ChatMessage] = []
    last: Message | None = None
    for unit in units(provider_order([m for m in messages if m.answered])):
        if not out and unit[0].role is not Role.USER:
            continue
        for m in unit:
            if last is not None and joins(last, m):
                text = "\n".join(t for t in (out[-1].content, m.content) if t)
                out[-1] = ChatMessage(m.role.value, text, m.tool_calls)
            else:
                out.append(ChatMessage(m.role.value, m.content, m.tool_calls, m.tool_call_id, m.name))
            last = m
    return out


def compose(memory_text: str | None, recent: Sequence[ChatMessage], *, max_chars: int) -> list[ChatMessage]:
    """The system message with the memory text, cut to what the recent messages and the block's
    tags leave of max_chars (cut at its end), in its block (quoting.py), then the recent
    messages. The tags count like every other character: a gateway sizes its prompt by
    max_chars. Only the caller's own text (the operator's rules, the question) is outside it."""
    out: list[ChatMessage] = []
    if memory_text:
        room = memory_room(recent, max_chars)
        if room:
            out.append(ChatMessage("system", memory_block(memory_text[:room])))
    out.extend(recent)
    return out


def memory_room(recent: Sequence[ChatMessage], max_chars: int) -> int:
    """What the recent messages and the block's tags leave of max_chars for the memory text
    (`compose` cuts it there)."""
    return max(0, max_chars - sum(m.size for m in recent) - frame_chars())


def cut_parts(parts: Sequence[tuple[str, str]], room: int) -> tuple[tuple[str, str], ...]:
    """The memory text's pieces (policy.Part) as `compose` sends them: joined by newlines
    and cut at `room` characters, the last piece cut short and those after it left out."""
    kept: list[tuple[str, str]] = []
    used = 0
    for origin, text in parts:
        left = room - used - (1 if kept else 0)
        if left <= 0:
            break
        kept.append((origin, text[:left]))
        used += min(len(text), left) + (1 if len(kept) > 1 else 0)
    return tuple(kept)


# Per-message caps of the recent transcript: a question is short, an answer may carry detail.
_TRANSCRIPT_CAPS = {Role.USER: 160, Role.ASSISTANT: 320}
_SPEAKERS = {"zh": {Role.USER: "用户", Role.ASSISTANT: "助手"}, "en": {Role.USER: "User", Role.ASSISTANT: "Assistant"}}


def _keep_newest(lines: Sequence[str], max_chars: int) -> str:
    """Join lines, dropping the oldest until the text fits; the newest line is cut if it alone is too long."""
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = len(line) + (1 if kept else 0)
        if used + cost > max_chars:
            if not kept:
                kept.append(line[-max_chars:] if max_chars > 0 else "")
            break
        kept.append(line)
        used += cost
    return "\n".join(reversed(kept))


def transcript_lines(messages: Sequence[Message]) -> list[str]:
    """`用户：…` / `助手：…` lines (`User: …` in English, as the newest messages speak), each capped
    (160 / 320 chars); tool traffic and the gateway's events are left out (the replies say what
    the tools found)."""
    lang = language_of("".join(m.content for m in messages[-4:] if m.role in _SPEAKERS["zh"]))
    return [
        f"{_SPEAKERS[lang][m.role]}：{_cap(m.content, _TRANSCRIPT_CAPS[m.role])}"
        if lang == "zh"
        else f"{_SPEAKERS[lang][m.role]}: {_cap(m.content, _TRANSCRIPT_CAPS[m.role])}"
        for m in messages
        if m.answered and m.role in _SPEAKERS[lang] and m.content
    ]


def recent_transcript(messages: Sequence[Message], *, max_chars: int) -> str:
    """The transcript_lines of `messages`, trimmed from the oldest end."""
    return _keep_newest(transcript_lines(messages), max_chars)


def answer_transcript(messages: Sequence[Message], *, max_chars: int) -> str:
    """The user's own words only, newest kept: what the user asked, for answer-focused prompts."""
    lines = [_cap(m.content, _TRANSCRIPT_CAPS[Role.USER]) for m in messages if m.role is Role.USER]
    return _keep_newest(lines, max_chars)


def _cap(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ago(seconds: float, lang: str) -> str:
    """A coarse, human 'how long ago': minutes under two hours, then hours, then days."""
    minutes = max(1, int(seconds // 60))
    if minutes < 120:
        return f"{minutes}分钟前" if lang == "zh" else _en(minutes, "minute")
    hours = minutes // 60
    if hours < 48:
        return f"{hours}小时前" if lang == "zh" else _en(hours, "hour")
    days = hours // 24
    return f"{days}天前" if lang == "zh" else _en(days, "day")


def _en(n: int, unit: str) -> str:
    return f"{n} {unit}{'' if n == 1 else 's'} ago"


def summary_system_text(
    summary: str,
    *,
    idle_seconds: float | None,
    reconnect_gap_s: float,
    templates: dict[str, str],
    lang: str | None = None,
) -> str:
    """The content of the summary system message in the conversation's language `lang` (by
    default the summary's): `[历史对话摘要] …` / `[Conversation summary] …`, or after a gap longer
    than reconnect_gap_s, the language's reconnect template (`用户上次（2小时前）的对话摘要：…`)."""
    lang = lang or language_of(summary)
    if idle_seconds is None or idle_seconds <= reconnect_gap_s:
        return SUMMARY_PREFIXES[lang] + summary
    return templates[lang].format(ago=ago(idle_seconds, lang), summary=summary)


def estimate_tokens(chars: int, chars_per_token: float) -> int:
    return math.ceil(chars / chars_per_token) if chars > 0 else 0


def frame(messages: list[ChatMessage], *, system_prompt: str | None, question: str | None) -> list[ChatMessage]:
    """The complete array for a provider: rules and summary in one leading system message (most
    providers accept only one), the turns, then the current question as the last user message."""
    out = list(messages)
    if system_prompt:
        if out and out[0].role == "system":
            out[0] = ChatMessage("system", f"{system_prompt}\n\n{out[0].content}")
        else:
            out.insert(0, ChatMessage("system", system_prompt))
    if question:
        if out and out[-1].role == Role.USER.value:
            out[-1] = ChatMessage(Role.USER.value, f"{out[-1].content}\n{question}")
        else:
            out.append(ChatMessage(Role.USER.value, question))
    return out
