"""The recall postings' contract (tiers/postings.py), run against process memory and a real Redis
(on the multiplexed connection and on redis-py), and BM25 over what they hold (recall.py)."""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
import redis

from tests.helpers.daemon import new_sid
from tests.helpers.servers import RealServers, redis_flush_prefix
from tiered_memory.core.recall import TERM_SCAN, around, asked_kind, boosted, search, with_neighbours
from tiered_memory.model import Message, MessageStatus, Role, SessionKey
from tiered_memory.tiers.hot import RecentBound
from tiered_memory.tiers.memory_hot import MemoryHot
from tiered_memory.tiers.postings import (
    ENTRY,
    STALE,
    MemoryPostings,
    PostingsBatch,
    PostingsRead,
    PostingsStore,
    merged,
    pack,
    packed_each,
)
from tiered_memory.tiers.redis.hot import RedisHot
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.redis.postings import RedisPostings
from tiered_memory.tiers.redis.recall_usage import RecallBudget

_RECENT = RecentBound(least=4, most=4)
# Small enough for a test to fill: a few batches of three messages.
_BOUND = 2_000


@pytest.fixture(params=["memory", "redis", "redis-py"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[PostingsStore, PostingsStore]]:
    """Two replicas' views of one store: the same object in process memory, two clients of one
    Redis under a key prefix of their own (flushed after)."""
    if request.param == "memory":
        hot = MemoryHot(max_sessions=100, summary_ttl_s=60, history_ttl_s=60, recent=_RECENT, recall_max_bytes=_BOUND)
        yield hot.postings, hot.postings
        return
    servers: RealServers = request.getfixturevalue("real_servers")
    prefix = f"tmt{servers.run_id}{uuid.uuid4().hex[:6]}"
    url = servers.redis_url if request.param == "redis" else f"{servers.redis_url}?socket_keepalive=true"
    tiers = [
        RedisHot.from_url(
            url,
            keys=Keys(prefix),
            timeout_s=1.0,
            summary_ttl_s=60,
            history_ttl_s=60,
            recent=_RECENT,
            recall_max_bytes=_BOUND,
        )
        for _ in range(2)
    ]
    yield tiers[0].postings, tiers[1].postings
    for tier in tiers:
        await tier.aclose()
    redis_flush_prefix(servers.redis_url, prefix)


def _turn(sid: SessionKey, seq: int, text: str, status: MessageStatus = MessageStatus.COMPLETED) -> Message:
    role = Role.USER if seq % 2 else Role.ASSISTANT
    return Message(sid, seq, (seq + 1) // 2, role, text, f"m{seq}", 1.0, status=status)


def _batch(sid: SessionKey, first: int, texts: list[str], read_at: float = 1.0) -> PostingsBatch:
    messages = [_turn(sid, first + i, t) for i, t in enumerate(texts)]
    return pack(messages, [t.split() for t in texts], read_at=read_at)


async def test_batches_are_added_in_order_once(stores: tuple[PostingsStore, PostingsStore]) -> None:
    """A batch is taken only when it continues the postings: a retry, the same batch from another
    replica and a batch past a gap change nothing, and each answer is the last seq indexed."""
    a, b = stores
    sid = new_sid()
    assert await a.read(sid, ["price"]) == PostingsRead(0, 0, 0, False)
    assert await b.add(sid, _batch(sid, 2, ["out of order"])) == 0
    assert await a.add(sid, _batch(sid, 1, ["the price is 398", "price noted"])) == 2
    assert await b.add(sid, _batch(sid, 1, ["the price is 398", "price noted"])) == 2
    assert await b.add(sid, _batch(sid, 4, ["a gap"])) == 2
    assert await b.add(sid, _batch(sid, 3, ["price again price"])) == 3
    read = await a.read(sid, ["price", "398", "absent"])
    assert (read.last_seq, read.docs, read.total_terms, read.full) == (3, 3, 9, False)
    assert set(read.postings) == {"price", "398"}
    assert [s for s, _ in search(read, ["price"], k=5)] == [3, 2, 1]  # two mentions in a short message first
    assert [s for s, _ in search(read, ["398"], k=5)] == [1]
    assert [s for s, _ in search(read, ["price"], k=5, before_seq=3)] == [2, 1]


async def test_messages_are_kept_for_snippets(stores: tuple[PostingsStore, PostingsStore]) -> None:
    """The answered messages come back whole, by seq; a stopped reply is neither kept nor found,
    but still counts as indexed (the next batch continues after it)."""
    a, b = stores
    sid = new_sid()
    said = [
        _turn(sid, 1, "book a table for four"),
        _turn(sid, 2, "table booked", MessageStatus.STOPPED),
        _turn(sid, 3, "thanks for the table"),
    ]
    assert await a.add(sid, pack(said, [m.content.split() for m in said], read_at=1.0)) == 3
    read = await b.read(sid, ["table"])
    assert read.docs == 2
    assert [s for s, _ in search(read, ["table"], k=5)] == [3, 1]  # the shorter message first
    found = await b.messages(sid, around(search(read, ["table"], k=5)))
    assert sorted(found) == [1, 3]
    assert found[1] == said[0]


def test_a_match_brings_its_neighbours_at_half_its_score() -> None:
    """The messages beside a match (the reply to it, what it answered) come with it at half its
    score; a message keeps its best score; nothing at or past `before_seq`, nothing before seq 1."""
    assert with_neighbours([(5, 4.0), (1, 2.0)]) == [(5, 4.0), (6, 2.0), (4, 2.0), (1, 2.0), (2, 1.0)]
    assert with_neighbours([(5, 4.0), (6, 3.0)], before_seq=7) == [(5, 4.0), (6, 3.0), (4, 2.0)]
    assert with_neighbours([]) == []


def test_a_term_is_scored_in_its_newest_messages_only() -> None:
    """A word said in more than TERM_SCAN messages is scored in its newest TERM_SCAN (a search's
    cost stays bounded on a very long session); its idf still counts every message that says it,
    and a rarer word of the question is found wherever it was said."""
    n = TERM_SCAN + 200
    said = [
        Message(SessionKey("s"), seq, seq, Role.USER, "w", f"m{seq}", 0.0, status=MessageStatus.COMPLETED)
        for seq in range(1, n + 1)
    ]
    terms = [["hello", "rare"] if seq == 3 else ["hello"] for seq in range(1, n + 1)]
    read = _read(pack(said, terms, read_at=time.time()))
    found = dict(search(read, ["hello"], k=n))
    assert min(found) == n - TERM_SCAN + 1
    assert len(found) == TERM_SCAN
    # BM25 (k1 1.2, b 0.75) with the idf of a word all n messages say, not TERM_SCAN of them.
    idf, mean = math.log(1 + 0.5 / (n + 0.5)), (n + 1) / n
    assert found[n] == pytest.approx(idf * 2.2 / (1 + 1.2 * (0.25 + 0.75 / mean)))
    assert [seq for seq, _ in search(read, ["hello", "rare"], k=1)] == [3]


def _read(batch: PostingsBatch) -> PostingsRead:
    return PostingsRead(
        last_seq=batch.last_seq, docs=batch.docs, total_terms=batch.terms, full=False, postings=batch.postings
    )


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        ("How many kids does she have?", "number"),
        ("When is the rehearsal dinner?", "number"),
        ("之前说的那个酒店，价格是什么？", "number"),
        ("Who are they waiting for?", "name"),
        ("刚才说的那家餐馆叫什么？", "name"),
        ("Why did Carol leave?", None),
    ],
)
def test_what_a_question_asks_for(question: str, kind: str | None) -> None:
    assert asked_kind(question) == kind


