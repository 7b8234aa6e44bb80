"""What each feature (memo.features: a key, a session term, a content word) is worth to a
context: the budget policy (policy.py) chooses the layout whose text holds the most of it. Pure."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence

from tiered_memory.model import Message
from tiered_memory.prompt.memo import View

# What a content word and a session keyword count beside a key (a number or a name): a question
# may need any word, but names and numbers are what later turns ask for most.
WORD_WEIGHT = 0.1
TERM_WEIGHT = 0.2
# A feature last said this many turns ago counts half as much as one said now.
_RECENCY_TURNS = 20.0
# What a feature's class (its tag, `memo.features`) weighs: a key counts 1.
_CLASS_WEIGHTS = {"\x00": WORD_WEIGHT, "\x01": TERM_WEIGHT}


class Weights:
    """Each feature's worth to this context: one over the number of messages that say it (a
    thing said once is lost for good when left out; one said every other message is back soon),
    discounted by the turns since it was last said (later turns refer to the recent past most),
    and by its class: a key (number, name) counts 1, a session term TERM_WEIGHT, another
    content word WORD_WEIGHT (a question may need it, but names and numbers are what it asks
    for most).

    Worked out for the features a layout shows only (`score`): a long session's candidates say
    thousands, a layout within a budget a few dozen, and weighing them all on every read was
    the largest single part of the policy's time in a `/turns` call."""

    __slots__ = ("_counts", "_known", "_last", "_now")

    def __init__(self, messages: Sequence[Message], view: dict[int, View]) -> None:
        said = [(m.turn, view[m.seq].features) for m in messages]
        self._counts = Counter(itertools.chain.from_iterable(fs for _, fs in said))
        self._last: dict[str, int] = {}
        for turn, fs in said:
            self._last.update(dict.fromkeys(fs, turn))  # a later message overwrites an earlier one
        self._now = messages[-1].turn if messages else 0
        self._known: dict[str, float] = {}

    def weight(self, feature: str) -> float:
        """The feature's worth; 0.0 for one no candidate says."""
        found = self._known.get(feature)
        if found is None:
            n = self._counts.get(feature)
            cls = _CLASS_WEIGHTS.get(feature[:1], 1.0)
            found = 0.0 if not n else cls / n / (1.0 + (self._now - self._last[feature]) / _RECENCY_TURNS)
            self._known[feature] = found
        return found

    def score(self, features: Iterable[str]) -> float:
        """The worth of what shows `features`: their weights summed."""
        return sum(map(self.weight, features))
