"""The hot tier on Redis: one pipelined round trip per read and per write, keys hash-tagged by session.

Every command on a plain redis:// URL goes through RespMux (one multiplexed connection, a write per
event-loop tick); on any other URL (TLS, a socket, URL options) through redis-py.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TypeVar, cast

from tiered_memory.breaker import CircuitBreaker
from tiered_memory.errors import HotUnavailable
from tiered_memory.model import HotSession, Message, Owner, SessionCounters, SessionKey, SessionState, Summary
from tiered_memory.tiers.codec import (
    MessageDecoder,
    decode_summary,
    encode_message,
    encode_state,
    encode_summary,
    state_of,
)
from tiered_memory.tiers.hot import HotExpiries, RecentBound
from tiered_memory.tiers.postings import SESSION_BYTES
from tiered_memory.tiers.redis.argv import AppendArgs, BackfillArgs, Ttls
from tiered_memory.tiers.redis.buckets import RedisBuckets
from tiered_memory.tiers.redis.hot_cache import HotCache, cache_invalidator
from tiered_memory.tiers.redis.jobs import RedisJobs
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.redis.link import RedisLink
from tiered_memory.tiers.redis.postings import CHANGED_LUA, RedisPostings, changed_args, forget_commands
from tiered_memory.tiers.redis.recall_usage import NO_BUDGET, RecallBudget
from tiered_memory.tiers.redis.resp import Arg, Endpoint, RespMux, Script
from tiered_memory.tiers.redis.scripts import (
    APPEND_LUA,
    BACKFILL_LUA,
    EXTEND_LUA,
    PUT_STATE_LUA,
    PUT_SUMMARY_LUA,
    UNLOCK_LUA,
)
from tiered_memory.tiers.redis.url import connect, parse_redis_url
from tiered_memory.tracing import Tracing

T = TypeVar("T")

_DIRTY_MAX = 1_000_000
# Entries of an events stream read at once when an erasure looks for a user's.
_STREAM_PAGE = 1000


class RedisHot:
    """HotTier on a Redis server. Every call is bounded by `timeout_s`; failures become HotUnavailable."""

    backend = "redis"

    def __init__(
        self,
        link: RedisLink,
        *,
        keys: Keys,
        summary_ttl_s: int,
        history_ttl_s: int,
        recent: RecentBound,
        recall_max_bytes: int = SESSION_BYTES,
        recall_budget: RecallBudget = NO_BUDGET,
        cache: HotCache[object] | None = None,
    ) -> None:
        """`cache`: the reads kept in process memory, with the link's mux created with
        `on_invalidate=cache_invalidator(cache)` (see from_url); used only while it tracks.
        `recall_max_bytes`: the bound of one session's recall postings, `recall_budget` of all
        sessions' and of one tenant's."""
        self.link = link
        self._postings = RedisPostings(
            link, keys=keys, ttl_s=history_ttl_s, session_max_bytes=recall_max_bytes, budget=recall_budget
        )
        self._buckets = RedisBuckets(link, keys=keys)
        self._jobs = RedisJobs(link, keys=keys)
        self._mux = link.mux
        self._cache = cache if link.mux is not None else None
        self._keys = keys
        self._summary_ttl = summary_ttl_s
        self._history_ttl = history_ttl_s
        # Made once: every append and backfill passes them to its script.
        self._ttls = Ttls(history_ttl_s, summary_ttl_s)
        self._recent = recent
        # The recent list is read whole by every context; its messages are decoded once.
        self._decoded = MessageDecoder()
        self._put_summary = Script.of(PUT_SUMMARY_LUA)
        self._unlock = Script.of(UNLOCK_LUA)
        self._backfill = Script.of(BACKFILL_LUA)
        self._extend = Script.of(EXTEND_LUA)
        self._append = Script.of(APPEND_LUA)
        self._put_state = Script.of(PUT_STATE_LUA)
        self._changed = Script.of(CHANGED_LUA)
        self._call = link.call
        self._read = link.read
        self._command = link.command
        self._script = link.script
        # Sessions whose append this process could not write to Redis (failed, timed out, or
        # refused by the open breaker): their hot entry may be stale, or complete a write late.
        # Their next hot read drops the entry and misses, so SQL answers and backfills it.
        # Bounded far above any outage's set of active sessions; past the bound a session is
        # not tracked, and the gap check of its next append is what repairs it.
        self._dirty: set[str] = set()

    @property
    def recent(self) -> RecentBound:
        return self._recent

    @property
    def postings(self) -> RedisPostings:
        return self._postings

    @property
    def buckets(self) -> RedisBuckets:
        return self._buckets

    @property
    def jobs(self) -> RedisJobs:
        return self._jobs

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        keys: Keys,
        timeout_s: float,
        summary_ttl_s: int,
        history_ttl_s: int,
        recent: RecentBound,
        recall_max_bytes: int = SESSION_BYTES,
        recall_budget: RecallBudget = NO_BUDGET,
        breaker: CircuitBreaker | None = None,
        cache_sessions: int = 0,
        tracing: Tracing | None = None,
    ) -> RedisHot:
        """One server, a Redis Cluster or a Sentinel-managed master, by the URL's scheme
        (see redis_url); a plain redis:// server's hot reads go through the multiplexed client,
        and with `cache_sessions` the latest reads of that many sessions are kept in process
        memory, invalidated by Redis (hot_cache.py). Raises ValueError for a URL of none of
        these forms."""
        client, close = connect(parse_redis_url(url), timeout_s=timeout_s)
        # None for a cluster or Sentinel URL: redis-py follows their topology.
        endpoint = Endpoint.from_url(url)
        cache: HotCache[object] | None = HotCache(cache_sessions) if cache_sessions and endpoint else None
        mux = None
        if endpoint:
            on_invalidate = cache_invalidator(cache) if cache is not None else None
            mux = RespMux(endpoint, connect_timeout_s=timeout_s, stale_after_s=timeout_s, on_invalidate=on_invalidate)
        return cls(
            RedisLink(client, timeout_s=timeout_s, breaker=breaker, mux=mux, close=close, tracing=tracing),
            cache=cache,
            keys=keys,
            summary_ttl_s=summary_ttl_s,
            history_ttl_s=history_ttl_s,
            recent=recent,
            recall_max_bytes=recall_max_bytes,
            recall_budget=recall_budget,
        )

    async def _drop_if_dirty(self, key: SessionKey) -> bool:
        """Drop the hot entry of a session this process failed to write; True when it did."""
        if key not in self._dirty:
            return False

        async def op() -> object:
            # Not the lock: a summarization elsewhere may hold it.
            k = self._keys
            return await self._command("DEL", k.recent(key), k.summary(key), k.state(key))

        with self._writing(key):
            await self._call(op)
        self._dirty.discard(key)
        return True

    def _cached(self) -> HotCache[object] | None:
        """The read cache, while Redis tells us what changes (never otherwise)."""
        return self._cache if self._cache is not None and self._mux is not None and self._mux.tracking else None

    async def _through_cache(self, key: SessionKey, kind: str, op: Callable[[], Awaitable[T]]) -> T:
        cache = self._cached()
        if cache is None:
            return await self._call(op)
        found = cache.get(key, kind)
        if found is not None:
            # Another replica may have changed the session and answered its caller, who now
            # asks here: its invalidation is on the way. The barrier waits for it (one PING on
            # the invalidation connection per event-loop tick), then the entry is looked up again.
            assert self._mux is not None
            if await self._mux.barrier() and self._cached() is cache:
                found = cache.get(key, kind)
                if found is not None:
                    return cast(T, found)
        stamp = cache.stamp(key)
        result = await self._call(op)
        if self._cached() is cache:
            cache.put(key, kind, result, stamp)
        return result

    @contextlib.contextmanager
    def _writing(self, key: SessionKey) -> Iterator[None]:
        """Around a write of ours: the session's cached reads go before it is sent, and reads in
        flight are not kept, before or after it is answered (its invalidation may come later)."""
        if self._cache is not None:
            self._cache.changed(key)
        try:
            yield
        finally:
            if self._cache is not None:
                self._cache.changed(key)

    async def read_summary(self, key: SessionKey) -> tuple[Summary | None, int | None, Owner | None]:
        if await self._drop_if_dirty(key):
            return None, None, None

        async def op() -> tuple[Summary | None, int | None, Owner | None]:
            raw_summary, state = await self._read(
                ("GET", self._keys.summary(key)),
                ("HMGET", self._keys.state(key), "turns", "tenant", "uid"),
            )
            raw_turns, tenant, uid = _fields(state, 3)
            return (
                decode_summary(_bytes(raw_summary)) if raw_summary else None,
                int(raw_turns) if raw_turns is not None else None,
                _owner(tenant, uid),
            )

        return await self._through_cache(key, "summary", op)

    async def read_session(self, key: SessionKey) -> HotSession:
        if await self._drop_if_dirty(key):
            return HotSession(summary=None, recent=(), turn_count=None, message_count=None, last_activity=None)

        async def op() -> HotSession:
            raw_summary, raw_recent, state = await self._read(
                ("GET", self._keys.summary(key)),
                ("LRANGE", self._keys.recent(key), 0, -1),
                ("HMGET", self._keys.state(key), "turns", "msgs", "last", "chars", "tenant", "uid", "gv", "gs"),
            )
            turns, msgs, last, chars, tenant, uid, gv, gs = _fields(state, 8)
            recent = sorted((self._decoded(_bytes(r)) for r in _fields(raw_recent)), key=lambda m: m.seq)
            return HotSession(
                summary=decode_summary(_bytes(raw_summary)) if raw_summary else None,
                recent=tuple(recent),
                turn_count=int(turns) if turns is not None else None,
                message_count=int(msgs) if msgs is not None else None,
                last_activity=float(last) if last is not None else None,
                content_chars=int(chars) if chars is not None else None,
                owner=_owner(tenant, uid),
                state=state_of(gv, gs),
            )

        return await self._through_cache(key, "session", op)

    async def record_append(
        self,
        message: Message,
        counters: SessionCounters,
    ) -> None:
        sid = message.key
        dirty = sid in self._dirty
        args = AppendArgs(
            encode_message(message),
            message.seq,
            counters,
            len(message.content),
            self._recent,
            self._ttls,
            dirty,
        ).argv()

        async def op() -> object:
            k = self._keys
            keys = [k.recent(sid), k.state(sid), k.summary(sid), k.state_floor(sid)]
            return await self._script(self._append, keys, args)

        try:
            with self._writing(sid):
                await self._call(op)
        except HotUnavailable:
            if len(self._dirty) < _DIRTY_MAX:
                self._dirty.add(sid)
            raise
        if dirty:
            self._dirty.discard(sid)

    async def put_state(self, key: SessionKey, state: SessionState, *, written: bool = True) -> bool:
        async def op() -> object:
            args: list[Arg] = [state.version, encode_state(state), self._summary_ttl, "1" if written else "0"]
            return await self._script(self._put_state, [self._keys.state(key), self._keys.state_floor(key)], args)

        with self._writing(key):
            return bool(await self._call(op))

    async def put_summary(self, key: SessionKey, summary: Summary) -> bool:
        async def op() -> object:
            return await self._script(
                self._put_summary,
                [self._keys.summary(key)],
                [encode_summary(summary), summary.version, self._summary_ttl],
            )

        with self._writing(key):
            return bool(await self._call(op))

    async def backfill(
        self,
        key: SessionKey,
        counters: SessionCounters,
        *,
        summary: Summary | None,
        recent: Sequence[Message] | None,
        state: SessionState | None = None,
    ) -> None:
        k = self._keys
        keys = [k.summary(key), k.recent(key), k.state(key), k.state_floor(key)]
        kept = self._recent.keep(recent) if recent is not None else ()
        args = BackfillArgs(
            encode_summary(summary) if summary else b"",
            summary.version if summary else 0,
            counters,
            self._ttls,
            [encode_message(m) for m in kept] if recent is not None else None,
            sum(m.size for m in kept),
            state,
        ).argv()

        async def op() -> object:
            return await self._script(self._backfill, keys, args)

        with self._writing(key):
            await self._call(op)

    async def delete(self, key: SessionKey, *, keep_state_floor: bool = False) -> None:
        async def op() -> None:
            kept = {self._keys.recall(key), *([self._keys.state_floor(key)] if keep_state_floor else [])}
            others = [k for k in self._keys.all_of(key) if k not in kept]
            await self._read(*forget_commands(self._keys, key, self._history_ttl, also=others))

        with self._writing(key):
            await self._call(op)

    async def invalidate(self, key: SessionKey, *, changed_seq: int) -> bool:
        async def op() -> bool:
            k = self._keys
            cached = [k.recent(key), k.summary(key), k.state(key)]
            keys, args = changed_args(k, key, self._history_ttl, changed_seq, also=cached)
            return bool(await self._script(self._changed, keys, args))

        try:
            with self._writing(key):
                return await self._call(op)
        except HotUnavailable:
            # What is cached may show a message SQL no longer holds (patched, or taken back and
            # its seq reused): this process's next append refreshes the session from SQL.
            if len(self._dirty) < _DIRTY_MAX:
                self._dirty.add(key)
            raise

    async def add_to_stream(self, stream: str, fields: Mapping[str, str], *, max_len: int) -> None:
        """XADD to `stream`, trimmed to about `max_len` entries: the EVENTS_STREAM sink."""
        pairs = [part for item in fields.items() for part in item]

        async def op() -> object:
            return await self._command("XADD", stream, "MAXLEN", "~", max_len, "*", *pairs)

        await self._call(op)

    async def remove_from_stream(self, stream: str, fields: Mapping[str, str]) -> int:
        """XDEL the entries of `stream` whose fields hold all of `fields`, read _STREAM_PAGE at a
        time (XRANGE from after the last one read): a user's erasure, bounded by the stream's length."""
        wanted = {k.encode(): v.encode() for k, v in fields.items()}
        start, removed = "-", 0
        while True:
            entries = await self._call(functools.partial(self._stream_page, stream, start))
            doomed = [entry_id for entry_id, got in entries if all(got.get(k) == v for k, v in wanted.items())]
            if doomed:
                removed += await self._call(functools.partial(self._stream_delete, stream, doomed))
            if len(entries) < _STREAM_PAGE:
                return removed
            start = "(" + entries[-1][0].decode()

    async def _stream_page(self, stream: str, start: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        page = await self._command("XRANGE", stream, start, "+", "COUNT", _STREAM_PAGE)
        out = []
        for entry in page if isinstance(page, list) else []:
            entry_id, fields = entry[0], entry[1]
            # The multiplexed client answers RESP as it is (a flat list of fields and values);
            # redis-py's parses an entry's fields into a dict.
            got = fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2], strict=True))
            out.append((bytes(entry_id), got))
        return out

    async def _stream_delete(self, stream: str, entry_ids: list[bytes]) -> int:
        answer = await self._command("XDEL", stream, *entry_ids)
        return answer if isinstance(answer, int) else 0

    async def try_lock(self, name: str, ttl_seconds: float) -> str | None:
        token = secrets.token_hex(8)

        async def op() -> object:
            return await self._command("SET", self._keys.lock(name), token, "NX", "PX", int(ttl_seconds * 1000))

        return token if await self._call(op) else None

    async def extend_lock(self, name: str, token: str, ttl_seconds: float) -> bool:
        async def op() -> object:
            return await self._script(self._extend, [self._keys.lock(name)], [token, int(ttl_seconds * 1000)])

        return bool(await self._call(op))

    async def unlock(self, name: str, token: str) -> None:
        async def op() -> object:
            return await self._script(self._unlock, [self._keys.lock(name)], [token])

        await self._call(op)

    async def expiries(self, key: SessionKey) -> HotExpiries:
        async def op() -> HotExpiries:
            found = await self._read(
                ("PTTL", self._keys.summary(key)),
                ("PTTL", self._keys.recent(key)),
                ("PTTL", self._keys.state(key)),
            )
            # PTTL: -2 for a missing key, -1 for one without an expiry (not written by this daemon).
            left = [ms / 1000 if isinstance(ms, int) and ms >= 0 else None for ms in found]
            return HotExpiries(summary_s=left[0], recent_s=left[1], counters_s=left[2])

        return await self._call(op)

    async def ping(self) -> None:
        async def op() -> object:
            return await self._command("PING")

        await self._call(op)

    async def aclose(self) -> None:
        await self.link.aclose()


def _bytes(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"expected a bulk string from Redis, got {type(value).__name__}")
    return value


def _fields(value: object, n: int | None = None) -> list[bytes | None]:
    """A multi-bulk reply (HMGET, LRANGE) as a list of bytes or None; TypeError when it is not one."""
    if not isinstance(value, list) or (n is not None and len(value) != n):
        raise TypeError(f"expected an array of {n or 'any number of'} items from Redis")
    if not all(v is None or isinstance(v, bytes) for v in value):
        raise TypeError("expected bulk strings from Redis")
    return value


def _owner(tenant: bytes | None, uid: bytes | None) -> Owner | None:
    """The owner in a state hash; None when it is not there (written before owners were kept, or
    the hash expired). A user id is never empty, so '' stands for none."""
    if tenant is None or uid is None:
        return None
    return Owner(tenant.decode("utf-8"), uid.decode("utf-8") or None)
