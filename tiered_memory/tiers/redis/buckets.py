"""Token buckets on Redis (`Keys.rate`), drawn on by every replica: one script a request reads,
refills and draws the bucket with Redis's clock, so that the replicas' clocks never matter."""

from __future__ import annotations

from tiered_memory.settings import Rate
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.redis.link import RedisLink
from tiered_memory.tiers.redis.resp import Script

# KEYS: the bucket. ARGV: tokens a second, burst, the request's cost, '1' when it is owed (taken
# whatever the bucket holds). The bucket is kept until it would be full again (a bucket forgotten
# is full: kept for less, a debt would be forgiven). Answers the seconds to wait ('0': go),
# as text (a Lua number would come back truncated to an integer). The arithmetic is buckets.take's.
_TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1] or ARGV[2])
local at = tonumber(state[2] or now)
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local cost = tonumber(ARGV[3])
local need = math.min(cost, burst)
local wait = 0
if tokens >= need or ARGV[4] == '1' then tokens = tokens - cost else wait = (need - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.max(2, math.ceil((burst - tokens) / rate) + 2))
return tostring(wait)
"""


class RedisBuckets:
    """Buckets through the hot tier's link (its connection, timeout and breaker)."""

    def __init__(self, link: RedisLink, *, keys: Keys) -> None:
        self._link = link
        self._keys = keys
        self._take = Script.of(_TAKE_LUA)

    async def take(self, key: str, rate: Rate, cost: float = 1.0, *, owed: bool = False) -> float:
        async def op() -> float:
            args = [rate.per_second, rate.burst, cost, "1" if owed else "0"]
            answer = await self._link.script(self._take, [self._keys.rate(key)], args)
            return float(answer.decode() if isinstance(answer, bytes) else str(answer))

        return await self._link.call(op)
