"""A user's memory across sessions: the profile aggregated from the user's session summaries,
which earlier session a new one carries over, and how that memory is phrased for a context.

Pure: tiers/sql/users.py stores the profile (merged inside the transaction that writes a summary),
reads.py fetches what a context carries, and this module decides. A profile grows by merging one
summary at a time (never a rescan of the user's history) and stays bounded: what it renders fits
PROFILE_MAX_CHARS, the least frequent and oldest items dropped first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiered_memory.model import SessionKey, Summary
from tiered_memory.prompt.context import ago
from tiered_memory.prompt.facts import lead
from tiered_memory.text.quoting import quoted

PROFILE_MAX_CHARS = 2000
# Earlier summaries a `topic` carry-over compares (the user's most recently updated): a caller with
# hundreds of sessions is matched against the recent ones, in one bounded read.
TOPIC_CANDIDATES = 20
# An item longer than this is cut when it is merged: a summary's items are 80 characters at most
# (payload.py), a topic a word or two; an LLM's or an old row's longer ones are cut, not refused.
_ITEM_MAX_CHARS = 120
_PROFILE_VERSION = 1
# Sessions an item (and the profile) remembers having counted: a user's sessions summarized in turns
# are counted once each while fewer than this many interleave.
_SEEN_IN = 8
_RECENT = 32

FACT, PREFERENCE, TOPIC = "fact", "preference", "topic"
_KINDS = (FACT, PREFERENCE, TOPIC)
# Per language: the block's label, then each kind's, then the separator of items.
_LABELS = {
    "zh": ("[用户档案]", {FACT: "关键信息：", PREFERENCE: "用户信息/偏好：", TOPIC: "常谈话题："}, "；"),
    "en": (
        "[User profile]",
        {FACT: "Key facts: ", PREFERENCE: "User info/preferences: ", TOPIC: "Frequent topics: "},
        "; ",
    ),
}
_FOLD = re.compile(r"[\W_]+")


def user_key(tenant: str, user_id: str) -> str:
    """The stored key of a user of a tenant ('' for none): a digest, exact where SQL collations
    are not (MySQL/MariaDB pad with spaces, so 'u1' would be 'u1 ')."""
    return hashlib.sha256(f"{tenant}\x00{user_id}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ProfileItem:
    """One thing known of the user: a stable fact, a preference or a topic; `count` is how many
    sessions said it, `seen_in` the digests of the last sessions that counted it (a session's
    later summaries say it again; two sessions of the user may be summarized in turns)."""

    kind: str
    text: str
    count: int
    first_seen: float
    last_seen: float
    seen_in: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Profile:
    items: tuple[ProfileItem, ...] = ()
    sessions: int = 0  # the sessions whose summaries were merged
    recent: tuple[str, ...] = ()  # the digests of the last sessions merged
    updated_at: float = 0.0

    def of(self, kind: str) -> list[ProfileItem]:
        """The items of one kind, the most frequent first, then the most recently said."""
        return sorted((i for i in self.items if i.kind == kind), key=lambda i: (-i.count, -i.last_seen, i.text))


@dataclass(frozen=True, slots=True)
class Earlier:
    """An earlier session of the user: its stored key, its summary and its last activity."""

    session_key: SessionKey
    summary: Summary
    last_activity: float


def load_profile(raw: Mapping[str, Any]) -> Profile:
    """The profile stored as `dump_profile` wrote it."""
    return Profile(
        items=tuple(
            ProfileItem(str(k), str(t), int(c), float(f), float(last), tuple(map(str, seen)))
            for k, t, c, f, last, seen in raw["items"]
        ),
        sessions=int(raw.get("sessions", 0)),
        recent=tuple(map(str, raw.get("recent", ()))),
        updated_at=float(raw.get("updated_at", 0.0)),
    )


def dump_profile(profile: Profile) -> dict[str, Any]:
    return {
        "version": _PROFILE_VERSION,
        "items": [[i.kind, i.text, i.count, i.first_seen, i.last_seen, list(i.seen_in)] for i in profile.items],
        "sessions": profile.sessions,
        "recent": list(profile.recent),
        "updated_at": profile.updated_at,
    }


def contributions(summary: Summary) -> list[tuple[str, str]]:
    """What a summary tells of its user: the structured payload's stable facts and preferences
    (every summary has one, the LLM's and the extractor's alike), and the summary's topics."""
    payload = summary.structured.get("payload")
    payload = payload if isinstance(payload, Mapping) else {}
    out: list[tuple[str, str]] = []
    for kind, name in ((FACT, "stable_facts"), (PREFERENCE, "user_preferences")):
        values = payload.get(name)
        if isinstance(values, list):
            out += [(kind, v) for v in values if isinstance(v, str)]
    out += [(TOPIC, t) for t in summary.topics]
    return [(kind, " ".join(text.split())[:_ITEM_MAX_CHARS]) for kind, text in out if text.strip()]


