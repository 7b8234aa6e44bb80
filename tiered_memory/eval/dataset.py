"""Evaluation conversations: the JSONL format, importers for KdConv, CrossWOZ and Topical-Chat, and
chaining short dialogues into sessions long enough for a budget to bite.

One JSON object per line:

    {"session": "med-zh-01", "dataset": "bilingual",
     "turns": [{"user": "...", "assistant": "..."}, ...],
     "probes": [{"kind": "inline" | "reconnect" | "end", "after_turn": 14,
                 "evidence": ["活力健"], "evidence_turn": 2, "question": "刚才那个产品叫什么？"}]}

`after_turn` is the number of completed turns replayed when the context is asked for (turns count
from 1); `evidence_turn` the turn that stated the evidence; every evidence string must be in the
context for the probe to count as recalled. Importers read only the annotations (KdConv `attrs`,
CrossWOZ `dialog_act`) to make probes: the daemon sees utterance text only. Topical-Chat has no
fact annotations: its facts are the numbers and names in the text that a session says only once.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiered_memory.eval.match import Haystack, normalize, word_pattern
from tiered_memory.eval.text import STOPWORDS, sentences

KINDS = ("inline", "reconnect", "end")
INLINE_MIN_GAP = 10
# Probes happen on a grid of turns, so that one context read serves every probe at that point.
PROBE_STEP = 5
# Gaps at which an imported fact is asked about again inline: each gap bucket gets probes.
INLINE_GAPS = (10, 15, 30, 60, 120, 200)
# Topical-Chat messages are long (about 100 characters): five turns (ten messages) already make a
# gap worth asking across.
SITTING_GAPS = (5, 10, 15, 30, 60)
SITTING_MIN_GAP = 5


@dataclass(frozen=True, slots=True)
class Probe:
    kind: str
    after_turn: int
    evidence: tuple[str, ...]
    evidence_turn: int
    question: str | None = None

    @property
    def gap(self) -> int:
        return self.after_turn - self.evidence_turn


@dataclass(frozen=True, slots=True)
class Conversation:
    session: str
    dataset: str
    turns: tuple[tuple[str, str], ...]
    probes: tuple[Probe, ...] = ()


@dataclass(frozen=True, slots=True)
class Fact:
    """Something stated at `turn` that a later question may need: its evidence and that question."""

    turn: int
    evidence: str
    question: str


@dataclass(slots=True)
class _Dialogue:
    turns: list[tuple[str, str]] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)


class DatasetError(ValueError):
    """A file that is not in the expected format; the message names the file and the line."""


# --- the JSONL format -----------------------------------------------------------------------


def load_jsonl(path: Path, *, dataset: str | None = None) -> list[Conversation]:
    out = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(_conversation(json.loads(line), dataset or path.stem))
            except (ValueError, KeyError, TypeError) as exc:
                raise DatasetError(f"{path}:{number}: {exc}") from None
    return out


def _conversation(doc: dict[str, Any], default_dataset: str) -> Conversation:
    turns = tuple((str(t["user"]), str(t["assistant"])) for t in doc["turns"])
    probes = []
    for p in doc.get("probes", []):
        if p["kind"] not in KINDS:
            raise ValueError(f"probe kind {p['kind']!r}: expected one of {KINDS}")
        after = int(p["after_turn"])
        if not 0 < after <= len(turns):
            raise ValueError(f"probe after_turn {after}: expected 1..{len(turns)}")
        evidence = tuple(str(e) for e in p["evidence"])
        if not evidence or not all(e.strip() for e in evidence):
            raise ValueError("probe evidence: expected non-empty strings")
        probes.append(Probe(p["kind"], after, evidence, int(p["evidence_turn"]), p.get("question")))
    return Conversation(str(doc["session"]), str(doc.get("dataset", default_dataset)), turns, tuple(probes))


def dump_jsonl(conversations: Iterable[Conversation], path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for c in conversations:
            doc = {
                "session": c.session,
                "dataset": c.dataset,
                "turns": [{"user": u, "assistant": a} for u, a in c.turns],
                "probes": [
                    {
                        "kind": p.kind,
                        "after_turn": p.after_turn,
                        "evidence": list(p.evidence),
                        "evidence_turn": p.evidence_turn,
                        **({"question": p.question} if p.question else {}),
                    }
                    for p in c.probes
                ],
            }
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")


# --- importers --------------------------------------------------------------------------------

_BRACKETS = re.compile(r"[（(].*?[）)]")
_TRIVIAL = frozenset({"", "none", "是", "否", "无", "有", "yes", "no"})
_MAX_EVIDENCE_CHARS = 24


def _usable(value: str, text: str, question: str) -> bool:
    """Evidence worth asking for: short, not trivial, said verbatim, and not given away by the question."""
    v = value.strip()
    if normalize(v) in _TRIVIAL or not 2 <= len(v) <= _MAX_EVIDENCE_CHARS:
        return False
    return Haystack(text).contains(v) and not Haystack(question).contains(v)


def read_kdconv(folder: Path) -> list[_Dialogue]:
    """KdConv `{film,music,travel}.json` (or any *.json there): dialogues of alternating speakers,
    the first taken as the user. Facts are knowledge triples whose value the utterance states."""
    dialogues = []
    files = sorted(folder.glob("*.json")) if folder.is_dir() else [folder]
    for path in files:
        for doc in json.loads(path.read_text(encoding="utf-8")):
            msgs = doc["messages"]
            d = _Dialogue()
            for i in range(0, len(msgs) - 1, 2):
                d.turns.append((msgs[i]["message"], msgs[i + 1]["message"]))
                for m in msgs[i : i + 2]:
                    for attr in m.get("attrs", []):
                        name, key, value = attr.get("name", ""), attr.get("attrname", ""), attr.get("attrvalue", "")
                        if key == "Information" or not name or not key:
                            continue
                        question = f"{_BRACKETS.sub('', name).strip()}的{key}是什么？"
                        if _usable(value, m["message"], question):
                            d.facts.append(Fact(len(d.turns), value.strip(), question))
            if d.turns:
                dialogues.append(d)
    return dialogues


def read_crosswoz(path: Path) -> list[_Dialogue]:
    """CrossWOZ `val.json` or `val.json.zip`: user/system turns; facts are the names, phone
    numbers, addresses, prices and other values an `Inform`/`Recommend` act states."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            name = next(n for n in z.namelist() if n.endswith(".json"))
            data = json.loads(z.read(name).decode("utf-8"))
    else:
        data = json.loads(path.read_text(encoding="utf-8"))
    dialogues = []
    for key in sorted(data, key=lambda k: int(k) if k.isdigit() else 0):
        msgs = data[key]["messages"]
        d = _Dialogue()
        i = 0
        while i + 1 < len(msgs):
            if msgs[i]["role"] != "usr" or msgs[i + 1]["role"] != "sys":
                i += 1
                continue
            d.turns.append((msgs[i]["content"], msgs[i + 1]["content"]))
            for m in msgs[i : i + 2]:
                for intent, domain, slot, value in m.get("dialog_act", []):
                    if intent not in ("Inform", "Recommend") or slot in ("none", "") or not isinstance(value, str):
                        continue
                    if slot == "名称":
                        question = f"刚才说的那家{domain}叫什么？"
                    else:
                        question = f"之前说的那个{domain}，{slot}是什么？"
                    if _usable(value, m["content"], question):
                        d.facts.append(Fact(len(d.turns), value.strip(), question))
            i += 2
        if d.turns:
            dialogues.append(d)
    return dialogues


