"""Writes tiered_memory/eval/data/bilingual.jsonl, the shipped memory-quality set, from
bench/data/bilingual_source.json.

Conversations of 20-60 turns in Chinese and English, in several domains (supplements, phones,
hotels, pharmacy, restaurants, insurance, laptops, travel). Each states products, doses, prices,
dates, names and preferences once, talks about other things for a while, and then refers back to
them by pronoun ("刚才那个产品", "the one you mentioned"). Probes: inline just before each referring
turn (>= 10 turns after the statement), reconnect at a point two thirds in, and end.

The words and sentences are data (bilingual_source.json says how to read it); what is here is how
a conversation is put together from them. Deterministic (the file's seed): rerunning it rewrites
the same file, byte for byte.

    .venv/bin/python -m bench.bilingual
"""

from __future__ import annotations

import argparse
import json
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiered_memory.eval.dataset import Conversation, Probe, dump_jsonl, last_mention

# The source stays here, beside its writer; the set is written where `tiered-memory eval` reads it
# (the only one of the two the wheel carries).
_HERE = Path(__file__).resolve().parent
SOURCE = _HERE / "data" / "bilingual_source.json"
OUT = _HERE.parent / "tiered_memory" / "eval" / "data" / "bilingual.jsonl"


@dataclass(frozen=True)
class FactTurn:
    """A statement (`user`, `assistant`) carrying `evidence`, and the later turn that refers to it."""

    user: str
    assistant: str
    evidence: str
    ref_user: str
    ref_assistant: str


class _Template(string.Formatter):
    """str.format, and `{name!c}`: the value with its first letter upper-cased (the rest kept)."""

    def convert_field(self, value: object, conversion: str | None) -> object:
        if conversion == "c":
            return str(value)[:1].upper() + str(value)[1:]
        return super().convert_field(value, conversion)


_TEMPLATE = _Template()


@dataclass(frozen=True)
class Domain:
    """One errand: its pools, drawn in order, and its facts' templates."""

    name: str
    draws: list[tuple[str, list[Any]]]
    facts: list[dict[str, str]]

    def facts_of(self, rng: random.Random) -> list[FactTurn]:
        """One value from each pool (an object sets several), then the facts stated with them."""
        values: dict[str, str] = {}
        for slot, pool in self.draws:
            drawn = rng.choice(pool)
            values |= drawn if isinstance(drawn, dict) else {slot: drawn}

        def say(template: str) -> str:
            return _TEMPLATE.vformat(template, (), values)

        return [
            FactTurn(
                say(f["user"]), say(f["assistant"]), values[f["evidence"]], say(f["ref_user"]), say(f["ref_assistant"])
            )
            for f in self.facts
        ]


@dataclass(frozen=True)
class Language:
    code: str
    domains: list[Domain]
    filler: list[tuple[str, str]]


def load(path: Path = SOURCE) -> tuple[int, int, list[Language]]:
    """The seed, the conversations per language, and the languages of the source file."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    languages = [
        Language(
            lang["language"],
            [Domain(d["name"], [(dr["slot"], dr["pool"]) for dr in d["draws"]], d["facts"]) for d in lang["domains"]],
            [(user, assistant) for user, assistant in lang["filler"]],
        )
        for lang in doc["languages"]
    ]
    return int(doc["seed"]), int(doc["conversations_per_language"]), languages


def conversation(rng: random.Random, index: int, lang: Language) -> Conversation:
    domains, filler = lang.domains, lang.filler
    facts = domains[index % len(domains)].facts_of(rng)
    if rng.random() < 0.5:
        # Two errands in one conversation: twice the facts to keep apart.
        facts += domains[(index + 1 + rng.randrange(len(domains) - 1)) % len(domains)].facts_of(rng)
    fillers = rng.sample(filler, len(filler))
    turns: list[tuple[str, str]] = []
    stated: dict[str, int] = {}

    def chat(n: int) -> None:
        for _ in range(n):
            turns.append(fillers[len(turns) % len(fillers)])

    for f in facts:
        turns.append((f.user, f.assistant))
        stated[f.evidence] = len(turns)
        chat(rng.randint(0, 2))
    chat(rng.randint(8, 14))
    refs: list[tuple[FactTurn, int]] = []
    order = rng.sample(facts, len(facts))
    for f in order:
        chat(max(0, stated[f.evidence] + 10 - len(turns)) + rng.randint(0, 3))
        turns.append((f.ref_user, f.ref_assistant))
        refs.append((f, len(turns)))
    chat(max(0, 20 - len(turns)) + rng.randint(0, 4))
    turns = turns[:60]
    n = len(turns)
    probes: list[Probe] = []
    for f, at in refs:
        if at > n:
            continue
        said = last_mention(turns, (f.evidence,), through=at - 1)
        if said and at - 1 - said >= 10:
            probes.append(Probe("inline", at - 1, (f.evidence,), said, f.ref_user))
    reconnect_at = max(r for _, r in refs[: max(1, 2 * len(refs) // 3)]) - 1
    for f in facts:
        said = last_mention(turns, (f.evidence,), through=reconnect_at)
        if said and reconnect_at - said >= 10:
            # The same question just before the restart: G2 compares the two.
            probes.append(Probe("inline", reconnect_at, (f.evidence,), said, f.ref_user))
            probes.append(Probe("reconnect", reconnect_at, (f.evidence,), said, f.ref_user))
        said = last_mention(turns, (f.evidence,), through=n)
        probes.append(Probe("end", n, (f.evidence,), said, f.ref_user))
    return Conversation(f"{lang.code}-{index:02d}", "bilingual", tuple(turns), tuple(probes))


def generate(source: Path = SOURCE) -> list[Conversation]:
    """Every conversation of the set, in the file's order: each language's in turn."""
    seed, per_language, languages = load(source)
    rng = random.Random(seed)
    return [conversation(rng, i, lang) for lang in languages for i in range(per_language)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=SOURCE, help="the words and sentences (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT, help="the set written (default: %(default)s)")
    args = parser.parse_args(argv)
    convs = generate(args.source)
    dump_jsonl(convs, args.out)
    turns = [len(c.turns) for c in convs]
    print(
        f"{args.out}: {len(convs)} conversations, {min(turns)}-{max(turns)} turns, "
        f"{sum(len(c.probes) for c in convs)} probes"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
