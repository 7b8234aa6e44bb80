"""Which language a conversation is in, for everything the daemon writes for it: Chinese or English.

It sits beside model.py, below every other module, so the summarizer (which prompt and labels to
send the LLM) and context assembly (which labels to render) can share one rule and agree.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Literal

from tiered_memory.model import Message, MessageStatus, Role

Language = Literal["zh", "en"]
LANGUAGES: tuple[Language, ...] = ("zh", "en")

_CJK = re.compile(r"[\u3400-\u9fff]")


def language_of(text: str) -> Language:
    """`zh` when at least a quarter of the characters are Chinese, `en` otherwise.

    An empty text is `zh`, the language the daemon was first built for.
    """
    if not text:
        return "zh"
    return "zh" if len(_CJK.findall(text)) * 4 >= len(text) else "en"


# What follows the spoken part of an interrupted reply wherever memory shows or summarizes it.
CUT_MARKS: dict[Language, str] = {"zh": "（被打断）", "en": " (interrupted)"}


def as_spoken(messages: Sequence[Message]) -> list[Message]:
    """`messages` as memory shows them: an interrupted reply's content marked as cut, in its own
    language, so that the model reading it does not take it for a whole answer (the stored
    message stays verbatim)."""
    return [
        dataclasses.replace(m, content=m.content + CUT_MARKS[language_of(m.content)])
        if m.status is MessageStatus.INTERRUPTED
        else m
        for m in messages
    ]


def conversation_language(messages: Sequence[Message]) -> Language:
    """The language of `messages` as the user speaks it: the user's messages decide, so an
    assistant answering in another language does not change it; all messages when there is no
    user message; `zh` when there are none at all."""
    user = [m.content for m in messages if m.role is Role.USER]
    return language_of("".join(user or [m.content for m in messages]))
