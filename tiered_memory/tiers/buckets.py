"""Token buckets: how many requests a tenant or a token may make, refilled at a steady rate up to a
burst. The arithmetic is pure (`take`); the buckets live in the hot tier, so that every replica
draws on the same one (Redis: redis_buckets.py), or in process memory on the embedded default
(`MemoryBuckets`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tiered_memory.lru import Lru

_RATE = re.compile(r"(\d+(?:\.\d+)?)/(s|m)")


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


def take(tokens: float, at: float, now: float, rate: Rate) -> tuple[float, float]:
    """A bucket of `tokens` last drawn on at `at`, drawn on at `now`: (tokens left, seconds to
    wait). The bucket refills at the rate up to its burst; a request takes one token, or, when
    there is none, nothing (it waits the time one takes to come)."""
    tokens = min(rate.burst, tokens + max(0.0, now - at) * rate.per_second)
    if tokens >= 1.0:
        return tokens - 1.0, 0.0
    return tokens, (1.0 - tokens) / rate.per_second


class Buckets(Protocol):
    async def take(self, key: str, rate: Rate) -> float:
        """Draw a request from the bucket `key` (full at first): 0.0 when it may go, else the
        seconds until it may. A backend that fails raises HotUnavailable."""
        ...


class MemoryBuckets:
    """Buckets in process memory (the embedded default: one process), the least recently drawn
    forgotten past `max_buckets` (a forgotten bucket is full again: generous, never stricter)."""

    def __init__(self, *, max_buckets: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets: Lru[str, tuple[float, float]] = Lru(max_buckets)
        self._clock = clock

    async def take(self, key: str, rate: Rate) -> float:
        now = self._clock()
        tokens, at = self._buckets.get(key) or (rate.burst, now)
        left, wait = take(tokens, at, now, rate)
        self._buckets.put(key, (left, now))
        return wait
