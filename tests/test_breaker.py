"""The circuit breaker's state machine, on an injected clock."""

from __future__ import annotations

from tiered_memory.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _state(b: CircuitBreaker) -> BreakerState:
    # A call, so that mypy does not carry a narrowed state across the breaker's own changes.
    return b.state


def test_opens_after_consecutive_failures_and_refuses_until_reset() -> None:
    clock = Clock()
    changes: list[BreakerState] = []
    rejected: list[str] = []
    b = CircuitBreaker(
        "redis",
        failures=3,
        reset_s=5,
        clock=clock,
        on_change=lambda _n, s: changes.append(s),
        on_reject=rejected.append,
    )
    for _ in range(2):
        assert b.allow()
        b.failure()
    assert b.allow()
    b.success()  # a success in between resets the count
    for _ in range(3):
        assert b.allow()
        b.failure()
    assert _state(b) is BreakerState.OPEN
    clock.now = 4.9
    assert not b.allow()
    assert rejected == ["redis"]
    assert changes == [BreakerState.OPEN]


def test_one_probe_after_reset_closes_or_reopens() -> None:
    clock = Clock()
    b = CircuitBreaker("sql", failures=1, reset_s=5, clock=clock)
    b.failure()
    clock.now = 5.0
    assert b.allow()  # the probe
    assert _state(b) is BreakerState.HALF_OPEN
    assert not b.allow()  # only one at a time
    b.failure()
    assert _state(b) is BreakerState.OPEN
    clock.now = 9.9
    assert not b.allow()
    clock.now = 10.0
    assert b.allow()
    b.success()
    assert _state(b) is BreakerState.CLOSED
    assert b.allow()


def test_a_probe_that_never_reports_does_not_wedge_the_breaker() -> None:
    clock = Clock()
    b = CircuitBreaker("llm", failures=1, reset_s=5, clock=clock)
    b.failure()
    clock.now = 5.0
    assert b.allow()  # probe, then its task is cancelled and reports nothing
    clock.now = 9.0
    assert not b.allow()
    clock.now = 10.0
    assert b.allow()
