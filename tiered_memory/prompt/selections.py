"""The last selection of each (session, budget), reused while what it was chosen from is the same.

A gateway reads a session's context again without anything new said (a retried request, a
second agent on the call, a reconnect, a dashboard): the policy would choose the same memory
again from the same candidates, and on a long session it is the largest part of a read. A read
hands over what the policy decides from (`Candidates`, its budget, and a `basis` naming the
summary and anything else its renderers close over) and gets back the selection made from the
same input, or None. Pure bookkeeping: the fingerprint is made of the candidates' own values
(the messages themselves), never of a hash alone, so a hit is exactly the same input.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from tiered_memory.model import Message
from tiered_memory.prompt.policy import Candidates

T = TypeVar("T")


def message_values(messages: Iterable[Message]) -> tuple[Message, ...]:
    """The messages themselves: a message is a frozen value, equal to another only field for
    field (its place, id, role, status, every text it has). A message the hot tier decoded before
    is the same object again (tiers/codec.MessageDecoder), which compares at once."""
    return tuple(messages)


def fingerprint(c: Candidates, max_chars: int, basis: Hashable) -> Fingerprint:
    """The policy's whole input as values: two reads with equal fingerprints choose alike.
    `basis` stands for what `c`'s renderers close over (the summary, its label)."""
    values = (
        max_chars,
        basis,
        c.whole,
        c.lang,
        c.subject,
        c.frame,
        message_values(c.messages),
        message_values(c.events),
        message_values(m for m, _ in c.matches),
        tuple(score for _, score in c.matches),
    )
    return Fingerprint(values, len(c.messages) + len(c.events) + len(c.matches))


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A read's input as values, and how many messages it holds (what the memo is bounded by)."""

    values: tuple[Hashable, ...]
    messages: int


@dataclass(frozen=True, slots=True)
class _Entry(Generic[T]):
    fingerprint: Fingerprint
    value: T


class SelectionMemo(Generic[T]):
    """The latest choice (any value the read derives from the candidates alone) per (session,
    budget), answered only for an equal fingerprint. Bounded by the messages its fingerprints
    hold (a session of short turns may have hundreds of candidates), the least recently used
    going first; belongs to one event loop."""

    def __init__(self, max_messages: int = 32_768) -> None:
        self._max = max_messages
        self._held = 0
        self._entries: OrderedDict[tuple[str, int], _Entry[T]] = OrderedDict()

    def get(self, session: str, max_chars: int, print_: Fingerprint) -> T | None:
        found = self._entries.get((session, max_chars))
        if found is None or found.fingerprint != print_:
            return None
        # Kept with the read's own messages from now on: equal, but perhaps other objects (a
        # list refilled from SQL, then decoded from the hot tier), compared field by field on
        # every read (150 µs for 390 candidates) until they are the same objects again.
        self._entries[(session, max_chars)] = _Entry(print_, found.value)
        self._entries.move_to_end((session, max_chars))
        return found.value

    def put(self, session: str, max_chars: int, print_: Fingerprint, value: T) -> T:
        replaced = self._entries.pop((session, max_chars), None)
        if replaced is not None:
            self._held -= replaced.fingerprint.messages
        self._entries[(session, max_chars)] = _Entry(print_, value)
        self._held += print_.messages
        while self._held > self._max and len(self._entries) > 1:
            _, dropped = self._entries.popitem(last=False)
            self._held -= dropped.fingerprint.messages
        return value

    @property
    def held(self) -> int:
        """The messages the kept fingerprints hold."""
        return self._held
