"""Token buckets: how many requests a tenant or a token may make, refilled at a steady rate up to a
burst. The arithmetic is pure (`take`); the buckets live in the hot tier, so that every replica
draws on the same one (Redis: tiers/redis/buckets.py), or in process memory on the embedded default
(`MemoryBuckets`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tiered_memory.lru import Lru

_RATE = re.compile(r"(\d+(?:\.\d+)?)/(s|m)")
# The RATE_LIMITS entry of every tenant not named.
ANY_TENANT = "*"
# The text that counts one against a rate: far more than an utterance (a few hundred bytes).
TEXT_UNIT = 4096


@dataclass(frozen=True, slots=True)
class Rate:
    """Requests a second, and the burst a bucket holds when full (a second's worth, at least 1)."""

    per_second: float

    @property
    def burst(self) -> float:
        return max(1.0, self.per_second)


def parse_rate(text: str) -> Rate:
    """`200/s` or `600/m`; ValueError otherwise."""
    found = _RATE.fullmatch(text.strip())
    if found is None or float(found[1]) <= 0:
        raise ValueError(f"expected a rate such as 200/s or 600/m, got {text.strip()[:32]!r}")
    return Rate(float(found[1]) / (60.0 if found[2] == "m" else 1.0))


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