def test_a_match_holding_what_is_asked_for_comes_first() -> None:
    """Of two matches, the one holding a number rises above a better-scored one without, when the
    question asks how many; without a kind asked, the scores alone order them."""
    sid = new_sid()
    plain = _turn(sid, 1, "we talked about the kids for a while")
    number = _turn(sid, 2, "she has 3 of them now")
    scored = [(plain, 2.0), (number, 1.5)]
    assert [m.seq for m, _ in boosted(scored, "number")] == [2, 1]
    assert [m.seq for m, _ in boosted(scored, None)] == [1, 2]
    assert [m.seq for m, _ in boosted(scored, "name")] == [1, 2]


def test_a_match_that_only_asks_ranks_below_the_statement_beside_it() -> None:
    """A message that only asks (a question mark, no number or name) shares the question's words
    but not its answer: it is worth half, so the reply that states the answer comes first. One
    that asks while stating a name or a number keeps its worth."""
    sid = new_sid()
    asking = _turn(sid, 1, "Which hotel did we book?")
    stating = _turn(sid, 2, "The Hotel Granvia, near the station.")
    assert [m.seq for m, _ in boosted([(asking, 2.0), (stating, 1.5)], None)] == [2, 1]
    assert [m.seq for m, _ in boosted([(asking, 2.0), (stating, 0.9)], None)] == [1, 2]
    telling = _turn(sid, 3, "Did you know the Granvia opened in 1997?")
    assert [m.seq for m, _ in boosted([(telling, 2.0), (stating, 1.5)], None)] == [3, 2]


