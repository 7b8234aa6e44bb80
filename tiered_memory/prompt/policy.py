"""The budget policy: which memory fills a context of `max_chars` characters, and in what form.

Pure: the reads fetch the candidates (raw messages newest last, the summary's facts, the
conversation's subject, the turns that match a question) and this module decides, with no I/O.

What it keeps, in this order of claim on the budget:
1. the last completed turn, raw (cut to fit and marked "…" when it alone is too long), and a
   question still waiting for its reply: a context with no raw turn is never the answer;
2. the conversation's subject (the user's first clause that names something), a few words that
   survive the smallest budget;
3. with a question, the older messages that match it (and their neighbours), best first, whole
   and quoted, in up to QUESTION_SHARE of the room: what answers the question is the most
   valuable memory there is, whatever words it is made of; a question that matches nothing costs
   nothing;
4. the rest by one of a few layouts (`LAYOUTS`): all raw; raw then the summary's newest facts;
   raw then a condensed stretch (condense.py: the same content words, numbers and names in
   fewer characters) reaching further back; the summary's facts first. Each layout is filled and
   the one that holds the most of what later turns ask about wins: its distinct keys (numbers,
   names), each weighted by how rarely the session says it and how recently, plus a little for
   every turn it shows contiguously back from now. So the density of each source is measured on
   the session at hand, not assumed: short Chinese turns stay raw where they reach far, long
   English ones are condensed or summarized where raw text reaches only a few messages.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tiered_memory.model import Message, Role
from tiered_memory.prompt.memo import View, features, memo_of, view_of
from tiered_memory.prompt.weights import Weights
from tiered_memory.text.dialogue import is_call, joins, units
from tiered_memory.text.quoting import quoted, remembered

# The labels of the system message's parts, in the conversation's language.
LABELS = {
    "zh": {
        "summary": "[历史对话摘要] ",
        "subject": "主题：",
        "condensed": "[更早的对话（精简）]",
        "salient": "[更早提到的要点]",
        "snippets": "[早前对话片段]",
        "lagging": "最近几轮：",
        "user": "用户：",
        "assistant": "助手：",
        "tool": "工具：",
        "system": "事件：",
        "events": "[系统事件]",
    },
    "en": {
        "summary": "[Conversation summary] ",
        "subject": "Subject: ",
        "condensed": "[Earlier turns, condensed]",
        "salient": "[Said earlier]",
        "snippets": "[Earlier in this conversation]",
        "lagging": "Recent turns: ",
        "user": "User: ",
        "assistant": "Assistant: ",
        "tool": "Tool: ",
        "system": "Event: ",
        "events": "[Events]",
    },
}
_CUT_MARK = "…"
# Room below which the summary is not asked for its facts: a label and a word of it is noise.
_MIN_FACTS_ROOM = 40
# A question's matching messages may take up to this share of the room; the layouts fill the
# rest (and whatever the matches leave).
QUESTION_SHARE = 0.95

Facts = Callable[[int, "int | None", bool], str]
"""Renders the summary's facts said before a turn (None: all of them) in at most `room`
characters, newest first or (True) by priority, framed (label or reconnect phrasing included);
empty when nothing fits."""


@dataclass(frozen=True, slots=True)
class Candidates:
    """What the reads fetched for one context.

    `messages`: raw messages, oldest first, contiguous and ending with the newest; `whole` when
    the first of them is the session's first message. `facts`: the summary's renderer, None
    without a summary. `matches`: earlier messages that match the question, each with its
    relevance, best first. `frame`: what the memory block's tags add to a system text (counted
    in the budget like every other character).
    """

    messages: Sequence[Message]
    whole: bool
    lang: str
    facts: Facts | None = None
    subject: str = ""
    matches: Sequence[tuple[Message, float]] = ()
    frame: int = 0
    terms_salient: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()  # the session's names that have no capitals (Chinese)
    events: Sequence[Message] = ()  # the gateway's events the summary does not hold yet, oldest first
    views: Callable[[Message], View] | None = None  # a cache of view_of; worked out here without one
    # A cache of `features` for the summary's rendered text (with the session's terms and names).
    text_features: Callable[[str], frozenset[str]] | None = None
    # What the session carries over from its user's earlier sessions (users.carried_text), in the
    # room given; None when it carries nothing.
    carried: Callable[[int], str] | None = None


Part = tuple[str, str]
"""A piece of the system text: its origin (one of ORIGINS) and its text."""

# Where a piece of the memory text came from: what the session carries over from its user's
# earlier sessions, the gateway's events, the summary's facts, earlier turns condensed or their key
# clauses, the subject line, the clauses that match the question, and the digest of turns the
# summary does not hold yet (reads.py).
ORIGINS = ("carried", "events", "summary", "condensed", "salient", "subject", "snippets", "lagging")


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen memory: raw messages (oldest first) and the system text before them (None
    when there is nothing to say), with the characters each source took. `parts` is the system
    text by where each piece came from (`ORIGINS`), in order: joined by newlines, they are it."""

    raw: list[Message]
    system: str | None
    chars: dict[str, int] = field(default_factory=dict)
    first_turn: int | None = None  # the first turn shown raw or condensed
    layout: int | None = None  # the index in LAYOUTS of the layout chosen
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True, slots=True)
class Layout:
    """One way to share the room the last turn and the subject leave: `raw` of it for the newest
    messages verbatim, `facts` for the summary's facts (newest first, or by priority when
    `by_rank`), the rest for the condensed stretch (or raw, when not `condensed`)."""

    raw: float
    facts: float
    condensed: bool
    by_rank: bool = False
    salient: bool = False  # the condensed stretch keeps only clauses that hold a key


