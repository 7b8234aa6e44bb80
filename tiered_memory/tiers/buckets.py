"""Token buckets: how many requests a tenant or a token may make, refilled at a steady rate up to a
burst. The arithmetic is pure (`take`); the buckets live in the hot tier, so that every replica
draws on the same one (Redis: tiers/redis/buckets.py), or in process memory on the embedded default
(`MemoryBuckets`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from tiered_memory.lru import Lru
from tiered_memory.settings import ANY_TENANT, Rate

# The text that counts one against a rate: far more than an utterance (a few hundred bytes).
TEXT_UNIT = 4096


def units(nbytes: int) -> int:
    """What `nbytes` of text count against a rate: one per started TEXT_UNIT, one at least."""
    return max(1, math.ceil(nbytes / TEXT_UNIT))


def tenant_bucket(tenant: str) -> str:
    """The key of a tenant's bucket ('' for the requests of none)."""
    return f"tenant:{tenant}"


def tenant_rate(rates: Mapping[str, Rate], tenant: str) -> Rate | None:
    """The tenant's RATE_LIMITS entry, else the `*` one, else none."""
    return rates.get(tenant, rates.get(ANY_TENANT))


def take(
    tokens: float, at: float, now: float, rate: Rate, cost: float = 1.0, *, owed: bool = False
) -> tuple[float, float]:
    """A bucket of `tokens` last drawn on at `at`, drawn on at `now` by a request that costs
    `cost` tokens: (tokens left, seconds to wait). The bucket refills at the rate up to its burst.
    A request goes when the bucket holds its cost, or is full when its cost is more than the burst
    (it would never go otherwise): it takes its whole cost, the bucket going into debt that the
    next requests wait out. A request that does not go takes nothing, and waits the time its cost
    (up to the burst) takes to come. `owed`: work already done, taken whatever the bucket holds
    (a negative cost, owed, gives back what a request took)."""
    tokens = min(rate.burst, tokens + max(0.0, now - at) * rate.per_second)
    need = min(cost, rate.burst)
    if tokens >= need or owed:
        return tokens - cost, 0.0
    return tokens, (need - tokens) / rate.per_second


class Buckets(Protocol):
    async def take(self, key: str, rate: Rate, cost: float = 1.0, *, owed: bool = False) -> float:
        """Draw a request of `cost` tokens from the bucket `key` (full at first): 0.0 when it may
        go, else the seconds until it may; `owed` takes the cost whatever the bucket holds (work
        done already). A backend that fails raises HotUnavailable."""
        ...


class MemoryBuckets:
    """Buckets in process memory (the embedded default: one process), the least recently drawn
    forgotten past `max_buckets` (a forgotten bucket is full again: generous, never stricter)."""

    def __init__(self, *, max_buckets: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets: Lru[str, tuple[float, float]] = Lru(max_buckets)
        self._clock = clock

    async def take(self, key: str, rate: Rate, cost: float = 1.0, *, owed: bool = False) -> float:
        now = self._clock()
        tokens, at = self._buckets.get(key) or (rate.burst, now)
        left, wait = take(tokens, at, now, rate, cost, owed=owed)
        self._buckets.put(key, (left, now))
        return wait
