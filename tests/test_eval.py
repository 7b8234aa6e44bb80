"""The memory-quality evaluation's parts that need no daemon: matching, baselines, the JSONL
format, the KdConv and CrossWOZ importers, chaining and probe placement, and the report."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tiered_memory.eval.baselines import BASELINES, newest_within
from tiered_memory.eval.command import shipped_set
from tiered_memory.eval.dataset import (
    INLINE_MIN_GAP,
    Conversation,
    DatasetError,
    Probe,
    chain,
    dump_jsonl,
    load_jsonl,
    read_crosswoz,
    read_kdconv,
)
from tiered_memory.eval.match import Haystack
from tiered_memory.eval.report import markdown, summarize
from tiered_memory.eval.runner import DAEMON, Result


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


def test_the_daemon_never_imports_the_evaluation() -> None:
    """The evaluation is a client of the daemon: serving a request loads none of it."""
    code = (
        "import sys, tiered_memory.app, tiered_memory.cli; "
        "sys.exit(any(m.startswith('tiered_memory.eval') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