# The layouts tried for every context; the one whose text holds the most distinct keys (numbers,
# names, the session's salient terms) wins, the earlier on a tie. They span the known good
# policies: all raw, raw with the newest facts, raw with the stretch condensed, the facts first.
LAYOUTS = (
    Layout(raw=1.0, facts=0.0, condensed=False),
    Layout(raw=0.75, facts=0.25, condensed=False),
    Layout(raw=0.6, facts=0.0, condensed=True),
    Layout(raw=0.9, facts=0.0, condensed=True, salient=True),
    Layout(raw=0.75, facts=0.0, condensed=True, salient=True),
    Layout(raw=0.4, facts=0.3, condensed=True, salient=True),
    Layout(raw=0.3, facts=0.3, condensed=True),
    Layout(raw=0.5, facts=0.5, condensed=False),
    Layout(raw=0.0, facts=0.7, condensed=False, by_rank=True),
)


@dataclass(slots=True)
class _Filled:
    selection: Selection
    seqs: list[int]  # the older messages shown in the condensed (or salient) block
    salient: bool
    facts_text: str


# The gateway's events may take up to this share of the budget (newest kept first).
EVENTS_SHARE = 0.25
# What a session carries over from its user's earlier sessions takes this share of the budget at
# least, and what the session's own memory leaves when it is short (a new session's first turns).
CARRIED_SHARE = 0.2


def choose(c: Candidates, max_chars: int) -> Selection:
    """The memory that fits `max_chars` characters of content, the block's tags (`c.frame`)
    included whenever there is a system text: what the session carries over from its user's
    earlier sessions first (it is older than anything the session says), then the session's
    own (`_own`)."""
    if c.frame and not (c.whole and not c.events and c.carried is None and _fits_raw(c.messages, max_chars)):
        max_chars = max(0, max_chars - c.frame)
    if c.carried is None:
        return _own(c, max_chars)
    own = _joined([m for m in c.messages if m.answered]) + sum(len(m.content) + 1 for m in c.events)
    # A session with nothing stored yet is whole too: its first question has all the room it needs.
    whole = c.whole or not c.messages
    room = max(int(max_chars * CARRIED_SHARE), max_chars - own) if whole else int(max_chars * CARRIED_SHARE)
    carried = c.carried(room)
    if not carried:
        return _own(c, max_chars)
    sel = _own(c, max_chars - len(carried) - 1)
    system = carried + (f"\n{sel.system}" if sel.system else "")
    parts = (("carried", carried), *sel.parts)
    return dataclasses.replace(sel, system=system, chars={**sel.chars, "carried": len(carried)}, parts=parts)