def read_topicalchat(path: Path) -> list[_Dialogue]:
    """Topical-Chat `valid_freq.json` (conversation id -> {"content": [{"agent", "message"}, ...]}),
    in sorted id order. `agent_1` is the user, `agent_2` the assistant; consecutive messages of one
    agent are joined by a space (whitespace squeezed); a leading `agent_2` message and a trailing unanswered `agent_1`
    one are dropped. Facts are `text_facts` of each message; which of them a session says only
    once is for `chain_sittings` to decide."""
    data = json.loads(path.read_text(encoding="utf-8"))
    dialogues = []
    for key in sorted(data):
        merged: list[tuple[str, str]] = []
        for m in data[key]["content"]:
            text = " ".join(m["message"].split())
            if not text:
                continue
            if merged and merged[-1][0] == m["agent"]:
                merged[-1] = (m["agent"], f"{merged[-1][1]} {text}")
            elif merged or m["agent"] == "agent_1":
                merged.append((m["agent"], text))
        d = _Dialogue()
        # Merged, the agents alternate from agent_1: pairs are turns, and a last agent_1 alone drops.
        for (_, user), (_, assistant) in zip(merged[::2], merged[1::2], strict=False):
            d.turns.append((user, assistant))
            for text in (user, assistant):
                d.facts.extend(Fact(len(d.turns), e, q) for e, q in text_facts(text))
        if d.turns:
            dialogues.append(d)
    return dialogues


