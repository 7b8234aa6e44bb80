"""The structured summary payload: building it by rules, checking what an LLM returns, and
rendering it for planning.

    {"summary": str, "conversation_goal": str, "stable_facts": [...], "user_preferences": [...],
     "resolved_points": [...], "pending_questions": [...], "retrieval_hints": [...]}

Limits hold whoever wrote it: summary <= SUMMARY_MAX_CHARS, goal <= 120 characters, each list
<= 6 items of <= 80 characters. An LLM reply that is not such an object, that is empty or says
there is nothing to summarize, or that answers the user instead of summarizing, is rejected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tiered_memory.errors import LlmFailed
from tiered_memory.model import Message, Role

LIST_FIELDS = ("stable_facts", "user_preferences", "resolved_points", "pending_questions", "retrieval_hints")
MAX_ITEMS = 6
MAX_ITEM_CHARS = 80
MAX_GOAL_CHARS = 120

# Words that say nothing about what a conversation is about; never a retrieval hint.
_HINT_STOPWORDS = frozenset(
    {
        "请问",
        "帮我",
        "一下",
        "可以",
        "什么",
        "怎么",
        "这个",
        "那个",
        "你好",
        "谢谢",
        "麻烦",
        "hello",
        "thanks",
        "please",
    }
)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)
_NOTHING = re.compile(
    r"^(?:无|暂无|没有|n/?a|none)[。.!！]?$|(?:无需|没有|暂无)(?:可|需要)?(?:摘要|总结|可总结)|nothing to summari[sz]e"
    r"|no (?:new )?(?:information|content) to summari[sz]e",
    re.IGNORECASE,
)
# A summary speaks about "the user" and "the assistant"; an answer speaks to the user.
_ANSWER_OPENING = re.compile(
    r"^(?:您好|你好|亲|好的[，,！!]|当然|没问题|可以的|抱歉|对不起|hi\b|hello\b|sure\b|of course|certainly|"
    r"yes[,!]|no[,!]|i'm sorry|i am sorry|great question)",
    re.IGNORECASE,
)
_SECOND_PERSON = re.compile(r"您|你(?!们好)|\byou\b|\byour\b", re.IGNORECASE)
_THIRD_PERSON = re.compile(r"用户|助手|客户|\buser\b|\bassistant\b|\bcustomer\b", re.IGNORECASE)


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _items(values: Sequence[Any]) -> list[str]:
    out: list[str] = []
    for v in values:
        item = _clip(v, MAX_ITEM_CHARS)
        if item and item not in out:
            out.append(item)
    return out[:MAX_ITEMS]


def bounded(payload: Mapping[str, Any], *, max_chars: int) -> dict[str, Any]:
    """The payload with every limit enforced (text clipped, lists shortened, strings only)."""
    out: dict[str, Any] = {
        "summary": _clip(payload.get("summary") or "", max_chars),
        "conversation_goal": _clip(payload.get("conversation_goal") or "", MAX_GOAL_CHARS),
    }
    for name in LIST_FIELDS:
        raw = payload.get(name) or []
        out[name] = _items(raw if isinstance(raw, list) else [raw])
    return out


def looks_like_answer(text: str) -> bool:
    """A reply addressed to the user ("您好，活力健每天…") rather than a summary about them."""
    head = text.strip()[:200]
    if _ANSWER_OPENING.match(head):
        return True
    return bool(_SECOND_PERSON.search(head)) and not _THIRD_PERSON.search(head)


def _encodable(value: object) -> bool:
    # JSON can carry a lone surrogate ("\ud800"); no database or UTF-8 encoder takes it.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(text: str) -> str:
    """Reject a plain-text LLM summary that is not valid Unicode, is empty, says there is
    nothing to summarize, or answers the user; returns the text otherwise."""
    if not _encodable(text):
        raise LlmFailed("malformed", "reply holds invalid Unicode (a lone surrogate)")
    stripped = text.strip()
    if not stripped or _NOTHING.search(stripped):
        raise LlmFailed("empty", "nothing to summarize")
    if looks_like_answer(stripped):
        raise LlmFailed("answer", "the reply answers the user instead of summarizing")
    return stripped


def read_llm_payload(raw: str) -> dict[str, Any]:
    """The payload in an LLM reply (a JSON object, optionally in a Markdown fence), its shape
    checked but its limits not yet enforced: grounding reads it first (a number an 80-character
    clip cut short would read as another), then `bounded` clips it. Raises
    LlmFailed('malformed' | 'empty' | 'answer')."""
    try:
        doc = json.loads(_FENCE.sub("", raw.strip()))
    except ValueError as exc:
        raise LlmFailed("malformed", "reply is not JSON") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), str):
        raise LlmFailed("malformed", "reply is not an object with a summary string")
    if any(not isinstance(doc.get(f, []), list) for f in LIST_FIELDS):
        raise LlmFailed("malformed", "a list field is not a list")
    if not _encodable(doc):
        raise LlmFailed("malformed", "reply holds invalid Unicode (a lone surrogate)")
    check_text(doc["summary"])
    return doc


def rule_payload(
    *,
    text: str,
    structured: Mapping[str, Any],
    new: Sequence[Message],
    topics: Sequence[str],
    previous: Mapping[str, Any] | None,
    max_chars: int,
) -> dict[str, Any]:
    """The payload by rules, from the deterministic extractor's facts: the previous summary plus
    this batch's highlights; the goal from the latest user message; pending questions accumulated;
    retrieval hints from the salient keywords less a stop-word list."""
    prev = previous or {}
    items = structured.get("items") or []
    # items: [kind, speaker, rank, order, text] in order of first mention (facts.py).
    by_priority = sorted(items, key=lambda i: (i[2], i[3]))
    facts = [i[4] for i in by_priority if i[0] == "fact"]
    user_questions = [m.content for m in new if m.role is Role.USER and _is_question(m.content)]
    latest_user = next((m.content for m in reversed(new) if m.role is Role.USER), None)

    def earlier(name: str) -> list[str]:
        values = prev.get(name)
        return [str(v) for v in values] if isinstance(values, list) else []

    hints = [t for t in topics if t.lower() not in _HINT_STOPWORDS and len(t) > 1]
    payload = {
        "summary": text,
        "conversation_goal": latest_user or prev.get("conversation_goal") or "",
        # What was established stays first: early facts are what memory is for.
        "stable_facts": [
            *earlier("stable_facts"),
            *([i[4] for i in by_priority if i[0] == "fact" and i[1] != "assistant"] or facts),
        ],
        "user_preferences": [*earlier("user_preferences"), *(i[4] for i in by_priority if i[0] == "profile")],
        # The newest conclusions the assistant gave, and the newest open questions.
        "resolved_points": _newest(
            [*earlier("resolved_points"), *(i[4] for i in items if i[0] == "fact" and i[1] == "assistant")]
        ),
        "pending_questions": _newest([*earlier("pending_questions"), *user_questions]),
        "retrieval_hints": [*earlier("retrieval_hints"), *hints],
    }
    return bounded(payload, max_chars=max_chars)


def _newest(values: list[str]) -> list[str]:
    """The last MAX_ITEMS distinct values, oldest first."""
    out: list[str] = []
    for v in reversed(values):
        if v not in out:
            out.append(v)
        if len(out) == MAX_ITEMS:
            break
    return out[::-1]


def _is_question(text: str) -> bool:
    return bool(re.search(r"[？?]|吗|呢|什么|怎么|多少|哪|为什么|\b(?:what|how|which|when|where|why)\b", text, re.I))


def planning(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a planner or router needs from the payload."""
    return {
        "goal": payload.get("conversation_goal", ""),
        "facts": list(payload.get("stable_facts", [])),
        "pending_questions": list(payload.get("pending_questions", [])),
        "retrieval_hints": list(payload.get("retrieval_hints", [])),
    }


