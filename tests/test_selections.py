"""The memo of the last selection per (session, budget) (selections.py): it answers only for the
same input, value for value, and any change the policy could see makes it choose again."""

from __future__ import annotations

import dataclasses
from typing import Any

from tiered_memory.model import Message, MessageStatus, Role, SessionKey
from tiered_memory.prompt.policy import Candidates
from tiered_memory.prompt.selections import SelectionMemo, fingerprint


def _messages(texts: list[str]) -> list[Message]:
    return [
        Message(SessionKey("s"), seq, (seq + 1) // 2, Role.USER if seq % 2 else Role.ASSISTANT, text, f"m{seq}", 0.0)
        for seq, text in enumerate(texts, 1)
    ]


_SAID = _messages(["We fly to Rome on May 3.", "Noted: Rome, May 3.", "Two seats, please.", "Booked 2 seats."])


def _candidates(messages: list[Message], **changes: Any) -> Candidates:
    # A copy of every message, as the next read decodes them: the memo compares values, not objects.
    copies = [dataclasses.replace(m) for m in messages]
    return dataclasses.replace(Candidates(messages=copies, whole=True, lang="en"), **changes)


def test_the_same_input_read_again_is_answered_from_the_memo() -> None:
    memo: SelectionMemo[str] = SelectionMemo()
    memo.put("s", 300, fingerprint(_candidates(_SAID), 300, ("v1",)), "chosen")
    assert memo.get("s", 300, fingerprint(_candidates(_SAID), 300, ("v1",))) == "chosen"


def test_anything_the_policy_sees_changed_is_chosen_again() -> None:
    memo: SelectionMemo[str] = SelectionMemo()
    memo.put("s", 300, fingerprint(_candidates(_SAID), 300, ("v1",)), "chosen")
    patched = [*_SAID[:-1], dataclasses.replace(_SAID[-1], content="Booked 3 seats.")]
    stopped = [*_SAID[:-1], dataclasses.replace(_SAID[-1], status=MessageStatus.INTERRUPTED)]
    retaken = [*_SAID[:-1], dataclasses.replace(_SAID[-1], message_id="other")]
    match = dataclasses.replace(_SAID[0], seq=9)
    changed = [
        fingerprint(_candidates([*_SAID, *_messages(["And a car?"])]), 300, ("v1",)),  # a new message
        fingerprint(_candidates(patched), 300, ("v1",)),  # an edit
        fingerprint(_candidates(stopped), 300, ("v1",)),  # a reply stopped
        fingerprint(_candidates(retaken), 300, ("v1",)),  # a take-back and another message at its seq
        fingerprint(_candidates(_SAID), 300, ("v2",)),  # a new summary, or another label
        fingerprint(_candidates(_SAID, matches=[(match, 1.0)]), 300, ("v1",)),  # a question's matches
        fingerprint(_candidates(_SAID, matches=[(match, 2.0)]), 300, ("v1",)),
        fingerprint(_candidates(_SAID, lang="zh"), 300, ("v1",)),
        fingerprint(_candidates(_SAID, whole=False), 300, ("v1",)),
        fingerprint(_candidates(_SAID, events=_messages(["[call transferred]"])), 300, ("v1",)),
    ]
    assert all(memo.get("s", 300, print_) is None for print_ in changed)
    assert len(set(changed)) == len(changed)
    # Another budget or another session is another entry.
    assert memo.get("s", 600, fingerprint(_candidates(_SAID), 600, ("v1",))) is None
    assert memo.get("t", 300, fingerprint(_candidates(_SAID), 300, ("v1",))) is None


def test_the_memo_keeps_the_latest_choice_of_each_session_and_budget() -> None:
    """One choice per (session, budget), and no more of them than hold `max_messages` messages
    in their fingerprints: the least recently used goes first."""
    memo: SelectionMemo[str] = SelectionMemo(max_messages=8)
    first = fingerprint(_candidates(_SAID), 300, ("v1",))
    assert first.messages == len(_SAID)
    memo.put("s", 300, first, "first")
    memo.put("s", 300, fingerprint(_candidates(_SAID), 300, ("v2",)), "second")
    assert memo.get("s", 300, first) is None
    assert memo.held == 4
    memo.put("t", 300, first, "t")
    assert memo.get("s", 300, fingerprint(_candidates(_SAID), 300, ("v2",))) == "second"  # now the newer
    memo.put("u", 300, first, "u")
    assert memo.get("t", 300, first) is None  # the least recently used went
    assert memo.get("s", 300, fingerprint(_candidates(_SAID), 300, ("v2",))) == "second"
    assert memo.get("u", 300, first) == "u"
    assert memo.held == 8
