"""A context in one call: `assemble` turns what the tier walk gathered (`Gathered`) into the
answer the API returns (`ContextAnswer`). It chooses the memory within the budget (policy.py),
renders the summary's facts, what the session carries over from its user and the digest of a
lagging summary, puts them in the messages a model reads with the request's knowledge-base
snippets, and shapes the transcripts and the token estimates.

No I/O and no clock: the walk (core/reads.py) reads the tiers and the time, this module only
computes. `Memo` keeps what a session's next read would compute again; it never changes an answer.

The walk also reads as much as the assembly will show: which turns are the window, how much room
the older turns have, what the knowledge-base snippets leave of the budget. That arithmetic is
the assembly's own (context.py, kb_snippets.py, users.py); the walk asks it here, through this
module, so that the read goes down into this room by one door.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal

from tiered_memory.lru import Lru
from tiered_memory.model import (
    ContextRequest,
    HotSession,
    Message,
    Role,
    SessionInfo,
    SessionKey,
    SessionState,
    Summary,
    SummaryAnswer,
    SummarySource,
    Tier,
    UserMemory,
)

# Pure: the structured summary's fields and their planning view (it imports only model and errors).
from tiered_memory.payload import planning, planning_history
from tiered_memory.prompt import kb_snippets
from tiered_memory.prompt.context import (
    ChatMessage,
    alternate,
    answer_transcript,
    compose,
    content_chars,
    cut_parts,
    estimate_tokens,
    frame,
    hot_list_whole,
    hot_window_complete,
    memory_room,
    older_chars,
    recent_transcript,
    summary_system_text,
    window,
    window_start_turn,
)
from tiered_memory.prompt.facts import FactBook, lead
from tiered_memory.prompt.memo import MemoCache, View
from tiered_memory.prompt.policy import Candidates, Facts, Part, Selection, choose, lagging_digest
from tiered_memory.prompt.selections import SelectionMemo, fingerprint
from tiered_memory.prompt.users import TOPIC_CANDIDATES, CarriedText, Earlier, Profile, best_by_topic, carried_text
from tiered_memory.text.dialogue import shown_and_events
from tiered_memory.text.language import as_spoken, language_of
from tiered_memory.text.quoting import frame_chars, quoted

__all__ = [
    "Carried",
    "ContextAnswer",
    "Explained",
    "Gathered",
    "Knobs",
    "Memo",
    "Remembered",
    "assemble",
    "content_chars",
    "earlier_wanted",
    "hot_list_whole",
    "hot_window_complete",
    "memory_budget",
    "older_chars",
    "window",
    "window_start_turn",
]

# The parts of a context's memory that come from the session's summary (policy.ORIGINS).
_FROM_SUMMARY = frozenset({"summary", "salient", "subject"})
# The user messages of a session's first turns say what it is about: a `topic` carry-over matches them.
_OPENING_TURNS = 3


@dataclass(frozen=True, slots=True)
class Explained:
    """Where a context's memory came from: the system text's pieces as sent, each with its origin
    (policy.ORIGINS), the raw messages shown after it, and the layout that won."""

    memory: tuple[Part, ...]
    raw: tuple[Message, ...]
    layout: int | None


@dataclass(frozen=True, slots=True)
class Carried:
    """What a context carried over from its user's earlier sessions (USER_MEMORY): the mode, the
    earlier session whose summary it shows (None: none) and the profile it shows (None: none)."""

    mode: UserMemory
    earlier: Earlier | None
    profile: Profile | None
    # What the policy had rendered, last: the context's answer says what made it in.
    shown: list[CarriedText] = dataclasses.field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ContextAnswer:
    key: SessionKey
    summary_tier: Tier
    summary: str | None
    covered_turns: int
    topics: tuple[str, ...]
    messages: list[ChatMessage]
    turn_count: int
    recent_transcript: str
    answer_transcript: str
    estimated_tokens: dict[str, int]
    planning: dict[str, Any] | None
    planning_history: str
    state: SessionState | None = None  # the gateway's, as the walk found it (None: unknown)
    carried: Carried | None = None  # what the session carried over from its user's earlier ones
    explained: Explained | None = None  # where each part of the memory came from (explain=true)
    compressions: int = 0  # how many times the session's turns were merged into its summary
    compression_applied: bool = False  # whether this context's memory holds the summary's text
    kb_snippets_used: int | None = None  # how many of the request's kb_snippets it shows (None: none given)


@dataclass(frozen=True, slots=True)
class Knobs:
    """The settings a context's assembly reads (settings.py names and checks them)."""

    memory_mode: Literal["none", "window", "summary"]
    summary_max_chars: int
    reconnect_gap_seconds: int
    reconnect_templates: dict[str, str]
    recent_transcript_max_chars: int
    answer_history_max_chars: int
    planning_history_max_chars: int
    chars_per_token: float