def merged(profile: Profile, summary: Summary, *, session: str, now: float) -> Profile:
    """`profile` with what `summary` (of `session`) says: a new item is counted once, an item
    seen before gains a session when none of the last sessions that counted it was this one;
    then bounded."""
    mark = _digest(session)
    items = {(i.kind, _folded(i.text)): i for i in profile.items}
    for kind, text in contributions(summary):
        key = (kind, _folded(text))
        if not key[1]:
            continue
        seen = items.get(key)
        if seen is None:
            items[key] = ProfileItem(kind, text, 1, now, now, (mark,))
        elif mark in seen.seen_in:
            items[key] = dataclasses.replace(seen, last_seen=now)
        else:
            seen_in = (*seen.seen_in, mark)[-_SEEN_IN:]
            items[key] = dataclasses.replace(seen, count=seen.count + 1, last_seen=now, seen_in=seen_in)
    new_session = mark not in profile.recent
    grown = Profile(
        items=tuple(items.values()),
        sessions=profile.sessions + (1 if new_session else 0),
        recent=(*(r for r in profile.recent if r != mark), mark)[-_RECENT:],
        updated_at=now,
    )
    return bounded(grown, PROFILE_MAX_CHARS)


def _digest(session: str) -> str:
    """A session's key, short: what a profile keeps to tell its sessions apart."""
    return hashlib.sha256(session.encode()).hexdigest()[:10]


def bounded(profile: Profile, max_chars: int) -> Profile:
    """The profile less its least frequent, then oldest, items until it renders in `max_chars`
    in either language."""
    kept = sorted(profile.items, key=lambda i: (i.count, i.last_seen))

    def size() -> int:
        shown = dataclasses.replace(profile, items=tuple(kept))
        return max(len(render_profile(shown, lang)) for lang in _LABELS)

    while kept and size() > max_chars:
        kept.pop(0)
    return dataclasses.replace(profile, items=tuple(i for i in profile.items if i in kept))


def render_profile(profile: Profile, lang: str, max_chars: int | None = None) -> str:
    """The profile as a labelled block, a line per kind, quoted (it is what users said); within
    `max_chars`, the least frequent and oldest items left out first. Empty when nothing fits."""
    label, kinds, sep = _LABELS[lang]
    order = {id(i): n for n, i in enumerate(sorted(profile.items, key=lambda i: (-i.count, -i.last_seen)))}
    shown = list(profile.items)
    while shown:
        lines = [label]
        for kind in _KINDS:
            items = [i for i in profile.of(kind) if i in shown]
            if items:
                lines.append(kinds[kind] + sep.join(_item_text(i, kind, lang) for i in items))
        text = "\n".join(lines)
        if max_chars is None or len(text) <= max_chars:
            return text
        shown.remove(max(shown, key=lambda i: order[id(i)]))
    return ""


def _item_text(item: ProfileItem, kind: str, lang: str) -> str:
    text = quoted(item.text)
    if kind == TOPIC and item.count > 1:
        return f"{text}（{item.count}）" if lang == "zh" else f"{text} ({item.count})"
    return text


def best_by_topic(candidates: Sequence[Earlier], text: str) -> Earlier | None:
    """The earlier session whose topics the new session's words name most (the most recent on a
    tie); None when none of its topics is named."""
    words = set(_FOLD.split(text.casefold()))
    folded = text.casefold()

    def named(topic: str) -> bool:
        t = topic.casefold().strip()
        if not t:
            return False
        # A Latin topic is a word of the text (or its plural); a Chinese one a part of it.
        return (t in words or f"{t}s" in words or (" " in t and t in folded)) if t.isascii() else t in folded

    best: tuple[int, Earlier] | None = None
    for earlier in candidates:
        score = sum(1 for topic in earlier.summary.topics if named(topic))
        if score and (best is None or score > best[0]):
            best = (score, earlier)
    return best[1] if best else None


@dataclass(frozen=True, slots=True)
class CarriedText:
    """The text a session carries and what of it made it in: the earlier summary, the profile."""

    text: str
    earlier: bool
    profile: bool


def carried_text(
    earlier: Earlier | None,
    profile: Profile | None,
    *,
    room: int,
    now: float,
    lang: str,
    templates: Mapping[str, str],
) -> CarriedText:
    """What a new session carries, in `room` characters: the earlier session's summary in the
    language's reconnect phrasing (`用户上次（3天前）的对话摘要：…`), its text cut at a sentence,
    then the profile (less what the summary says) in what is left. Empty when nothing fits."""
    said = ""
    left = room
    if earlier is not None and earlier.summary.text:
        when = ago(max(0.0, now - earlier.last_activity), lang)
        frame = len(templates[lang].format(ago=when, summary=""))
        if left - frame > 1:
            said = templates[lang].format(ago=when, summary=lead(quoted(earlier.summary.text), left - frame))
            left -= len(said) + 1
    block = ""
    if profile is not None and profile.items:
        shown = _folded(said)
        unsaid = tuple(i for i in profile.items if not shown or _folded(i.text) not in shown)
        block = render_profile(dataclasses.replace(profile, items=unsaid), lang, left) if unsaid else ""
    return CarriedText("\n".join(t for t in (said, block) if t), earlier=bool(said), profile=bool(block))


def _folded(text: str) -> str:
    """What tells two items apart: their words, case and punctuation aside."""
    return " ".join(_FOLD.sub(" ", text.casefold()).split())
