"""The deterministic extractive summarizer: what it keeps, within what budget, and how it merges."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from tiered_memory.model import Message, Role, SessionKey
from tiered_memory.summarize.extractive import Extraction, Extractor

ZH_TURNS = [
    ("你好，我叫王小明，想了解一下你们的益生菌冻干粉。", "王先生您好！益生菌冻干粉是我们的明星产品，每盒30条。"),
    ("这个怎么吃？", "建议每天2次，每次1条，饭后用温水冲服，水温不要超过40度。"),
    ("多少钱一盒？", "单盒398元，现在买两盒送一盒。"),
    ("我不喜欢太甜的，有原味的吗？", "有原味的，不含蔗糖，口感比较清淡。"),
    ("好的，我考虑一下。", "没问题，有需要随时找我。"),
    ("对了，最近天气好热啊。", "是啊，这几天都挺热的，注意防暑。"),
    ("你平时喜欢看电影吗？", "我没有自己的喜好，不过可以给您推荐一些好评的电影。"),
    ("推荐一部喜剧吧。", "很多人喜欢轻松的家庭喜剧，周末和家人一起看正合适。"),
    ("周末想去爬山，有什么建议？", "记得带够水，穿舒适的运动鞋，早点出发避开人流。"),
    ("我家猫最近不爱吃饭。", "可能是天气热没胃口，可以观察一下，如果一直不吃建议带去看兽医。"),
    ("晚饭吃什么好呢？", "可以试试清淡的凉面或者蔬菜沙拉。"),
    ("哈哈好的，谢谢你。", "不客气，祝您生活愉快！"),
]
ZH_EVIDENCE = ("王小明", "益生菌冻干粉", "每天2次，每次1条", "398元", "不喜欢太甜")

EN_TURNS = [
    (
        "Hi, my name is Sarah Connor and I'm allergic to penicillin.",
        "Nice to meet you, Sarah. I'll keep the penicillin allergy in mind.",
    ),
    (
        "How much is the Omega-3 fish oil from NordicNaturals?",
        "The NordicNaturals Omega-3 bottle is $49.99 for 120 softgels.",
    ),
    ("What dose should I take?", "Take 200 mg twice a day with meals."),
    ("I prefer capsules without gelatin.", "We have a vegetarian capsule version at the same price."),
    ("ok thanks", "You're welcome!"),
    ("The weather has been lovely lately.", "Yes, it's a great time to be outside."),
    ("Any good podcast suggestions?", "Lots of people enjoy science and history shows."),
    ("I went hiking yesterday.", "That sounds fun! Hiking is great exercise."),
    ("My cat keeps knocking things over.", "Cats are curious; giving it toys may help."),
    ("What should I cook tonight?", "A simple pasta with vegetables is quick and tasty."),
    ("Sounds good.", "Enjoy your dinner!"),
    ("Bye for now.", "Goodbye, take care!"),
]
EN_EVIDENCE = ("Sarah Connor", "penicillin", "$49.99", "200 mg", "I prefer capsules", "How much is the Omega-3")


def conversation(turns: Sequence[tuple[str, str]], first_turn: int = 1) -> list[Message]:
    """User/assistant pairs as stored messages, turn numbers starting at `first_turn`."""
    messages: list[Message] = []
    for offset, (user, assistant) in enumerate(turns):
        turn = first_turn + offset
        for role, content in ((Role.USER, user), (Role.ASSISTANT, assistant)):
            seq = 2 * turn - (1 if role is Role.USER else 0)
            messages.append(Message(SessionKey("s1"), seq, turn, role, content, f"m{seq}", float(seq)))
    return messages


def last_messages_baseline(messages: Sequence[Message], max_chars: int) -> str:
    """What a memory without summaries would keep: the last 8 messages, cut to the same budget."""
    return "\n".join(m.content for m in messages[-8:])[:max_chars]


@pytest.fixture(scope="module")
def extractor() -> Extractor:
    # One instance for the module: jieba's dictionary load is the only slow step.
    return Extractor()


@pytest.mark.parametrize(
    ("turns", "evidence", "max_chars"),
    [(ZH_TURNS, ZH_EVIDENCE, 300), (EN_TURNS, EN_EVIDENCE, 400)],
    ids=["zh", "en"],
)
def test_early_facts_survive_where_the_last_messages_lose_them(
    extractor: Extractor, turns: list[tuple[str, str]], evidence: tuple[str, ...], max_chars: int
) -> None:
    """Names, doses, prices, preferences and questions of the first turns survive twelve turns of
    chit-chat, which the last-8-messages baseline of the same size has already dropped."""
    messages = conversation(turns)
    result = extractor.extract(messages, max_chars=max_chars)
    baseline = last_messages_baseline(messages, max_chars)
    assert len(result.text) <= max_chars
    for fact in evidence:
        assert fact in result.text, fact
        assert fact not in baseline, fact


def test_labels_follow_the_conversations_language(extractor: Extractor) -> None:
    """A mostly Chinese conversation gets Chinese labels, an English one English labels; the
    assistant's statements are marked as the assistant's."""
    zh = extractor.extract(conversation(ZH_TURNS)).text
    en = extractor.extract(conversation(EN_TURNS)).text
    assert "用户信息/偏好：" in zh
    assert "关键信息：" in zh
    assert "助手：单盒398元" in zh
    assert "User info/preferences: " in en
    assert "assistant: Take 200 mg twice day" in en  # English facts drop their function words


def test_preferences_inside_questions_and_transcripts_are_kept(extractor: Extractor) -> None:
    """A constraint said in the same message as a question, or deep inside a long comma-only voice
    transcript, is still filed under the user's preferences, ahead of everything else."""
    transcript = (
        "嗯那个我想问一下，就是我们下周三要去杭州玩，住西湖边上，一共四个人，两个大人两个孩子，"
        "然后我老婆对海鲜过敏，你看有什么餐厅推荐，预算一个人一百左右，最好离酒店近一点，晚上八点以后也能吃的那种"
    )
    assert len(transcript) > 80  # long enough to be re-cut into clauses
    messages = conversation(
        [
            ("成都有什么好吃的推荐吗？我不太能吃辣", "可以试试钟水饺、龙抄手，都可以做不辣的。"),
            (transcript, "西湖边的知味观和楼外楼都可以提前说明忌口。"),
            ("Which flight is cheaper? I'd rather not have more than one stop.", "The nonstop is $268."),
        ]
    )
    text = extractor.extract(messages, max_chars=240).text
    preferences = text.splitlines()[0]
    assert preferences.startswith("用户信息/偏好：")
    for fact in ("我不太能吃辣", "我老婆对海鲜过敏", "预算一个人一百左右", "I'd rather not have more than one stop"):
        assert fact in preferences, fact


