"""A circuit breaker: stop paying a dependency's timeout on every call while it is down.

After `failures` consecutive failures the breaker opens and every call is refused at once (the
caller takes its fallback: SQL instead of Redis, the deterministic summarizer instead of the LLM,
503 instead of a write). After `reset_s` one call is let through as a probe; its success closes
the breaker, its failure opens it for another `reset_s`. A probe that never reports (its task was
cancelled) does not wedge the breaker: after another `reset_s` the next call probes again.

Single event loop, no awaits inside: the state changes are atomic without a lock.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class BreakerState(enum.IntEnum):
    """Exported as a gauge value, so the numbers are part of the metric's meaning."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Counts consecutive failures of one dependency and refuses calls while it is open."""

    def __init__(
        self,
        name: str,
        *,
        failures: int,
        reset_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, BreakerState], None] | None = None,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        if failures < 1 or reset_s <= 0:
            raise ValueError("a breaker needs failures >= 1 and reset_s > 0")
        self.name = name
        self._threshold = failures
        self._reset_s = reset_s
        self._clock = clock
        self._on_change = on_change
        self._on_reject = on_reject
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._since = 0.0  # when the breaker opened, or when the current probe started

    @property
    def state(self) -> BreakerState:
        return self._state

    def allow(self) -> bool:
        """Whether a call may go to the dependency now. A True while open or half-open makes
        this call the probe; it must be followed by `success()` or `failure()`."""
        if self._state is BreakerState.CLOSED:
            return True
        now = self._clock()
        if now - self._since >= self._reset_s:
            self._since = now
            self._set(BreakerState.HALF_OPEN)
            return True
        if self._on_reject is not None:
            self._on_reject(self.name)
        return False

    def success(self) -> None:
        self._consecutive = 0
        if self._state is not BreakerState.CLOSED:
            self._set(BreakerState.CLOSED)

    def failure(self) -> None:
        self._consecutive += 1
        if self._state is BreakerState.HALF_OPEN or self._consecutive >= self._threshold:
            self._since = self._clock()
            self._set(BreakerState.OPEN)

    def _set(self, state: BreakerState) -> None:
        if state is self._state:
            return
        self._state = state
        if self._on_change is not None:
            self._on_change(self.name, state)
