"""The budget policy (prompt/policy.py) and the condenser it uses: each rule of the policy is a
test here, on self-made conversations, with no store and no daemon."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from tiered_memory.eval.command import shipped_set
from tiered_memory.eval.dataset import load_jsonl
from tiered_memory.model import Message, Role, SessionKey
from tiered_memory.prompt.facts import render
from tiered_memory.prompt.memo import features
from tiered_memory.prompt.policy import ORIGINS, QUESTION_SHARE, Candidates, Selection, choose, lagging_digest
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.testing import ZH_12_TURNS
from tiered_memory.text.condense import clauses, condense, is_phatic, keys
from tiered_memory.text.quoting import frame_chars

_BUDGETS = (150, 200, 300, 600, 1000, 2000, 4000)


def _messages(turns: list[tuple[str, str]]) -> list[Message]:
    out: list[Message] = []
    for t, (user, assistant) in enumerate(turns, 1):
        for role, text in ((Role.USER, user), (Role.ASSISTANT, assistant)):
            seq = len(out) + 1
            out.append(Message(SessionKey("s"), seq, t, role, text, f"m{seq}", 0.0))
    return out


def _candidates(messages: list[Message], extractor: Extractor, lang: str) -> Candidates:
    extraction = extractor.extract(messages[:-2])

    def facts(room: int, before: int | None, by_rank: bool) -> str:
        body = render(extraction.structured, room - 10, before_turn=before, newest_first=not by_rank)
        return "[summary] " + body if body and room > 10 else ""

    return Candidates(
        messages=messages,
        whole=True,
        lang=lang,
        facts=facts,
        subject=str(extraction.structured.get("subject", "")),
    )


def _text(sel: Selection) -> str:
    return "\n".join([sel.system or "", *(m.content for m in sel.raw)])


@pytest.fixture(scope="module")
def extractor() -> Extractor:
    return Extractor()


def test_the_whole_conversation_raw_when_it_fits(extractor: Extractor) -> None:
    """When every message fits, they are all raw and nothing else is said."""
    messages = _messages(ZH_12_TURNS[:3])
    sel = choose(_candidates(messages, extractor, "zh"), 10_000)
    assert sel.system is None
    assert sel.raw == messages


def test_every_context_of_every_shipped_conversation_ends_with_its_last_turn_raw(extractor: Extractor) -> None:
    """The last completed turn is always there raw (cut to fit when needed, and marked), at every
    budget of 200 characters or more: a context with no raw turn is a bug. The budget holds."""
    for conv in load_jsonl(shipped_set()):
        messages = _messages(list(conv.turns))
        lang = "zh" if conv.session.startswith("zh") else "en"
        c = _candidates(messages, extractor, lang)
        for budget in (200, 300, 600, 1000, 2000, 4000):
            sel = choose(c, budget)
            used = len(sel.system or "") + sum(len(m.content) for m in sel.raw)
            assert used <= budget, (conv.session, budget)
            last_user, last_reply = messages[-2], messages[-1]
            assert [m.seq for m in sel.raw[-2:]] == [last_user.seq, last_reply.seq], (conv.session, budget)
            for shown, original in zip(sel.raw[-2:], (last_user, last_reply), strict=True):
                whole = shown.content == original.content
                assert whole or "…" in shown.content, (conv.session, budget)


def test_a_long_last_turn_is_cut_and_keeps_its_question() -> None:
    """A reply longer than the budget is cut at its end, its question stays whole beside it."""
    messages = _messages([("你好", "好的"), ("详细说说活力健？", "活力健" + "很好" * 400)])
    sel = choose(Candidates(messages=messages, whole=True, lang="zh"), 300)
    assert sel.raw[0].content == "详细说说活力健？"
    assert sel.raw[-1].content.endswith("…")
    assert sum(len(m.content) for m in sel.raw) <= 300


@pytest.mark.parametrize("budget", _BUDGETS)
def test_the_subject_survives_the_smallest_budget(extractor: Extractor, budget: int) -> None:
    """The product named only in turn 1 is in the context at every budget of 150 or more."""
    messages = _messages(ZH_12_TURNS)
    sel = choose(_candidates(messages, extractor, "zh"), budget)
    assert "活力健" in _text(sel), budget


def test_older_turns_are_condensed_when_that_reaches_further(extractor: Extractor) -> None:
    """Long English messages: the layout that reaches a fact 10 messages back wins over the
    newest raw text, which cannot hold it."""
    filler = "and honestly I was thinking about it the whole time while we were talking about it"
    turns = [
        (f"Day {i}: I went to the market with my friend, {filler}.", f"That sounds nice, {filler}.") for i in range(8)
    ]
    turns[2] = (f"My sister Marguerite moved to Winnipeg in 2019, {filler}.", f"Oh wow, {filler}.")
    messages = _messages(turns)
    sel = choose(_candidates(messages, extractor, "en"), 1000)
    text = _text(sel)
    for fact in ("Marguerite", "Winnipeg", "2019"):
        assert fact in text
    newest = "\n".join(m.content for m in messages)[-1000:]
    assert "Marguerite" not in newest


_FILLER = "and honestly I was thinking about it the whole time while we were talking about it"


def _day_turns() -> list[tuple[str, str]]:
    return [
        (f"Day {i}: I went to the market with my friend, {_FILLER}.", f"That sounds nice for day {i}, {_FILLER}.")
        for i in range(12)
    ]


def test_a_question_gives_its_matching_messages_room_first() -> None:
    """The older messages that match a question are shown whole, even when they hold no key (a
    plain-word answer: "the subway"), where the context without the question does not reach."""
    turns = _day_turns()
    turns[1] = ("How will we get to the museum tomorrow?", "We will take the subway, it is quicker than the bus.")
    messages = _messages(turns)
    plain = choose(Candidates(messages=messages, whole=True, lang="en"), 600)
    asked = choose(
        Candidates(messages=messages, whole=True, lang="en", matches=[(messages[2], 3.0), (messages[3], 1.5)]), 600
    )
    assert "subway" not in _text(plain)
    assert "We will take the subway, it is quicker than the bus." in _text(asked)
    assert [origin for origin, _ in asked.parts][-1] == "snippets"
    assert _joined_chars(asked) <= 600


def test_a_question_that_matches_nothing_costs_nothing() -> None:
    """No matching message: the context is the one without the question."""
    messages = _messages(_day_turns())
    plain = choose(Candidates(messages=messages, whole=True, lang="en"), 600)
    asked = choose(Candidates(messages=messages, whole=True, lang="en", matches=[]), 600)
    assert asked == plain


def test_the_matches_take_at_most_their_share_and_the_last_turn_stays_raw() -> None:
    """However many messages match, they claim at most QUESTION_SHARE of the room first, the
    layout fills the rest with the last turn raw, and a match is never the last turn again."""
    messages = _messages(_day_turns())
    older = messages[:-2]
    matches = [(m, 10.0 - i / 100) for i, m in enumerate([*reversed(older), messages[-1]])]
    sel = choose(Candidates(messages=messages, whole=True, lang="en", matches=matches), 1000)
    assert [m.seq for m in sel.raw][-2:] == [messages[-2].seq, messages[-1].seq]
    snippets = dict(sel.parts)["snippets"]
    assert messages[-1].content not in snippets
    room = 1000 - sum(len(m.content) for m in sel.raw)
    assert len(snippets) <= QUESTION_SHARE * room + len(messages[0].content)
    assert _joined_chars(sel) <= 1000


def test_a_long_match_that_cannot_fit_whole_keeps_its_beginning() -> None:
    """At a small budget a long matching message is shown cut at its end and marked, rather than
    left out: its beginning may hold the answer."""
    turns = _day_turns()
    long = "The rehearsal dinner is at Luigi's on Friday at eight, " + _FILLER + ", " + _FILLER
    turns[1] = ("Where is the rehearsal dinner?", long)
    messages = _messages(turns)
    sel = choose(Candidates(messages=messages, whole=True, lang="en", matches=[(messages[3], 3.0)]), 300)
    snippets = dict(sel.parts)["snippets"]
    assert "Luigi's on Friday" in snippets
    assert snippets.endswith("…")
    assert _joined_chars(sel) <= 300


def test_a_match_shown_raw_gives_its_place_to_the_next() -> None:
    """A matching message the layout shows raw is not repeated in the question's block: the
    next best match takes the room."""
    turns = [(f"Question {i} about trains?", f"Answer {i}: the train leaves at {i} o'clock.") for i in range(40)]
    messages = _messages(turns)
    shown_raw = messages[-4]
    sel = choose(
        Candidates(messages=messages, whole=True, lang="en", matches=[(shown_raw, 5.0), (messages[5], 4.0)]), 400
    )
    assert shown_raw.seq in {m.seq for m in sel.raw}
    snippets = dict(sel.parts)["snippets"]
    assert shown_raw.content not in snippets
    assert messages[5].content in snippets


def test_the_budget_counts_the_block_tags() -> None:
    """With the block's tags given as `frame`, the system text and the raw turns leave room for
    them: every character the daemon sends is within max_chars."""
    messages = _messages(_day_turns())
    systems = 0
    for budget in range(150, 1500, 50):
        sel = choose(Candidates(messages=messages, whole=True, lang="en", frame=frame_chars()), budget)
        systems += sel.system is not None
        assert _joined_chars(sel) + (frame_chars() if sel.system else 0) <= budget
    assert systems > 10


def _joined_chars(sel: Selection) -> int:
    return sum(len(m.content) for m in sel.raw) + len(sel.system or "")


def test_the_parts_are_the_system_text_by_origin(extractor: Extractor) -> None:
    """Every context's system text is its parts joined, each part from a known origin (what
    `explain=true` shows): the summary's facts, condensed turns, the subject, a question's
    snippets, the gateway's events; at every budget of every shipped conversation."""
    for conv in load_jsonl(shipped_set()):
        messages = _messages(list(conv.turns))
        lang = "zh" if conv.session.startswith("zh") else "en"
        c = _candidates(messages, extractor, lang)
        note = Message(SessionKey("s"), 0, 1, Role.SYSTEM, "call transferred to billing", "n0", 0.0)
        asked = dataclasses.replace(c, matches=[(messages[0], 2.0), (messages[1], 1.0)], events=[note])
        for candidates, budget in itertools.product((c, asked), (200, 600, 2000)):
            sel = choose(candidates, budget)
            assert "\n".join(text for _, text in sel.parts) == (sel.system or ""), (conv.session, budget)
            assert {origin for origin, _ in sel.parts} <= set(ORIGINS)
        assert {origin for origin, _ in choose(asked, 600).parts} >= {"events"}


