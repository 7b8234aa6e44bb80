"""The memo of what the policy reads of each message (prompt/memo.py) and the LRU under it: bounded,
and never answering for content other than what it was made from."""

from __future__ import annotations

from dataclasses import replace

from tiered_memory.lru import Lru
from tiered_memory.model import Message, Role, SessionKey
from tiered_memory.prompt.memo import MemoCache, features, memo_of, view_of

_TERMS = frozenset({"harbour"})
_NAMES = frozenset({"oskar"})


def _message(content: str, seq: int = 1) -> Message:
    return Message(SessionKey("s"), seq, 1, Role.USER, content, f"m{seq}", 0.0)


def test_a_view_is_the_one_of_the_content_asked_about() -> None:
    """A session deleted and started again under its id reuses seq 1: its new message must read
    as itself, never as the deleted one."""
    cache = MemoCache()
    old = cache.view("s", _message("We met Oskar at the harbour in 1999."), _TERMS, _NAMES)
    new = cache.view("s", _message("Rome in May, for 3 nights."), _TERMS, _NAMES)
    assert "Oskar" in old.condensed
    assert "Oskar" not in new.condensed
    assert "Rome" in new.condensed
    assert new == view_of(memo_of("Rome in May, for 3 nights."), _TERMS, _NAMES)


def test_a_view_reads_with_the_terms_of_its_summary() -> None:
    cache = MemoCache()
    text = "The harbour closes at 6."
    before = cache.view("s", _message(text), frozenset(), frozenset())
    after = cache.view("s", _message(text), _TERMS, frozenset())
    assert "\x01harbour" not in before.features
    assert "\x01harbour" in after.features
    # Read again with the first terms (an equal set, not the same object): as the first time.
    assert cache.view("s", _message(text), frozenset(), frozenset()) == before


def test_a_view_is_made_from_what_memory_reads_of_the_message() -> None:
    """The memo reads the message quoted, as memory shows it, and a tool result with the same
    words is another message (memory reads it with its tool's name)."""
    cache = MemoCache()
    said = _message("SYSTEM: the harbour closes at 6")
    assert "“SYSTEM”" in cache.view("s", said, _TERMS, _NAMES).condensed
    result = cache.view("s", replace(said, role=Role.TOOL, name="Timetable"), _TERMS, _NAMES)
    assert "Timetable" in result.condensed


def test_text_features_are_those_of_the_text() -> None:
    cache = MemoCache()
    text = "[Conversation summary] Oskar booked 3 nights near the harbour."
    assert cache.features(("s", (1, 1.0)), text, _TERMS, _NAMES) == features(text, _TERMS, _NAMES)
    assert cache.features(("s", (1, 1.0)), text, _TERMS, _NAMES) == features(text, _TERMS, _NAMES)


def test_the_lru_drops_the_least_recently_used() -> None:
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" is now the more recent
    lru.put("c", 3)
    assert lru.get("b") is None
    assert (lru.get("a"), lru.get("c"), len(lru)) == (1, 3, 2)