def test_incremental_merge_keeps_both_batches_without_duplicates(extractor: Extractor) -> None:
    """Extracting turns 1-3, then turns 4-6 on top of the first result, keeps the facts of both
    batches; a fact repeated in the second batch is kept once."""
    first = extractor.extract(conversation(ZH_TURNS[:3]))
    repeated = [("还有别的优惠吗？", "单盒398元，现在买两盒送一盒。"), *ZH_TURNS[3:5]]
    second = extractor.extract(conversation(repeated, first_turn=4), previous_structured=first.structured)
    for fact in ("王小明", "每天2次，每次1条", "398元", "不喜欢太甜", "还有别的优惠吗"):
        assert fact in second.text, fact
    assert second.text.count("单盒398元") == 1
    texts = [item[4] for item in second.structured["items"]]
    assert len(texts) == len(set(texts))


def test_structured_survives_a_json_round_trip(extractor: Extractor) -> None:
    """`structured` is plain JSON, so the stored copy merges exactly like the in-memory one."""
    first = extractor.extract(conversation(EN_TURNS[:4]))
    stored = json.loads(json.dumps(first.structured))
    later = conversation(EN_TURNS[4:6], first_turn=5)
    assert extractor.extract(later, previous_structured=stored) == extractor.extract(
        later, previous_structured=first.structured
    )


def test_budget_holds_for_a_long_session_and_early_facts_stay(extractor: Extractor) -> None:
    """Two hundred messages full of numbers and names still render within max_chars, and the
    budget goes to the earliest facts rather than only the newest."""
    filler = [
        (f"第{day}天我在公园走了{day * 300}步，遇到了邻居李阿姨。", f"第{day}天走{day * 300}步很棒，继续保持！")
        for day in range(1, 98)
    ]
    messages = conversation([*ZH_TURNS[:3], *filler])
    assert len(messages) == 200
    for max_chars in (0, 1, 40, 200, 1400):
        result = extractor.extract(messages, max_chars=max_chars)
        assert len(result.text) <= max_chars
    result = extractor.extract(messages)
    for fact in ("王小明", "每天2次，每次1条", "398元"):
        assert fact in result.text, fact
    # Bounded: about 2 x max_chars of fact text, their JSON framing and 64 entities.
    assert len(json.dumps(result.structured, ensure_ascii=False)) < 8 * 1400


def test_previous_llm_summary_is_carried_forward(extractor: Extractor) -> None:
    """Without previous structured facts, an LLM's earlier summary leads the text, trimmed to at
    most half the budget, and stays there through later incremental merges."""
    earlier = "用户王小明咨询了益生菌冻干粉，助手说明每天2次、每次1条。" + "闲聊了天气和电影。" * 60
    new = conversation(ZH_TURNS[2:4], first_turn=3)
    first = extractor.extract(new, previous_text=earlier, max_chars=400)
    assert first.text.startswith("早前摘要：用户王小明咨询了益生菌冻干粉")
    assert len(first.text) <= 400
    assert "398元" in first.text
    later = extractor.extract(
        conversation(ZH_TURNS[4:6], first_turn=5), previous_structured=first.structured, max_chars=400
    )
    assert later.text.startswith("早前摘要：用户王小明咨询了益生菌冻干粉")


