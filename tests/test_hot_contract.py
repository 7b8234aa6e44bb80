"""One contract for the hot tier, run against the in-process cache and a real Redis."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis

from tests.helpers.daemon import new_sid
from tests.helpers.hot import HISTORY_TTL, RECENT, SUMMARY_TTL, redis_tier, tier_of
from tests.helpers.servers import RealServers, redis_flush_prefix
from tiered_memory.errors import HotUnavailable
from tiered_memory.model import (
    Message,
    Owner,
    Role,
    SessionCounters,
    SessionKey,
    SessionState,
    Summary,
    SummarySource,
)
from tiered_memory.tiers.codec import MessageDecoder, encode_message
from tiered_memory.tiers.hot import HotExpiries, HotTier, RecentBound
from tiered_memory.tiers.memory_hot import MemoryHot
from tiered_memory.tiers.postings import STALE, pack
from tiered_memory.tiers.redis.hot import RedisHot

OWNER = Owner("acme", "u1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# "redis" runs on the multiplexed connection (a plain redis:// URL); "redis-py" on redis-py's own
# client, which URLs with options (and TLS, sockets) get.
@pytest.fixture(params=["memory", "redis", "redis-py"])
async def hot(request: pytest.FixtureRequest) -> AsyncIterator[HotTier]:
    async for tier in tier_of(request, RECENT):
        yield tier


def msg(sid: SessionKey, seq: int, role: Role = Role.USER) -> Message:
    return Message(sid, seq, (seq + 1) // 2, role, f"内容 {seq}", f"m{seq}", 1.5 * seq, "u1")


def summary(version: int, text: str = "summary") -> Summary:
    return Summary(text, 3 * version, version, SummarySource.DETERMINISTIC, 10.0, 5.0, ("活力健",), {"k": [1]}, 1)


async def test_empty_session_reads_nothing(hot: HotTier) -> None:
    """An unknown session has no summary, no recent messages and no counters."""
    sid = new_sid()
    assert await hot.read_summary(sid) == (None, None, None)
    snap = await hot.read_session(sid)
    assert snap.summary is None
    assert snap.recent == ()
    assert snap.turn_count is None
    assert snap.owner is None


async def test_recent_list_is_trimmed_and_ordered(hot: HotTier) -> None:
    """record_append keeps the newest RECENT.most messages, oldest first, with SQL's counters."""
    sid = new_sid()
    for seq in range(1, 8):
        await hot.record_append(msg(sid, seq), SessionCounters(seq // 2, seq, 100.0 + seq, OWNER))
    snap = await hot.read_session(sid)
    assert [m.seq for m in snap.recent] == [4, 5, 6, 7]
    assert snap.recent[-1] == msg(sid, 7)
    assert (snap.turn_count, snap.message_count, snap.last_activity) == (3, 7, 107.0)
    assert snap.owner == OWNER


CHARS = RecentBound(least=2, most=8, chars=20)
# Lengths that cross the bound one way and the other, multi-byte text included (Python counts
# characters, Redis's Lua bytes), then terse turns until the count bound rules, and a long one.
TEXTS = ["你好，我叫李雷", "hello there friend", "一", "x" * 25, "好的", "再见了朋友们", "ok", "bbb", "明天下午三点见"]
TEXTS += [*"zyxwvu", "the sixteenth one is long", *"srq"]


@pytest.fixture(params=["memory", "redis"])
async def by_chars(request: pytest.FixtureRequest) -> AsyncIterator[HotTier]:
    async for tier in tier_of(request, CHARS):
        yield tier


def said(sid: SessionKey, seq: int) -> Message:
    return dataclasses.replace(msg(sid, seq), content=TEXTS[(seq - 1) % len(TEXTS)])


def test_a_message_decodes_as_its_encoding_says() -> None:
    """The recent list's decoder keeps what it decoded by the encoding: the same bytes read again
    are the same message, a message changed at the same seq is the changed one."""
    sid = SessionKey(new_sid())
    first, changed = said(sid, 1), dataclasses.replace(said(sid, 1), content="edited")
    # Room for about two encodings: the least recently used goes.
    decode = MessageDecoder(max_bytes=2 * len(encode_message(first)) + 8)
    assert decode(encode_message(first)) == first
    assert decode(encode_message(first)) is decode(encode_message(first))
    assert decode(encode_message(changed)) == changed
    assert decode(encode_message(said(sid, 2))) == said(sid, 2)
    assert decode(encode_message(first)) == first  # dropped by the bound, decoded again


async def _append_all(hot: HotTier, sid: SessionKey, seqs: range) -> None:
    for seq in seqs:
        await hot.record_append(said(sid, seq), SessionCounters(seq // 2, seq, 1.0, OWNER))
        kept = CHARS.keep([said(sid, s) for s in range(1, seq + 1)])
        assert [m.seq for m in (await hot.read_session(sid)).recent] == [m.seq for m in kept], seq


async def test_recent_list_is_bounded_by_characters(by_chars: HotTier) -> None:
    """Past `least` messages the list keeps only as many of the newest as hold `chars` characters
    (as Python counts them), and never more than `most`; a refill from SQL keeps the same, and the
    appends after it go on from its total, as do appends to a list whose total was never kept or
    no longer holds (a daemon that keeps none appended to it, or refilled it)."""
    sid = new_sid()
    await _append_all(by_chars, sid, range(1, 12))
    history = [said(sid, s) for s in range(1, 12)]
    await by_chars.backfill(sid, SessionCounters(5, 11, 1.0, OWNER), summary=None, recent=history)
    assert [m.seq for m in (await by_chars.read_session(sid)).recent] == [m.seq for m in CHARS.keep(history)]
    await _append_all(by_chars, sid, range(12, 16))
    first = 16
    if isinstance(by_chars, RedisHot):
        # Message 16 as a daemon that keeps no total appends it (rolling upgrade): the list and
        # the count move, the total stays behind.
        await by_chars.link.client.rpush(by_chars._keys.recent(sid), encode_message(said(sid, 16)))
        await by_chars.link.client.hset(by_chars._keys.state(sid), "msgs", 16)
        first = 17
    await _append_all(by_chars, sid, range(first, 22))
    if isinstance(by_chars, RedisHot):
        # A daemon that keeps no total refills the list with a window at the same count.
        window = [said(sid, s) for s in range(12, 22)]
        await by_chars.link.client.delete(by_chars._keys.recent(sid))
        await by_chars.link.client.rpush(by_chars._keys.recent(sid), *(encode_message(m) for m in window))
        for seq in range(22, 26):
            await by_chars.record_append(said(sid, seq), SessionCounters(seq // 2, seq, 1.0, OWNER))
        expected = CHARS.keep([*window, *(said(sid, s) for s in range(22, 26))])
        assert [m.seq for m in (await by_chars.read_session(sid)).recent] == [m.seq for m in expected]


def test_recent_bound_keeps_the_newest_and_knows_its_room() -> None:
    """keep: the newest `most`, then from the oldest while the rest still hold `chars`, never
    below `least`; has_room: whether one more in front would be kept. Chars 0 bounds by count."""
    texts = ["aaaa", "bb", "cccccc", "d", "ee"]
    ms = [dataclasses.replace(msg(SessionKey("s"), i + 1), content=t) for i, t in enumerate(texts)]
    assert [m.content for m in RecentBound(least=1, most=5, chars=8).keep(ms)] == ["cccccc", "d", "ee"]
    assert [m.content for m in RecentBound(least=4, most=5, chars=3).keep(ms)] == ["bb", "cccccc", "d", "ee"]
    assert [m.content for m in RecentBound(least=1, most=2, chars=100).keep(ms)] == ["d", "ee"]
    assert [m.content for m in RecentBound(least=3, most=3).keep(ms)] == ["cccccc", "d", "ee"]
    assert RecentBound(least=1, most=5, chars=10).has_room(ms[2:])
    assert not RecentBound(least=1, most=5, chars=9).has_room(ms[2:])
    assert not RecentBound(least=1, most=3, chars=100).has_room(ms[2:])
    assert RecentBound(least=4, most=5, chars=1).has_room(ms[2:])
    with pytest.raises(ValueError, match="least <= most"):
        RecentBound(least=3, most=2)


async def test_summary_round_trip_and_version_guard(hot: HotTier) -> None:
    """A summary round-trips unchanged; an older version never replaces a newer one."""
    sid = new_sid()
    assert await hot.put_summary(sid, summary(2, "newer")) is True
    assert await hot.put_summary(sid, summary(1, "older")) is False
    got, turns, owner = await hot.read_summary(sid)
    assert got == summary(2, "newer")
    assert turns is None
    assert owner is None
    assert await hot.put_summary(sid, summary(2, "same version rewrites")) is True
    assert await hot.put_summary(sid, summary(3, "newest")) is True
    assert (await hot.read_session(sid)).summary == summary(3, "newest")


async def test_expiries_say_how_long_each_entry_has_left(hot: HotTier) -> None:
    """The seconds the summary, the recent list and the counters have left (what the inspector
    shows), and None for each entry a session does not have."""
    sid = new_sid()
    assert await hot.expiries(sid) == HotExpiries(summary_s=None, recent_s=None, counters_s=None)
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
    left = await hot.expiries(sid)
    assert left.summary_s is None
    assert left.recent_s is not None
    assert HISTORY_TTL - 5 < left.recent_s <= HISTORY_TTL
    assert left.counters_s is not None
    assert 0 < left.counters_s <= max(SUMMARY_TTL, HISTORY_TTL)
    await hot.put_summary(sid, summary(1))
    left = await hot.expiries(sid)
    assert left.summary_s is not None
    assert SUMMARY_TTL - 5 < left.summary_s <= SUMMARY_TTL


async def test_lock_is_exclusive_and_token_guarded(hot: HotTier) -> None:
    """Only one holder at a time; a wrong token cannot release it."""
    sid = new_sid()
    token = await hot.try_lock(sid, 30)
    assert token
    assert await hot.try_lock(sid, 30) is None
    await hot.unlock(sid, "not-the-token")
    assert await hot.try_lock(sid, 30) is None
    await hot.unlock(sid, token)
    assert await hot.try_lock(sid, 30)


async def test_delete_forgets_the_session(hot: HotTier) -> None:
    """delete removes summary, recent list and counters."""
    sid = new_sid()
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
    await hot.put_summary(sid, summary(1))
    await hot.delete(sid)
    snap = await hot.read_session(sid)
    assert snap.summary is None
    assert snap.recent == ()
    assert snap.message_count is None
    assert snap.owner is None
    await hot.ping()


async def test_redis_keys_are_hash_tagged_with_ttls(real_servers: RealServers) -> None:
    """Every key of a session carries the {session_id} hash tag and the configured TTL."""
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    tier = redis_tier(real_servers.redis_url, prefix)
    sid = new_sid()
    try:
        await tier.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
        await tier.put_summary(sid, summary(1))
        raw = redis.Redis.from_url(real_servers.redis_url)
        keys = sorted(k.decode() for k in raw.scan_iter(match=f"{prefix}:*"))
        assert keys == [f"{prefix}:{{{sid}}}:recent", f"{prefix}:{{{sid}}}:state", f"{prefix}:{{{sid}}}:summary"]
        assert 0 < raw.ttl(f"{prefix}:{{{sid}}}:recent") <= HISTORY_TTL
        assert HISTORY_TTL < raw.ttl(f"{prefix}:{{{sid}}}:summary") <= SUMMARY_TTL
        assert HISTORY_TTL < raw.ttl(f"{prefix}:{{{sid}}}:state") <= SUMMARY_TTL
        raw.close()
    finally:
        await tier.aclose()
        redis_flush_prefix(real_servers.redis_url, prefix)


async def test_memory_ttls_and_bound() -> None:
    """The in-process cache expires recent turns after HISTORY_TTL and the summary after
    SUMMARY_TTL, like Redis, and evicts the least recently used session past its bound."""
    clock = Clock()
    hot = MemoryHot(max_sessions=2, summary_ttl_s=100, history_ttl_s=10, recent=RECENT, clock=clock)
    await hot.record_append(msg(SessionKey("a"), 1), SessionCounters(0, 1, 1.0, OWNER))
    await hot.put_summary(SessionKey("a"), summary(1))
    clock.now += 11
    snap = await hot.read_session(SessionKey("a"))
    assert snap.recent == ()
    assert snap.summary == summary(1)
    assert snap.turn_count == 0
    assert snap.owner == OWNER
    clock.now += 90
    assert (await hot.read_session(SessionKey("a"))).summary is None
    for sid in map(SessionKey, ("x", "y", "z")):
        await hot.put_summary(sid, dataclasses.replace(summary(1), text=sid))
    assert len(hot) == 2
    assert (await hot.read_summary(SessionKey("x")))[0] is None
    assert (await hot.read_summary(SessionKey("z")))[0] is not None


async def test_a_changed_message_drops_the_postings_only_when_they_reach_it(hot: HotTier) -> None:
    """After a message changed in SQL (a streaming reply finalized, a take-back), the recent list
    goes, and the recall postings too when they hold that message; postings that end before it
    stay (a gateway finalizes a reply every turn). A batch read before the change is refused
    either way: it may hold the message as it was."""
    sid = new_sid()
    before = time.time() - 1
    await hot.postings.add(sid, pack([msg(sid, 1), msg(sid, 2)], [["alpha"], ["beta"]], read_at=before))
    await hot.record_append(msg(sid, 3), SessionCounters(1, 3, 1.0, OWNER))
    assert not await hot.invalidate(sid, changed_seq=3)
    assert (await hot.postings.read(sid, ["alpha"])).last_seq == 2
    assert (await hot.read_session(sid)).recent == ()
    assert await hot.postings.add(sid, pack([msg(sid, 3)], [["gamma"]], read_at=before)) == STALE
    assert await hot.postings.add(sid, pack([msg(sid, 3)], [["gamma"]], read_at=time.time() + 1)) == 3
    assert await hot.invalidate(sid, changed_seq=3)
    assert (await hot.postings.read(sid, ["alpha"])).last_seq == 0


async def test_memory_bound_in_bytes() -> None:
    """The in-process cache is bounded by what its sessions hold, not only by their count: 150
    sessions of twelve 32 KB messages (the review's load, ~59 MB of text) stay under a 16 MiB
    bound, the least recently used evicted first, the newest whole; deleting and invalidating
    give their bytes back."""
    hot = MemoryHot(max_sessions=10_000, summary_ttl_s=100, history_ttl_s=100, recent=RECENT, max_bytes=16 * 2**20)
    long = "长" * 16_000  # 32 KB of UTF-8
    token = await hot.try_lock("locked", 60)
    for n in range(150):
        for seq in range(1, 13):
            m = dataclasses.replace(msg(SessionKey(f"s{n}"), seq), content=long)
            await hot.record_append(m, SessionCounters(0, seq, 1.0, OWNER))
        assert hot.bytes <= 16 * 2**20
    assert len(hot) < 150
    assert (await hot.read_session(SessionKey("s0"))).recent == ()
    assert len((await hot.read_session(SessionKey("s149"))).recent) == len(
        RECENT.keep([msg(SessionKey("s149"), s) for s in range(1, 13)])
    )
    assert not await hot.try_lock("locked", 60)  # a held summary lock is never evicted
    assert token is not None
    held = hot.bytes
    await hot.delete(SessionKey("s149"))
    await hot.invalidate(SessionKey("s148"), changed_seq=12)
    assert hot.bytes < held - 2 * 32_000
    await hot.aclose()
    assert hot.bytes == 0


async def test_backfill_refills_unless_newer_data_arrived(hot: HotTier) -> None:
    """backfill writes summary, recent list and counters in one call, but does not roll back
    counters or the list when an append newer than its SQL read is already there."""
    sid = new_sid()
    msgs = [msg(sid, seq) for seq in range(1, 4)]
    await hot.backfill(sid, SessionCounters(1, 3, 5.0, OWNER), summary=summary(1), recent=msgs)
    snap = await hot.read_session(sid)
    assert snap.recent == tuple(msgs)
    assert (snap.turn_count, snap.message_count, snap.summary) == (1, 3, summary(1))
    await hot.record_append(msg(sid, 4), SessionCounters(2, 4, 6.0, OWNER))
    await hot.backfill(sid, SessionCounters(1, 3, 5.0, OWNER), summary=None, recent=msgs)
    snap = await hot.read_session(sid)
    assert [m.seq for m in snap.recent] == [1, 2, 3, 4]
    assert snap.message_count == 4


async def test_a_state_put_outranks_an_older_one_refilled_after_it(hot: HotTier) -> None:
    """A state put while the tier holds no counters of the session is not shown, but its version
    stays as the state floor: a refill carrying an older state (read from SQL before that put)
    leaves the state unknown instead of caching the older one, and one carrying that version or a
    newer caches it. The floor outlives a loss of the counters (a changed message), not a delete."""
    sid = new_sid()
    assert await hot.put_state(sid, SessionState(2, {"step": "paid"})) is False
    assert (await hot.read_session(sid)).state is None
    counters = SessionCounters(1, 2, 5.0, OWNER)
    await hot.backfill(sid, counters, summary=None, recent=None, state=SessionState(1, {"step": "cart"}))
    snap = await hot.read_session(sid)
    assert (snap.message_count, snap.state) == (2, None)
    assert await hot.put_state(sid, SessionState(1, {"step": "cart"})) is False
    assert (await hot.read_session(sid)).state is None
    await hot.backfill(sid, counters, summary=None, recent=None, state=SessionState(2, {"step": "paid"}))
    assert (await hot.read_session(sid)).state == SessionState(2, {"step": "paid"})

    assert await hot.put_state(sid, SessionState(3, {"step": "shipped"})) is True
    await hot.invalidate(sid, changed_seq=2)
    assert (await hot.read_session(sid)).message_count is None
    await hot.backfill(sid, counters, summary=None, recent=None, state=SessionState(2, {"step": "paid"}))
    assert (await hot.read_session(sid)).state is None

    await hot.delete(sid)
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
    assert (await hot.read_session(sid)).state == SessionState(0, None)
    assert await hot.put_state(sid, SessionState(1, {"of": "the new session"})) is True


async def test_a_first_append_after_a_state_put_leaves_the_state_unknown(hot: HotTier) -> None:
    """A session's first append says it has no state, unless a PUT of its state reached the tier
    first (that append's own write came late): then the state is unknown, for SQL to answer."""
    sid = new_sid()
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
    assert (await hot.read_session(sid)).state == SessionState(0, None)
    late = new_sid()
    await hot.put_state(late, SessionState(1, {"step": "cart"}))
    await hot.record_append(msg(late, 1), SessionCounters(0, 1, 1.0, OWNER))
    snap = await hot.read_session(late)
    assert (snap.message_count, snap.state) == (1, None)


async def test_a_state_a_read_caches_raises_no_floor_and_a_summary_reset_keeps_it(hot: HotTier) -> None:
    """A state a read took from SQL (not `written`) is cached like a PUT's but leaves no floor: a
    read that ends after the session's delete leaves nothing that outranks the states of a
    session made again under its id. A delete that keeps the floor (a summary reset: the session
    lives on) still refuses a refill older than the PUT before it."""
    sid = new_sid()
    assert await hot.put_state(sid, SessionState(3, {"of": "a deleted session"}), written=False) is False
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
    assert (await hot.read_session(sid)).state == SessionState(0, None)
    assert await hot.put_state(sid, SessionState(1, {"step": "cart"})) is True
    assert await hot.put_state(sid, SessionState(2, {"step": "paid"})) is True

    await hot.delete(sid, keep_state_floor=True)
    assert (await hot.read_session(sid)).message_count is None
    counters = SessionCounters(0, 1, 1.0, OWNER)
    await hot.backfill(sid, counters, summary=None, recent=None, state=SessionState(1, {"step": "cart"}))
    assert (await hot.read_session(sid)).state is None
    assert await hot.put_state(sid, SessionState(1, {"step": "cart"}), written=False) is False
    assert await hot.put_state(sid, SessionState(2, {"step": "paid"}), written=False) is True
    assert (await hot.read_session(sid)).state == SessionState(2, {"step": "paid"})


async def test_a_refill_caches_the_state_unless_a_newer_one_is_there(hot: HotTier) -> None:
    """backfill's state is version-guarded like put_state's, and kept even when the counters are
    not replaced (an append newer than the refill's SQL read got there first)."""
    sid = new_sid()
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
    await hot.record_append(msg(sid, 2), SessionCounters(1, 2, 2.0, OWNER))
    await hot.backfill(
        sid, SessionCounters(0, 1, 1.0, OWNER), summary=None, recent=None, state=SessionState(3, {"a": 1})
    )
    snap = await hot.read_session(sid)
    assert (snap.message_count, snap.state) == (2, SessionState(3, {"a": 1}))
    await hot.backfill(
        sid, SessionCounters(1, 2, 2.0, OWNER), summary=None, recent=None, state=SessionState(2, {"a": 0})
    )
    assert (await hot.read_session(sid)).state == SessionState(3, {"a": 1})


async def test_the_hot_tier_keeps_no_reasoning(hot: HotTier) -> None:
    """A reply's reasoning stays in SQL: appended or refilled, the hot tier's copy of the message
    has none (nothing the hot tier serves shows it, and its records stay small); the rest of the
    message is kept as it was."""
    sid = new_sid()
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 101.0, OWNER))
    reply = dataclasses.replace(msg(sid, 2, Role.ASSISTANT), thinking_content="先想一想 quokka", thinking_duration=7)
    await hot.record_append(reply, SessionCounters(1, 2, 102.0, OWNER))
    bare = dataclasses.replace(reply, thinking_content=None, thinking_duration=None)
    assert (await hot.read_session(sid)).recent == (msg(sid, 1), bare)
    other = new_sid()
    refilled = dataclasses.replace(reply, key=other)
    await hot.backfill(other, SessionCounters(1, 2, 102.0, OWNER), summary=None, recent=[msg(other, 1), refilled])
    assert (await hot.read_session(other)).recent == (msg(other, 1), dataclasses.replace(bare, key=other))


async def test_owner_goes_with_the_counters(hot: HotTier) -> None:
    """The owner SQL reported is read back by both reads, a session without a user or tenant
    keeps that (not 'unknown'), and a later append that claimed the session updates it; a
    backfill older than that append does not roll it back."""
    sid = new_sid()
    unowned = Owner("", None)
    await hot.backfill(sid, SessionCounters(0, 1, 1.0, unowned), summary=summary(1), recent=None)
    assert (await hot.read_session(sid)).owner == unowned
    assert await hot.read_summary(sid) == (summary(1), 0, unowned)
    claimed = Owner("", "alice")
    await hot.record_append(msg(sid, 2), SessionCounters(1, 2, 2.0, claimed))
    await hot.backfill(sid, SessionCounters(0, 1, 1.0, unowned), summary=None, recent=None)
    assert (await hot.read_session(sid)).owner == claimed
    assert (await hot.read_summary(sid))[2] == claimed


async def test_undecodable_redis_values_are_a_miss_not_a_crash(real_servers: RealServers) -> None:
    """A damaged or foreign value under a session key raises HotUnavailable (the next tier
    answers), and SQL's answer replaces it, even one claiming a higher version (another release's,
    a bad write): otherwise every read of the session would go to SQL until its TTL."""
    prefix = f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}"
    tier = redis_tier(real_servers.redis_url, prefix)
    sid = new_sid()
    raw = redis.Redis.from_url(real_servers.redis_url)
    try:
        foreign = (
            b'{"version": 99, "text": "x", "covered": "3"}',
            b'{"version": 99, "text": "x", "covered": 3, "source": "bogus", "updated_at": 1}',
            b'{"version": 99, "text": "x", "covered": 3, "source": "llm", "updated_at": 1, "topics": 5}',
        )
        for bad in (b"garbage", b'{"text": "x"}', *foreign):
            raw.set(f"{prefix}:{{{sid}}}:summary", bad)
            with pytest.raises(HotUnavailable):
                await tier.read_summary(sid)
            with pytest.raises(HotUnavailable):
                await tier.read_session(sid)
            await tier.backfill(sid, SessionCounters(3, 6, 1.0, OWNER), summary=summary(1), recent=None)
            assert (await tier.read_summary(sid))[0] == summary(1)
    finally:
        raw.close()
        await tier.aclose()
        redis_flush_prefix(real_servers.redis_url, prefix)


async def test_extend_lock_only_for_its_holder(hot: HotTier) -> None:
    """extend_lock renews the lock for the token that holds it and for no other."""
    sid = new_sid()
    token = await hot.try_lock(sid, 30)
    assert token
    assert await hot.extend_lock(sid, token, 60) is True
    assert await hot.extend_lock(sid, "someone-else", 60) is False
    await hot.unlock(sid, token)
    assert await hot.extend_lock(sid, token, 60) is False


async def test_a_first_message_drops_a_summary_left_under_its_key(hot: HotTier) -> None:
    """A summary cached under a key before the session's first message (a stranger's: a tenant
    session cached under its bare id before schema version 6) is gone once seq 1 is appended; a
    repeat of seq 1 later leaves the session's own summary alone."""
    sid = new_sid()
    assert await hot.put_summary(sid, summary(7, "someone else's"))
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
    assert await hot.read_summary(sid) == (None, 0, OWNER)
    await hot.record_append(msg(sid, 2), SessionCounters(1, 2, 2.0, OWNER))
    assert await hot.put_summary(sid, summary(1))
    await hot.record_append(msg(sid, 1), SessionCounters(0, 1, 1.0, OWNER))
    assert (await hot.read_summary(sid))[0] == summary(1)


async def test_appends_apply_in_seq_order_only(hot: HotTier) -> None:
    """A repeated or late append changes nothing; an append past a gap (earlier ones never
    arrived) drops the window and counters, so the read path goes to SQL instead."""
    sid = new_sid()
    for seq in range(1, 4):
        await hot.record_append(msg(sid, seq), SessionCounters(seq // 2, seq, 100.0 + seq, OWNER))
    await hot.record_append(msg(sid, 2), SessionCounters(1, 2, 102.0, OWNER))
    snap = await hot.read_session(sid)
    assert [m.seq for m in snap.recent] == [1, 2, 3]
    assert (snap.message_count, snap.turn_count) == (3, 1)

    await hot.record_append(msg(sid, 6), SessionCounters(3, 6, 106.0, OWNER))
    snap = await hot.read_session(sid)
    assert snap.recent == ()
    assert snap.message_count is None
    assert snap.turn_count is None
