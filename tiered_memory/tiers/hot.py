"""The hot tier's contract, which the Redis and in-process backends both fulfil.

The hot tier is a cache: it may lose anything at any moment, and SQL stays the source of truth.
Every method is one round trip; a backend that fails or misses its timeout raises HotUnavailable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiered_memory.model import HotSession, Message, Owner, SessionCounters, SessionKey, SessionState, Summary
from tiered_memory.tiers.buckets import Buckets
from tiered_memory.tiers.jobs import JobStore
from tiered_memory.tiers.postings import PostingsStore


@dataclass(frozen=True, slots=True)
class RecentBound:
    """How much of a session's newest messages its recent list keeps: at most `most`, and past
    `least` only as many as it takes to hold `chars` characters of content. With `chars` 0 the
    list keeps `most` messages whatever their length.

    Bounded by characters, the list holds what a context at the default budget reads whatever
    the length of the session's messages (a count that covers terse turns holds a few long ones
    and sends every context to SQL); `least` keeps the window and a lagging summary's turns,
    `most` bounds a session of one-word turns."""

    least: int
    most: int
    chars: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.least <= self.most or self.chars < 0:
            raise ValueError(f"a recent list needs 1 <= least <= most and chars >= 0, not {self}")

    def keep(self, messages: Sequence[Message]) -> Sequence[Message]:
        """The newest of `messages` (oldest first) that the list keeps."""
        kept = messages[-self.most :]
        if not self.chars:
            return kept
        total = sum(m.size for m in kept)
        drop = 0
        while len(kept) - drop > self.least and total - kept[drop].size >= self.chars:
            total -= kept[drop].size
            drop += 1
        return kept[drop:]

    def has_room(self, messages: Sequence[Message]) -> bool:
        """Whether a list holding `messages` would keep one more put in front of them."""
        if len(messages) >= self.most:
            return False
        return not self.chars or len(messages) < self.least or sum(m.size for m in messages) < self.chars


@dataclass(frozen=True, slots=True)
class HotExpiries:
    """Seconds until each of a session's hot entries expires: its summary, its recent list and
    its counters (None: the entry is not there)."""

    summary_s: float | None
    recent_s: float | None
    counters_s: float | None


class HotTier(Protocol):
    backend: str
    """`redis` or `memory`, for logs, metrics and /readyz."""

    @property
    def recent(self) -> RecentBound:
        """What the recent list keeps of a session's newest messages."""
        ...

    @property
    def postings(self) -> PostingsStore:
        """The sessions' recall postings, kept beside their hot entries (and deleted with them)."""
        ...

    @property
    def buckets(self) -> Buckets:
        """The request-rate buckets of tenants and tokens (RATE_LIMITS), shared like the rest."""
        ...

    @property
    def jobs(self) -> JobStore:
        """The sessions' rebuild jobs: their records and leases, read by every replica."""
        ...

    async def read_summary(self, key: SessionKey) -> tuple[Summary | None, int | None, Owner | None]:
        """The cached summary, turn count and owner of a session (any may be missing)."""
        ...

    async def read_session(self, key: SessionKey) -> HotSession:
        """Summary, recent messages (ordered by seq), counters and owner, in one round trip."""
        ...

    async def record_append(
        self,
        message: Message,
        counters: SessionCounters,
    ) -> None:
        """Push a committed message onto the recent list (trimmed) and set the counters and the
        owner SQL reported; the owner lives as long as the counters.

        In seq order only: a message at or below the cached count changes nothing (a retry, or a
        write that arrived late), and one past a gap drops the recent list and counters, so the
        next read goes to SQL rather than serving a window with messages missing. A session's
        first message (seq 1) drops any summary cached under its key: none can precede it."""
        ...

    async def put_summary(self, key: SessionKey, summary: Summary) -> bool:
        """Cache a summary unless a newer version is already cached; True when written."""
        ...

    async def put_state(self, key: SessionKey, state: SessionState, *, written: bool = True) -> bool:
        """Cache the gateway's state of a session (read back in `read_session`) unless a newer
        version is cached or the session's state floor is newer, and only beside counters the hot
        tier holds; True when written.

        `written`: this state was just written to SQL (a PUT), and raises the state floor, kept
        as long as counters would be and through a loss of the counters (only a session's delete
        drops it): a read that took an older state from SQL before that write was committed, and
        refills the session after it, must not cache the older state (`backfill`). A first append
        that finds a floor leaves the state unknown rather than empty (a PUT got there first).
        Not `written`: a copy a read took from SQL, which raises nothing (a read that ends after
        the session's delete must leave nothing behind)."""
        ...

    async def backfill(
        self,
        key: SessionKey,
        counters: SessionCounters,
        *,
        summary: Summary | None,
        recent: Sequence[Message] | None,
        state: SessionState | None = None,
    ) -> None:
        """Refill a session from SQL after a miss, in one round trip: the summary (unless a newer
        version is cached), the counters, owner and recent list (replacing the list) unless an
        append newer than this SQL read has already reached the hot tier, and, given, the
        gateway's state SQL gave with them, unless a newer version is cached or was put since
        (the state floor, `put_state`)."""
        ...

    async def delete(self, key: SessionKey, *, keep_state_floor: bool = False) -> None:
        """Forget everything about a session; with `keep_state_floor`, but its state floor (the
        session lives on: its summary was reset)."""
        ...

    async def remove_from_stream(self, stream: str, fields: Mapping[str, str]) -> int:
        """Delete the entries of the events stream `stream` whose fields hold all of `fields` (a
        user's erasure); the entries removed. 0 where the tier keeps no streams."""
        ...

    async def invalidate(self, key: SessionKey, *, changed_seq: int) -> bool:
        """Forget what is cached of a session (recent list, summary, counters) after SQL changed
        its message `changed_seq` (patched, or taken back), so that the next read refills it; its
        lock stays. Its recall postings go only when they reach that message (0: in any case, as
        for a take-back, whose seq is reused): postings that end before it hold nothing it
        changed (a streaming reply is never indexed while it streams, history.py), and a batch
        read before now is refused either way. Whether they went."""
        ...

    async def try_lock(self, name: str, ttl_seconds: float) -> str | None:
        """Take the session's summarization lock; a token when taken, None when someone holds it."""
        ...

    async def extend_lock(self, name: str, token: str, ttl_seconds: float) -> bool:
        """Give the lock ttl_seconds more if this token still holds it; False when it does not."""
        ...

    async def unlock(self, name: str, token: str) -> None:
        """Release the lock if this token still holds it."""
        ...

    async def expiries(self, key: SessionKey) -> HotExpiries:
        """How long the session's entries have left (the inspector shows the TTLs)."""
        ...

    async def ping(self) -> None:
        """Raise HotUnavailable unless the backend answers."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