def test_condense_keeps_names_numbers_and_content_words() -> None:
    """Function words and phatic clauses go; names (with their small words), numbers, negations
    and content words stay verbatim."""
    text = "Hey Anna! I love the Lord of the Rings, it was filmed in New Zealand in 1999. I don't eat fish."
    out = condense(text)
    for kept in ("Lord of the Rings", "New Zealand", "1999", "love", "don't", "fish"):
        assert kept in out
    assert "Anna" not in out
    assert len(out) < len(text) * 0.75
    assert condense("[Tue 2024-03-05] Hi! I bought a Honda Civic for $12,000.") == (
        "[Tue 2024-03-05] bought Honda Civic $12,000."
    )


@pytest.mark.parametrize(
    ("clause", "phatic"),
    [
        ("Hey Anna!", True),
        ("Thanks Tom", True),
        ("yeah lol", True),
        ("[Tue 2024-03-05]", True),
        ("嗯嗯，好的", True),
        ("I think Steve Carell was great", False),
        ("It costs 12 dollars", False),
        ("活力健每天2次", False),
    ],
)
def test_phatic_clauses(clause: str, phatic: bool) -> None:
    assert all(is_phatic(c) for c in clauses(clause)) is phatic


def test_keys_are_numbers_names_and_session_terms() -> None:
    """Keys are numbers (with their Chinese unit) and names; the session's terms and other content
    words are features of their own class."""
    assert keys("We met Tom Brady in 1999, said my iPhone") >= {"tom", "brady", "1999", "iphone"}
    assert keys("活力健每天2次") == {"2次"}
    found = features("活力健每天2次", frozenset({"活力"}))
    assert {"2次", "\x01活力", "\x00每天"} <= found