class Memo:
    """What the assembly keeps across reads, since a session's next context reads most of the same
    messages again: what the policy works out of each message (its condensed form, its features),
    each summary's facts, and the last choice per (session, budget). Belongs to one event loop."""

    def __init__(self) -> None:
        self.notes = MemoCache()
        # Each summary's facts, loaded once (None: not the extractor's), by (session, summary stamp).
        self.books: Lru[tuple[str, tuple[int, float]], tuple[FactBook | None]] = Lru(1024)
        # The last choice per (session, budget): a read of an unchanged session answers from it.
        self.selections: SelectionMemo[tuple[Selection, tuple[Part, ...]]] = SelectionMemo()


@dataclass(frozen=True, slots=True)
class Remembered:
    """What SQL holds of a session's user for a carry-over (USER_MEMORY): the mode asked for, the
    profile (None: none stored) and the user's other sessions' summaries, most recent first."""

    mode: UserMemory
    profile: Profile | None
    earlier: tuple[tuple[SessionKey, Summary], ...]


@dataclass(frozen=True, slots=True)
class Gathered:
    """Everything the tier walk found for one context: the hot entry, the summary's answer, the
    SQL session when SQL was asked, the turn count, the raw messages to choose from (older turns,
    the gap a lagging summary leaves, the window), the window with its gap, a question's matching
    messages with their scores, the user's memory (None: none carried), when it was read, and the
    gateway's state as the hot tier knows it, else as SQL's session read gave it (None: unknown)."""

    key: SessionKey
    hot: HotSession
    answer: SummaryAnswer
    info: SessionInfo | None
    turn_count: int
    shown: tuple[Message, ...]
    recent: tuple[Message, ...]
    snippets: tuple[tuple[Message, float], ...]
    remembered: Remembered | None
    now: float
    state: SessionState | None = None


def memory_budget(want: ContextRequest) -> int:
    """The memory's budget: what the knowledge-base snippets' share leaves (all without them)."""
    return want.max_chars - kb_snippets.reserve(want.kb_snippets or (), want.max_chars)


def earlier_wanted(mode: UserMemory) -> int:
    """How many of the user's earlier summaries a carry-over in `mode` chooses from."""
    return {"off": 0, "profile": 0, "last_session": 1, "topic": TOPIC_CANDIDATES}[mode]


def assemble(gathered: Gathered, want: ContextRequest, *, knobs: Knobs, memo: Memo) -> ContextAnswer:
    """The context `want` asks for, of what the walk gathered: the policy's choice within the
    memory's budget, framed by `system_prompt` and `question`, the knowledge-base snippets set
    apart before the memory is chosen and more of them in what the memory leaves (kb_snippets.py),
    with where each part of the memory came from and what the session carried over."""
    question, kb = want.question, want.kb_snippets or ()
    max_chars = memory_budget(want)
    carried = _carried(gathered, question)
    candidates, basis = _candidates(gathered, carried, question, knobs, memo)
    chosen, parts = _chosen(gathered, candidates, basis, max_chars, knobs, memo)
    raw = alternate(chosen.raw)
    memory_text = "\n".join(text for _, text in parts) or None
    messages = compose(memory_text, raw, max_chars=max_chars)
    # The snippets set apart, and more of them when the memory did not need all its room.
    messages, used, reference = kb_snippets.shown(messages, kb, max_chars=want.max_chars, lang=candidates.lang)
    shaped = _shaped(
        gathered, messages, knobs, system_prompt=want.system_prompt, question=question, reference=reference
    )
    explained = Explained(cut_parts(parts, memory_room(raw, max_chars)), tuple(chosen.raw), chosen.layout)
    applied = any(origin in _FROM_SUMMARY and text for origin, text in explained.memory)
    shaped = dataclasses.replace(
        shaped,
        explained=explained,
        compression_applied=applied,
        kb_snippets_used=None if want.kb_snippets is None else used,
    )
    if carried is not None and carried.shown and carried.shown[-1].text and "carried" in chosen.chars:
        made = carried.shown[-1]
        carried = Carried(
            carried.mode, carried.earlier if made.earlier else None, carried.profile if made.profile else None
        )
        return dataclasses.replace(shaped, carried=carried)
    return shaped


