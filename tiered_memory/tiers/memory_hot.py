"""The hot tier in process memory, for the embedded default: bounded in sessions and in bytes,
with Redis's TTLs.

Each session's recent list, summary and counters expire like their Redis keys would; the least
recently used session is evicted when `max_sessions` is reached, or when what they all hold passes
`max_bytes` (an estimate of the memory their texts and objects take: one caller's long messages
must not grow the process without bound). Single-process by nature, so its lock only serializes
summarizers within this process.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tiered_memory.model import HotSession, Message, Owner, SessionCounters, SessionKey, SessionState, Summary
from tiered_memory.reasoning import without_reasoning
from tiered_memory.tiers.buckets import MemoryBuckets
from tiered_memory.tiers.hot import HotExpiries, RecentBound
from tiered_memory.tiers.jobs import MemoryJobs
from tiered_memory.tiers.postings import SESSION_BYTES, MemoryPostings

# What the recall postings of every session hold in all, in bytes of names and values (the least
# recently asked session dropped first): about what 40,000 short messages take, a 10,000-turn
# session beside 1,600 of 12 turns. Python's objects add about as much again.
RECALL_BYTES = 32 * 2**20
# HOT_MAX_BYTES's default: some 7,000 twelve-turn sessions of short messages, 600 of 32 KiB ones.
HOT_BYTES = 256 * 2**20
# What a message, a summary or an entry costs beyond its texts: the objects around them (a
# Message's slots, str headers, list and dict slots), and a summary's stored facts beside its text
# (the extractor keeps about twice its budget of them). Estimates, on the side of too much.
_OBJECT_BYTES = 400
_SUMMARY_BYTES = 16 * 1024
_STATE_BYTES = 16 * 1024


def _text_bytes(text: str) -> int:
    """A str's memory in CPython, near enough: a byte a character for ASCII, two for other text."""
    return len(text) if text.isascii() else 2 * len(text)


def _newest(entry: _Entry, state: SessionState) -> bool:
    """Whether `state` is at least as new as the entry's and as its floor."""
    cached = entry.gateway_state.version if entry.gateway_state is not None else -1
    return state.version >= max(cached, entry.state_floor)


def _weight(entry: _Entry) -> int:
    """What a session's entry is estimated to hold in memory, in bytes."""
    weight = _OBJECT_BYTES + sum(_text_bytes(m.content) + len(m.tool_calls) + _OBJECT_BYTES for m in entry.recent)
    if entry.summary is not None:
        weight += 2 * _text_bytes(entry.summary.text) + _SUMMARY_BYTES
    if entry.gateway_state is not None and entry.gateway_state.value is not None:
        weight += _STATE_BYTES
    return weight


@dataclass(slots=True)
class _Entry:
    recent: list[Message] = field(default_factory=list)
    recent_until: float = 0.0
    summary: Summary | None = None
    summary_until: float = 0.0
    turns: int | None = None
    msgs: int | None = None
    last: float | None = None
    chars: int | None = None
    owner: Owner | None = None
    gateway_state: SessionState | None = None
    state_until: float = 0.0
    state_floor: int = -1  # the newest state version put (put_state); -1: none
    floor_until: float = 0.0
    lock_token: str | None = None
    lock_until: float = 0.0
    weight: int = 0  # _weight when last settled


