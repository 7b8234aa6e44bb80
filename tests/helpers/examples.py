"""How much Hypothesis tries: the settings of the property tests."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def bounded(max_examples: int) -> settings:
    """Derandomized, no example database, no deadline (CI machines are shared and slow)."""
    return settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=max_examples,
        suppress_health_check=[HealthCheck.too_slow],
    )
