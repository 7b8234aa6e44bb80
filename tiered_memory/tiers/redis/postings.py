"""Recall postings on Redis: one hash per session (`Keys.recall`), read by every replica.

The hash holds the counters (`last`, `docs`, `terms`, `size`, `full`) beside the `t:<term>` and
`d:<seq>` fields of postings.py. A batch is appended by one script, so that two replicas adding
the same messages (both saw the appends, or both caught up after a loss) add them once: the
second finds `last` moved and changes nothing. The hash lives HISTORY_TTL_SECONDS past its last
batch, like the recent list (a session that comes back later catches its postings up from SQL on
its first question), and goes with the session's other keys on delete.

Forgetting a session's postings (a deleted session) also sets its floor
(`Keys.recall_floor`, the time it happened, for HISTORY_TTL_SECONDS): a batch read from SQL or
committed before then is refused, so that a catch-up or an append indexed while the delete ran
never puts the old messages back. The times are the replicas' clocks: keep them in step (NTP).
A changed message (patched, taken back) sets the floor too, but drops the postings only when they
reach it, in the same script: a gateway finalizing its streaming reply every turn would otherwise
make the next question read the whole session back from SQL every turn.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tiered_memory.model import Message, SessionKey
from tiered_memory.tiers.postings import (
    STALE,
    PostingsBatch,
    PostingsRead,
    decode_doc,
    doc_field,
    term_field,
    term_key,
)
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.redis.link import RedisLink
from tiered_memory.tiers.redis.recall_usage import NO_BUDGET, RecallBudget, RecallLedger
from tiered_memory.tiers.redis.resp import Arg, Command, Script

# Appends one batch if it continues the postings. KEYS: the hash, the floor (when the postings
# were last forgotten). ARGV: first seq, last seq, answered messages, terms, bytes, the session's
# bound in bytes, TTL, when the batch was read, then field and value pairs (a `t:` value is
# appended to the field, a `d:` value set). Answers the last seq indexed after and the postings'
# size in bytes, or -1 for a batch read before the floor. Full postings take nothing more, and
# stay as long as they are added to.
_ADD_LUA = """
local floor = redis.call('GET', KEYS[2])
if floor and tonumber(ARGV[8]) < tonumber(floor) then return {-1, 0} end
local state = redis.call('HMGET', KEYS[1], 'last', 'full', 'size')
local last, size = tonumber(state[1] or '0'), tonumber(state[3] or '0')
if state[2] == '1' then
  redis.call('EXPIRE', KEYS[1], ARGV[7])
  return {last, size}
end
if last ~= tonumber(ARGV[1]) - 1 then return {last, size} end
if size + tonumber(ARGV[5]) > tonumber(ARGV[6]) then
  redis.call('HSET', KEYS[1], 'full', '1', 'last', last)
  redis.call('EXPIRE', KEYS[1], ARGV[7])
  return {last, size}
end
for i = 9, #ARGV - 1, 2 do
  local name, value = ARGV[i], ARGV[i + 1]
  if string.byte(name, 1) == 116 then
    local cur = redis.call('HGET', KEYS[1], name)
    if cur then value = cur .. value end
  end
  redis.call('HSET', KEYS[1], name, value)