async def test_postings_past_their_bound_stop_growing(stores: tuple[PostingsStore, PostingsStore]) -> None:
    """A batch that would pass the session's bound in bytes marks the postings full: it is not
    added, nor is any later one, and a search still finds what was indexed."""
    a, b = stores
    sid = new_sid()
    seq = 1
    while True:
        batch = _batch(sid, seq, [f"word{seq} filler text here", f"reply {seq} more filler"])
        if await a.add(sid, batch) != batch.last_seq:
            break
        seq += 2
        assert seq < 200, "the bound was never reached"
    read = await b.read(sid, ["word1"])
    assert read.full
    assert read.last_seq == seq - 1
    assert [s for s, _ in search(read, ["word1"], k=1)] == [1]
    small = _batch(sid, seq, ["x"])
    assert await b.add(sid, small) == seq - 1


async def test_forget_drops_the_postings(stores: tuple[PostingsStore, PostingsStore]) -> None:
    a, b = stores
    sid, other = new_sid(), new_sid()
    await a.add(sid, _batch(sid, 1, ["alpha beta"]))
    await a.add(other, _batch(other, 1, ["alpha"]))
    await b.forget(sid)
    assert (await a.read(sid, ["alpha"])).last_seq == 0
    # A new session under the same id, read after the forget.
    assert await a.add(sid, _batch(sid, 1, ["gamma"], read_at=time.time() + 1)) == 1
    assert (await a.read(other, ["alpha"])).postings


async def test_process_memory_drops_the_least_recently_asked_session() -> None:
    """All sessions' postings in process memory stay within their bound, the least recently
    asked dropped first; the newest stays even alone over it."""
    batches = {SessionKey(f"s{n}"): _batch(SessionKey(f"s{n}"), 1, [f"alpha beta gamma {n}"]) for n in range(4)}
    each = batches[SessionKey("s0")].size
    assert all(b.size == each for b in batches.values())
    store = MemoryPostings(max_bytes=3 * each, session_max_bytes=100 * each)
    for sid in map(SessionKey, ("s0", "s1", "s2")):
        await store.add(sid, batches[sid])
    await store.read(SessionKey("s0"), ())  # now the most recently asked
    await store.add(SessionKey("s3"), batches[SessionKey("s3")])
    indexed = {sid: (await store.read(sid, ())).last_seq for sid in batches}
    assert indexed == {"s0": 1, "s1": 0, "s2": 1, "s3": 1}
    assert store.size == 3 * each
    big = _batch(SessionKey("big"), 1, ["word " * 60 + "other " * 60])
    assert big.size > 3 * each
    await store.add(SessionKey("big"), big)
    assert (len(store), store.size) == (1, big.size)
    await store.forget(SessionKey("big"))
    assert (len(store), store.size) == (0, 0)


