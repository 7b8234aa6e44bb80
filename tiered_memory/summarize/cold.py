"""The cold tier's answer: a deterministic summary of a session's messages, made at read time.

Used when neither Redis nor the warm row has a summary (never made yet, deleted, or lost with
both caches): the extractor over the answered messages, shaped like a stored summary (version 0,
source deterministic) so that callers treat every tier's answer alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from tiered_memory.model import Message, SessionInfo, Summary, SummarySource
from tiered_memory.payload import rule_payload
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.topics import TopicTagger
from tiered_memory.text.dialogue import for_summary
from tiered_memory.text.language import as_spoken

# What a cold extraction reads, in multiples of the summary's size: an extractor needs a choice of
# sentences several times what it keeps, and the cost of the read follows what it reads.
COLD_READ_SUMMARIES = 3


def cold_slice(head: Sequence[Message], tail: Sequence[Message], *, max_chars: int) -> list[Message]:
    """What a cold extraction of a long session reads: whole messages from its opening (a third
    of `max_chars`: who the user is and what they came for) and from its end (the rest: what is
    going on now), at least one of each, each message once. `head` is oldest first from the
    session's first message, `tail` oldest first up to its newest."""
    head_room = max_chars // 3
    sizes = list(accumulate(len(m.content) for m in head))
    opening = list(head[: max(1, sum(1 for s in sizes if s <= head_room))])
    last = opening[-1].seq if opening else 0
    later = [m for m in tail if m.seq > last]
    sizes = list(accumulate(len(m.content) for m in reversed(later)))
    kept = max(1, sum(1 for s in sizes if s <= max_chars - head_room)) if later else 0
    return opening + later[len(later) - kept :]


def cold_summary(
    extractor: Extractor, info: SessionInfo, messages: Sequence[Message], *, tagger: TopicTagger, max_chars: int
) -> Summary | None:
    """A summary of the session's completed turns in `messages`; None when nothing was answered.
    Blocking (the extractor is CPU work): callers run it in a text worker (summarize/lane.py)."""
    answered = for_summary(as_spoken([m for m in messages if m.answered]))
    if not answered:
        return None
    extraction = extractor.extract(answered, max_chars=max_chars)
    if not extraction.text:
        return None
    return Summary(
        text=extraction.text,
        covered_turns=info.turn_count,
        version=0,
        source=SummarySource.DETERMINISTIC,
        updated_at=info.last_activity,
        created_at=info.created_at,
        topics=tagger.tags([extraction.text, *(m.content for m in answered)], extraction.topics),
        structured={
            **extraction.structured,
            "payload": rule_payload(
                text=extraction.text,
                structured=extraction.structured,
                new=answered,
                topics=extraction.topics,
                previous=None,
                max_chars=max_chars,
            ),
        },
    )
