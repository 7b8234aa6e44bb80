"""The one way to tolerate a tier being unavailable: count it and go on with a fallback.

Reads fall through to the next tier and background work leaves a cache behind when Redis or SQL
fails; every such place counts the failure by tier and operation
(`tiered_memory_tier_errors_total{tier,op}`), the figure the degraded-tier alerts watch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Iterator
from typing import Literal, TypeVar

from prometheus_client import Counter

from tiered_memory.errors import HotUnavailable, SqlUnavailable

T = TypeVar("T")
D = TypeVar("D")

TierName = Literal["hot", "sql"]


class TierErrors:
    """Counts a tier's failures by operation, and runs a call that may fail with a fallback."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter

    def count(self, tier: TierName, op: str) -> None:
        self._counter.labels(tier, op).inc()

    async def hot(self, op: str, call: Awaitable[T], fallback: D) -> T | D:
        """`call`'s result, or `fallback` (counted) when the hot tier is unavailable."""
        try:
            return await call
        except HotUnavailable:
            self.count("hot", op)
            return fallback

    async def sql(self, op: str, call: Awaitable[T], fallback: D) -> T | D:
        """`call`'s result, or `fallback` (counted) when SQL is unavailable."""
        try:
            return await call
        except SqlUnavailable:
            self.count("sql", op)
            return fallback

    @contextlib.contextmanager
    def counted(self, tier: TierName, op: str) -> Iterator[None]:
        """Count a failure of `tier` in the block and let it propagate: for a change the caller
        must hear failed (a retry of the request repeats it)."""
        failure = HotUnavailable if tier == "hot" else SqlUnavailable
        try:
            yield
        except failure:
            self.count(tier, op)
            raise