_NUMBER_EDGES = "$£€#([{\"'“‘.,!?;:)]}”’…"
_WORD = re.compile(r"(?<![\w'’])[^\W\d_][\w'’&-]*")
_CONTRACTION = re.compile(r"(?:n['’]t|['’](?:s|m|ve|ll|d|re))$", re.IGNORECASE)
_CLAUSE_OPENERS = '.!?;,:"“(…-—'


def text_facts(text: str) -> Iterator[tuple[str, str]]:
    """(evidence, question) for what one message states, from its text alone: numbers (a token
    with a digit, "$200" -> "200") and names (a run of capitalised words, not opening a clause,
    none of them a STOPWORD, of 3 letters or more: "ESPN", "Tom Brady"). The question is the
    sentence that says it with the evidence masked, so it recalls the moment without the answer."""
    found = [tok.strip(_NUMBER_EDGES) for tok in text.split() if any(c.isdigit() for c in tok)]
    found += _names(text)
    for evidence in dict.fromkeys(found):
        pattern = word_pattern(evidence, re.IGNORECASE)
        sentence = next((s for s in sentences(text) if pattern.search(s)), text)
        question = f'What was the "…" in: {pattern.sub("…", sentence).rstrip(".!?")}?'
        if _usable(evidence, text, question):
            yield evidence, question


def _names(text: str) -> list[str]:
    runs: list[tuple[bool, list[str]]] = []  # (opens the message or a clause, its words)
    joins_at = -1  # where a capitalised word must start to extend the last run
    for word in _WORD.finditer(text):
        base = _CONTRACTION.sub("", word.group())  # "Brady's" -> "Brady", "I'm" -> "I"
        if not word.group()[0].isupper() or base.casefold() in STOPWORDS:
            joins_at = -1
            continue
        if word.start() == joins_at and text[joins_at - 1] == " ":
            runs[-1][1].append(base)
        else:
            before = text[: word.start()].rstrip()
            runs.append((not before or before[-1] in _CLAUSE_OPENERS, [base]))
        joins_at = word.end() + 1 if base == word.group() else -1  # a possessive ends the name
    # A run that opens a clause may be only a capital letter: no name is taken from it.
    named = (" ".join(words) for opens, words in runs if not opens)
    return [n for n in named if sum(c.isalpha() for c in n) >= 3]


# --- chaining and probes ------------------------------------------------------------------------


def chain(dialogues: Sequence[_Dialogue], *, dataset: str, per_session: int, sessions: int) -> list[Conversation]:
    """Consecutive dialogues joined `per_session` at a time into `sessions` long sessions, with
    probes placed by `place_probes`."""
    out = []
    for n, group in enumerate(_groups(dialogues, per_session, sessions)):
        turns: list[tuple[str, str]] = []
        facts: list[Fact] = []
        for d in group:
            facts.extend(Fact(f.turn + len(turns), f.evidence, f.question) for f in d.facts)
            turns.extend(d.turns)
        out.append(Conversation(f"{dataset}-{n:03d}", dataset, tuple(turns), tuple(place_probes(turns, facts))))
    return out


_FIRST_SITTING = dt.date(2024, 3, 5)
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # not %a: that follows the locale