async def test_a_batch_read_before_the_postings_were_forgotten_is_refused(
    stores: tuple[PostingsStore, PostingsStore],
) -> None:
    """After `forget` (a delete, a patched message), a batch read before it is refused, whoever
    adds it; one read after it starts the postings anew."""
    a, b = stores
    sid = new_sid()
    before = time.time() - 1
    await a.add(sid, _batch(sid, 1, ["old words"]))
    await b.forget(sid)
    stale = pack([_turn(sid, 1, "old words")], [["old", "words"]], read_at=before)
    assert await a.add(sid, stale) == STALE
    assert (await b.read(sid, ["old"])).last_seq == 0
    fresh = pack([_turn(sid, 1, "new words")], [["new", "words"]], read_at=time.time() + 1)
    assert await a.add(sid, fresh) == 1
    assert set((await b.read(sid, ["old", "new"])).postings) == {"new"}


async def test_a_long_term_is_found_as_it_was_stored(stores: tuple[PostingsStore, PostingsStore]) -> None:
    """Terms are kept cut to 64 characters; a question's long term is cut the same way."""
    a, b = stores
    sid = new_sid()
    url = "https://example.com/" + "x" * 80
    await a.add(sid, _batch(sid, 1, [f"see {url}"]))
    assert [s for s, _ in search(await b.read(sid, [url]), [url], k=1)] == [1]


@pytest.mark.parametrize("stores", ["redis"], indirect=True)
async def test_full_postings_keep_their_ttl(stores: tuple[PostingsStore, PostingsStore]) -> None:
    """Postings marked full by a first batch past the bound expire like any others (and are
    added to no more)."""
    a, _ = stores
    sid = new_sid()
    big = _batch(sid, 1, [" ".join(f"w{n}" for n in range(400))])
    assert big.size > _BOUND
    assert await a.add(sid, big) == 0
    assert (await a.read(sid, ())).full
    assert isinstance(a, RedisPostings)
    ttl = await a._link.command("TTL", a._keys.recall(sid))
    assert isinstance(ttl, int)
    assert 0 < ttl <= 60


async def test_process_memory_keeps_no_entry_for_postings_that_do_not_start() -> None:
    """After a restart, appends past the session's start find no postings in process memory:
    they are refused without leaving an empty entry behind."""
    store = MemoryPostings(max_bytes=10_000, session_max_bytes=10_000)
    assert await store.add(SessionKey("s"), _batch(SessionKey("s"), 5, ["late append"])) == 0
    assert len(store) == 0


def test_batches_merged_are_the_batch_of_their_messages() -> None:
    """A catch-up packs its batch in parts, a text worker's call each: the parts merged are the
    batch packed whole (every term's entries in seq order, the messages, the counters), a stopped
    reply left out of both."""
    sid = new_sid()
    texts = ["order 4471 lisbon", "lisbon ships may", "order again", "maria order lisbon", "may 5th order"]
    messages = [_turn(sid, i + 1, t) for i, t in enumerate(texts)]
    messages[3] = _turn(sid, 4, texts[3], MessageStatus.STOPPED)
    whole = pack(messages, [t.split() for t in texts], read_at=2.0)
    parts = [messages[:2], messages[2:3], messages[3:]]
    at = [3.0, 2.0, 4.0]
    merged_batch = merged([pack(p, [m.content.split() for m in p], read_at=r) for p, r in zip(parts, at, strict=True)])
    assert merged_batch == whole
    assert [seq for seq, _tf, _n in ENTRY.iter_unpack(merged_batch.postings["order"])] == [1, 3, 5]
    assert sorted(merged_batch.messages) == [1, 2, 3, 5]