def _own(c: Candidates, max_chars: int) -> Selection:
    """The session's own memory in `max_chars`: the gateway's events first (they are what happened
    on the call, and short), in the system text's lead, then the rest (`_choose`)."""
    label = LABELS[c.lang]["events"]
    kept = _fit_lines([(m.seq, m.turn, quoted(m.content)) for m in c.events], int(max_chars * EVENTS_SHARE), label)
    if not kept:
        return _choose(c, max_chars)
    events = "\n".join([label, *(text for _, _, text in kept)])
    sel = _choose(c, max_chars - len(events) - 1)
    system = events + (f"\n{sel.system}" if sel.system else "")
    parts = (("events", events), *sel.parts)
    return dataclasses.replace(sel, system=system, chars={**sel.chars, "events": len(events)}, parts=parts)


def _fits_raw(messages: Sequence[Message], max_chars: int) -> bool:
    return _joined([m for m in messages if m.answered]) <= max_chars


def _choose(c: Candidates, max_chars: int) -> Selection:
    labels = LABELS[c.lang]
    messages = [m for m in c.messages if m.answered]
    if c.whole and _joined(messages) <= max_chars:
        # The raw turns hold the whole conversation: a summary would only repeat them. (Counted
        # as sent: two messages of one role in a row go out joined by a newline.)
        first = messages[0].turn if messages else None
        return Selection(raw=messages, system=None, chars={"raw": _chars(messages)}, first_turn=first)
    if not messages:
        # Nothing raw to show (a mode without turns, or a session without any): the facts alone.
        text = c.facts(max_chars, None, True) if c.facts is not None else ""
        return Selection(
            raw=[], system=text or None, chars={"facts": len(text)}, parts=(("summary", text),) if text else ()
        )
    read = c.views or (lambda m: view_of(memo_of(remembered(m)), c.terms_salient, c.names))
    view = {m.seq: read(m) for m in messages}

    tail = last_turn(messages)
    subject = _subject_line(c, tail, labels, max_chars)
    head = len(subject) + 1 if subject else 0
    # With a question's matches waiting, a long last turn keeps half the room, cut as when it
    # alone is too long: the answer to what was just asked may lie in the other half.
    tail_room = (max_chars - head) // 2 if _older_matches(c, tail) else max_chars - head
    raw_tail = fit_tail(tail, max(0, tail_room))
    room = max_chars - _joined(raw_tail) - head
    older = messages[: len(messages) - len(tail)]
    # Cut once: every layout takes the newest of them that fit its raw share.
    older_units = units(older)
    lines = [(m.seq, m.turn, labels[m.role.value] + view[m.seq].condensed) for m in older if view[m.seq].condensed]
    salient_lines = [(m.seq, m.turn, view[m.seq].salient) for m in older if view[m.seq].salient]
    weight = Weights(messages, view)
    by_seq = {m.seq: m for m in messages}

    rendered: dict[str, frozenset[str]] = {}

    def text_features(text: str) -> frozenset[str]:
        found = rendered.get(text)
        if found is None:
            # Layouts often render the same facts: their features are read once.
            found = rendered[text] = (
                c.text_features(text) if c.text_features else features(text, c.terms_salient, c.names)
            )
        return found

    def best(room: int) -> Selection:
        """The layout whose text holds the most weighted features in `room`."""
        top: tuple[float, Selection] | None = None
        for layout in LAYOUTS:
            if (layout.facts and c.facts is None) or (layout.condensed and not lines):
                continue
            filled = _fill(
                c,
                layout,
                older_units,
                salient_lines if layout.salient else lines,
                salient_lines,
                raw_tail,
                room,
                labels,
            )
            found = set(text_features(filled.facts_text))
            found.update(*(_raw_features(m, by_seq, view, text_features) for m in filled.selection.raw))
            if filled.salient:
                found.update(*(view[seq].salient_features for seq in filled.seqs))
            else:
                found.update(*(view[seq].condensed_features for seq in filled.seqs))
            # Every feature of a message shown has a weight; one only the facts say counts nothing.
            score = weight.score(found)
            if top is None or score > top[0]:
                top = (score, dataclasses.replace(filled.selection, layout=LAYOUTS.index(layout)))
        assert top is not None
        return top[1]

    matches = _match_lines(c, first_raw=raw_tail[0].seq if raw_tail else None, labels=labels)
    sel, extra = _with_question(best, matches, room, max_chars - head, labels["snippets"])
    return _finish(c, sel, subject, extra, labels)


