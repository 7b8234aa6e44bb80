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

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from tiered_memory.context_policy import Candidates
from tiered_memory.lru import Lru
from tiered_memory.model import Message

T = TypeVar("T")


def message_values(messages: Iterable[Message]) -> tuple[Message, ...]:
    """The messages themselves: a message is a frozen value, equal to another only field for
    field (its place, id, role, status, every text it has). A message the hot tier decoded before
    is the same object again (tiers/codec.MessageDecoder), which compares at once."""
    return tuple(messages)


def fingerprint(c: Candidates, max_chars: int, basis: Hashable) -> Hashable:
    """The policy's whole input as values: two reads with equal fingerprints choose alike.
    `basis` stands for what `c`'s renderers close over (the summary, its label)."""
    return (
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


@dataclass(frozen=True, slots=True)
class _Entry(Generic[T]):
    fingerprint: Hashable
    value: T


class SelectionMemo(Generic[T]):
    """The latest choice (any value the read derives from the candidates alone) per (session,
    budget), answered only for an equal fingerprint. Bounded; belongs to one event loop."""

    def __init__(self, max_entries: int = 1024) -> None:
        self._entries: Lru[tuple[str, int], _Entry[T]] = Lru(max_entries)

    def get(self, session: str, max_chars: int, print_: Hashable) -> T | None:
        found = self._entries.get((session, max_chars))
        return found.value if found is not None and found.fingerprint == print_ else None

    def put(self, session: str, max_chars: int, print_: Hashable, value: T) -> T:
        self._entries.put((session, max_chars), _Entry(print_, value))
        return value