class MemoryHot:
    """HotTier in a dict. `clock` is injectable so tests can move time past a TTL."""

    backend = "memory"

    def __init__(
        self,
        *,
        max_sessions: int,
        summary_ttl_s: int,
        history_ttl_s: int,
        recent: RecentBound,
        recall_max_bytes: int = SESSION_BYTES,
        tenant_recall_max_bytes: int = 0,
        max_bytes: int = HOT_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`recall_max_bytes`: the bound of one session's recall postings, `tenant_recall_max_bytes`
        of one tenant's (0: none); all sessions' are bounded by RECALL_BYTES. `max_bytes`
        (HOT_MAX_BYTES) bounds the sessions' entries."""
        self._postings = MemoryPostings(
            max_bytes=max(RECALL_BYTES, recall_max_bytes),
            session_max_bytes=recall_max_bytes,
            tenant_max_bytes=tenant_recall_max_bytes,
        )
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._buckets = MemoryBuckets()
        self._jobs = MemoryJobs(clock=clock)
        self._max = max_sessions
        self._max_bytes = max_bytes
        self._bytes = 0
        self._summary_ttl = summary_ttl_s
        self._history_ttl = history_ttl_s
        self._recent = recent
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """What the sessions' entries are estimated to hold (the recall postings apart)."""
        return self._bytes

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.weight

    def _settle(self, key: str, entry: _Entry) -> None:
        """Weigh an entry after a change, then evict the least recently used others while the
        cache holds more than its bounds. The entry just written stays, whatever it weighs, and so
        does one whose summary lock is held (dropping it would let a second summary pass start)."""
        weight = _weight(entry)
        self._bytes += weight - entry.weight
        entry.weight = weight
        while len(self._entries) > self._max or self._bytes > self._max_bytes:
            victim = next((k for k, e in self._entries.items() if k != key and e.lock_token is None), None)
            if victim is None:
                return
            self._drop(victim)

    @property
    def postings(self) -> MemoryPostings:
        return self._postings

    @property
    def buckets(self) -> MemoryBuckets:
        return self._buckets

    @property
    def jobs(self) -> MemoryJobs:
        return self._jobs

    def _get(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = self._clock()
        expired = (
            (entry.recent and entry.recent_until <= now)
            or (entry.summary is not None and entry.summary_until <= now)
            or (entry.gateway_state is not None and entry.state_until <= now)
        )
        if entry.recent_until <= now:
            entry.recent = []
        if entry.summary_until <= now:
            entry.summary = None
        if entry.state_until <= now:
            entry.turns = entry.msgs = entry.chars = None
            entry.last = None
            entry.owner = None
            entry.gateway_state = None
        if entry.floor_until <= now:
            entry.state_floor = -1
        if entry.lock_until <= now:
            entry.lock_token = None
        if (
            not entry.recent
            and entry.summary is None
            and entry.turns is None
            and entry.lock_token is None
            and entry.state_floor < 0
        ):
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        if expired:
            self._settle(key, entry)  # what expired weighs nothing now
        return entry

    def _get_or_create(self, key: str) -> _Entry:
        entry = self._get(key)
        if entry is None:
            entry = _Entry()
            self._entries[key] = entry
            self._settle(key, entry)
        return entry

    @property
    def recent(self) -> RecentBound:
        return self._recent

    async def read_summary(self, key: SessionKey) -> tuple[Summary | None, int | None, Owner | None]:
        entry = self._get(key)
        return (entry.summary, entry.turns, entry.owner) if entry else (None, None, None)

    async def read_session(self, key: SessionKey) -> HotSession:
        entry = self._get(key)
        if entry is None:
            return HotSession(summary=None, recent=(), turn_count=None, message_count=None, last_activity=None)
        return HotSession(
            summary=entry.summary,
            recent=tuple(sorted(entry.recent, key=lambda m: m.seq)),
            turn_count=entry.turns,
            message_count=entry.msgs,
            last_activity=entry.last,
            content_chars=entry.chars,
            owner=entry.owner,
            state=entry.gateway_state,
        )

    async def record_append(
        self,
        message: Message,
        counters: SessionCounters,
    ) -> None:
        entry = self._get_or_create(message.key)
        now = self._clock()
        # The same ordering rule as Redis: a repeated write changes nothing, and a gap (a write
        # that never arrived) drops the window so the next read rebuilds it from SQL.
        if entry.msgs is not None and entry.msgs >= message.seq:
            return
        if entry.msgs is not None and entry.msgs < message.seq - 1:
            entry.recent = []
            entry.turns = entry.msgs = entry.chars = None
            entry.last = None
            entry.owner = None
            entry.gateway_state = None
            self._settle(message.key, entry)
            return
        if message.seq == 1:
            entry.summary = None  # a stranger's: no summary of a session precedes its first message
            # Nor any gateway state (PUT needs the session), unless a PUT got here before this
            # write did (its floor is here): then unknown, as on Redis (APPEND_LUA).
            entry.gateway_state = SessionState(0, None) if entry.state_floor < 0 else None
        # Like the Redis codec, the hot tier keeps no reasoning: nothing it serves shows it.
        entry.recent.append(without_reasoning(message))
        if len(entry.recent) > self._recent.least:
            entry.recent = list(self._recent.keep(entry.recent))
        entry.recent_until = now + self._history_ttl
        _count(entry, counters)
        entry.state_until = now + self._summary_ttl
        self._settle(message.key, entry)

    async def put_state(self, key: SessionKey, state: SessionState, *, written: bool = True) -> bool:
        entry = self._get(key) if not written else self._get_or_create(key)
        if entry is None or state.version < entry.state_floor:
            return False
        if written:
            # Raised by a PUT's write, as on Redis (PUT_STATE_LUA), and kept when the counters go.
            entry.state_floor = state.version
            entry.floor_until = self._clock() + self._summary_ttl
        if entry.turns is None or not _newest(entry, state):
            return False
        entry.gateway_state = state
        self._settle(key, entry)
        return True

    async def put_summary(self, key: SessionKey, summary: Summary) -> bool:
        entry = self._get_or_create(key)
        if entry.summary is not None and entry.summary.version > summary.version:
            return False
        entry.summary = summary
        entry.summary_until = self._clock() + self._summary_ttl
        self._settle(key, entry)
        return True

    async def backfill(
        self,
        key: SessionKey,
        counters: SessionCounters,
        *,
        summary: Summary | None,
        recent: Sequence[Message] | None,
        state: SessionState | None = None,
    ) -> None:
        if summary is not None:
            await self.put_summary(key, summary)
        entry = self._get_or_create(key)
        if state is not None and _newest(entry, state):
            entry.gateway_state = state
        if entry.msgs is not None and entry.msgs > counters.message_count:
            self._settle(key, entry)
            return
        now = self._clock()
        if recent is not None:
            entry.recent = [without_reasoning(m) for m in self._recent.keep(recent)]
            entry.recent_until = now + self._history_ttl
        _count(entry, counters)
        entry.state_until = now + self._summary_ttl
        self._settle(key, entry)

    async def delete(self, key: SessionKey, *, keep_state_floor: bool = False) -> None:
        entry = self._entries.get(key)
        self._drop(key)
        self._postings.drop(key)
        if keep_state_floor and entry is not None and entry.state_floor >= 0:
            kept = self._entries[key] = _Entry(state_floor=entry.state_floor, floor_until=entry.floor_until)
            self._settle(key, kept)

    async def remove_from_stream(self, stream: str, fields: Mapping[str, str]) -> int:
        return 0  # EVENTS_STREAM needs Redis: there is none here

    async def invalidate(self, key: SessionKey, *, changed_seq: int) -> bool:
        dropped = self._postings.drop(key, changed_seq=changed_seq)
        entry = self._entries.get(key)
        if entry is not None:
            # Only the lock and the state floor stay (an empty entry is dropped by the next _get).
            self._drop(key)
            kept = _Entry(lock_token=entry.lock_token, lock_until=entry.lock_until)
            kept.state_floor, kept.floor_until = entry.state_floor, entry.floor_until
            self._entries[key] = kept
            self._settle(key, kept)
        return dropped

    async def try_lock(self, name: str, ttl_seconds: float) -> str | None:
        entry = self._get_or_create(name)
        if entry.lock_token is not None:
            return None
        entry.lock_token = secrets.token_hex(8)
        entry.lock_until = self._clock() + ttl_seconds
        return entry.lock_token

    async def extend_lock(self, name: str, token: str, ttl_seconds: float) -> bool:
        entry = self._get(name)
        if entry is None or entry.lock_token != token:
            return False
        entry.lock_until = self._clock() + ttl_seconds
        return True

    async def unlock(self, name: str, token: str) -> None:
        entry = self._entries.get(name)
        if entry is not None and entry.lock_token == token:
            entry.lock_token = None

    async def expiries(self, key: SessionKey) -> HotExpiries:
        entry = self._get(key)
        if entry is None:
            return HotExpiries(summary_s=None, recent_s=None, counters_s=None)
        now = self._clock()
        return HotExpiries(
            summary_s=entry.summary_until - now if entry.summary is not None else None,
            recent_s=entry.recent_until - now if entry.recent else None,
            counters_s=entry.state_until - now if entry.turns is not None else None,
        )

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self._postings.clear()
        self._jobs.clear()


def _count(entry: _Entry, counters: SessionCounters) -> None:
    """Set the entry's counters and owner to SQL's (set, never incremented, as in Redis)."""
    entry.turns, entry.msgs, entry.last = counters.turn_count, counters.message_count, counters.last_activity
    entry.chars, entry.owner = counters.content_chars, counters.owner
