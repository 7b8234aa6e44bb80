"""The knowledge-base snippets a caller hands one context (`kb_snippets`): how many and how large
they may be, the share of `max_chars` they keep, their labelled block, and where it goes.

Snippets are the caller's retrieval results for this turn (a knowledge base, an MCP tool):
external facts for reference, not memory. They are never stored (not as messages, nor in a
summary or the recall postings); a context shows them once, where the prompt order models attend
to best puts them: after the system message's memory, before the recent turns, in the user's role.

Where exactly: the recent turns alternate user/assistant from a user message, and a provider
refuses (or silently merges) two user messages in a row, so the block is not a message of its
own there. It leads the window's first user message, joined to it by a newline as any two user
messages in a row are (context.alternate), inside its own tags and under a label that says it is
reference material the application supplied, not the user's words. A second system message would
keep it apart from the turns, but most providers take only one; an assistant message between the
block and the turns would put words in the model's mouth. With no turn to lead (a new session,
MEMORY_MODE=none) the block is a user message of its own, which the question then joins
(context.frame).

Pure functions.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from tiered_memory.model import Role
from tiered_memory.prompt.context import ChatMessage

# At most this many snippets, of this many bytes of UTF-8 in all: a turn's retrieval is a handful
# of passages, and the bytes fit the room the request body keeps beside its two texts (64 KiB,
# settings.max_body_bytes) even JSON-escaped, so no body bound moves for them.
KB_SNIPPETS_MAX = 16
KB_SNIPPETS_MAX_BYTES = 16 * 1024
# The share of max_chars the snippets keep before the memory is chosen: they are the caller's
# explicit request for this turn, but the last turn and the memory still need room. What the
# memory leaves of its own share goes to further snippets.
KB_SHARE = 0.5

# The block's tags, the same in both languages so that a gateway (and its rules) can name them.
_OPEN = "<reference>"
_CLOSE = "</reference>"
# The label follows the user's language, like the memory's labels (policy.LABELS), and is
# short: it counts in max_chars, every time.
LABELS = {
    "zh": "[知识库资料：本轮的外部参考事实，不是用户说的话]",
    "en": "[Knowledge base: reference facts for this turn, not said by the user]",
}
# A snippet's own copy of the block's tags, however spaced: bent out of shape, so that retrieved
# text cannot close the block early and pass what follows off as the user's words.
_TAG = re.compile(r"(?i)<(?=(?:\s|[\u200b-\u200d\u2060\ufeff])*/?(?:\s|[\u200b-\u200d\u2060\ufeff])*reference\b)")


def _line(i: int, snippet: str) -> str:
    return f"[{i}] {_TAG.sub('‹', snippet)}"


def block(snippets: Sequence[str], lang: str) -> str:
    """The snippets, numbered from 1, in their tagged and labelled block; '' for none."""
    if not snippets:
        return ""
    return "\n".join([_OPEN, LABELS[lang], *(_line(i, s) for i, s in enumerate(snippets, 1)), _CLOSE])


def cost(snippets: Sequence[str], lang: str) -> int:
    """The characters the block of `snippets` adds to a context: the block and the newline that
    joins it to the first user message (counted even when it stands alone: a bound, not a
    guess); 0 for none."""
    return len(block(snippets, lang)) + 1 if snippets else 0


def fitting(snippets: Sequence[str], room: int, lang: str | None = None) -> int:
    """How many of the first `snippets` fit `room` characters whole (`cost`), in the caller's
    order: the caller ranks them, so the last give way first and a snippet is never cut (half a
    passage can state a wrong fact). With `lang` None, under the longer label, so that the count
    holds in either language."""
    labels = [lang] if lang is not None else list(LABELS)
    # The tags, the label and the newlines between them, then each snippet's line and its newline.
    used = max(len(_OPEN) + len(LABELS[lb]) + len(_CLOSE) + 3 for lb in labels)
    for n, snippet in enumerate(snippets, 1):
        used += len(_line(n, snippet)) + 1
        if used > room:
            return n - 1
    return len(snippets)


def reserve(snippets: Sequence[str], max_chars: int) -> int:
    """The characters a context of `max_chars` keeps for `snippets` before its memory is chosen:
    the cost of the first that fit KB_SHARE of it, under the longer label (the language is known
    only once the memory is read); 0 when none fits."""
    n = fitting(snippets, int(max_chars * KB_SHARE))
    return max(cost(snippets[:n], lang) for lang in LABELS) if n else 0


def place(messages: Sequence[ChatMessage], reference: str) -> list[ChatMessage]:
    """`messages` (a leading system message, then turns from a user message) with the block
    `reference` after the system message: leading the first user message, or, when none follows,
    a user message of its own. Unchanged for an empty block."""
    out = list(messages)
    if not reference:
        return out
    at = 1 if out and out[0].role == "system" else 0
    if at < len(out) and out[at].role == Role.USER.value:
        out[at] = dataclasses.replace(out[at], content=f"{reference}\n{out[at].content}")
    else:
        out.insert(at, ChatMessage(Role.USER.value, reference))
    return out


def shown(
    memory: Sequence[ChatMessage], snippets: Sequence[str], *, max_chars: int, lang: str
) -> tuple[list[ChatMessage], int, str]:
    """The context's messages with the snippets placed, once the memory was chosen in what
    `reserve` left of `max_chars` (`memory`: the system message and the turns): the first that
    fit what the memory leaves (their reserve at least, more when it needed less), in `lang`.
    Returns the messages, how many snippets they show, and the block ('' for none)."""
    used = fitting(snippets, max_chars - sum(m.size for m in memory), lang)
    reference = block(snippets[:used], lang)
    return place(memory, reference), used, reference