def lagging_digest(c: Candidates, sel: Selection, covered_turns: int, room: int) -> str:
    """The key points of the turns after `covered_turns` (the summary does not hold them yet: it
    lags behind a slow LLM) that `sel` does not show, newest kept first, in `room` characters
    with their label; empty when there are none. Made of each message's view, which the context
    works out anyway and keeps: no extraction runs on the request path."""
    first = sel.first_turn
    if not first:
        return ""
    read = c.views or (lambda m: view_of(memo_of(remembered(m)), c.terms_salient, c.names))
    labels = LABELS[c.lang]
    lines = []
    for m in c.messages:
        if covered_turns < m.turn < first and m.answered:
            points = read(m).salient or read(m).condensed
            if points:
                lines.append((m.seq, m.turn, labels[m.role.value] + points))
    kept = _fit_lines(lines, room, labels["lagging"])
    return "\n".join([labels["lagging"], *(text for _, _, text in kept)]) if kept else ""


def _raw_features(
    m: Message, by_seq: dict[int, Message], view: dict[int, View], text: Callable[[str], frozenset[str]]
) -> frozenset[str]:
    """The features of a raw message as shown: its view's when whole, its text's when cut."""
    whole = by_seq.get(m.seq)
    return view[m.seq].features if whole is not None and whole.content == m.content else text(m.content)


def _with_question(
    best: Callable[[int], Selection],
    matches: list[tuple[int, str]],
    room: int,
    max_chars: int,
    label: str,
) -> tuple[Selection, list[tuple[int, str]]]:
    """The best layout and the question's matching lines that fit beside it in `max_chars`. The
    matches claim their room first (best first, up to QUESTION_SHARE of `room`); the layout fills
    the rest; then a match the layout shows raw gives its place to the next best."""
    claimed = _block_chars(_fit_matches(matches, int(room * QUESTION_SHARE), label), label)
    sel = best(room - claimed)
    if not matches:
        return sel, []
    shown = {m.seq for m in sel.raw}
    left = max_chars - _joined(sel.raw) - (len(sel.system) + 1 if sel.system else 0)
    return sel, _fit_matches([line for line in matches if line[0] not in shown], left, label)


# A match cut shorter than this says too little to be worth its label.
_MIN_CUT = 30


def _fit_matches(lines: Sequence[tuple[int, str]], room: int, label: str) -> list[tuple[int, str]]:
    """The best lines that fit `room` whole with their label (`_fit_best`), and then, where room
    is left, the best line that did not fit, cut at its end and marked: a long message that
    answers the question is worth its beginning when it cannot be had whole."""
    kept = _fit_best(lines, room, label)
    # A line costs itself and the newline before it; the block's label and its newline are paid once.
    longest = room - (_block_chars(kept, label) if kept else len(label) + 1) - 1
    if longest < _MIN_CUT:
        return kept
    taken = {seq for seq, _ in kept}
    cut = next(((seq, text) for seq, text in lines if seq not in taken), None)
    return kept if cut is None else [*kept, (cut[0], cut[1][: longest - 1] + _CUT_MARK)]


def _subject_line(c: Candidates, tail: Sequence[Message], labels: dict[str, str], max_chars: int) -> str:
    """`Subject: …` when the last turn does not say the subject and it takes at most a quarter of
    the budget; empty otherwise."""
    if not c.subject or any(c.subject.casefold() in m.content.casefold() for m in tail):
        return ""
    line = labels["subject"] + c.subject
    return line if len(line) <= max_chars // 4 else ""


def _finish(
    c: Candidates, sel: Selection, subject: str, extra: Sequence[tuple[int, str]], labels: dict[str, str]
) -> Selection:
    """The chosen layout's memory with the subject line (unless its text says the subject) after
    it, and the question's clauses last."""
    parts = list(sel.parts)
    if subject and c.subject.casefold() not in (sel.system or "").casefold():
        parts.append(("subject", subject))
    else:
        subject = ""
    if extra:
        parts.append(("snippets", "\n".join([labels["snippets"], *(text for _, text in sorted(extra))])))
    chars = {**sel.chars, "subject": len(subject), "snippets": _block_chars(extra, labels["snippets"])}
    return Selection(
        raw=sel.raw,
        system="\n".join(text for _, text in parts) or None,
        chars=chars,
        first_turn=sel.first_turn,
        layout=sel.layout,
        parts=tuple(parts),
    )


