"""Assembling what a gateway sends its model: the summary, then the recent turns, within a budget.

Pure functions over model objects: the service fetches, this module decides what fits and in
which order. Models attend best to a system message carrying the long-term memory followed by the
raw recent turns, alternating user/assistant and starting with a user message.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tiered_memory.language import language_of
from tiered_memory.model import Message, Role

SUMMARY_PREFIX = "[历史对话摘要] "
SUMMARY_PREFIXES = {"zh": SUMMARY_PREFIX, "en": "[Conversation summary] "}


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
    messages are dropped, consecutive messages of one role are joined, and a reply that was
    stopped, failed or is still streaming is left out (its question stands alone)."""
    out: list[ChatMessage] = []
    for m in messages:
        if not m.answered:
            continue
        if not out and m.role is Role.ASSISTANT:
            continue
        if out and out[-1].role == m.role.value:
            out[-1] = ChatMessage(m.role.value, out[-1].content + "\n" + m.content)
        else:
            out.append(ChatMessage(m.role.value, m.content))
    return out


def fit_recent(messages: Sequence[Message], *, room: int) -> tuple[list[Message], list[Message]]:
    """Split the raw turns into those that fit `room` characters (newest first, whole messages)
    and the older ones that do not. When the newest message alone is too long, it is cut — and a
    reply keeps its question beside it (each cut to share the room), never a reply on its own.
    Unanswered replies (stopped, failed, streaming) are left out; a kept list never starts with
    an assistant message (its question did not fit), which then counts as not fitting."""
    answered = [m for m in messages if m.answered]
    kept: list[Message] = []
    used = 0
    for idx in range(len(answered) - 1, -1, -1):
        m = answered[idx]
        # alternate() joins consecutive messages of one role with a newline (two questions around
        # a stopped reply): that newline is content too, or the joined turns overrun the room.
        cost = len(m.content) + (1 if kept and kept[-1].role is m.role else 0)
        if used + cost <= room:
            kept.append(m)
            used += cost
            continue
        if not kept and room > 0:
            question = answered[idx - 1] if idx > 0 and answered[idx - 1].role is Role.USER else None
            if m.role is Role.ASSISTANT and question is not None:
                q_room = min(len(question.content), room // 2)
                kept = [_cut(m, room - q_room), _cut(question, q_room)]
            else:
                kept = [_cut(m, room)]
        break
    kept.reverse()
    while kept and kept[0].role is Role.ASSISTANT:
        kept.pop(0)
    return kept, answered[: len(answered) - len(kept)]


def _cut(m: Message, limit: int) -> Message:
    """A message cut to `limit` characters: a reply keeps its beginning (where the answer is), a
    user message its end (the words just spoken)."""
    if len(m.content) <= limit:
        return m
    if limit <= 1:
        return dataclasses.replace(m, content=m.content[:limit])
    if m.role is Role.ASSISTANT:
        return dataclasses.replace(m, content=m.content[: limit - 1] + "…")
    return dataclasses.replace(m, content="…" + m.content[-(limit - 1) :])


def summary_room(summary_chars: int, max_chars: int) -> int:
    """What the summary is guaranteed of a budget before raw turns take the rest: most of a small
    budget (its facts are denser than raw turns), at most 700 characters of that, and half of a
    large one (raw turns past the window then reach further back). Measured in docs/QUALITY.md."""
    return min(summary_chars, max(max_chars // 2, min(max_chars * 7 // 10, 700)))


def compose(memory_text: str | None, recent: Sequence[ChatMessage], *, max_chars: int) -> list[ChatMessage]:
    """The system message with the memory text, cut to what the recent messages leave of
    max_chars (cut at its end), followed by the recent messages."""
    used = sum(len(m.content) for m in recent)
    out: list[ChatMessage] = []
    if memory_text:
        room = max(0, max_chars - used)
        if room:
            out.append(ChatMessage("system", memory_text[:room]))
    out.extend(recent)
    return out


def assemble(summary_text: str | None, messages: Sequence[Message], *, max_chars: int) -> list[ChatMessage]:
    """Fit the summary system text and the raw turns into max_chars of content.

    The newest turns matter most for the next reply, the summary for everything older: the summary
    is guaranteed up to half the budget, the recent messages take what they need of the rest
    (newest first, whole messages; the newest cut only when it alone exceeds the room), and the
    summary may then grow into whatever the recent turns left unused.
    """
    kept, _ = fit_recent(messages, room=max_chars - min(len(summary_text or ""), max_chars // 2))
    return compose(summary_text, alternate(kept), max_chars=max_chars)


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


def recent_transcript(messages: Sequence[Message], *, max_chars: int) -> str:
    """`用户：…` / `助手：…` lines, each capped (160 / 320 chars), trimmed from the oldest end."""
    lang = language_of("".join(m.content for m in messages[-4:]))
    lines = [
        f"{_SPEAKERS[lang][m.role]}：{_cap(m.content, _TRANSCRIPT_CAPS[m.role])}"
        if lang == "zh"
        else f"{_SPEAKERS[lang][m.role]}: {_cap(m.content, _TRANSCRIPT_CAPS[m.role])}"
        for m in messages
        if m.answered
    ]
    return _keep_newest(lines, max_chars)


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


_RECALL_LABELS = {"zh": "[早前对话片段]", "en": "[Earlier in this conversation]"}


def recall_text(turns: Sequence[Sequence[Message]], *, max_chars: int) -> str:
    """Earlier turns that match the question, labelled as earlier conversation: `turns` best
    first, each kept whole (lines capped as in the transcript) while the text fits `max_chars`,
    shown in conversation order. Empty when none fits."""
    if not turns:
        return ""
    lang = language_of("".join(m.content for turn in turns for m in turn))
    label = _RECALL_LABELS[lang]
    chosen: list[tuple[int, str]] = []
    used = len(label)
    for turn in turns:
        sep = "：" if lang == "zh" else ": "
        block = "\n".join(
            f"{_SPEAKERS[lang][m.role]}{sep}{_cap(m.content, _TRANSCRIPT_CAPS[m.role])}" for m in turn if m.answered
        )
        if block and used + 1 + len(block) <= max_chars:
            chosen.append((turn[0].seq, block))
            used += 1 + len(block)
    if not chosen:
        return ""
    return "\n".join([label, *(block for _, block in sorted(chosen))])


def with_recall(messages: list[ChatMessage], text: str) -> list[ChatMessage]:
    """The recalled text at the end of the leading system message (one is made when there is none)."""
    if not text:
        return messages
    if messages and messages[0].role == "system":
        return [ChatMessage("system", f"{messages[0].content}\n{text}"), *messages[1:]]
    return [ChatMessage("system", text), *messages]
