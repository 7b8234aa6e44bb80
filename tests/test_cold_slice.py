"""The cold extraction's read of a long session: whole messages of its opening and of its end,
bounded by characters."""

from __future__ import annotations

from tiered_memory.model import Message, Role, SessionKey
from tiered_memory.summarize.cold import cold_slice


def _messages(sizes: list[int], first_seq: int = 1) -> list[Message]:
    return [
        Message(SessionKey("s"), seq, (seq + 1) // 2, Role.USER if seq % 2 else Role.ASSISTANT, "x" * n, f"m{seq}", 0.0)
        for seq, n in enumerate(sizes, start=first_seq)
    ]


def test_a_third_from_the_opening_and_the_rest_from_the_end() -> None:
    session = _messages([10] * 100)
    read = cold_slice(session[:40], session[60:], max_chars=90)
    assert [m.seq for m in read] == [1, 2, 3, *range(95, 101)]


def test_one_message_each_side_even_when_longer_than_its_share() -> None:
    session = _messages([500] * 10)
    assert [m.seq for m in cold_slice(session[:5], session[5:], max_chars=300)] == [1, 10]


def test_the_end_starts_after_the_opening() -> None:
    session = _messages([10] * 8)
    read = cold_slice(session, session, max_chars=60)
    assert [m.seq for m in read] == [1, 2, 5, 6, 7, 8]
    assert len({m.seq for m in read}) == len(read)
