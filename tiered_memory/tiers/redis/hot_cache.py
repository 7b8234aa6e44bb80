"""The hot tier's reads kept in process memory, coherent with Redis by its invalidations.

Redis tracks the keys a connection reads (`CLIENT TRACKING`) and, when any client changes one or
it expires, sends that key's name to a connection of ours subscribed to `__redis__:invalidate`
(resp.py). A session's cached reads go at the first such message for any of its keys, and all of
them when either connection drops or reconnects (a new connection has tracked nothing yet).

A read that was in flight while its session changed must not be kept: its answer may predate the
change, and the invalidation may have come before the reply (two sockets, no order between them).
So each session has a change stamp, taken when a read starts and compared when it ends; a read is
kept only if no change, no write of ours and no reset came in between. This process's own writes
change the stamp before they are sent and after they are answered, so a read here never returns
what this process has just overwritten, whatever the invalidation's timing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from tiered_memory.lru import Lru
from tiered_memory.model import SessionKey

V = TypeVar("V")


class HotCache(Generic[V]):
    """Up to `max_sessions` sessions' cached reads, each under a `kind` (the read it answers)."""

    def __init__(self, max_sessions: int) -> None:
        self._entries: Lru[str, dict[Hashable, V]] = Lru(max_sessions)
        # Change stamps of recently changed sessions; a session without one reads as `_floor`.
        # Bounded: past the bound they are all forgotten and the floor rises to now, which only
        # makes reads in flight unkeepable, never a stale one keepable.
        self._changes: dict[str, int] = {}
        self._max_changes = 4 * max_sessions
        self._clock = 0
        self._floor = 0

    def get(self, key: SessionKey, kind: Hashable) -> V | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.get(kind)

    def stamp(self, key: SessionKey) -> int:
        """The session's change stamp now: take it before a read is sent."""
        return self._changes.get(key, self._floor)

    def put(self, key: SessionKey, kind: Hashable, value: V, stamp: int) -> None:
        """Keep `value` if nothing changed the session since `stamp` was taken."""
        if self.stamp(key) != stamp:
            return
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries.put(key, {})
        entry[kind] = value

    def changed(self, key: SessionKey) -> None:
        """The session changed (an invalidation, or a write of ours): its reads go, and reads in
        flight are not kept."""
        self._clock += 1
        if len(self._changes) >= self._max_changes:
            self._changes.clear()
            self._floor = self._clock
        self._changes[key] = self._clock
        self._entries.pop(key)

    def reset(self) -> None:
        """Everything may have changed (a connection dropped or reconnected, a FLUSHDB)."""
        self._clock += 1
        self._changes.clear()
        self._floor = self._clock
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def cache_invalidator(cache: HotCache[V]) -> Callable[[list[str] | None], None]:
    """What the multiplexed client calls with invalidated keys (None: everything): each key's
    session, the hash tag of `Keys`, changed."""

    def invalidate(keys: list[str] | None) -> None:
        if keys is None:
            cache.reset()
            return
        for key in keys:
            start, end = key.find("{"), key.find("}")
            if 0 <= start < end:
                cache.changed(SessionKey(key[start + 1 : end]))

    return invalidate
