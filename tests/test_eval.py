"""The memory-quality evaluation's parts that need no daemon: matching, baselines, the JSONL
format, the KdConv, CrossWOZ and Topical-Chat importers, chaining and probe placement, and the
report."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.skips import TOPICALCHAT, required_file
from tiered_memory.eval.baselines import (
    BASELINES,
    bm25_question,
    bm25_terms,
    hybrid_compressed,
    hybrid_salient,
    newest_within,
)
from tiered_memory.eval.command import shipped_set
from tiered_memory.eval.dataset import (
    INLINE_MIN_GAP,
    SITTING_MIN_GAP,
    Conversation,
    DatasetError,
    Probe,
    chain,
    chain_sittings,
    dump_jsonl,
    load_jsonl,
    read_crosswoz,
    read_kdconv,
    read_topicalchat,
)
from tiered_memory.eval.friendsqa import read_friendsqa
from tiered_memory.eval.match import Haystack
from tiered_memory.eval.report import markdown, mean_message_chars, summarize
from tiered_memory.eval.runner import DAEMON, WITH_QUESTION, Result


def test_matching_normalizes_width_case_and_chinese_spaces() -> None:
    """Full-width digits match ASCII ones, case is ignored, Chinese ignores whitespace."""
    hay = Haystack("活力健 一盒 ３９８元，VitaBoost is great")
    assert hay.contains("398元")
    assert hay.contains("活力健一盒")
    assert hay.contains("vitaboost")
    assert not hay.contains("599元")
    assert not hay.contains("   ")


def test_english_matches_whole_words_only() -> None:
    hay = Haystack("Annual plan for Mr. Ann Lee, $39.99 twice a day")
    assert hay.contains("Ann Lee")
    assert hay.contains("ann  lee")
    assert not hay.contains("Ann L")
    assert not hay.contains("nual")
    assert hay.contains("$39.99")
    assert hay.contains_all(["twice a day", "Ann"])


def test_baselines_cut_to_the_budget_keeping_the_newest() -> None:
    turns = [(f"u{i}", f"a{i}") for i in range(1, 11)]
    assert newest_within(["abc", "defg"], 6) == "c\ndefg"
    assert newest_within(["abc"], 0) == ""
    assert BASELINES["last-3-turns"](turns, 100) == "u8\na8\nu9\na9\nu10\na10"
    assert BASELINES["last-8-messages"](turns, 100).split("\n")[0] == "u7"
    assert BASELINES["whole-transcript"](turns, 8) == "u10\na10"
    for baseline in BASELINES.values():
        assert len(baseline(turns, 7)) <= 7


_CHAT = "mostly reading and cooking at home"


def _old_and_new(old: str, chat: int = 10) -> list[tuple[str, str]]:
    """One old turn saying `old`, then `chat` turns of small talk."""
    return [(old, "ok"), *[(f"what else do you like {i * 'x'}", _CHAT) for i in range(chat)]]


def test_every_baseline_keeps_to_its_budget() -> None:
    turns = _old_and_new("We met Tom Brady in 1990, it was fun; the rest of the day was quiet")
    turns += [("你好，我叫王小明。价格398元", "好的，记住了")]
    for name, baseline in BASELINES.items():
        for budget in (0, 1, 7, 40, 90, 150, 300, 5000):
            assert len(baseline(turns, budget)) <= budget, (name, budget)


def test_hybrids_give_the_newest_text_priority() -> None:
    """A hybrid ends with the newest text in its share of the budget (75% or 60%), as the plain
    baseline would send it; what it keeps of older messages only comes before."""
    turns = _old_and_new("We met Tom Brady in 1990")
    newest = BASELINES["whole-transcript"]
    for hybrid, share in ((hybrid_salient, 0.75), (hybrid_compressed, 0.6)):
        for budget in (10, 60, 200, 400, 5000):
            assert hybrid(turns, budget).endswith(newest(turns, int(budget * share))), (hybrid, budget)
        assert "Brady" not in hybrid(turns, 60)


def test_hybrid_salient_adds_old_clauses_with_a_number_or_a_name() -> None:
    turns = _old_and_new("well, we met Tom Brady there, that was the year 1990; it was fun")
    text = hybrid_salient(turns, 200)
    assert "we met Tom Brady there\nthat was the year 1990\n" in text
    assert "it was fun" not in text
    assert "Brady" not in BASELINES["whole-transcript"](turns, 200)
    assert text.endswith(_CHAT)


def test_hybrid_compressed_drops_function_words_and_passes_chinese_through() -> None:
    turns = _old_and_new("The price of the ticket was 40 dollars and it was late", chat=3)
    assert hybrid_compressed(turns, 300).startswith("price ticket 40 dollars late\n")
    assert "The price" not in BASELINES["whole-transcript"](turns, 180)
    turns = _old_and_new("你好，我叫王小明。价格398元", chat=3)
    assert hybrid_compressed(turns, 250).startswith("你好，我叫王小明。价格398元\n")
    assert hybrid_salient(turns, 250).startswith("价格398元\n")


def test_jsonl_round_trip_and_errors(tmp_path: Path) -> None:
    conv = Conversation(
        "s1", "d", (("我叫王小明", "你好"), ("嗯", "好")), (Probe("end", 2, ("王小明",), 1, "我叫什么？"),)
    )
    path = tmp_path / "d.jsonl"
    dump_jsonl([conv], path)
    assert load_jsonl(path) == [conv]
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["probes"][0]["after_turn"] = 3
    path.write_text(json.dumps(doc, ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"d\.jsonl:1: probe after_turn 3"):
        load_jsonl(path)


def test_shipped_set_is_bilingual_long_and_probed_far_enough() -> None:
    """20-60 turns each, Chinese and English, every inline and reconnect probe >= 10 turns after
    its evidence, and the evidence really said at the turn the probe names."""
    convs = load_jsonl(shipped_set())
    assert {c.session.split("-")[0] for c in convs} == {"zh", "en"}
    for c in convs:
        assert 20 <= len(c.turns) <= 60, c.session
        assert {p.kind for p in c.probes} >= {"inline", "end"}, c.session
        for p in c.probes:
            said = Haystack("\n".join(c.turns[p.evidence_turn - 1]))
            assert said.contains_all(p.evidence), (c.session, p)
            if p.kind != "end":
                assert p.gap >= INLINE_MIN_GAP, (c.session, p)


def _kdconv(path: Path) -> None:
    dialogues = [
        {
            "messages": [
                {"message": f"知道{film}这部电影吗？"},
                {
                    "message": f"知道，导演是{director}。",
                    "attrs": [{"name": f"{film}（电影）", "attrname": "导演", "attrvalue": director}],
                },
            ]
            + [{"message": f"第{i}句闲聊。"} for i in range(24)]
        }
        for film, director in (("恋恋笔记本", "尼克·卡索维茨"), ("爱乐之城", "达米恩·查泽雷"))
    ]
    path.write_text(json.dumps(dialogues, ensure_ascii=False), encoding="utf-8")


def test_kdconv_import_chains_dialogues_and_places_probes(tmp_path: Path) -> None:
    """Facts come from attributes the utterance states; chained sessions get inline probes at
    >= 10 turns, a reconnect point, and an end probe; the question names the entity, not the value."""
    _kdconv(tmp_path / "film.json")
    dialogues = read_kdconv(tmp_path)
    assert len(dialogues) == 2
    assert dialogues[0].facts[0].evidence == "尼克·卡索维茨"
    assert dialogues[0].facts[0].question == "恋恋笔记本的导演是什么？"
    (conv,) = chain(dialogues, dataset="kdconv", per_session=2, sessions=1)
    assert len(conv.turns) == 26
    kinds = {p.kind for p in conv.probes}
    assert kinds == {"inline", "reconnect", "end"}
    for p in conv.probes:
        assert conv.turns[p.evidence_turn - 1][1] == f"知道，导演是{p.evidence[0]}。"
        if p.kind != "end":
            assert p.gap >= INLINE_MIN_GAP


def test_crosswoz_import_reads_the_zip(tmp_path: Path) -> None:
    doc = {
        "1": {
            "messages": [
                {"role": "usr", "content": "推荐一家餐馆。", "dialog_act": []},
                {
                    "role": "sys",
                    "content": "推荐讲礼驴肉馆，人均68元。",
                    "dialog_act": [["Inform", "餐馆", "名称", "讲礼驴肉馆"], ["Inform", "餐馆", "人均消费", "68元"]],
                },
            ]
        }
    }
    with zipfile.ZipFile(tmp_path / "val.json.zip", "w") as z:
        z.writestr("val.json", json.dumps(doc, ensure_ascii=False))
    (d,) = read_crosswoz(tmp_path / "val.json.zip")
    assert d.turns == [("推荐一家餐馆。", "推荐讲礼驴肉馆，人均68元。")]
    assert [(f.evidence, f.question) for f in d.facts] == [
        ("讲礼驴肉馆", "刚才说的那家餐馆叫什么？"),
        ("68元", "之前说的那个餐馆，人均消费是什么？"),
    ]


def _topicalchat(path: Path) -> None:
    """Two conversations in the Topical-Chat format: the first opens with an agent_2 greeting, has
    two agent_1 messages in a row and ends on an unanswered agent_1 message; "250" and "Packers"
    are said once, "Denver" twice."""

    def msg(agent: str, text: str) -> dict[str, str]:
        return {"agent": agent, "message": text, "sentiment": "Neutral"}

    chat = [m for i in range(10) for m in (msg("agent_1", f"what else do you like {i}"), msg("agent_2", _CHAT))]
    doc = {
        "t_b": {"content": [msg("agent_1", "Good morning"), msg("agent_2", "Morning"), *chat]},
        "t_a": {
            "content": [
                msg("agent_2", "Hello there!"),
                msg("agent_1", "Hi."),
                msg("agent_1", "Do you like football?"),
                msg("agent_2", "Yes, we drove 250 miles to see the Packers play."),
                msg("agent_1", "I was in Denver last year."),
                msg("agent_2", "My aunt lives in Denver too."),
                *chat,
                msg("agent_1", "Bye now"),
            ],
            "config": "A",
        },
    }
    path.write_text(json.dumps(doc), encoding="utf-8")


def test_topicalchat_import_merges_messages_and_keeps_the_roles(tmp_path: Path) -> None:
    """In id order; agent_1 is the user; consecutive messages of one agent are one message; a
    leading agent_2 message and a trailing unanswered agent_1 one are dropped."""
    _topicalchat(tmp_path / "valid_freq.json")
    first, second = read_topicalchat(tmp_path / "valid_freq.json")
    assert first.turns[0] == ("Hi. Do you like football?", "Yes, we drove 250 miles to see the Packers play.")
    assert first.turns[-1] == ("what else do you like 9", _CHAT)
    assert len(first.turns) == 12
    assert second.turns[0] == ("Good morning", "Morning")
    facts = {f.evidence: f for f in first.facts}
    assert {"250", "Packers", "Denver"} <= set(facts)
    assert facts["250"].turn == 1
    assert facts["250"].question == 'What was the "…" in: Yes, we drove … miles to see the Packers play?'
    assert facts["Packers"].question == 'What was the "…" in: Yes, we drove 250 miles to see the … play?'


def test_topicalchat_sittings_are_dated_and_probe_what_is_said_once(tmp_path: Path) -> None:
    """Each sitting opens with a later date stamp; a number and a name said once are probed, inline
    from 5 turns on, at the reconnect point (the sitting boundary) and at the end; a name said twice
    is not; no question gives its evidence away."""
    _topicalchat(tmp_path / "valid_freq.json")
    dialogues = read_topicalchat(tmp_path / "valid_freq.json")
    (conv,) = chain_sittings(dialogues, dataset="topicalchat", per_session=2, sessions=1)
    assert conv.turns[0][0] == "[Tue 2024-03-05] Hi. Do you like football?"
    assert conv.turns[12][0] == "[Fri 2024-03-08] Good morning"
    assert sum(u.startswith("[") for u, _ in conv.turns) == 2
    assert {p.evidence for p in conv.probes} == {("250",), ("Packers",)}
    assert {p.kind for p in conv.probes} == {"inline", "reconnect", "end"}
    assert {p.after_turn for p in conv.probes if p.kind == "reconnect"} == {12}
    inline = sorted(p.gap for p in conv.probes if p.kind == "inline" and p.evidence == ("250",))
    assert inline == [9, 11, 14, 19]
    for p in conv.probes:
        assert p.question is not None
        assert not Haystack(p.question).contains(p.evidence[0])
        assert "…" in p.question
        if p.kind != "end":
            assert p.gap >= SITTING_MIN_GAP
    assert chain_sittings(dialogues, dataset="topicalchat", per_session=3, sessions=1) == []


def test_the_real_topicalchat_file_makes_eight_probed_sessions() -> None:
    """The Topical-Chat file beside the project makes 8 sessions of 10 dated sittings, each with
    probes of every kind, of long messages."""
    path = required_file(TOPICALCHAT, "Topical-Chat data")
    convs = chain_sittings(read_topicalchat(path), dataset="topicalchat", per_session=10, sessions=8)
    assert len(convs) == 8
    for c in convs:
        assert sum(u.startswith("[") for u, _ in c.turns) == 10, c.session
        kinds = [p.kind for p in c.probes]
        assert all(kinds.count(k) > 0 for k in ("inline", "reconnect", "end")), c.session
    assert 80 < mean_message_chars(convs)["topicalchat"] < 200


def test_report_tables_and_targets() -> None:
    results = [
        Result("d", "s", "inline", DAEMON, 4000, 12, True),
        Result("d", "s", "inline", DAEMON, 4000, 150, False),
        Result("d", "s", "inline", "last-5-turns", 4000, 12, False),
        Result("d", "s", "inline", "last-5-turns", 4000, 150, False),
    ]
    summary = summarize(results, budgets=[4000])
    cells = {(r["method"], r["kind"]): (r["recall"], r["n"]) for r in summary["table"]}
    assert cells[(DAEMON, "inline>=10")] == (0.5, 2)
    gaps = {(r["method"], r["gap"]): r["recall"] for r in summary["by_gap"]}
    assert gaps[(DAEMON, "10-20")] == 1.0
    assert gaps[(DAEMON, "100+")] == 0.0
    g1 = next(t for t in summary["targets"] if t["target"].startswith("G1"))
    assert (g1["value"], g1["met"]) == (0.5, False)
    assert "| d | inline>=10 | daemon | 0.50 (2) |" in markdown(summary)


def _results(method: str, kind: str, budget: int, hits: int, of: int = 10) -> list[Result]:
    return [Result("d", "s", kind, method, budget, 20, i < hits) for i in range(of)]


def test_report_targets_against_the_newest_text_and_the_hybrids() -> None:
    """The daemon is held to the best of the newest text and the two hybrids, less 0.01; the
    "x times the newest text" targets are informational; a question must never lower end recall."""
    results = [
        *_results(DAEMON, "end", 1000, 6),
        *_results(WITH_QUESTION, "end", 1000, 5),
        *_results("whole-transcript", "end", 1000, 3),
        *_results("hybrid-salient", "end", 1000, 6),
        *_results("hybrid-compressed", "end", 1000, 4),
        *_results("last-5-turns", "end", 1000, 9),  # no longer a rival
    ]
    summary = summarize(results, budgets=[1000])
    summary["run"] = {"mean_message_chars": {"d": 97.25}}
    got = {t["target"]: t for t in summary["targets"]}
    best = got[">= best of newest text and hybrids - 0.01, end @ 1000"]
    assert (best["value"], best["bound"], best["met"]) == (0.6, 0.59, True)
    times = got["end >= 1.5x newest text @ 1000"]
    assert (times["bound"], times["met"], times["informational"]) == (pytest.approx(0.45), True, True)
    asked = got["question end >= 2x newest text @ 1000"]
    assert (asked["met"], asked["informational"]) == (False, True)
    hurts = got["question never hurts, end @ 1000"]
    assert (hurts["value"], hurts["bound"], hurts["met"], hurts["informational"]) == (0.5, 0.6, False, False)
    text = markdown(summary)
    assert "\n\n| dataset | mean message chars |\n|---|---|\n| d | 97.2 |\n" in text.split("### Recall")[0]
    assert "| question end >= 2x newest text @ 1000 | 0.500 | 0.600 | no (informational) |" in text
    assert "| question never hurts, end @ 1000 | 0.500 | 0.600 | NO |" in text


def test_the_daemon_never_imports_the_evaluation() -> None:
    """The evaluation is a client of the daemon: serving a request loads none of it."""
    code = (
        "import sys, tiered_memory.app, tiered_memory.cli; "
        "sys.exit(any(m.startswith('tiered_memory.eval') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_bm25_with_the_question_keeps_the_best_match_beside_the_newest_text() -> None:
    """The naive BM25 baseline: the newest text in half the budget, then the older message that
    matches the question best (function words dropped), within the budget."""
    turns = [(f"Filler line number {i} about nothing.", f"Sure, filler {i}.") for i in range(30)]
    turns[2] = ("Where is the rehearsal dinner?", "The rehearsal dinner is at Luigi's on Friday.")
    text = bm25_question(turns, 300, "Who hosts the rehearsal dinner?")
    assert len(text) <= 300
    assert "Luigi's" in text
    assert "Sure, filler 29." in text
    assert bm25_terms("Who hosts the 2 dinners 在北京") == ["hosts", "2", "dinners", "在北", "北京"]


def test_friendsqa_scenes_become_sessions_with_their_questions_at_the_end(tmp_path: Path) -> None:
    """Each utterance is a `Speaker: text` message (a stage note its text alone), roles
    alternating; a question is asked at the end when its shortest answer lies 10 or more
    messages back, that answer (trailing punctuation dropped) its evidence."""
    utterances = [{"uid": 0, "speakers": ["Ross Geller"], "utterance": "My son 's name is Jamie ."}]
    utterances += [{"uid": i, "speakers": ["Carol Willick"], "utterance": f"Line {i} ."} for i in range(1, 12)]
    utterances.append({"uid": 12, "speakers": ["#NOTE#"], "utterance": "( Ross leaves . )"})
    qas = [
        {"question": "What is Ross 's son called ?", "answers": [{"answer_text": "Jamie .", "utterance_id": 0}]},
        {"question": "What did Carol say last ?", "answers": [{"answer_text": "Line 11", "utterance_id": 11}]},
        {"question": "Who spoke first ?", "answers": [{"answer_text": "Ross Geller", "utterance_id": 0}]},
    ]
    scene = {"title": "s01", "paragraphs": [{"utterances:": utterances, "qas": qas}]}
    path = tmp_path / "friendsqa.json"
    path.write_text(json.dumps({"data": [scene, scene]}), encoding="utf-8")
    [conv] = read_friendsqa(path, per_session=2)
    assert conv.turns[0] == ("Ross Geller: My son 's name is Jamie .", "Carol Willick: Line 1 .")
    assert conv.turns[6][0] == "( Ross leaves . )"
    assert len(conv.turns) == 13  # 26 messages
    asked = sorted((p.question, p.evidence) for p in conv.probes)
    # The second scene's "Line 11" is 2 messages from the end: not asked; the first scene's is.
    assert asked == sorted(
        [
            ("What is Ross 's son called ?", ("Jamie",)),
            ("What is Ross 's son called ?", ("Jamie",)),
            ("What did Carol say last ?", ("Line 11",)),
            ("Who spoke first ?", ("Ross Geller",)),
            ("Who spoke first ?", ("Ross Geller",)),
        ]
    )
    assert all(p.kind == "end" and p.after_turn == 13 for p in conv.probes)
