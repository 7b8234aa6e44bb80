"""Query-aware recall's policy: BM25 over a session's postings, and the turns its best matches
belong to. Pure: history.py reads the postings (tiers/postings.py) and the messages.

A session's search terms (jieba words for Chinese, words and numbers for English) are kept as
postings in the hot tier, every replica reading the same ones; a search costs the postings of the
question's terms, not the session's length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tiered_memory.model import Message, Slice
from tiered_memory.tiers.postings import ENTRY, PostingsRead, entries, term_key

# BM25's usual constants: term-frequency saturation and length normalisation.
_K1 = 1.2
_B = 0.75


def search(
    read: PostingsRead, terms: Sequence[str], *, k: int, before_seq: int | None = None
) -> list[tuple[int, float]]:
    """The k best (seq, score) by BM25, best first (ties: the newer first); only messages before
    `before_seq` when given."""
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
        for seq, tf, length in entries(data):
            if before_seq is not None and seq >= before_seq:
                continue
            norm = tf + _K1 * (1 - _B + _B * length / mean)
            scores[seq] = scores.get(seq, 0.0) + idf * tf * (_K1 + 1) / norm
    best = sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))
    return best[:k]


def around(hits: Sequence[tuple[int, float]]) -> list[int]:
    """The seqs whose messages show the hits' turns: each hit and its neighbours."""
    return sorted({s for seq, _ in hits for s in (seq - 1, seq, seq + 1) if s > 0})


def turn_of(seq: int, messages: Mapping[int, Message]) -> list[Message]:
    """The messages of the turn holding `seq` (a question and its answer) among `messages`, in
    order; none when `seq` is not there."""
    found = messages.get(seq)
    if found is None:
        return []
    out = [found]
    for other in (seq - 1, seq + 1):
        near = messages.get(other)
        if near is not None and near.turn == found.turn:
            out.append(near)
    return sorted(out, key=lambda m: m.seq)


def best_turns(hits: Sequence[tuple[int, float]], messages: Mapping[int, Message], *, most: int) -> list[list[Message]]:
    """The turns of `hits` (best first), each once, at most `most`."""
    turns: list[list[Message]] = []
    done: set[int] = set()
    for seq, _score in hits:
        turn = turn_of(seq, messages)
        if not turn or turn[0].turn in done:
            continue
        done.add(turn[0].turn)
        turns.append(turn)
        if len(turns) == most:
            break
    return turns


@dataclass(frozen=True, slots=True)
class RecallMatch:
    """One answer of a recall: the matching message, its score, the raw messages of its turn, and
    the summary slice that covers it (None when no summary covers it yet)."""

    seq: int
    turn: int
    score: float
    slice: Slice | None
    messages: list[Message]
