"""When a session's summary is due: the cadence of SUMMARY_EVERY_N_TURNS, from
SUMMARY_START_TURNS on. Pure; the SQL form of the same rule is store.summary_due."""

from __future__ import annotations


def at_cadence_point(turn_count: int, *, every_n: int, start: int) -> bool:
    """Whether a session that just completed its turn `turn_count` is due a summary: a multiple
    of `every_n`, and at least `start` turns (no summary of a session shorter than that)."""
    return turn_count >= max(start, 1) and turn_count % every_n == 0


def past_cadence_point(turn_count: int, covered_turns: int, *, every_n: int, start: int) -> bool:
    """Whether a cadence point lies between the summary's `covered_turns` and `turn_count`."""
    return turn_count >= max(start, 1) and turn_count - turn_count % every_n > covered_turns