end
redis.call('HINCRBY', KEYS[1], 'docs', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'terms', ARGV[4])
size = redis.call('HINCRBY', KEYS[1], 'size', ARGV[5])
redis.call('HSET', KEYS[1], 'last', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[7])
return {tonumber(ARGV[2]), size}
"""

# Forgets what a session's hot entry holds of a changed message, in one step. KEYS: the hash, the
# floor, then the other keys to delete. ARGV: now, the floor's TTL, the changed message's seq.
# Sets the floor, deletes the other keys, and deletes the hash if it reaches that seq (0: in any
# case); answers 1 when there was one and it went.
CHANGED_LUA = """
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
if #KEYS > 2 then redis.call('DEL', unpack(KEYS, 3)) end
local last = redis.call('HGET', KEYS[1], 'last')
if last and tonumber(last) < tonumber(ARGV[3]) then return 0 end
return redis.call('DEL', KEYS[1])
"""


def changed_args(
    keys: Keys, key: SessionKey, ttl_s: int, changed_seq: int, *, also: Sequence[str]
) -> tuple[list[str], list[Arg]]:
    """The keys and arguments of CHANGED_LUA: the session's message `changed_seq` changed in SQL;
    its postings go if they reach it, the keys `also` in any case, and a batch read before now is
    refused."""
    return [keys.recall(key), keys.recall_floor(key), *also], [repr(time.time()), ttl_s, changed_seq]


class RedisPostings:
    """PostingsStore on Redis, through the hot tier's link (its connection and breaker)."""

    def __init__(
        self, link: RedisLink, *, keys: Keys, ttl_s: int, session_max_bytes: int, budget: RecallBudget = NO_BUDGET
    ) -> None:
        """`budget` bounds all sessions' postings and each tenant's (tiers/redis/recall_usage.py)."""
        self._link = link
        self._ledger = RecallLedger(link, keys=keys, ttl_s=ttl_s, budget=budget) if budget.active else None
        self._keys = keys
        self._ttl = ttl_s
        self._session_max = session_max_bytes
        self._add = Script.of(_ADD_LUA)

    async def read(self, key: SessionKey, terms: Sequence[str], *, doc: int | None = None) -> PostingsRead:
        asked = list(dict.fromkeys(map(term_key, terms)))
        # The asked message's field first (absent: `last` again), then the terms'.
        head = ["last", "docs", "terms", "full", doc_field(doc) if doc is not None else "last"]

        async def op() -> PostingsRead:
            reply = await self._link.command("HMGET", self._keys.recall(key), *head, *map(term_field, asked))
            if not isinstance(reply, list) or len(reply) != len(head) + len(asked):
                raise TypeError("expected an array from HMGET")
            last, docs, total, full, kept = reply[: len(head)]
            postings = {t: v for t, v in zip(asked, reply[len(head) :], strict=True) if isinstance(v, bytes)}
            message = decode_doc(key, doc, kept) if doc is not None and isinstance(kept, bytes) else None
            return PostingsRead(_int(last), _int(docs), _int(total), full == b"1", postings, message)

        return await self._link.call(op)

    async def messages(self, key: SessionKey, seqs: Sequence[int]) -> dict[int, Message]:
        if not seqs:
            return {}

        async def op() -> dict[int, Message]:
            reply = await self._link.command("HMGET", self._keys.recall(key), *map(doc_field, seqs))
            if not isinstance(reply, list) or len(reply) != len(seqs):
                raise TypeError("expected an array from HMGET")
            return {s: decode_doc(key, s, v) for s, v in zip(seqs, reply, strict=True) if isinstance(v, bytes)}

        return await self._link.call(op)

    async def add(self, key: SessionKey, batch: PostingsBatch) -> int:
        args: list[Arg] = [
            batch.first_seq,
            batch.last_seq,
            batch.docs,
            batch.terms,
            batch.size,
            self._session_max,
            self._ttl,
            repr(batch.read_at),
        ]
        for term, data in batch.postings.items():
            args += [term_field(term), data]
        for seq, doc in batch.messages.items():
            args += [doc_field(seq), doc]

        async def op() -> tuple[int, int]:
            keys = [self._keys.recall(key), self._keys.recall_floor(key)]
            answer = await self._link.script(self._add, keys, args)
            if not (isinstance(answer, list) and len(answer) == 2 and all(isinstance(n, int) for n in answer)):
                raise TypeError("expected [last, size] from the postings script")
            return answer[0], answer[1]

        last, size = await self._link.call(op)
        if self._ledger is not None and last != STALE and size > 0:
            dropped = await self._ledger.record(key, size)
            if dropped:
                # Dropped, not forgotten: no floor, so that a later question catches them up.
                # One DEL each: the sessions' keys are in slots of their own on a cluster.
                await self._link.call(lambda: self._link.read(*[("DEL", self._keys.recall(k)) for k in dropped]))
        return last

    async def forget(self, key: SessionKey) -> None:
        async def op() -> object:
            return await self._link.read(*forget_commands(self._keys, key, self._ttl))

        await self._link.call(op)


def forget_commands(keys: Keys, key: SessionKey, ttl_s: int, *, also: Sequence[str] = ()) -> list[Command]:
    """The commands that forget a session's postings (and the keys `also`), in one round trip:
    the floor first, so that a batch read before now and arriving in between is refused, then
    the hash."""
    floor = ("SET", keys.recall_floor(key), repr(time.time()), "EX", ttl_s)
    return [floor, ("DEL", keys.recall(key), *also)]


def _int(value: object) -> int:
    return int(value) if isinstance(value, bytes) else 0
