"""The arguments of the hot tier's two largest Lua scripts, by name. A script reads ARGV by
position; these dataclasses are the one place that order is written, next to the scripts'
comments in tiers/redis/hot.py (`_APPEND_LUA`, `_BACKFILL_LUA`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tiered_memory.model import SessionCounters, SessionState
from tiered_memory.tiers.codec import encode_state
from tiered_memory.tiers.hot import RecentBound
from tiered_memory.tiers.redis.resp import Arg


@dataclass(frozen=True, slots=True)
class Ttls:
    """How long Redis keeps a session's recent list and its summary and counters, in seconds."""

    history: int
    summary: int


@dataclass(frozen=True, slots=True)
class AppendArgs:
    """One committed message pushed onto the recent list, with SQL's counters. Counters are set,
    never incremented, so that a lost or repeated write can never make them drift."""

    message: bytes
    seq: int
    counters: SessionCounters
    content_chars: int
    """Characters of this message's content (the list's running total grows by them)."""
    bound: RecentBound
    ttls: Ttls
    dirty: bool
    """This process failed a write of the session before: the entry is dropped first."""

    def argv(self) -> list[Arg]:
        c = self.counters
        return [
            self.message,  # 1
            self.seq,  # 2
            c.turn_count,  # 3
            c.message_count,  # 4
            c.last_activity,  # 5
            c.content_chars,  # 6
            self.bound.most,  # 7
            self.ttls.history,  # 8
            self.ttls.summary,  # 9
            "1" if self.dirty else "0",  # 10
            c.owner.tenant,  # 11
            c.owner.user_id or "",  # 12
            self.content_chars,  # 13
            self.bound.least,  # 14
            self.bound.chars,  # 15
        ]


@dataclass(frozen=True, slots=True)
class BackfillArgs:
    """A session refilled from SQL: the summary unless a newer version is cached, and the
    counters (and the recent list, when `recent` is given) unless a newer append got there."""

    summary: bytes
    """The encoded summary, or b"" for none."""
    version: int
    counters: SessionCounters
    ttls: Ttls
    recent: Sequence[bytes] | None
    """The encoded messages the list is replaced with, oldest first; None keeps the list."""
    recent_chars: int
    state: SessionState | None = None
    """The gateway's state SQL gave with the counters (None: none given)."""

    def argv(self) -> list[Arg]:
        c = self.counters
        return [
            self.summary,  # 1
            self.version,  # 2
            self.ttls.summary,  # 3
            c.message_count,  # 4
            c.turn_count,  # 5
            c.last_activity,  # 6
            self.ttls.history,  # 7
            "1" if self.recent is not None else "0",  # 8
            c.content_chars,  # 9
            c.owner.tenant,  # 10
            c.owner.user_id or "",  # 11
            self.recent_chars,  # 12
            self.state.version if self.state is not None else -1,  # 13
            encode_state(self.state) if self.state is not None else "",  # 14
            *(self.recent or ()),  # 15…
        ]
