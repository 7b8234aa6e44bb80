"""A bounded least-recently-used map: the one memo shape the read path keeps per process (what
it derived from a message, a summary's loaded facts), so a long-lived daemon's memory stays flat."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """Up to `max_entries` values; a `put` beyond that drops the least recently used. Not
    thread-safe: it belongs to one event loop."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: K, value: V) -> V:
        """Store `value` under `key` and return it."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return value

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
