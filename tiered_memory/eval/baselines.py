"""What a gateway without this daemon would send, computed from the transcript alone, at the same
character budget as the daemon's context: the raw messages, newest kept, oldest cut first."""

from __future__ import annotations

from collections.abc import Callable, Sequence

Turns = Sequence[tuple[str, str]]
Baseline = Callable[[Turns, int], str]


def newest_within(messages: Sequence[str], budget: int) -> str:
    """Messages joined by newlines, dropping the oldest until they fit in `budget` characters;
    the oldest one kept is cut at its start when only part of it fits."""
    kept: list[str] = []
    used = 0
    for m in reversed(messages):
        cost = len(m) + (1 if kept else 0)
        if used + cost > budget:
            room = budget - used - (1 if kept else 0)
            if room > 0:
                kept.append(m[-room:])
            break
        kept.append(m)
        used += cost
    return "\n".join(reversed(kept))


def _messages(turns: Turns) -> list[str]:
    return [text for pair in turns for text in pair]


def last_turns(k: int) -> Baseline:
    def baseline(turns: Turns, budget: int) -> str:
        return newest_within(_messages(turns[-k:]), budget)

    return baseline


def whole_transcript(turns: Turns, budget: int) -> str:
    return newest_within(_messages(turns), budget)


def last_messages(n: int) -> Baseline:
    def baseline(turns: Turns, budget: int) -> str:
        return newest_within(_messages(turns)[-n:], budget)

    return baseline


BASELINES: dict[str, Baseline] = {
    "last-3-turns": last_turns(3),
    "last-5-turns": last_turns(5),
    "whole-transcript": whole_transcript,
    "last-8-messages": last_messages(8),
}