def chain_sittings(
    dialogues: Sequence[_Dialogue], *, dataset: str, per_session: int, sessions: int
) -> list[Conversation]:
    """Like `chain`, for conversations that read as sittings of one long relationship
    (Topical-Chat): each sitting's first user message opens with a date stamp ("[Tue 2024-03-05] "),
    2 to 4 days after the previous sitting's; evidence said other than exactly once in the session
    (stamps included, so a number a stamp also shows is dropped) is no fact; inline probes from
    SITTING_GAPS; the reconnect point is the sitting boundary nearest two thirds of the session."""
    out = []
    for n, group in enumerate(_groups(dialogues, per_session, sessions)):
        turns: list[tuple[str, str]] = []
        facts: list[Fact] = []
        ends: list[int] = []
        day = _FIRST_SITTING
        for i, d in enumerate(group):
            day += dt.timedelta(days=2 + i % 3 if i else 0)
            facts.extend(Fact(f.turn + len(turns), f.evidence, f.question) for f in d.facts)
            (user, assistant), *rest = d.turns
            turns.append((f"[{_WEEKDAYS[day.weekday()]} {day.isoformat()}] {user}", assistant))
            turns.extend(rest)
            ends.append(len(turns))
        said = Haystack("\n".join(m for pair in turns for m in pair))
        once = [f for f in facts if said.count(f.evidence) == 1]
        reconnect = min(ends[:-1] or ends, key=lambda e: (abs(3 * e - 2 * len(turns)), e))
        probes = place_probes(turns, once, gaps=SITTING_GAPS, min_gap=SITTING_MIN_GAP, reconnect_at=reconnect)
        out.append(Conversation(f"{dataset}-{n:03d}", dataset, tuple(turns), tuple(probes)))
    return out


def _groups(dialogues: Sequence[_Dialogue], per_session: int, sessions: int) -> Iterator[Sequence[_Dialogue]]:
    """`sessions` runs of `per_session` consecutive dialogues, fewer when the dialogues run out."""
    for n in range(sessions):
        group = dialogues[n * per_session : (n + 1) * per_session]
        if len(group) < per_session:
            return
        yield group


def last_mention(turns: Sequence[tuple[str, str]], evidence: Sequence[str], *, through: int) -> int:
    """The last turn <= `through` whose text holds every evidence string (0 when none does): a fact
    repeated later is only as old as its last repetition."""
    for t in range(through, 0, -1):
        u, a = turns[t - 1]
        if Haystack(u + "\n" + a).contains_all(evidence):
            return t
    return 0


def place_probes(
    turns: Sequence[tuple[str, str]],
    facts: Sequence[Fact],
    *,
    gaps: Sequence[int] = INLINE_GAPS,
    min_gap: int = INLINE_MIN_GAP,
    reconnect_at: int | None = None,
) -> Iterator[Probe]:
    """For each fact: inline probes `gaps` turns later (on the PROBE_STEP grid), a reconnect probe
    at `reconnect_at` (default: two thirds of the session, on the grid) and an inline one at the
    same point, and an end probe. Gaps are counted from the fact's last mention, and an inline or
    reconnect probe needs at least `min_gap` turns; duplicates are dropped."""
    n = len(turns)
    if reconnect_at is None:
        reconnect_at = max(PROBE_STEP, (2 * n // 3) // PROBE_STEP * PROBE_STEP)
    seen: set[tuple[str, int, str]] = set()
    for f in facts:
        points = {("inline", _on_grid(f.turn + g)) for g in gaps}
        points |= {("inline", reconnect_at), ("reconnect", reconnect_at), ("end", n)}
        for kind, at in sorted(points, key=lambda p: (p[1], p[0])):
            if at > n or (kind, at, f.evidence) in seen:
                continue
            said = last_mention(turns, (f.evidence,), through=at)
            if said == 0 or (kind != "end" and at - said < min_gap):
                continue
            seen.add((kind, at, f.evidence))
            yield Probe(kind, at, (f.evidence,), said, f.question)


def _on_grid(turn: int) -> int:
    return math.ceil(turn / PROBE_STEP) * PROBE_STEP
