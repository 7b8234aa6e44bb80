"""SessionReads: how the service reads a session across the tiers, for load_best_summary and
context. Reads walk hot → warm → cold and say which tier answered; a tier that fails or times out
is skipped, counted and logged; what SQL gave is written back to the hot tier."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from tiered_memory.core.history import History
from tiered_memory.errors import Forbidden
from tiered_memory.lru import Lru
from tiered_memory.metrics import Metrics
from tiered_memory.model import (
    Caller,
    ContextRequest,
    HotSession,
    Message,
    Owner,
    Role,
    SessionInfo,
    SessionKey,
    SessionState,
    Summary,
    SummaryAnswer,
    SummarySource,
    Tier,
    UserMemory,
    key_tenant,
)
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
from tiered_memory.prompt.notes import NoteCache, View
from tiered_memory.prompt.policy import Candidates, Facts, Part, Selection, choose, lagging_digest
from tiered_memory.prompt.selections import SelectionMemo, fingerprint
from tiered_memory.prompt.users import TOPIC_CANDIDATES, CarriedText, Earlier, Profile, best_by_topic, carried_text
from tiered_memory.settings import Settings
from tiered_memory.summarize.cold import COLD_READ_SUMMARIES, cold_slice, cold_summary
from tiered_memory.summarize.lane import TextLane, Ticket, text_bytes
from tiered_memory.summarize.payload import planning, planning_history
from tiered_memory.summarize.topics import TopicTagger
from tiered_memory.text.dialogue import shown_and_events
from tiered_memory.text.language import as_spoken, language_of
from tiered_memory.text.quoting import frame_chars, quoted
from tiered_memory.tiers.errors import TierErrors
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tiers.sql.users import SqlUsers

# A cold extraction reads at most this many rows from the start of a session and from its end
# (its characters are bounded by summarize.cold; these bound a session of very short messages).
_COLD_HEAD_MESSAGES = 50
_COLD_TAIL_MESSAGES = 100
# A context read puts at most this many turns between a lagging summary and the window.
_GAP_MAX_TURNS = 100
# The parts of a context's memory that come from the session's summary (context_policy.ORIGINS).
_FROM_SUMMARY = frozenset({"summary", "salient", "subject"})
# The user messages of a session's first turns say what it is about: a `topic` carry-over matches them.
_OPENING_TURNS = 3


@dataclass(frozen=True, slots=True)
class _Walked:
    """What the tier walk of a context read found: the hot entry, the summary's answer, the SQL
    session when SQL was asked, the raw messages from the window on, and the turn count."""

    hot: HotSession
    answer: SummaryAnswer
    info: SessionInfo | None
    available: list[Message]
    turn_count: int


@dataclass(frozen=True, slots=True)
class ContextAnswer:
    session_id: str
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
    state: SessionState | None = None  # the gateway's, as the hot tier knows it (None: unknown)
    carried: Carried | None = None  # what the session carried over from its user's earlier ones
    explained: Explained | None = None  # where each part of the memory came from (explain=true)
    compressions: int = 0  # how many times the session's turns were merged into its summary
    compression_applied: bool = False  # whether this context's memory holds the summary's text
    kb_snippets_used: int | None = None  # how many of the request's kb_snippets it shows (None: none given)


@dataclass(frozen=True, slots=True)
class Explained:
    """Where a context's memory came from: the system text's pieces as sent, each with its origin
    (context_policy.ORIGINS), the raw messages shown after it, and the layout that won."""

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


class SessionReads:
    """The reads that walk the tiers: the best summary (hot → warm → cold → none) and the context
    (summary, recent turns and older ones, within a budget). What SQL answers is backfilled into
    the hot tier, so that the next read is hot."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: SqlStore,
        users: SqlUsers,
        hot: HotTier,
        history: History,
        text: TextLane,
        tagger: TopicTagger,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self._s = settings
        self._store = store
        self._users = users
        self._hot = hot
        self._history = history
        self._text = text
        self._tagger = tagger
        self._metrics = metrics
        self._errors = TierErrors(metrics.tier_errors)
        self._clock = clock
        # What the context policy works out of each message (its condensed form, its features),
        # kept across reads: a session's next context reads most of the same messages again.
        self._notes = NoteCache()
        # Each summary's facts, loaded once (None: not the extractor's), by (session, summary stamp).
        self._books: Lru[tuple[str, tuple[int, float]], tuple[FactBook | None]] = Lru(1024)
        # The last choice per (session, budget): a read of an unchanged session answers from it.
        self._selections: SelectionMemo[tuple[Selection, tuple[Part, ...]]] = SelectionMemo()

    async def load_best_summary(self, key: SessionKey, *, caller: Caller) -> SummaryAnswer:
        """Hot summary → warm row (backfilling hot) → deterministic extraction from messages → none.

        The owner comes from the same hot round trip; only when the hot tier does not know it is
        SQL asked, and for a restricted caller that answer is required (SqlUnavailable otherwise).
        Raises Forbidden when the session is not the caller's.
        """
        summary, turns, owner = await self._errors.hot("read_summary", self._hot.read_summary(key), (None, None, None))
        if owner is not None and not _in_namespace(owner, key):
            summary, turns, owner = None, None, None
        if owner is not None:
            authorize(caller, owner)
        if summary is not None:
            info: SessionInfo | None = None
            if owner is None and not caller.unrestricted:
                info = await self._store.get_session(key, replica=True)
                if info is None:
                    # SQL knows no such session: the cached summary is an orphan, shown to nobody.
                    return self._answer(key, Tier.NONE, None, 0)
                authorize(caller, info.owner)
            elif turns is None:
                # The counters expired before the summary did; SQL knows the turn count.
                info = await self._sql_session(key)
            if info is not None:
                # Counters and owner back into the hot tier, so that the next read needs no SQL.
                await self._backfill(info, summary=None, recent=None)
                turns = info.turn_count
            return self._answer(key, Tier.HOT, summary, summary.covered_turns if turns is None else turns)
        answer, info = await self._summary_below_hot(key, caller)
        if info is not None and (answer.tier is Tier.WARM or owner is None):
            await self._backfill(info, summary=answer.summary if answer.tier is Tier.WARM else None, recent=None)
        return answer

    async def _summary_below_hot(
        self, key: SessionKey, caller: Caller, *, cold: bool = True
    ) -> tuple[SummaryAnswer, SessionInfo | None]:
        """The warm row, else the cold extraction (unless not `cold`), else none; with the
        session SQL returned. Raises Forbidden when SQL says the session is not the caller's."""
        summary, info = await self._errors.sql("read_summary", self._store.get_summary(key, replica=True), (None, None))
        if info is None:
            return self._answer(key, Tier.NONE, None, 0), None
        authorize(caller, info.owner)
        if summary is not None:
            return self._answer(key, Tier.WARM, summary, info.turn_count), info
        extracted = await self._cold_summary(info) if cold else None
        tier = Tier.NONE if extracted is None else Tier.COLD
        return self._answer(key, tier, extracted, info.turn_count), info

    async def _backfill(self, info: SessionInfo, *, summary: Summary | None, recent: list[Message] | None) -> None:
        await self._errors.hot(
            "backfill", self._hot.backfill(info.session_id, info.counters, summary=summary, recent=recent), None
        )

    async def _keep_older(
        self, key: SessionKey, info: SessionInfo | None, hot: HotSession, messages: list[Message]
    ) -> None:
        """Put older messages a context read from SQL into the hot list, in front of what it
        holds, so that the next context of the session reads them from the hot tier (a list that
        was refilled with the window only, after Redis lost it, otherwise sends every context to
        SQL until appends have grown it back). Written only if no append reached the hot tier
        meanwhile; the tier keeps the newest of them it has room for."""
        if info is not None:
            # The list must end where the counters do, or the next read takes it as incomplete.
            if messages and messages[-1].seq == info.message_count:
                await self._backfill(info, summary=None, recent=messages)
            return
        counters = hot.counters
        if counters is None or not messages or messages[-1].seq != counters.message_count:
            return
        await self._errors.hot("backfill", self._hot.backfill(key, counters, summary=None, recent=messages), None)

    async def _cold_summary(self, info: SessionInfo) -> Summary | None:
        messages = await self._errors.sql("read_messages", self._cold_messages(info), None)
        if messages is None:
            return None
        # A request waits on it: urgent, ahead of every tenant's background work.
        ticket = Ticket(key_tenant(info.session_id), text_bytes(messages), urgent=True)
        limit = self._s.summary_max_chars
        return await self._text.call(ticket, cold_summary, info, messages, tagger=self._tagger, max_chars=limit)

    async def _cold_messages(self, info: SessionInfo) -> list[Message]:
        """What a cold extraction reads: the whole session when it is short, else whole messages
        of its opening and of its end, COLD_READ_SUMMARIES times SUMMARY_MAX_CHARS in all. A cold
        read runs on the request path, so its cost must not grow with the session (a 10,000-turn
        session took 8 s read whole, and 600 messages 230 ms); the opening holds who the user is
        and what they came for, the end what is going on now, and the summary job (scheduled by
        the service after a cold read of a session whose summary is due), which reads every turn
        batch by batch, covers the middle. Completed turns only, like a real summary: an open
        question is in the window, raw."""
        sid = info.session_id
        max_chars = COLD_READ_SUMMARIES * self._s.summary_max_chars
        head = await self._store.first_messages(sid, _COLD_HEAD_MESSAGES, replica=True, known_seq=info.message_count)
        if len(head) < _COLD_HEAD_MESSAGES and content_chars(head) <= max_chars:
            messages = head
        else:
            tail = head
            if len(head) == _COLD_HEAD_MESSAGES:
                tail = await self._store.recent_messages(
                    sid, _COLD_TAIL_MESSAGES, replica=True, known_seq=info.message_count
                )
            messages = cold_slice(head, tail, max_chars=max_chars)
        return [m for m in messages if m.turn <= info.turn_count]

    def _answer(self, key: SessionKey, tier: Tier, summary: Summary | None, turns: int) -> SummaryAnswer:
        self._metrics.summary_loads.labels(tier.value).inc()
        if summary is not None:
            self._metrics.summary_lag.observe(max(0, turns - summary.covered_turns))
        return SummaryAnswer(session_id=key, tier=tier, summary=summary, turn_count=turns)

    async def _sql_session(self, key: SessionKey) -> SessionInfo | None:
        return await self._errors.sql("read_session", self._store.get_session(key, replica=True), None)

    async def context(
        self,
        key: SessionKey,
        want: ContextRequest,
        *,
        caller: Caller,
    ) -> ContextAnswer:
        """Summary plus recent turns, prompt-ordered, within max_chars of memory; with
        `user_memory` (None: off), led by what the session carries over from its user's earlier
        sessions (the session's user, or `user_id` for a session not stored yet).

        One hot round trip answers both when Redis has them; otherwise the summary walk and the
        SQL read of the recent turns run concurrently, each with its own fallback, and what SQL
        gave is backfilled into the hot tier in one more round trip so the next read is hot.
        Turns the summary does not cover yet (it lags behind a slow LLM) and that are older than
        the window are added raw when they fit, or as a deterministic digest: no turn falls
        between the summary and the window. `system_prompt`, `question` and the memory block's tags
        (not counted in max_chars) frame it: rules and memory in one system message, question last.
        The caller's `kb_snippets` are counted in max_chars: the first that fit its KB_SHARE are
        set apart before the memory is chosen in the rest, and what the memory leaves goes to
        the next ones; they lead the first user message (kb_snippets.py).

        The owner comes from the same hot round trip; only when the hot tier does not know it is
        SQL asked, and for a restricted caller that answer is required (SqlUnavailable otherwise).
        Raises Forbidden when the session is not the caller's.
        """
        question, excluded, kb = want.question, want.exclude_message_id, want.kb_snippets or ()
        # The memory's budget: what the knowledge-base snippets' share leaves (all without them).
        max_chars = want.max_chars - kb_snippets.reserve(kb, want.max_chars)
        hot, known = await self._authorized(key, caller)
        keep = 0 if self._s.memory_mode == "none" else self._s.keep_recent_turns
        (answer, warm_info), (available, info, rows) = await asyncio.gather(
            self._context_summary(key, caller, hot, max_chars), self._window_rows(key, hot, known, keep)
        )
        retried = False
        if excluded is not None:
            # A retried load-then-append: its message is stored already and comes back as the
            # question. Without it the messages are not the session's: not written back to the list.
            kept = [m for m in available if m.message_id != excluded]
            retried, available = len(kept) < len(available), kept
        sql_info = info or warm_info
        warm_summary = answer.summary if answer.tier is Tier.WARM else None
        if sql_info is not None and (rows is not None or warm_summary is not None or hot.owner is None):
            await self._backfill(sql_info, summary=warm_summary, recent=rows)
        turn_count = sql_info.turn_count if sql_info else max(hot.turn_count or 0, answer.turn_count)
        recent = window(available, turn_count=turn_count, keep_recent_turns=keep)
        walked = _Walked(hot=hot, answer=answer, info=sql_info, available=available, turn_count=turn_count)
        shown, recent, snippets = await self._material(
            key, walked, recent, max_chars=max_chars, question=question, write_back=not retried
        )
        carried = await self._carried(key, walked, shown, want.user_memory or "off", want.user_id, question)
        candidates, basis = self._candidates(key, walked, shown, snippets, carried, question)
        chosen, parts = self._chosen(key, walked, candidates, basis, max_chars)
        raw = alternate(chosen.raw)
        memory_text = "\n".join(text for _, text in parts) or None
        messages = compose(memory_text, raw, max_chars=max_chars)
        # The snippets set apart, and more of them when the memory did not need all its room.
        messages, used, reference = kb_snippets.shown(messages, kb, max_chars=want.max_chars, lang=candidates.lang)
        shaped = self._shaped(
            key, walked, recent, messages, system_prompt=want.system_prompt, question=question, reference=reference
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

    async def _authorized(self, key: SessionKey, caller: Caller) -> tuple[HotSession, SessionInfo | None]:
        """The hot tier's entry of the session once the caller may read it, and the SQL row when
        the hot tier did not know the owner and SQL was asked (Forbidden otherwise)."""
        hot = await self._errors.hot("read_session", self._hot.read_session(key), _NO_HOT)
        if hot.owner is not None and not _in_namespace(hot.owner, key):
            hot = _NO_HOT
        known: SessionInfo | None = None
        if hot.owner is not None:
            authorize(caller, hot.owner)
        elif not caller.unrestricted:
            known = await self._store.get_session(key, replica=True)
            if known is None:
                # SQL knows no such session: whatever the cache still holds is shown to nobody.
                hot = _NO_HOT
            else:
                authorize(caller, known.owner)
        return hot, known

    async def _carried(
        self,
        session: SessionKey,
        walked: _Walked,
        shown: list[Message],
        mode: UserMemory,
        user_id: str | None,
        question: str | None,
    ) -> Carried | None:
        """What the session may carry over from its user's earlier sessions in the tenant of its
        key: the profile, and the most recent earlier summary (`last_session`) or the one whose
        topics the session's first user messages name (`topic`). None when it carries nothing
        (mode off, no user, nothing stored, or SQL down: a context never fails for it)."""
        if mode == "off" or self._s.memory_mode == "none":
            return None
        owner = walked.hot.owner or (walked.info.owner if walked.info else None)
        # A stored session's own user, never a stated one: a session carries its owner's memory.
        user = owner.user_id if owner is not None else user_id
        if user is None:
            return None
        wanted = {"profile": 0, "last_session": 1, "topic": TOPIC_CANDIDATES}[mode]
        found = await self._errors.sql(
            "read_user_memory",
            self._users.carried(key_tenant(session), user, exclude=session, profile=True, earlier=wanted),
            None,
        )
        if found is None:
            return None
        profile, others = found
        earlier = [Earlier(key, summary, summary.updated_at) for key, summary in others]
        chosen: Earlier | None = None
        if mode == "last_session" and earlier:
            chosen = earlier[0]
        elif mode == "topic" and earlier:
            summary = walked.answer.summary
            opening = [m.content for m in shown if m.role is Role.USER and m.turn <= _OPENING_TURNS]
            said = [str(summary.structured.get("subject", "")) if summary else "", *opening]
            if len(opening) < _OPENING_TURNS and question:
                said.append(question)  # a new session's first question says what it is about
            chosen = best_by_topic(earlier, "\n".join(said))
        if chosen is None and (profile is None or not profile.items):
            return None
        return Carried(mode, chosen, profile if profile is not None and profile.items else None)

    async def _context_summary(
        self, key: SessionKey, caller: Caller, hot: HotSession, max_chars: int
    ) -> tuple[SummaryAnswer, SessionInfo | None]:
        """The summary a context shows, and the SQL session when SQL was asked."""
        if self._s.memory_mode != "summary":
            return SummaryAnswer(key, Tier.NONE, None, hot.turn_count or 0), None
        if hot.summary is not None:
            turns = hot.turn_count if hot.turn_count is not None else hot.summary.covered_turns
            return self._answer(key, Tier.HOT, hot.summary, turns), None
        whole = hot_list_whole(hot.recent, message_count=hot.message_count)
        if whole and content_chars(m for m in hot.recent if m.answered) <= max_chars:
            # The context will be the whole conversation, raw: a summary would not be shown,
            # and a young session's (none yet, its first LLM call still out) would be
            # extracted from SQL on every request until it lands.
            return self._answer(key, Tier.NONE, None, hot.turn_count or 0), None
        # A warm row may be there (the hot summary evicted); an extraction is not made on a
        # request for a session the hot list holds whole: the policy condenses its raw turns
        # itself, until the summary job's summary lands.
        return await self._summary_below_hot(key, caller, cold=not whole)

    async def _window_rows(
        self, key: SessionKey, hot: HotSession, known: SessionInfo | None, keep: int
    ) -> tuple[list[Message], SessionInfo | None, list[Message] | None]:
        """Messages from the window's first turn (hot list, or SQL with one turn more), the SQL
        session when SQL was asked (`known` when the caller's check already asked it), and the
        rows to backfill."""

        async def sql_session() -> SessionInfo | None:
            return known if known is not None else await self._sql_session(key)

        if keep == 0:
            return [], known if hot.turn_count is not None else await sql_session(), None
        if hot_window_complete(
            hot.recent, message_count=hot.message_count, turn_count=hot.turn_count, keep_recent_turns=keep
        ):
            return list(hot.recent), known, None
        info = await sql_session()
        if info is None:
            # SQL is down (or the session is unknown): whatever Redis still has beats nothing.
            return list(hot.recent), None, None
        first = window_start_turn(info.turn_count, max(keep, 1))
        # One turn more than the window (down to turn 0, a greeting), so that the hot list this
        # refills is seen as complete by hot_window_complete next time.
        known_seq = max(info.message_count, hot.message_count or 0)
        rows = await self._errors.sql(
            "read_recent",
            self._store.messages_in_turns(key, after_turn=first - 2, replica=True, known_seq=known_seq),
            None,
        )
        if rows is None:
            return list(hot.recent), info, None
        return rows, info, rows

    async def _material(
        self,
        key: SessionKey,
        walked: _Walked,
        recent: list[Message],
        *,
        max_chars: int,
        question: str | None,
        write_back: bool,
    ) -> tuple[list[Message], list[Message], list[tuple[Message, float]]]:
        """What the policy chooses from, beyond the window: the turns between a lagging summary
        and the window, the older raw turns, and a question's matching messages. Returns (the raw
        messages to choose from, the window with its gap, the matching messages). Older turns
        read from SQL are put into the hot list when `write_back` (the messages read are the
        session's as stored)."""
        if self._s.memory_mode != "summary":
            return recent, recent, []
        hot, info, available = walked.hot, walked.info, walked.available
        covered = walked.answer.summary.covered_turns if walked.answer.summary else 0
        # A question's matches come from before the window, the turns a lagging summary leaves
        # out included: those the context shows raw anyway give their place to the next.
        window_seq = recent[0].seq if recent else None
        recent = await self._with_gap(key, covered, walked.turn_count, recent, available)
        count = info.message_count if info else hot.message_count
        snippets: list[tuple[Message, float]] = []
        if question and window_seq is not None and count:
            snippets = await self._history.snippets(
                key, question, count, before_seq=window_seq, seen=available, max_chars=max_chars
            )
        if not self._s.context_older_turns:
            return recent, recent, snippets
        # Older raw turns for the policy to condense or take the key points of.
        before_window = await self._history.older(
            key,
            recent,
            available,
            older_chars(max_chars, content_chars(recent)),
            message_count=count,
            content_chars=info.content_chars if info else hot.content_chars,
        )
        # Read from SQL: the older turns and the gap a lagging summary leaves before the list, one
        # contiguous stretch in front of it (the gap alone left a hole the next read refilled).
        fetched = [m for m in [*before_window, *recent] if not available or m.seq < available[0].seq]
        # Only while the hot list has room: once it holds what the default budget reads, a larger
        # budget's older turns come from SQL on each read (one indexed read). A load-then-append
        # writes them back too (a gateway that only calls /turns would otherwise read them from
        # SQL on every turn of a session whose list Redis lost), but not its retry.
        if fetched and write_back and self._hot.recent.has_room(available):
            await self._keep_older(key, info, hot, [*fetched, *available])
        return [*before_window, *recent], recent, snippets

    def _candidates(
        self,
        key: SessionKey,
        walked: _Walked,
        shown: list[Message],
        snippets: list[tuple[Message, float]],
        carried: Carried | None = None,
        question: str | None = None,
    ) -> tuple[Candidates, Hashable]:
        """The policy's input: the messages, the summary as a renderer of its facts, the subject,
        the session's terms, and this process's cache of what each message reads as; with what
        its renderers close over (the summary and its label), for `SelectionMemo`."""
        summary = walked.answer.summary
        spoken = as_spoken(shown)
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
        book = self._book(key, stamp, summary)
        names, salient = book.terms() if book is not None else (frozenset(), frozenset())

        def views(m: Message) -> View:
            return self._notes.view(key, m, salient, names)

        def text_features(text: str) -> frozenset[str]:
            return self._notes.features((key, stamp), text, salient, names)

        last = walked.info.last_activity if walked.info else walked.hot.last_activity
        # Read once: the label (`[Conversation summary]`, or how long ago after a gap) is part of
        # what the memo of this read's choice is kept under.
        idle = None if last is None else self._clock() - last
        # The summary's text too: a cold extraction's stamp (version 0, the session's last activity)
        # may stay the same when an older message is patched.
        said_summary = (summary.covered_turns, summary.text) if summary else (0, "")
        basis = (stamp, said_summary, self._summary_text("", idle, lang))
        candidates = Candidates(
            messages=shown,
            whole=bool(spoken) and spoken[0].seq <= 1,
            lang=lang,
            facts=self._facts(summary, book, idle, lang) if summary is not None else None,
            subject=quoted(str(summary.structured.get("subject", ""))) if summary else "",
            matches=matches,
            frame=frame_chars(),
            terms_salient=salient,
            names=names,
            events=events,
            views=views,
            text_features=text_features,
            carried=self._carried_renderer(carried, lang) if carried is not None else None,
        )
        return candidates, basis

    def _chosen(
        self, key: SessionKey, walked: _Walked, candidates: Candidates, basis: Hashable, max_chars: int
    ) -> tuple[Selection, tuple[Part, ...]]:
        """The policy's choice and the system text's parts, from the memo when this session was
        read at this budget from the same input last time. A context that carries memory over is
        chosen afresh: what it carries is rendered as the policy asks for it."""
        print_ = fingerprint(candidates, max_chars, basis) if candidates.carried is None else None
        found = self._selections.get(key, max_chars, print_) if print_ is not None else None
        if found is not None:
            return found
        chosen = choose(candidates, max_chars)
        room_left = memory_room(alternate(chosen.raw), max_chars)
        parts = self._with_digest(walked, candidates, chosen, max_chars=max_chars, room_left=room_left)
        return (chosen, parts) if print_ is None else self._selections.put(key, max_chars, print_, (chosen, parts))

    def _carried_renderer(self, carried: Carried, lang: str) -> Callable[[int], str]:
        def render(room: int) -> str:
            made = carried_text(
                carried.earlier,
                carried.profile,
                room=room,
                now=self._clock(),
                lang=lang,
                templates=self._s.reconnect_templates,
            )
            carried.shown.append(made)
            return made.text

        return render

    def _book(self, key: SessionKey, stamp: tuple[int, float], summary: Summary | None) -> FactBook | None:
        """The extractor's facts of `summary`, loaded once per summary; None for an LLM's summary
        (its text, not the extractor's facts beside it, is the memory) or without one."""
        if summary is None or not summary.structured or summary.source is not SummarySource.DETERMINISTIC:
            return None
        found = self._books.get((key, stamp))
        if found is None:
            found = self._books.put((key, stamp), (FactBook.load(summary.structured),))
        return found[0]

    def _with_digest(
        self, walked: _Walked, candidates: Candidates, chosen: Selection, *, max_chars: int, room_left: int
    ) -> tuple[Part, ...]:
        """The chosen system text's parts, led by the key points of the turns the summary does
        not hold yet and that the context does not show, so that a budget cut falls on the rest,
        not on them; but never over a question's matches, which outrank them: beside those the
        digest takes only the room the selection left of `room_left` (what the raw turns and the
        block's tags leave of max_chars)."""
        if self._s.memory_mode != "summary":
            return chosen.parts
        summary = walked.answer.summary
        room = max(50, min(self._s.summary_max_chars, max_chars // 4))
        if chosen.chars.get("snippets"):
            room = min(room, room_left - len(chosen.system or "") - 1)
        digest = lagging_digest(candidates, chosen, summary.covered_turns if summary else 0, room)
        return (("lagging", digest), *chosen.parts) if digest else chosen.parts

    def _shaped(
        self,
        key: SessionKey,
        walked: _Walked,
        recent: list[Message],
        messages: list[ChatMessage],
        *,
        system_prompt: str | None,
        question: str | None,
        reference: str = "",
    ) -> ContextAnswer:
        """The answer: the messages framed for a provider, the transcripts, the token estimates."""
        summary, info = walked.answer.summary, walked.info
        messages = frame(messages, system_prompt=system_prompt, question=question)
        # What sending the whole history instead would cost, framed the same way (`reference`:
        # the knowledge-base block, which it would carry too).
        framing = len(system_prompt or "") + len(question or "") + len(reference)
        full = (info.content_chars if info else (walked.hot.content_chars or 0)) + framing
        returned = sum(m.size for m in messages)
        payload = summary.structured.get("payload") if summary else None
        return ContextAnswer(
            session_id=key,
            summary_tier=walked.answer.tier,
            summary=summary.text if summary else None,
            covered_turns=summary.covered_turns if summary else 0,
            topics=summary.topics if summary else (),
            messages=messages,
            turn_count=walked.turn_count,
            recent_transcript=recent_transcript(as_spoken(recent), max_chars=self._s.recent_transcript_max_chars),
            answer_transcript=answer_transcript(recent, max_chars=self._s.answer_history_max_chars),
            estimated_tokens={
                "context": estimate_tokens(returned, self._s.chars_per_token),
                "full_history": estimate_tokens(full, self._s.chars_per_token),
            },
            planning=planning(payload) if payload else None,
            planning_history=planning_history(
                recent_transcript(as_spoken(recent), max_chars=self._s.planning_history_max_chars),
                payload,
                max_chars=self._s.planning_history_max_chars,
            ),
            state=walked.hot.state,
            compressions=summary.compressions if summary else 0,
        )

    def _summary_text(self, text: str, idle_seconds: float | None, lang: str) -> str:
        return summary_system_text(
            text,
            idle_seconds=idle_seconds,
            reconnect_gap_s=self._s.reconnect_gap_seconds,
            templates=self._s.reconnect_templates,
            lang=lang,
        )

    def _facts(self, summary: Summary, book: FactBook | None, idle_seconds: float | None, lang: str) -> Facts:
        """The summary's renderer for the policy: an extractor's re-rendered from its stored facts
        for the room and turns given (whole facts, none shown raw); an LLM's text cut to sentences."""
        label_chars = len(self._summary_text("", idle_seconds, lang))

        def facts(room: int, before_turn: int | None, by_rank: bool) -> str:
            if room <= label_chars:
                return ""
            if book is not None:
                body = book.render(
                    room - label_chars, before_turn=before_turn, topics=summary.topics, newest_first=not by_rank
                )
            else:
                body = lead(quoted(summary.text), room - label_chars)
            return self._summary_text(body, idle_seconds, lang) if body else ""

        return facts

    async def _with_gap(
        self, key: SessionKey, covered: int, turn_count: int, recent: list[Message], available: list[Message]
    ) -> list[Message]:
        """The window with the turns covered+1 … (window start - 1) in front of it: turns the
        summary does not hold yet (it lags behind a slow LLM) and that left the window."""
        first = recent[0].turn if recent else turn_count + 1
        # A summary that lags far (hours of LLM outage) leaves a gap too long to read on every
        # request: its latest turns are read, and the summary job catches up with the rest.
        covered = max(covered, first - 1 - _GAP_MAX_TURNS)
        if covered + 1 >= first:
            return recent
        gap = [m for m in available if covered < m.turn < first]
        if not gap or gap[0].turn != covered + 1:
            read = self._store.messages_in_turns(key, after_turn=covered, through_turn=first - 1, replica=True)
            found = await self._errors.sql("read_gap", read, None)
            if found is None:
                return recent
            gap = found
        return [*gap, *recent]


def _in_namespace(owner: Owner, key: str) -> bool:
    """Whether a hot entry's owner belongs under its key. One that does not was cached under a
    tenant session's bare id before schema version 6 moved the session to `<tenant>/<id>`; until
    its TTL it is a stranger's, and the read goes to SQL as if it were not there.

    Kept after the shim's own need has passed (every such entry expired within
    SUMMARY_REDIS_TTL_SECONDS of the upgrade): one comparison per read, and it keeps a hot entry
    that names another tenant, however it was written, from being shown under this key
    (tests/test_auth.py::test_a_hot_entry_outside_its_namespace_is_never_shown checks it)."""
    return owner.tenant == key_tenant(key)


def authorize(caller: Caller, owner: Owner) -> None:
    if not caller.may_access(owner):
        raise Forbidden


_NO_HOT = HotSession(summary=None, recent=(), turn_count=None, message_count=None, last_activity=None)
