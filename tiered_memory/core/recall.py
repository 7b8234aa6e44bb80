"""Query-aware recall's policy: BM25 over a session's postings, and the turns its best matches
belong to. Pure: history.py reads the postings (tiers/postings.py) and the messages.

A session's search terms (jieba words for Chinese, words and numbers for English) are kept as
postings in the hot tier, every replica reading the same ones; a search costs the postings of the
question's terms, not the session's length.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tiered_memory.model import Message, Slice
from tiered_memory.text.condense import keys
from tiered_memory.tiers.postings import ENTRY, PostingsRead, entries, term_key

# BM25's usual constants: term-frequency saturation and length normalisation.
_K1 = 1.2
_B = 0.75
# A term is scored in at most its newest this many messages. A question's cost is the postings of
# its terms, and a common word of a very long session has tens of thousands (a search at 10,000
# turns spent most of its time on them); such a word weighs little (its idf is low), and where
# it is one of the question's words, its newest mentions are the likeliest to be asked about.
# Its idf still counts every message that says it.
TERM_SCAN = 1024


def search(
    read: PostingsRead, terms: Sequence[str], *, k: int, before_seq: int | None = None
) -> list[tuple[int, float]]:
    """The k best (seq, score) by BM25, best first (ties: the newer first); only messages before
    `before_seq` when given; each term scored in its newest TERM_SCAN messages."""
    n = read.docs
    if n == 0 or k <= 0:
        return []
    mean = read.total_terms / n or 1.0
    scores: dict[int, float] = {}
    for term in {term_key(t) for t in terms}:
        data = read.postings.get(term)
        if not data:
            continue
        df = len(data) // ENTRY.size
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for seq, tf, length in entries(data[max(0, df - TERM_SCAN) * ENTRY.size :]):
            if before_seq is not None and seq >= before_seq:
                continue
            norm = tf + _K1 * (1 - _B + _B * length / mean)
            scores[seq] = scores.get(seq, 0.0) + idf * tf * (_K1 + 1) / norm
    # The k best of what may be thousands of scored messages (sorted(...)[:k], without the sort).
    return heapq.nsmallest(k, scores.items(), key=lambda kv: (-kv[1], -kv[0]))


# What a neighbour of a matching message is worth beside it: the answer to a question is often
# in the reply to what matched it, or in what it replied to (measured on the tuning data: half
# the match's score beat 0.3, 0.6, 0.7 and 0.9).
NEIGHBOUR_WEIGHT = 0.5


def with_neighbours(hits: Sequence[tuple[int, float]], *, before_seq: int | None = None) -> list[tuple[int, float]]:
    """The hits and the messages just before and after each, a neighbour at NEIGHBOUR_WEIGHT of
    its hit's score (a message keeps its best score), best first (ties: the newer first); only
    seqs before `before_seq` when given."""
    scores: dict[int, float] = {}
    for seq, score in hits:
        for near, worth in ((seq, score), (seq - 1, score * NEIGHBOUR_WEIGHT), (seq + 1, score * NEIGHBOUR_WEIGHT)):
            if near > 0 and (before_seq is None or near < before_seq) and worth > scores.get(near, 0.0):
                scores[near] = worth
    return sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))


# What a message that holds the kind of thing a question asks for (a number for "how many" or
# "多少", a name for "who" or "叫什么") is worth beside one that does not.
KIND_BOOST = 1.5
_NUMBER_ASKED = re.compile(
    r"(?i)\b(?:how (?:many|much|old|long|far|often)|what time|when|what year|which year|phone|price|cost)\b"
    r"|多少|几[个点号岁天次年月位间]|电话|号码|价格|价钱|费用|评分|时间|哪年|什么时候"
)
_NAME_ASKED = re.compile(r"(?i)\b(?:who|whom|whose|called|named|name)\b|谁|叫什么|名字|名称|哪家|哪位")
_DIGIT = re.compile(r"\d")


def asked_kind(question: str) -> str | None:
    """What a question asks for: "number" (how many, how much, when, 多少, 几点, a phone or a
    price), "name" (who, what is it called, 谁, 叫什么), or None."""
    if _NUMBER_ASKED.search(question):
        return "number"
    if _NAME_ASKED.search(question):
        return "name"
    return None


def holds_kind(text: str, kind: str | None) -> bool:
    """Whether `text` holds the kind of thing `asked_kind` named: a digit for a number, a key
    that is not a number (a capitalised word past a sentence's start) for a name."""
    if kind == "number":
        return _DIGIT.search(text) is not None
    if kind == "name":
        return any(not _DIGIT.search(k) for k in keys(text))
    return False


# What a message that only asks (it ends in a question mark and names no number or name) is
# worth beside one that states something: it shares the question's words, but its answer is in
# the reply, which comes as its neighbour. One that asks while stating ("Did you know Tom Brady
# won in 2001?") keeps its worth.
ASKING_WEIGHT = 0.5
_ASKS = re.compile(r"[?？]\s*$")


def only_asks(text: str) -> bool:
    return _ASKS.search(text) is not None and not keys(text)


def boosted(scored: Sequence[tuple[Message, float]], kind: str | None) -> list[tuple[Message, float]]:
    """`scored` with the messages that hold `kind` worth KIND_BOOST times more and those that only
    ask ASKING_WEIGHT as much, best first (ties: the newer first)."""
    out = []
    for m, score in scored:
        worth = score * KIND_BOOST if holds_kind(m.content, kind) else score
        out.append((m, worth * ASKING_WEIGHT if only_asks(m.content) else worth))
    return sorted(out, key=lambda ms: (-ms[1], -ms[0].seq))


def around(hits: Sequence[tuple[int, float]]) -> list[int]:
    """The seqs whose messages show the hits' turns: each hit and its neighbours."""
    return sorted({s for seq, _ in hits for s in (seq - 1, seq, seq + 1) if s > 0})


@dataclass(frozen=True, slots=True)
class RecallMatch:
    """One answer of a recall: the matching message, its score, the raw messages of its turn, and
    the summary slice that covers it (None when no summary covers it yet)."""

    seq: int
    turn: int
    score: float
    slice: Slice | None
    messages: list[Message]
