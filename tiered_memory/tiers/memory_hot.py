"""The hot tier in process memory, for the embedded default: bounded in sessions, with Redis's TTLs.

Each session's recent list, summary and counters expire like their Redis keys would; the least
recently used session is evicted when `max_sessions` is reached. Single-process by nature, so its
lock only serializes summarizers within this process.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tiered_memory.model import HotSession, Message, Owner, SessionState, Summary
from tiered_memory.tiers.hot import RecentBound
from tiered_memory.tiers.postings import SESSION_BYTES, MemoryPostings

# What the recall postings of every session hold in all, in bytes of names and values (the least
# recently asked session dropped first): about what 40,000 short messages take, a 10,000-turn
# session beside 1,600 of 12 turns. Python's objects add about as much again.
RECALL_BYTES = 32 * 2**20


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
    lock_token: str | None = None
    lock_until: float = 0.0


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`recall_max_bytes`: the bound of one session's recall postings; all sessions' are
        bounded by RECALL_BYTES."""
        self._postings = MemoryPostings(
            max_bytes=max(RECALL_BYTES, recall_max_bytes), session_max_bytes=recall_max_bytes
        )
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._max = max_sessions
        self._summary_ttl = summary_ttl_s
        self._history_ttl = history_ttl_s
        self._recent = recent
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def postings(self) -> MemoryPostings:
        return self._postings

    def _get(self, session_id: str) -> _Entry | None:
        entry = self._entries.get(session_id)
        if entry is None:
            return None
        now = self._clock()
        if entry.recent_until <= now:
            entry.recent = []
        if entry.summary_until <= now:
            entry.summary = None
        if entry.state_until <= now:
            entry.turns = entry.msgs = entry.chars = None
            entry.last = None
            entry.owner = None
            entry.gateway_state = None
        if entry.lock_until <= now:
            entry.lock_token = None
        if not entry.recent and entry.summary is None and entry.turns is None and entry.lock_token is None:
            del self._entries[session_id]
            return None
        self._entries.move_to_end(session_id)
        return entry

    def _get_or_create(self, session_id: str) -> _Entry:
        entry = self._get(session_id)
        if entry is None:
            entry = _Entry()
            self._entries[session_id] = entry
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return entry

    @property
    def recent(self) -> RecentBound:
        return self._recent

    async def read_summary(self, session_id: str) -> tuple[Summary | None, int | None, Owner | None]:
        entry = self._get(session_id)
        return (entry.summary, entry.turns, entry.owner) if entry else (None, None, None)

    async def read_session(self, session_id: str) -> HotSession:
        entry = self._get(session_id)
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
        *,
        turn_count: int,
        message_count: int,
        last_activity: float,
        owner: Owner,
        content_chars: int = 0,
    ) -> None:
        entry = self._get_or_create(message.session_id)
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
            return
        if message.seq == 1:
            entry.summary = None  # a stranger's: no summary of a session precedes its first message
            entry.gateway_state = SessionState(0, None)  # nor any gateway state (PUT needs the session)
        entry.recent.append(message)
        if len(entry.recent) > self._recent.least:
            entry.recent = list(self._recent.keep(entry.recent))
        entry.recent_until = now + self._history_ttl
        entry.turns, entry.msgs, entry.last, entry.chars = turn_count, message_count, last_activity, content_chars
        entry.owner = owner
        entry.state_until = now + self._summary_ttl

    async def put_state(self, session_id: str, state: SessionState) -> bool:
        entry = self._get(session_id)
        if entry is None or entry.turns is None:
            return False
        if entry.gateway_state is not None and entry.gateway_state.version > state.version:
            return False
        entry.gateway_state = state
        return True

    async def put_summary(self, session_id: str, summary: Summary) -> bool:
        entry = self._get_or_create(session_id)
        if entry.summary is not None and entry.summary.version > summary.version:
            return False
        entry.summary = summary
        entry.summary_until = self._clock() + self._summary_ttl
        return True

    async def backfill(
        self,
        session_id: str,
        *,
        summary: Summary | None,
        recent: Sequence[Message] | None,
        turn_count: int,
        message_count: int,
        last_activity: float,
        owner: Owner,
        content_chars: int = 0,
    ) -> None:
        if summary is not None:
            await self.put_summary(session_id, summary)
        entry = self._get_or_create(session_id)
        if entry.msgs is not None and entry.msgs > message_count:
            return
        now = self._clock()
        if recent is not None:
            entry.recent = list(self._recent.keep(recent))
            entry.recent_until = now + self._history_ttl
        entry.turns, entry.msgs, entry.last, entry.chars = turn_count, message_count, last_activity, content_chars
        entry.owner = owner
        entry.state_until = now + self._summary_ttl

    async def delete(self, session_id: str) -> None:
        self._entries.pop(session_id, None)
        self._postings.drop(session_id)

    async def invalidate(self, session_id: str) -> None:
        self._postings.drop(session_id)
        entry = self._entries.get(session_id)
        if entry is not None:
            # Only the lock stays (an empty entry is dropped by the next _get).
            self._entries[session_id] = _Entry(lock_token=entry.lock_token, lock_until=entry.lock_until)

    async def try_lock(self, session_id: str, ttl_seconds: float) -> str | None:
        entry = self._get_or_create(session_id)
        if entry.lock_token is not None:
            return None
        entry.lock_token = secrets.token_hex(8)
        entry.lock_until = self._clock() + ttl_seconds
        return entry.lock_token

    async def extend_lock(self, session_id: str, token: str, ttl_seconds: float) -> bool:
        entry = self._get(session_id)
        if entry is None or entry.lock_token != token:
            return False
        entry.lock_until = self._clock() + ttl_seconds
        return True

    async def unlock(self, session_id: str, token: str) -> None:
        entry = self._entries.get(session_id)
        if entry is not None and entry.lock_token == token:
            entry.lock_token = None

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        self._entries.clear()
        self._postings.clear()