def test_summary_facts_do_not_displace_raw_turns_that_say_more() -> None:
    """Short turns, each naming something: the raw text reaches back further than any summary
    of it would say, so the context is raw turns (with their key points spilled behind them),
    not the facts."""
    turns = [(f"第{i}家店叫什么？", f"第{i}家店叫老王{i}号面馆。") for i in range(1, 80)]
    messages = _messages(turns)

    def facts(room: int, before: int | None, by_rank: bool) -> str:
        return "[历史对话摘要] 用户问了很多面馆。"[:room]

    sel = choose(Candidates(messages=messages, whole=True, lang="zh", facts=facts), 1000)
    assert sel.chars.get("facts", 0) == 0
    assert sel.chars["raw"] > 600
    shown = _text(sel)
    for i in range(70, 80):
        assert f"老王{i}号面馆" in shown


def test_the_lagging_turns_not_shown_lead_as_their_key_points() -> None:
    """The turns after the summary's and before the first one shown come as their key points
    (names, numbers), newest kept first when the room is short; none without such turns."""
    messages = _messages(ZH_12_TURNS[:8])
    c = Candidates(messages=messages, whole=True, lang="zh")
    shown = Selection(raw=messages[-4:], system=None, first_turn=7)
    digest = lagging_digest(c, shown, 3, 1000)
    assert digest.startswith("最近几轮：\n")
    for point in ("18度", "科幻片", "香山", "七点"):  # turns 4, 5, 6
        assert point in digest
    for point in ("398元", "2次", "防晒霜"):  # turns 3, 2 (covered) and 7 (shown)
        assert point not in digest
    short = lagging_digest(c, shown, 3, 60)
    assert 0 < len(short) <= 60
    assert short.split("\n")[-1] == digest.split("\n")[-1]
    assert lagging_digest(c, shown, 6, 1000) == ""
    assert lagging_digest(c, Selection(raw=[], system=None), 3, 1000) == ""