def _carried(gathered: Gathered, question: str | None) -> Carried | None:
    """What the session carries over of what SQL holds of its user: the profile, and the most
    recent earlier summary (`last_session`) or the one whose topics the session's first user
    messages name (`topic`). None when it carries nothing."""
    remembered = gathered.remembered
    if remembered is None:
        return None
    mode, profile = remembered.mode, remembered.profile
    earlier = [Earlier(key, summary, summary.updated_at) for key, summary in remembered.earlier]
    chosen: Earlier | None = None
    if mode == "last_session" and earlier:
        chosen = earlier[0]
    elif mode == "topic" and earlier:
        summary = gathered.answer.summary
        opening = [m.content for m in gathered.shown if m.role is Role.USER and m.turn <= _OPENING_TURNS]
        said = [str(summary.structured.get("subject", "")) if summary else "", *opening]
        if len(opening) < _OPENING_TURNS and question:
            said.append(question)  # a new session's first question says what it is about
        chosen = best_by_topic(earlier, "\n".join(said))
    if chosen is None and (profile is None or not profile.items):
        return None
    return Carried(mode, chosen, profile if profile is not None and profile.items else None)


def _candidates(
    gathered: Gathered, carried: Carried | None, question: str | None, knobs: Knobs, memo: Memo
) -> tuple[Candidates, Hashable]:
    """The policy's input: the messages, the summary as a renderer of its facts, the subject,
    the session's terms, and the memo of what each message reads as; with what its renderers
    close over (the summary and its label), for `SelectionMemo`."""
    key, summary = gathered.key, gathered.answer.summary
    spoken = as_spoken(gathered.shown)
    snippets = gathered.snippets
    matches = list(zip(as_spoken([m for m, _ in snippets]), [score for _, score in snippets], strict=True))
    shown, events = shown_and_events(spoken, summary.covered_turns if summary else 0)
    # The user's language labels the memory (a mixed conversation follows the user).
    said = "".join(m.content for m in shown[-6:] if m.role is Role.USER)
    earlier = carried.earlier.summary.text if carried is not None and carried.earlier else ""
    # A new session's first question (or the memory it carries) speaks when nothing else has.
    lang = language_of(said or (summary.text if summary else "") or question or earlier)
    # A summary's version and write time tell it apart, even from one of a deleted session
    # that had the same id.
    stamp = (summary.version, summary.updated_at) if summary is not None else (0, 0.0)
    book = _book(memo, key, stamp, summary)
    names, salient = book.terms() if book is not None else (frozenset(), frozenset())

    def views(m: Message) -> View:
        return memo.notes.view(key, m, salient, names)

    def text_features(text: str) -> frozenset[str]:
        return memo.notes.features((key, stamp), text, salient, names)

    last = gathered.info.last_activity if gathered.info else gathered.hot.last_activity
    # The label (`[Conversation summary]`, or how long ago after a gap) is part of what the memo
    # of this read's choice is kept under.
    idle = None if last is None else gathered.now - last
    # The summary's text too: a cold extraction's stamp (version 0, the session's last activity)
    # may stay the same when an older message is patched.
    said_summary = (summary.covered_turns, summary.text) if summary else (0, "")
    basis = (stamp, said_summary, _summary_text(knobs, "", idle, lang))
    candidates = Candidates(
        messages=shown,
        whole=bool(spoken) and spoken[0].seq <= 1,
        lang=lang,
        facts=_facts(knobs, summary, book, idle, lang) if summary is not None else None,
        subject=quoted(str(summary.structured.get("subject", ""))) if summary else "",
        matches=matches,
        frame=frame_chars(),
        terms_salient=salient,
        names=names,
        events=events,
        views=views,
        text_features=text_features,
        carried=_carried_renderer(carried, lang, gathered.now, knobs) if carried is not None else None,
    )
    return candidates, basis


def _chosen(
    gathered: Gathered, candidates: Candidates, basis: Hashable, max_chars: int, knobs: Knobs, memo: Memo
) -> tuple[Selection, tuple[Part, ...]]:
    """The policy's choice and the system text's parts, from the memo when this session was
    read at this budget from the same input last time. A context that carries memory over is
    chosen afresh: what it carries is rendered as the policy asks for it."""
    key = gathered.key
    print_ = fingerprint(candidates, max_chars, basis) if candidates.carried is None else None
    found = memo.selections.get(key, max_chars, print_) if print_ is not None else None
    if found is not None:
        return found
    chosen = choose(candidates, max_chars)
    room_left = memory_room(alternate(chosen.raw), max_chars)
    parts = _with_digest(gathered, candidates, chosen, knobs, max_chars=max_chars, room_left=room_left)
    return (chosen, parts) if print_ is None else memo.selections.put(key, max_chars, print_, (chosen, parts))


def _carried_renderer(carried: Carried, lang: str, now: float, knobs: Knobs) -> Callable[[int], str]:
    def render(room: int) -> str:
        made = carried_text(
            carried.earlier,
            carried.profile,
            room=room,
            now=now,
            lang=lang,
            templates=knobs.reconnect_templates,
        )
        carried.shown.append(made)
        return made.text

    return render


