"""The cold answer of a session with no summary in either tier: whole messages of its opening and
of its end, bounded by characters, shown raw and labelled."""

from __future__ import annotations

from tiered_memory.model import Message, Role, SessionInfo, SessionKey, SummarySource
from tiered_memory.summarize.cold import ELISION, cold_digest, cold_slice
from tiered_memory.summarize.topics import TopicTagger


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


def _info(turns: int) -> SessionInfo:
    return SessionInfo(SessionKey("s"), None, turns, 2 * turns, created_at=1.0, last_activity=2.0, closed_at=None)


def _dialogue(turns: int) -> list[Message]:
    out = []
    for t in range(1, turns + 1):
        user = "I am Dana and I fly to Lisbon on May 5th." if t == 1 else f"Question number {t}?"
        out.append(Message(SessionKey("s"), 2 * t - 1, t, Role.USER, user, f"u{t}", 0.0))
        out.append(Message(SessionKey("s"), 2 * t, t, Role.ASSISTANT, f"Answer number {t}.", f"a{t}", 0.0))
    return out


def test_a_long_session_is_its_opening_and_its_end_raw() -> None:
    session = _dialogue(100)
    summary = cold_digest(
        _info(100),
        session[:24],
        session[-64:],
        tagger=TopicTagger({"city": ("Lisbon",)}),
        max_chars=300,
        through_turn=100,
    )
    assert summary is not None
    lines = summary.text.split("\n")
    assert lines[0] == "User: I am Dana and I fly to Lisbon on May 5th."
    assert ELISION in lines
    assert lines[-2:] == ["User: Question number 100?", "Assistant: Answer number 100."]
    assert len(summary.text) <= 300
    assert (summary.covered_turns, summary.version, summary.source) == (100, 0, SummarySource.DETERMINISTIC)
    assert summary.topics == ("Lisbon",)


def test_a_context_leaves_its_window_out() -> None:
    session = _dialogue(100)
    summary = cold_digest(_info(100), session[:24], session[-64:], tagger=TopicTagger(), max_chars=300, through_turn=97)
    assert summary is not None
    assert summary.text.endswith("Assistant: Answer number 97.")
    assert "number 98" not in summary.text
    assert summary.covered_turns == 97


def test_a_short_session_is_whole_and_one_that_the_window_holds_has_none() -> None:
    session = _dialogue(3)
    summary = cold_digest(_info(3), session, session, tagger=TopicTagger(), max_chars=1400, through_turn=3)
    assert summary is not None
    assert ELISION not in summary.text
    assert summary.text.count("\n") == 5
    assert cold_digest(_info(3), session, session, tagger=TopicTagger(), max_chars=1400, through_turn=0) is None


def test_a_lone_long_message_is_cut_to_the_budget() -> None:
    long = [Message(SessionKey("s"), 1, 1, Role.USER, "x" * 150, "u1", 0.0)]
    long.append(Message(SessionKey("s"), 2, 1, Role.ASSISTANT, "y" * 300, "a1", 0.0))
    summary = cold_digest(_info(1), long, long, tagger=TopicTagger(), max_chars=100, through_turn=1)
    assert summary is not None
    assert len(summary.text) <= 100


def test_the_gateways_events_are_listed_as_a_summary_lists_them() -> None:
    session = _dialogue(2)
    event = Message(SessionKey("s"), 5, 3, Role.SYSTEM, "call transferred to billing", "e1", 0.0)
    summary = cold_digest(
        _info(3), [*session, event], [*session, event], tagger=TopicTagger(), max_chars=1400, through_turn=3
    )
    assert summary is not None
    assert summary.text.endswith("\nEvents: call transferred to billing")
    assert "System" not in summary.text