def _fill(
    c: Candidates,
    layout: Layout,
    older: Sequence[list[Message]],
    lines: Sequence[tuple[int, int, str]],
    salient_lines: Sequence[tuple[int, int, str]],
    raw_tail: list[Message],
    room: int,
    labels: dict[str, str],
) -> _Filled:
    """One layout's memory in `room` characters (besides the last turn, already chosen). A
    layout without a condensed stretch spills what its raw messages and facts leave (the next
    older message did not fit whole) into the key clauses of the messages before them. `older`:
    the messages before the last turn, cut into units (dialogue.units)."""
    fact_room = int(room * layout.facts) if c.facts is not None else 0
    raw_room = int(room * layout.raw) if layout.condensed else room - fact_room
    extra, extra_chars = _newest_that_fit(older, raw_room, raw_tail[0] if raw_tail else None)
    raw = [*extra, *raw_tail]
    first_seq = raw[0].seq if raw else None
    rest = [(seq, turn, text) for seq, turn, text in lines if first_seq is None or seq < first_seq]
    salient = layout.salient or not layout.condensed
    if not layout.condensed:
        rest = [line for line in salient_lines if first_seq is None or line[0] < first_seq]
    label = labels["salient" if salient else "condensed"]
    cond_room = room - extra_chars - fact_room
    kept = _fit_lines(rest, cond_room, label)
    facts_text = ""
    if c.facts is not None:
        before = kept[0][1] if kept else (raw[0].turn if raw else None)
        left = room - extra_chars - _block_chars(kept, label)
        facts_text = c.facts(left - 1, before, layout.by_rank) if left > _MIN_FACTS_ROOM else ""
        if len(kept) < len(rest):
            # Room the facts did not take: the condensed stretch reaches further back.
            spare = left - (len(facts_text) + 1 if facts_text else 0)
            kept = _fit_lines(rest, _block_chars(kept, label) + spare, label)
    parts: list[Part] = []
    if facts_text:
        parts.append(("summary", facts_text))
    if kept:
        parts.append(("salient" if salient else "condensed", "\n".join([label, *(text for _, _, text in kept)])))
    chars = {
        "raw": _joined(raw),
        "facts": len(facts_text),
        "condensed": _block_chars(kept, label),
    }
    first_turn = kept[0][1] if kept else (raw[0].turn if raw else None)
    system = "\n".join(text for _, text in parts) or None
    selection = Selection(raw=raw, system=system, chars=chars, first_turn=first_turn, parts=tuple(parts))
    return _Filled(selection, [seq for seq, _, _ in kept], salient, facts_text)


def last_turn(messages: Sequence[Message]) -> list[Message]:
    """The last completed turn (its question, the tool calls and results its reply used, and the
    reply) and a question still waiting after it. `messages` are in provider order."""
    replies = [i for i, m in enumerate(messages) if m.role is not Role.USER]
    if not replies:
        return list(messages[-1:])
    end = start = replies[-1]
    # Tool traffic before the reply belongs to its turn (and is never split from the reply).
    while start > 0 and (messages[start - 1].role is Role.TOOL or is_call(messages[start - 1])):
        start -= 1
    if start > 0 and messages[start - 1].role is Role.USER and messages[start - 1].turn == messages[end].turn:
        start -= 1
    return list(messages[start:])