def _book(memo: Memo, key: SessionKey, stamp: tuple[int, float], summary: Summary | None) -> FactBook | None:
    """The extractor's facts of `summary`, loaded once per summary; None for an LLM's summary
    (its text, not the extractor's facts beside it, is the memory) or without one."""
    if summary is None or not summary.structured or summary.source is not SummarySource.DETERMINISTIC:
        return None
    found = memo.books.get((key, stamp))
    if found is None:
        found = memo.books.put((key, stamp), (FactBook.load(summary.structured),))
    return found[0]


def _with_digest(
    gathered: Gathered, candidates: Candidates, chosen: Selection, knobs: Knobs, *, max_chars: int, room_left: int
) -> tuple[Part, ...]:
    """The chosen system text's parts, led by the key points of the turns the summary does
    not hold yet and that the context does not show, so that a budget cut falls on the rest,
    not on them; but never over a question's matches, which outrank them: beside those the
    digest takes only the room the selection left of `room_left` (what the raw turns and the
    block's tags leave of max_chars)."""
    if knobs.memory_mode != "summary":
        return chosen.parts
    summary = gathered.answer.summary
    room = max(50, min(knobs.summary_max_chars, max_chars // 4))
    if chosen.chars.get("snippets"):
        room = min(room, room_left - len(chosen.system or "") - 1)
    digest = lagging_digest(candidates, chosen, summary.covered_turns if summary else 0, room)
    return (("lagging", digest), *chosen.parts) if digest else chosen.parts


def _shaped(
    gathered: Gathered,
    messages: list[ChatMessage],
    knobs: Knobs,
    *,
    system_prompt: str | None,
    question: str | None,
    reference: str = "",
) -> ContextAnswer:
    """The answer: the messages framed for a provider, the transcripts, the token estimates."""
    summary, info, recent = gathered.answer.summary, gathered.info, gathered.recent
    messages = frame(messages, system_prompt=system_prompt, question=question)
    # What sending the whole history instead would cost, framed the same way (`reference`:
    # the knowledge-base block, which it would carry too).
    framing = len(system_prompt or "") + len(question or "") + len(reference)
    full = (info.content_chars if info else (gathered.hot.content_chars or 0)) + framing
    returned = sum(m.size for m in messages)
    payload = summary.structured.get("payload") if summary else None
    return ContextAnswer(
        key=gathered.key,
        summary_tier=gathered.answer.tier,
        summary=summary.text if summary else None,
        covered_turns=summary.covered_turns if summary else 0,
        topics=summary.topics if summary else (),
        messages=messages,
        turn_count=gathered.turn_count,
        recent_transcript=recent_transcript(as_spoken(recent), max_chars=knobs.recent_transcript_max_chars),
        answer_transcript=answer_transcript(recent, max_chars=knobs.answer_history_max_chars),
        estimated_tokens={
            "context": estimate_tokens(returned, knobs.chars_per_token),
            "full_history": estimate_tokens(full, knobs.chars_per_token),
        },
        planning=planning(payload) if payload else None,
        planning_history=planning_history(
            recent_transcript(as_spoken(recent), max_chars=knobs.planning_history_max_chars),
            payload,
            max_chars=knobs.planning_history_max_chars,
        ),
        state=gathered.state,
        compressions=summary.compressions if summary else 0,
    )


def _summary_text(knobs: Knobs, text: str, idle_seconds: float | None, lang: str) -> str:
    return summary_system_text(
        text,
        idle_seconds=idle_seconds,
        reconnect_gap_s=knobs.reconnect_gap_seconds,
        templates=knobs.reconnect_templates,
        lang=lang,
    )


def _facts(knobs: Knobs, summary: Summary, book: FactBook | None, idle_seconds: float | None, lang: str) -> Facts:
    """The summary's renderer for the policy: an extractor's re-rendered from its stored facts
    for the room and turns given (whole facts, none shown raw); an LLM's text cut to sentences."""
    label_chars = len(_summary_text(knobs, "", idle_seconds, lang))
    # Quoted once: the policy asks for the summary at many rooms.
    text = quoted(summary.text) if book is None else ""

    def facts(room: int, before_turn: int | None, by_rank: bool) -> str:
        if room <= label_chars:
            return ""
        if book is not None:
            body = book.render(
                room - label_chars, before_turn=before_turn, topics=summary.topics, newest_first=not by_rank
            )
        else:
            body = lead(text, room - label_chars)
        return _summary_text(knobs, body, idle_seconds, lang) if body else ""

    return facts