def test_foreign_structured_data_falls_back_to_previous_text(extractor: Extractor) -> None:
    """Structured data this extractor did not write is ignored rather than trusted."""
    result = extractor.extract(
        conversation(EN_TURNS[:1]),
        previous_structured={"facts": ["something an LLM wrote"]},
        previous_text="The user asked about shipping to Berlin.",
    )
    assert result.text.startswith("Earlier summary: The user asked about shipping to Berlin.")


def test_max_chars_must_not_be_negative(extractor: Extractor) -> None:
    """A negative budget is a caller's bug, reported rather than silently sliced."""
    with pytest.raises(ValueError, match="max_chars"):
        extractor.extract([], max_chars=-1)


def test_same_input_gives_the_same_output() -> None:
    """Two extractors, one of them run from several threads at once, give identical results."""
    messages = conversation([*ZH_TURNS, *EN_TURNS])
    expected = Extractor().extract(messages, max_chars=500)
    shared = Extractor()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results: list[Extraction] = list(pool.map(lambda _: shared.extract(messages, max_chars=500), range(8)))
    for result in results:
        assert result == expected
        assert json.dumps(result.structured) == json.dumps(expected.structured)


def test_topics_of_finds_entities_in_chinese_and_english(extractor: Extractor) -> None:
    """topics_of tags named entities of any text, most salient first, at most `limit`."""
    zh = extractor.topics_of("张医生建议王小明去北京协和医院复查，按时服用阿莫西林胶囊。")
    assert {"王小明", "北京协和医院", "阿莫西林"} <= set(zh)
    en = extractor.topics_of("Dr. Emily Chen at Mayo Clinic suggested an iPhone 15 Pro and a Fitbit Charge.")
    assert {"Emily Chen", "Mayo Clinic", "iPhone 15 Pro", "Fitbit Charge"} <= set(en)
    assert len(extractor.topics_of("。".join(ZH_TURNS[0]) * 5, limit=3)) <= 3


def test_extraction_topics_rank_the_conversations_entities(extractor: Extractor) -> None:
    """An extraction's topics are its recurring entities, at most ten."""
    result = extractor.extract(conversation(EN_TURNS))
    assert len(result.topics) <= 10
    assert {"Sarah Connor", "NordicNaturals"} <= set(result.topics)


def test_english_facts_leave_out_greetings_addresses_and_bare_stamps(extractor: Extractor) -> None:
    """Greetings, thanks, forms of address and a sitting's date stamp alone are no facts; a
    stamp stays when it dates what follows it; English facts lose their function words."""
    turns = [
        ("[Tue 2024-03-05] Hey Anna!", "Hi Tom! Thanks for calling."),
        ("Yeah Anna, so I finally booked the flight to Lisbon for April 5.", "Great, Tom! Which airline?"),
        ("TAP, flight TP 1351. Thanks Anna!", "Yeah Tom, noted."),
    ]
    text = extractor.extract(conversation(turns)).text
    for noise in ("Hey Anna", "Thanks Anna", "Yeah Tom", "Hi Tom"):
        assert noise not in text
    assert "Lisbon" in text
    assert "April 5" in text
    assert "TP 1351" in text
    assert "Key facts: " in text  # English labels for an English conversation
    assert " the flight" not in text


def test_the_subject_is_the_users_first_clause_that_names_something(extractor: Extractor) -> None:
    """Stored with the facts, carried through merges: what the session is about."""
    first = extractor.extract(conversation(ZH_TURNS[:2]))
    assert "益生菌冻干粉" in first.structured["subject"]
    later = extractor.extract(conversation(ZH_TURNS[2:6], first_turn=3), previous_structured=first.structured)
    assert later.structured["subject"] == first.structured["subject"]
    english = extractor.extract(conversation([("[Tue 2024-03-05] Hey Anna!", "Hi!"), *EN_TURNS[:2]]))
    assert "Sarah Connor" in english.structured["subject"]


def test_english_search_terms_are_stems_so_a_paraphrase_matches(extractor: Extractor) -> None:
    """Recall's terms put English words in their Snowball stem on both sides (postings and the
    question), so a question in another form of the word finds the message; numbers and
    Chinese words stay as they are, function words go."""
    ex = extractor
    said = set(ex.search_terms("They are waiting for the rehearsal dinner, and got married in 2019."))
    asked = set(ex.search_terms("Who waited at the rehearsals before they married?"))
    assert {"wait", "rehears", "marri"} <= said & asked
    assert "2019" in said
    assert "the" not in said
    assert "王小明" in ex.search_terms("王小明订了活力健")
