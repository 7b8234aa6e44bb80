"""The policy of a user's memory across sessions (users.py), pure: how a profile grows from
summaries and stays bounded, which earlier session a new one is about, and how carried memory is
phrased within its room."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tiered_memory.model import SessionKey, Summary, SummarySource
from tiered_memory.prompt.users import (
    FACT,
    PREFERENCE,
    PROFILE_MAX_CHARS,
    TOPIC,
    Earlier,
    Profile,
    best_by_topic,
    carried_text,
    dump_profile,
    load_profile,
    merged,
    render_profile,
    user_key,
)

TEMPLATES = {
    "zh": "用户上次（{ago}）的对话摘要：{summary}",
    "en": "Summary of the user's previous conversation ({ago}): {summary}",
}


def summary(
    text: str = "s",
    *,
    facts: Sequence[str] = (),
    prefs: Sequence[str] = (),
    topics: tuple[str, ...] = (),
    at: float = 0.0,
) -> Summary:
    payload: dict[str, Any] = {"summary": text, "stable_facts": list(facts), "user_preferences": list(prefs)}
    return Summary(
        text=text,
        covered_turns=3,
        version=1,
        source=SummarySource.DETERMINISTIC,
        updated_at=0.0,
        created_at=0.0,
        topics=topics,
        structured={"payload": payload},
    )


def test_a_profile_counts_each_thing_once_per_session_that_said_it() -> None:
    first = summary(facts=["Order 7731 ships to Portland"], prefs=["prefers email"], topics=("Tokyo", "refund"))
    p = merged(Profile(), first, session="s1", now=10.0)
    # The session's next summary says the same again (and one thing more): counted once still.
    again = summary(facts=["Order 7731 ships to Portland", "budget 5000"], prefs=["Prefers e-mail!"], topics=("Tokyo",))
    p = merged(p, again, session="s1", now=20.0)
    p = merged(p, summary(topics=("tokyo", "visa"), prefs=["prefers email"]), session="s2", now=30.0)
    topics = {i.text.casefold(): i for i in p.of(TOPIC)}
    assert topics["tokyo"].count == 2
    assert topics["tokyo"].first_seen == 10.0
    assert topics["tokyo"].last_seen == 30.0
    assert topics["refund"].count == 1
    assert topics["visa"].count == 1
    facts = {i.text: i.count for i in p.of(FACT)}
    assert facts == {"Order 7731 ships to Portland": 1, "budget 5000": 1}
    # "prefers email" and "Prefers e-mail!" differ in a word's spelling: two items; the first twice.
    assert next((i.text, i.count) for i in p.of(PREFERENCE)) == ("prefers email", 2)
    assert p.sessions == 2
    assert p.updated_at == 30.0
    # Most frequent first: the profile renders what the user keeps coming back to at the top.
    assert p.of(TOPIC)[0].text.casefold() == "tokyo"
    assert load_profile(dump_profile(p)) == p


def test_two_sessions_summarized_in_turns_count_twice() -> None:
    """Two live sessions of one user, their cadence passes interleaved A, B, A, B, A, B: each thing
    they both say counts two sessions, not six."""
    p = Profile()
    for n in range(6):
        p = merged(p, summary(facts=["member 4417"], topics=("gym",)), session="ab"[n % 2], now=float(n))
    assert [(i.text, i.count) for i in p.items] == [("member 4417", 2), ("gym", 2)]
    assert p.sessions == 2


def test_a_profile_stays_within_its_bound_dropping_the_rare_and_old_first() -> None:
    p = Profile()
    for n in range(200):
        # One topic every session names, and a new fact of its own in each.
        s = summary(facts=[f"fact number {n} with some words to take room {n * 7}"], topics=("insurance",))
        p = merged(p, s, session=f"s{n}", now=float(n))
    for lang in ("en", "zh"):
        assert len(render_profile(p, lang)) <= PROFILE_MAX_CHARS
    kept = [i.text for i in p.of(FACT)]
    assert "fact number 199 with some words to take room 1393" in kept  # the newest stays
    assert not any(t.startswith("fact number 0 ") for t in kept)  # the oldest went first
    assert p.of(TOPIC)[0].text == "insurance"
    assert p.of(TOPIC)[0].count == 200
    assert p.sessions == 200


def test_a_rendered_profile_fits_any_room_by_leaving_out_the_least_said() -> None:
    p = merged(Profile(), summary(facts=["visa 12 days"], topics=("visa",)), session="a", now=1.0)
    p = merged(p, summary(facts=["hotel Kyoto Inn"], topics=("visa", "hotel")), session="b", now=2.0)
    whole = render_profile(p, "en")
    assert whole.splitlines()[0] == "[User profile]"
    assert "visa (2)" in whole
    smaller = render_profile(p, "en", len(whole) - 5)
    assert len(smaller) <= len(whole) - 5
    assert "visa" in smaller
    assert render_profile(p, "zh").startswith("[用户档案]\n关键信息：")
    assert render_profile(p, "en", 10) == ""


def test_the_earlier_session_named_by_the_new_one_is_carried() -> None:
    tokyo = Earlier(SessionKey("u/s1"), summary("Flight to Tokyo booked.", topics=("Tokyo", "flight")), 10.0)
    laptop = Earlier(SessionKey("u/s2"), summary("Laptop screen repair.", topics=("laptop", "screen repair")), 20.0)
    zh = Earlier(SessionKey("u/s3"), summary("活力健的剂量。", topics=("活力健", "剂量")), 5.0)
    newest_first = [laptop, tokyo, zh]
    assert best_by_topic(newest_first, "Any news about my flights to Tokyo?") is tokyo
    assert best_by_topic(newest_first, "The screen repair of my laptop is late") is laptop
    assert best_by_topic(newest_first, "活力健一天吃几次？") is zh
    assert best_by_topic(newest_first, "I want to open a bank account") is None
    # A word inside another is not the topic ("flight" is not named by "flightless").
    assert best_by_topic([tokyo], "a flightless bird") is None


def test_carried_memory_uses_the_reconnect_phrasing_within_its_room() -> None:
    earlier = Earlier(SessionKey("u/s1"), summary("用户订了去东京的机票，确认号 TK7731。用户偏好靠窗座位。"), 1000.0)
    p = merged(Profile(), summary(facts=["确认号 TK7731"], prefs=["素食"]), session="u/s1", now=1000.0)
    made = carried_text(earlier, p, room=400, now=1000.0 + 3 * 86400, lang="zh", templates=TEMPLATES)
    assert made.text.startswith("用户上次（3天前）的对话摘要：用户订了去东京的机票")
    assert made.earlier
    # The profile says only what the summary did not: 素食, not TK7731 again.
    assert made.profile
    assert "素食" in made.text
    assert made.text.count("TK7731") == 1
    for room in (0, 20, 40, 60, 90, 400):
        cut = carried_text(earlier, p, room=room, now=1000.0 + 7200, lang="en", templates=TEMPLATES)
        assert len(cut.text) <= room
        if cut.earlier:
            assert cut.text.startswith("Summary of the user's previous conversation (2 hours ago): ")


def test_a_users_key_is_exact() -> None:
    assert user_key("acme", "u1") != user_key("acme", "u1 ")
    assert user_key("acme", "u1") != user_key("", "u1") != user_key("acme/u1", "")
    assert len(user_key("t", "u")) == 64
