"""The bytes of recall postings Redis holds, in all and per tenant, bounded as the embedded tier
bounds its own: past RECALL_TOTAL_MAX_BYTES (or a tenant's TENANT_MAX_RECALL_BYTES) the least
recently indexed sessions' postings are dropped (the tenant's own for its bound), and the newest
stays even alone over a bound. Postings are a cache SQL rebuilds: a dropped session's next
question catches its postings up from SQL. Without the bound one tenant's sessions grow Redis to
its maxmemory, where every tenant's writes fail.

A ledger under one hash tag (one cluster slot), apart from the sessions' own keys: each
session's postings size as its add script last reported it (absolute, so that a lost or
repeated report heals at the next), when its hash expires, and the totals. A session hash that
goes (a delete, a changed message, its TTL) leaves its ledger entry to expire with it: for up to
HISTORY_TTL_SECONDS the ledger may count bytes that are gone, never fewer than are there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tiered_memory.model import SessionKey, key_tenant
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.redis.link import RedisLink
from tiered_memory.tiers.redis.resp import Script


@dataclass(frozen=True, slots=True)
class RecallBudget:
    """Bounds of all sessions' postings and of one tenant's, in bytes (0: none)."""

    total: int = 0
    tenant: int = 0

    @property
    def active(self) -> bool:
        return bool(self.total or self.tenant)


NO_BUDGET = RecallBudget()


# Records a session's postings size and drops the least recently indexed sessions past a bound.
# KEYS: the ages (zset: member → when its hash expires), the sizes (hash), the totals (hash:
# `*` for all, a tenant's name for its own), the member's tenant's ages (zset; the ages key when
# it has none). ARGV: member, its tenant ('' for none), its size, now, when it expires, the total
# bound, the tenant bound, the tenant ages' key prefix, how many expired entries to clear.
# A tenant's ages key is computed for the members it drops: it carries the same hash tag as the
# declared keys, so it is in their slot. Answers the members dropped.
_RECORD_LUA = """
local member, tenant, size = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, expires = tonumber(ARGV[4]), tonumber(ARGV[5])
local total_max, tenant_max, tenant_prefix = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local function tenant_of(m)  -- model.key_tenant
  local i = string.find(m, '/', 1, true)
  if i then return string.sub(m, 1, i - 1) end
  return ''
end
local function remove(m)
  local s = tonumber(redis.call('HGET', KEYS[2], m) or '0')
  local t = tenant_of(m)
  redis.call('HDEL', KEYS[2], m)
  redis.call('ZREM', KEYS[1], m)
  redis.call('HINCRBY', KEYS[3], '*', -s)
  if t ~= '' then
    redis.call('ZREM', tenant_prefix .. t, m)
    redis.call('HINCRBY', KEYS[3], 't:' .. t, -s)
  end
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[9]))) do
  remove(m)
end
local before = tonumber(redis.call('HGET', KEYS[2], member) or '0')
redis.call('HSET', KEYS[2], member, size)
redis.call('ZADD', KEYS[1], expires, member)
redis.call('HINCRBY', KEYS[3], '*', size - before)
if tenant ~= '' then
  redis.call('ZADD', KEYS[4], expires, member)
  redis.call('HINCRBY', KEYS[3], 't:' .. tenant, size - before)
end
local dropped = {}
local function shed(ages, field, bound)
  while bound > 0 and tonumber(redis.call('HGET', KEYS[3], field) or '0') > bound do
    local oldest = redis.call('ZRANGE', ages, 0, 1)
    local victim = oldest[1]
    if victim == member then victim = oldest[2] end
    if not victim then return end
    remove(victim)
    dropped[#dropped + 1] = victim
  end
end
if tenant ~= '' then shed(KEYS[4], 't:' .. tenant, tenant_max) end
shed(KEYS[1], '*', total_max)
return dropped
"""

# Expired entries cleared per record: a bounded amount of work per call, ahead of the adds.
_CLEAR_PER_CALL = 64


class RecallLedger:
    """The ledger on Redis, through the hot tier's link."""

    def __init__(self, link: RedisLink, *, keys: Keys, ttl_s: int, budget: RecallBudget) -> None:
        self._link = link
        self._keys = keys
        self._ttl = ttl_s
        self.budget = budget
        self._record = Script.of(_RECORD_LUA)
        tag = f"{keys.prefix}:{{recall-usage}}"
        self._ages, self._sizes, self._totals, self._tenant_prefix = (
            f"{tag}:ages",
            f"{tag}:sizes",
            f"{tag}:totals",
            f"{tag}:tenant:",
        )

    async def record(self, key: SessionKey, size: int) -> list[SessionKey]:
        """Record the session's postings `size`; the sessions whose postings must go to bring the
        totals under their bounds (the caller deletes their hashes)."""
        tenant = key_tenant(key)
        now = time.time()
        keys = [self._ages, self._sizes, self._totals, self._tenant_prefix + tenant if tenant else self._ages]
        args: list[str | int] = [
            key,
            tenant,
            size,
            repr(now),
            repr(now + self._ttl),
            self.budget.total,
            self.budget.tenant,
            self._tenant_prefix,
            _CLEAR_PER_CALL,
        ]

        async def op() -> list[SessionKey]:
            answer = await self._link.script(self._record, keys, args)
            if not isinstance(answer, list):
                raise TypeError("expected an array from the recall ledger script")
            return [SessionKey(m.decode() if isinstance(m, bytes) else str(m)) for m in answer]

        return await self._link.call(op)

    async def totals(self) -> dict[str, int]:
        """The totals as the ledger holds them: `*` for all, `t:<tenant>` for each tenant."""

        async def op() -> dict[str, int]:
            reply = await self._link.command("HGETALL", self._totals)
            if isinstance(reply, dict):
                pairs = list(reply.items())
            elif isinstance(reply, list):
                pairs = list(zip(reply[::2], reply[1::2], strict=True))
            else:
                raise TypeError("expected a map from HGETALL")
            return {_text(k): int(_text(v)) for k, v in pairs}

        return await self._link.call(op)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
