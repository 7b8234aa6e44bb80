"""Context assembly: the raw window, alternation, and the character budget."""

from __future__ import annotations

from tiered_memory.context import (
    SUMMARY_PREFIX,
    ChatMessage,
    alternate,
    assemble,
    fit_recent,
    hot_window_complete,
    window,
)
from tiered_memory.model import Message, Role


def conv(n_turns: int, trailing_user: bool = False) -> list[Message]:
    out = []
    for t in range(1, n_turns + 1):
        out.append(Message("s", 2 * t - 1, t, Role.USER, f"u{t}", f"u{t}", 0.0))
        out.append(Message("s", 2 * t, t, Role.ASSISTANT, f"a{t}", f"a{t}", 0.0))
    if trailing_user:
        out.append(Message("s", 2 * n_turns + 1, n_turns + 1, Role.USER, "pending", "p", 0.0))
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
    msgs.insert(2, Message("s", 9, 2, Role.USER, "again", "x", 0.0))
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


def test_assemble_fits_the_budget_newest_first() -> None:
    """Total content stays within max_chars; the newest messages survive; the summary keeps up to
    half the budget and takes what the recent turns leave."""
    recent = [
        Message("s", 1, 1, Role.USER, "x" * 30, "1", 0.0),
        Message("s", 2, 1, Role.ASSISTANT, "y" * 30, "2", 0.0),
        Message("s", 3, 2, Role.USER, "z" * 30, "3", 0.0),
    ]
    out = assemble(SUMMARY_PREFIX + "s" * 200, recent, max_chars=100)
    assert sum(len(m.content) for m in out) <= 100
    assert out[0].role == "system"
    assert out[0].content.startswith(SUMMARY_PREFIX)
    assert out[-1].content == "z" * 30
    roomy = assemble(SUMMARY_PREFIX + "short", recent, max_chars=1000)
    assert roomy[0].content == SUMMARY_PREFIX + "short"
    assert len(roomy) == 4
    assert assemble(None, recent, max_chars=1000) == [ChatMessage(m.role.value, m.content) for m in recent]


def test_a_long_newest_reply_keeps_its_question() -> None:
    """When the newest reply alone exceeds the room, it is cut and its question kept beside it;
    what does not fit is returned as dropped (oldest first)."""
    msgs = conv(3)
    msgs[-1] = Message("s", 6, 3, Role.ASSISTANT, "答" * 3000, "a3", 0.0)
    kept, dropped = fit_recent(msgs, room=200)
    assert [m.role for m in kept] == [Role.USER, Role.ASSISTANT]
    assert kept[0].content == "u3"
    assert sum(len(m.content) for m in kept) <= 200
    assert kept[1].content.endswith("…")
    assert [m.content for m in dropped] == ["u1", "a1", "u2", "a2"]


def test_a_reply_whose_question_did_not_fit_counts_as_dropped() -> None:
    """A kept list never starts with a reply: one whose question did not fit is dropped with it."""
    msgs = conv(2)
    kept, dropped = fit_recent(msgs, room=len("a1") + len("u2") + len("a2"))
    assert [m.content for m in kept] == ["u2", "a2"]
    assert [m.content for m in dropped] == ["u1", "a1"]
