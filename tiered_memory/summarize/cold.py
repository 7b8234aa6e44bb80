"""The cold tier's answer: a session's own words, made at read time.

Used when neither Redis nor the warm row has a summary (never made yet, deleted, or lost with
both caches). It is made on the request path, so it does no language work: the extractor tags
parts of speech at about 0.2 ms a message, and a cold read of a long session that extracted from
150 messages took 60-130 ms where a hot read takes one. The answer is the session's opening (who
the user is, what they came for) and its newest completed turns, raw, as labelled lines within
SUMMARY_MAX_CHARS; the read that finds it schedules the real summary (core/service.py), which the
next reads find in the hot tier. Shaped like a stored summary (version 0, source deterministic) so
that callers treat every tier's answer alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, pairwise

from tiered_memory.model import Message, SessionInfo, Summary, SummarySource
from tiered_memory.prompt.context import transcript_lines
from tiered_memory.prompt.facts import events_line
from tiered_memory.summarize.topics import TopicTagger
from tiered_memory.text.dialogue import events, for_summary
from tiered_memory.text.language import as_spoken, conversation_language

# Between the opening and the end, when turns were left out.
ELISION = "…"


def cold_slice(head: Sequence[Message], tail: Sequence[Message], *, max_chars: int) -> list[Message]:
    """What a cold answer of a long session shows: whole messages from its opening (a third of
    `max_chars`: who the user is and what they came for) and from its end (the rest: what is
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


def cold_digest(
    info: SessionInfo,
    head: Sequence[Message],
    tail: Sequence[Message],
    *,
    tagger: TopicTagger,
    max_chars: int,
    through_turn: int,
) -> Summary | None:
    """The session's completed turns up to `through_turn` as its opening and its end (cold_slice
    of `head` and `tail`), labelled, and the gateway's events among them on a line of their own,
    as a summary records them, within `max_chars`; with the operator's topic keywords it names
    (`tagger`: a substring search). None when nothing was answered. A context passes the turn
    before its window, so the raw window is not shown twice."""

    def answered(messages: Sequence[Message]) -> list[Message]:
        return for_summary(as_spoken([m for m in messages if m.answered and m.turn <= through_turn]))

    shown = cold_slice(answered(head), answered(tail), max_chars=max_chars)
    if not shown:
        return None
    # Contiguous from the first message shown: the opening; the rest is the end.
    split = next((i for i, (a, b) in enumerate(pairwise(shown), 1) if b.seq != a.seq + 1), len(shown))
    end = transcript_lines(shown[split:])
    noted = [m.content for m in events(shown) if m.content]
    if noted:
        end.append(events_line(noted, conversation_language(shown)))
    text = fit(transcript_lines(shown[:split]), end, max_chars)
    if not text:
        return None
    return Summary(
        text=text,
        covered_turns=min(info.turn_count, through_turn),
        version=0,
        source=SummarySource.DETERMINISTIC,
        updated_at=info.last_activity,
        created_at=info.created_at,
        topics=tagger.tags([m.content for m in shown], ()),
    )


def fit(opening: Sequence[str], end: Sequence[str], max_chars: int) -> str:
    """The opening's lines, ELISION, then the end's, within `max_chars`: the end's oldest lines
    go first, then the opening's newest; a lone line left too long is cut."""
    first, last = list(opening), list(end)

    def text() -> str:
        return "\n".join([*first, ELISION, *last] if first and last else [*first, *last])

    while len(text()) > max_chars and len(first) + len(last) > 1:
        if len(last) > 1 or not first:
            last.pop(0)
        else:
            first.pop()
    return text()[:max_chars]