def fit_tail(tail: Sequence[Message], room: int) -> list[Message]:
    """The last turn in `room` characters: whole when it fits; else without its tool calls and
    results (the reply says what they found), and then the questions keep up to half the room
    between them (a question is short, and the reply needs it beside it) and the reply the rest,
    each cut and marked (a reply keeps its beginning, a question its end)."""
    # An empty message would cost a newline and say nothing (a call's is its calls).
    tail = [m for m in tail if m.content or m.tool_calls]
    if _joined(tail) <= room:
        return tail
    tail = [m for unit in units(tail) if not is_call(unit[0]) for m in unit]
    if _joined(tail) <= room:
        return tail
    room = max(0, room - (_joined(tail) - _chars(tail)))  # the newlines that join messages of one role
    questions = [m for m in tail if m.role is Role.USER]
    replies = [m for m in tail if m.role is not Role.USER]
    q_room = min(_chars(questions), room // 2) if replies else room
    shares = {}
    left = q_room
    for m in reversed(questions):  # the newest question first: it is what was just asked
        shares[m.seq] = min(len(m.content), left)
        left -= shares[m.seq]
    left = room - q_room + left
    for m in replies:
        shares[m.seq] = min(len(m.content), left)
        left -= shares[m.seq]
    out = [cut(m, shares[m.seq]) for m in tail]
    return [m for m in out if m.content]


def cut(m: Message, limit: int) -> Message:
    """A message cut to `limit` characters and marked: a reply keeps its beginning (where the
    answer is), a user message its end (the words just spoken)."""
    if len(m.content) <= limit:
        return m
    if limit <= 1:
        return dataclasses.replace(m, content=m.content[: max(limit, 0)])
    if m.role is not Role.USER:
        return dataclasses.replace(m, content=m.content[: limit - 1] + _CUT_MARK)
    return dataclasses.replace(m, content=_CUT_MARK + m.content[-(limit - 1) :])


def _newest_that_fit(older: Sequence[list[Message]], room: int, before: Message | None) -> tuple[list[Message], int]:
    """The newest messages of the units `older` that fit `room` in front of `before` (the first
    raw message after them), and the characters they take: alternation joins two messages of one
    role with a newline, which counts too. A tool call and its results are kept or dropped
    together."""
    kept: list[list[Message]] = []
    used = 0

    def cost(unit: list[Message]) -> int:
        nxt = kept[-1][0] if kept else before
        return sum(m.size for m in unit) + (1 if nxt is not None and joins(unit[-1], nxt) else 0)

    for unit in reversed(older):
        if used + cost(unit) > room:
            break
        used += cost(unit)
        kept.append(unit)
    # A raw stretch never starts with a reply (or tool traffic) whose question is not shown beside it.
    while kept and kept[-1][0].role is not Role.USER:
        unit = kept.pop()
        used -= cost(unit)
    kept.reverse()
    return [m for unit in kept for m in unit], used


def _fit_lines(lines: Sequence[tuple[int, int, str]], room: int, label: str) -> list[tuple[int, int, str]]:
    """The newest lines that fit `room` with their label (and the newline before the block),
    kept in order."""
    used = len(label) + 1
    kept: list[tuple[int, int, str]] = []
    for line in reversed(lines):
        if used + 1 + len(line[2]) > room:
            break
        kept.append(line)
        used += 1 + len(line[2])
    kept.reverse()
    return kept


def _fit_best(lines: Sequence[tuple[int, str]], room: int, label: str) -> list[tuple[int, str]]:
    """The first lines (best first) that fit `room` with their label."""
    used = len(label) + 1
    kept: list[tuple[int, str]] = []
    for line in lines:
        if used + 1 + len(line[1]) <= room:
            kept.append(line)
            used += 1 + len(line[1])
    return kept


def _block_chars(lines: Sequence[tuple[object, ...]], label: str) -> int:
    """A block's characters: its label, each line after a newline, and the newline before it."""
    return len(label) + sum(1 + len(str(line[-1])) for line in lines) + 1 if lines else 0


def _older_matches(c: Candidates, tail: Sequence[Message]) -> bool:
    first = tail[0].seq if tail else None
    return any(first is None or m.seq < first for m, _ in c.matches)


def _match_lines(c: Candidates, *, first_raw: int | None, labels: dict[str, str]) -> list[tuple[int, str]]:
    """(seq, labelled text) of the messages that match the question and are older than
    `first_raw` (the last turn, always shown raw), best first: each whole, as memory reads it."""
    out: list[tuple[int, str]] = []
    for m, _score in c.matches:
        if m.answered and (first_raw is None or m.seq < first_raw) and (text := remembered(m)):
            out.append((m.seq, labels[m.role.value] + text))
    return out


def _chars(messages: Sequence[Message]) -> int:
    return sum(m.size for m in messages)


def _joined(messages: Sequence[Message]) -> int:
    """The characters of the messages once alternated: a newline joins two of one role."""
    return _chars(messages) + sum(1 for a, b in itertools.pairwise(messages) if joins(a, b))
