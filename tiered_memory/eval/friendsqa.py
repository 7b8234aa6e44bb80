"""The FriendsQA importer: TV-show scenes with human-written questions, chained into sessions.

FriendsQA (`friendsqa_dev.json`: {"data": [{"title", "paragraphs": [{"utterances:", "qas"}]}]})
annotates each scene's questions with the spans that answer them. Its questions are real ones,
paraphrases of what was said ("Who are they waiting for at the rehearsal dinner?"), unlike the
template or masked-sentence questions of the other importers: the set for the question path.

`per_session` consecutive scenes make one session; each utterance is one message, `Speaker: text`
(a stage direction, speaker `#NOTE#`, is its text alone), the roles alternating user, assistant
from the first; a last message without its pair is dropped. Every question whose answer lies at
least `min_back` messages before the end is asked there (an `end` probe with its question); its
evidence is the shortest annotated answer, trailing punctuation dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiered_memory.eval.dataset import Conversation, Probe
from tiered_memory.eval.match import Haystack

MIN_BACK = 10
SCENES_PER_SESSION = 8
_NOTE = "#NOTE#"
_TRAILING = " .,!?;:…-\"'"


@dataclass(frozen=True, slots=True)
class _Question:
    text: str
    evidence: str
    message: int  # the index, in its scene, of the message that says the evidence


@dataclass(frozen=True, slots=True)
class _Scene:
    messages: tuple[str, ...]
    questions: tuple[_Question, ...]


def read_friendsqa(
    path: Path, *, per_session: int = SCENES_PER_SESSION, sessions: int | None = None
) -> list[Conversation]:
    """`sessions` sessions (all that the file fills when None) of `per_session` scenes each."""
    scenes = [_scene(p) for doc in json.loads(path.read_text(encoding="utf-8"))["data"] for p in doc["paragraphs"]]
    count = len(scenes) // per_session if sessions is None else sessions
    out = []
    for n in range(count):
        group = scenes[n * per_session : (n + 1) * per_session]
        if len(group) < per_session:
            break
        out.append(_session(f"friendsqa-{n:03d}", group))
    return out


def _line(utterance: dict[str, Any]) -> str:
    text = " ".join(str(utterance["utterance"]).split())
    speakers = [s for s in utterance.get("speakers", []) if s and s != _NOTE]
    return f"{', '.join(speakers)}: {text}" if speakers else text


def _scene(paragraph: dict[str, Any]) -> _Scene:
    utterances = paragraph["utterances:"]
    messages = tuple(_line(u) for u in utterances)
    questions = []
    for qa in paragraph.get("qas", []):
        answers = [a for a in qa.get("answers", []) if str(a.get("answer_text", "")).strip(_TRAILING)]
        if not answers:
            continue
        shortest = min(answers, key=lambda a: len(str(a["answer_text"]).strip(_TRAILING)))
        evidence = str(shortest["answer_text"]).strip(_TRAILING)
        at = int(shortest["utterance_id"])
        # An answer must be said where it is annotated (a speaker's name is, in its label).
        if 0 <= at < len(messages) and Haystack(messages[at]).contains(evidence):
            questions.append(_Question(" ".join(str(qa["question"]).split()), evidence, at))
    return _Scene(messages, tuple(questions))


def _session(session: str, scenes: Sequence[_Scene]) -> Conversation:
    messages: list[str] = []
    asked: list[tuple[int, _Question]] = []
    for scene in scenes:
        asked += [(len(messages) + q.message, q) for q in scene.questions]
        messages += scene.messages
    if len(messages) % 2:
        messages.pop()
    turns = tuple(zip(messages[::2], messages[1::2], strict=True))
    probes = tuple(
        Probe("end", len(turns), (q.evidence,), at // 2 + 1, q.text)
        for at, q in asked
        if at < len(messages) and len(messages) - at >= MIN_BACK
    )
    return Conversation(session, "friendsqa", turns, probes)
