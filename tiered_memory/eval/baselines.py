"""What a gateway without this daemon would send, computed from the transcript alone, at the same
character budget as the daemon's context: the raw messages, newest kept, oldest cut first; two
cheap hybrids of that with something kept from the older messages; and, for a probe asked with its
question, a naive BM25 over the older messages beside the newest text."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from tiered_memory.eval.text import STOPWORDS, clauses, drop_function_words

Turns = Sequence[tuple[str, str]]
Baseline = Callable[[Turns, int], str]


def newest_within(messages: Sequence[str], budget: int) -> str:
    """Messages joined by newlines, dropping the oldest until they fit in `budget` characters;
    the oldest one kept is cut at its start when only part of it fits."""
    kept: list[str] = []
    used = 0
    for m in reversed(messages):
        cost = len(m) + (1 if kept else 0)
        if used + cost > budget:
            room = budget - used - (1 if kept else 0)
            if room > 0:
                kept.append(m[-room:])
            break
        kept.append(m)
        used += cost
    return "\n".join(reversed(kept))


def _messages(turns: Turns) -> list[str]:
    return [text for pair in turns for text in pair]


def last_turns(k: int) -> Baseline:
    def baseline(turns: Turns, budget: int) -> str:
        return newest_within(_messages(turns[-k:]), budget)

    return baseline


def whole_transcript(turns: Turns, budget: int) -> str:
    return newest_within(_messages(turns), budget)


def last_messages(n: int) -> Baseline:
    def baseline(turns: Turns, budget: int) -> str:
        return newest_within(_messages(turns)[-n:], budget)

    return baseline


def _whole(messages: Sequence[str], budget: int) -> int:
    """How many of the newest messages fit whole in `budget` characters, joined by newlines."""
    used = -1
    for n, m in enumerate(reversed(messages)):
        used += len(m) + 1
        if used > budget:
            return n
    return len(messages)


def _hybrid(turns: Turns, budget: int, share: float, pieces: Callable[[Sequence[str]], list[str]]) -> str:
    """The newest messages raw (as `newest_within`) in `share` of `budget`; then, in the room left,
    `pieces` of the older messages (those that did not fit whole), newest piece first while each
    fits whole. Kept pieces come before the raw text, oldest first, one per line."""
    messages = _messages(turns)
    raw_budget = int(budget * share)
    raw = newest_within(messages, raw_budget)
    room = budget - len(raw)
    kept: list[str] = []
    for piece in reversed(pieces(messages[: len(messages) - _whole(messages, raw_budget)])):
        if len(piece) + 1 > room:
            break
        kept.append(piece)
        room -= len(piece) + 1
    return "\n".join(p for p in [*reversed(kept), raw] if p)


_DIGIT = re.compile(r"\d")


def _salient(clause: str) -> bool:
    """A clause with a digit, or with an uppercase letter on a word other than its first (the
    pronoun "I", "I'm", ... aside): a number or a name."""
    later = (w for w in clause.split()[1:] if re.split("['’]", w)[0] != "I")
    return bool(_DIGIT.search(clause)) or any(c.isupper() for w in later for c in w)


def hybrid_salient(turns: Turns, budget: int) -> str:
    """The newest text in 75% of the budget, then older clauses that carry a number or a name."""
    return _hybrid(turns, budget, 0.75, lambda older: [c for m in older for c in clauses(m) if _salient(c)])


def hybrid_compressed(turns: Turns, budget: int) -> str:
    """The newest text in 60% of the budget, then older messages without English function words."""
    return _hybrid(turns, budget, 0.6, lambda older: [c for m in older if (c := drop_function_words(m))])


BASELINES: dict[str, Baseline] = {
    "last-3-turns": last_turns(3),
    "last-5-turns": last_turns(5),
    "whole-transcript": whole_transcript,
    "last-8-messages": last_messages(8),
    "hybrid-salient": hybrid_salient,
    "hybrid-compressed": hybrid_compressed,
}


QuestionBaseline = Callable[[Turns, int, str], str]
_WORDS = re.compile(r"[^\W\d_]+|\d+")
_CJK_RUN = re.compile(r"[\u3400-\u9fff]+")
_BM25_K1 = 1.2
_BM25_B = 0.75


def bm25_terms(text: str) -> list[str]:
    """A naive engineer's terms: lower-cased words and numbers less the English function words,
    and each Chinese run's character pairs (a lone character as itself)."""
    folded = text.casefold()
    out = [w for w in _WORDS.findall(_CJK_RUN.sub(" ", folded)) if w not in STOPWORDS]
    for run in _CJK_RUN.findall(folded):
        out += [run[i : i + 2] for i in range(len(run) - 1)] or [run]
    return out


def bm25_scores(documents: Sequence[str], question: str) -> list[float]:
    """Okapi BM25 of each document against the question's terms (k1 1.2, b 0.75)."""
    docs = [bm25_terms(d) for d in documents]
    if not docs:
        return []
    mean = sum(map(len, docs)) / len(docs) or 1.0
    asked = set(bm25_terms(question))
    df = {t: sum(1 for d in docs if t in d) for t in asked}
    scores = []
    for d in docs:
        score = 0.0
        for t in asked:
            tf = d.count(t)
            if tf:
                idf = math.log(1 + (len(docs) - df[t] + 0.5) / (df[t] + 0.5))
                score += idf * tf * (_BM25_K1 + 1) / (tf + _BM25_K1 * (1 - _BM25_B + _BM25_B * len(d) / mean))
        scores.append(score)
    return scores


def bm25_question(turns: Turns, budget: int, question: str) -> str:
    """The newest text for 50% of the budget, then the older messages (those that did not fit
    whole) that score highest by BM25 against the question, best first, while they fit; the
    first that does not is cut to the room left. Kept messages come before the raw text, best
    first, one per line."""
    messages = _messages(turns)
    raw_budget = budget // 2
    raw = newest_within(messages, raw_budget)
    room = budget - len(raw) - (1 if raw else 0)
    older = messages[: len(messages) - _whole(messages, raw_budget)]
    scores = bm25_scores(older, question)
    kept: list[str] = []
    for i in sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: -scores[i]):
        cost = len(older[i]) + (1 if kept else 0)
        if cost > room:
            if room - (1 if kept else 0) > 0:
                kept.append(older[i][: room - (1 if kept else 0)])
            break
        kept.append(older[i])
        room -= cost
    return "\n".join(p for p in [*kept, raw] if p)


BM25_QUESTION = "bm25+question"
QUESTION_BASELINES: dict[str, QuestionBaseline] = {BM25_QUESTION: bm25_question}