class _Words:
    """A tokenizer that splits on spaces, as a text worker's extractor is called."""

    def search_terms_of(self, texts: Sequence[str]) -> list[list[str]]:
        return [t.split() for t in texts]


def test_appends_packed_one_by_one_merge_into_the_batch_of_their_messages() -> None:
    """Appends are packed by a text worker a message each, read when each was committed, and
    merged on the event loop: the batch is the one packed whole, read when the first was."""
    sid = new_sid()
    texts = ["order 4471 lisbon", "lisbon ships may", "order again"]
    messages = [dataclasses.replace(_turn(sid, i + 1, t), created_at=5.0 + i) for i, t in enumerate(texts)]
    each = packed_each(_Words(), messages)
    assert [(b.first_seq, b.last_seq, b.read_at) for b in each] == [(1, 1, 5.0), (2, 2, 6.0), (3, 3, 7.0)]
    assert merged(each) == pack(messages, [t.split() for t in texts], read_at=5.0)


@pytest.fixture(params=["memory", "redis"])
async def budgeted(request: pytest.FixtureRequest) -> AsyncIterator[tuple[PostingsStore, int, Callable[[], int]]]:
    """A store whose tenants may hold two one-message sessions' postings, and all of them four;
    with the size of one such batch and what the store counts as held in all."""
    each = _batch(SessionKey("a/s"), 1, ["alpha beta gamma 0"]).size
    if request.param == "memory":
        memory = MemoryPostings(max_bytes=4 * each, session_max_bytes=100 * each, tenant_max_bytes=2 * each)
        yield memory, each, lambda: memory.size
        return
    servers: RealServers = request.getfixturevalue("real_servers")
    prefix = f"tmt{servers.run_id}{uuid.uuid4().hex[:6]}"
    tier = RedisHot.from_url(
        servers.redis_url,
        keys=Keys(prefix),
        timeout_s=1.0,
        summary_ttl_s=60,
        history_ttl_s=60,
        recent=_RECENT,
        recall_max_bytes=100 * each,
        recall_budget=RecallBudget(total=4 * each, tenant=2 * each),
    )
    plain = redis.Redis.from_url(servers.redis_url)

    def held() -> int:
        return int(plain.hget(f"{prefix}:{{recall-usage}}:totals", "*") or 0)

    yield tier.postings, each, held
    plain.close()
    await tier.aclose()
    redis_flush_prefix(servers.redis_url, prefix)


async def test_a_tenant_and_all_tenants_hold_postings_within_their_budget(
    budgeted: tuple[PostingsStore, int, Callable[[], int]],
) -> None:
    """Past its tenant's bound a tenant's least recently indexed session's postings go (its own,
    not another tenant's); past the total, anyone's least recent; the newest stays even alone
    over a bound. What is dropped is caught up later like postings lost with the hot tier."""
    store, each, held = budgeted
    order = ["a/s0", "a/s1", "a/s2", "b/s0", "b/s1", "c/s0"]
    for n, sid in enumerate(order):
        await store.add(SessionKey(sid), _batch(SessionKey(sid), 1, [f"alpha beta gamma {n}"]))
    indexed = {sid: (await store.read(SessionKey(sid), ())).last_seq for sid in order}
    # a/s0 went for a's bound when a/s2 came; a/s1 for the total when c/s0 came.
    assert indexed == {"a/s0": 0, "a/s1": 0, "a/s2": 1, "b/s0": 1, "b/s1": 1, "c/s0": 1}
    assert held() == 4 * each
    big = _batch(SessionKey("b/big"), 1, ["word " * 60 + "other " * 60])
    assert big.size > 4 * each
    await store.add(SessionKey("b/big"), big)
    assert (await store.read(SessionKey("b/big"), ())).last_seq == 1
    assert held() == big.size
    await store.add(SessionKey("a/s0"), _batch(SessionKey("a/s0"), 1, ["alpha beta gamma 0"]))
    assert (await store.read(SessionKey("a/s0"), ())).last_seq == 1