# A transcript line's speaker label: `用户：`, `Assistant: `.
_LABEL = re.compile(r"^[^\n:：]{1,16}(?:：|: )")


def newest_lines(transcript: str, room: int) -> str:
    """The transcript's newest whole lines that fit `room` characters, so that what is kept starts
    with a speaker's label; when even the newest line is longer, its label and its end, marked
    as cut."""
    lines = transcript.split("\n")
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = len(line) + (1 if kept else 0)
        if used + cost > room:
            break
        kept.append(line)
        used += cost
    if kept or room <= 0:
        return "\n".join(reversed(kept))
    line = lines[-1]
    found = _LABEL.match(line)
    label = found.group(0) if found and len(found.group(0)) < room - 1 else ""
    said = line[len(label) :]
    return label + "…" + said[len(said) - (room - len(label) - 1) :] if room - len(label) > 1 else line[-room:]


def planning_history(recent_transcript: str, payload: Mapping[str, Any] | None, *, max_chars: int) -> str:
    """About 65% recent transcript (at least half, its newest whole lines kept) and the rest
    structured facts."""
    recent_budget = min(max(max_chars // 2, round(max_chars * 0.65)), max_chars)
    recent = newest_lines(recent_transcript, recent_budget) if recent_transcript else ""
    structured_budget = max(0, max_chars - len(recent) - 2)
    if not payload or structured_budget == 0:
        return recent
    p = planning(payload)
    zh = bool(re.search(r"[\u3400-\u9fff]", json.dumps(p, ensure_ascii=False)))
    labels = ("目标", "事实", "待跟进", "检索提示") if zh else ("Goal", "Facts", "Pending", "Hints")
    sep = "；" if zh else "; "
    lines = [
        f"{labels[0]}：{p['goal']}" if zh else f"{labels[0]}: {p['goal']}",
        *(
            (f"{label}：" if zh else f"{label}: ") + sep.join(values)
            for label, values in zip(
                labels[1:], (p["facts"], p["pending_questions"], p["retrieval_hints"]), strict=True
            )
            if values
        ),
    ]
    structured = "\n".join(line for line in lines if not line.endswith(("：", ": ")))[:structured_budget]
    return f"{structured}\n\n{recent}" if recent and structured else structured or recent
