"""Context assembly: the raw window, alternation, and the character budget."""

from __future__ import annotations

from tiered_memory.model import Message, Role, SessionKey
from tiered_memory.prompt.context import (
    ChatMessage,
    ago,
    alternate,
    hot_list_whole,
    hot_window_complete,
    window,
)


def conv(n_turns: int, trailing_user: bool = False) -> list[Message]:
    out = []
    for t in range(1, n_turns + 1):
        out.append(Message(SessionKey("s"), 2 * t - 1, t, Role.USER, f"u{t}", f"u{t}", 0.0))
        out.append(Message(SessionKey("s"), 2 * t, t, Role.ASSISTANT, f"a{t}", f"a{t}", 0.0))
    if trailing_user:
        out.append(Message(SessionKey("s"), 2 * n_turns + 1, n_turns + 1, Role.USER, "pending", "p", 0.0))
    return out


def test_window_keeps_the_last_turns_and_the_one_in_progress() -> None:
    """The window is the last K completed turns plus a user message still awaiting its reply."""
    msgs = conv(5, trailing_user=True)
    got = window(msgs, turn_count=5, keep_recent_turns=2)
    assert [m.content for m in got] == ["u4", "a4", "u5", "a5", "pending"]
    assert window(msgs, turn_count=5, keep_recent_turns=0) == []


def test_alternate_starts_with_user_and_joins_runs() -> None:
    """Leading assistant messages are dropped; consecutive messages of one role are joined."""
    msgs = conv(2)[1:]
    msgs.insert(2, Message(SessionKey("s"), 9, 2, Role.USER, "again", "x", 0.0))
    assert alternate(msgs) == [
        ChatMessage("user", "u2\nagain"),
        ChatMessage("assistant", "a2"),
    ]


def test_hot_window_completeness() -> None:
    """The hot list is enough only if contiguous, current, and reaching back to the window start."""
    msgs = conv(6)
    assert hot_window_complete(msgs[-6:], message_count=12, turn_count=6, keep_recent_turns=3) is False
    assert hot_window_complete(msgs[-8:], message_count=12, turn_count=6, keep_recent_turns=3) is True
    assert hot_window_complete(msgs[-8:], message_count=13, turn_count=6, keep_recent_turns=3) is False
    gap = msgs[-8:-3] + msgs[-2:]
    assert hot_window_complete(gap, message_count=12, turn_count=6, keep_recent_turns=3) is False
    assert hot_window_complete(msgs[:4], message_count=4, turn_count=2, keep_recent_turns=3) is True
    assert hot_window_complete([], message_count=None, turn_count=None, keep_recent_turns=3) is False


def test_how_long_ago_in_minutes_hours_and_days() -> None:
    """Minutes under two hours, then hours under two days, then days; in each language."""
    cases = [(30, "1分钟前", "1 minute ago"), (90 * 60, "90分钟前", "90 minutes ago")]
    cases += [(2 * 3600, "2小时前", "2 hours ago"), (47 * 3600, "47小时前", "47 hours ago")]
    cases += [(3 * 86400, "3天前", "3 days ago"), (2 * 86400, "2天前", "2 days ago")]
    for seconds, zh, en in cases:
        assert (ago(seconds, "zh"), ago(seconds, "en")) == (zh, en), seconds


def test_a_hot_list_is_whole_from_the_first_message_to_the_count() -> None:
    """Whole: it starts at seq 1, ends at the count SQL reported, and lacks none between."""
    ms = [Message(SessionKey("s"), seq, (seq + 1) // 2, Role.USER, "x", f"m{seq}", 0.0) for seq in range(1, 5)]
    assert hot_list_whole(ms, message_count=4)
    assert not hot_list_whole(ms, message_count=5)
    assert not hot_list_whole(ms[1:], message_count=4)
    assert not hot_list_whole([ms[0], ms[2], ms[3]], message_count=4)
    assert not hot_list_whole([], message_count=0)
