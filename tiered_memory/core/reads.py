"""SessionReads: how the service reads a session across the tiers, for load_best_summary and
context. Reads walk hot → warm → cold and say which tier answered; a tier that fails or times out
is skipped, counted and logged; what SQL gave is written back to the hot tier. A context's walk
gathers everything its answer needs into one value, which prompt/assemble.py makes the answer of
in one call: this module reads, that one computes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tiered_memory.core.history import History
from tiered_memory.errors import Forbidden
from tiered_memory.metrics import Metrics
from tiered_memory.model import (
    Caller,
    ContextRequest,
    HotSession,
    Message,
    Owner,
    SessionInfo,
    SessionKey,
    SessionState,
    Summary,
    SummaryAnswer,
    Tier,
    UserMemory,
    key_tenant,
)
from tiered_memory.prompt.assemble import (
    ContextAnswer,
    Gathered,
    Knobs,
    Memo,
    Remembered,
    assemble,
    content_chars,
    earlier_wanted,
    hot_list_whole,
    hot_window_complete,
    memory_budget,
    older_chars,
    window,
    window_start_turn,
)
from tiered_memory.settings import Settings
from tiered_memory.summarize.cold import cold_digest
from tiered_memory.summarize.topics import TopicTagger
from tiered_memory.tiers.errors import TierErrors
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tiers.sql.users import SqlUsers

# A cold answer reads at most this many rows from the start of a session and from its end (its
# characters are bounded by SUMMARY_MAX_CHARS, a third and the rest; these bound the rows of a
# session of very short messages, and leave room for the window a context leaves out).
_COLD_HEAD_MESSAGES = 24
_COLD_TAIL_MESSAGES = 64
_COLD_MESSAGES = _COLD_HEAD_MESSAGES + _COLD_TAIL_MESSAGES
# A context read puts at most this many turns between a lagging summary and the window.
_GAP_MAX_TURNS = 100


@dataclass(frozen=True, slots=True)
class _Below:
    """What SQL answered below the hot tier: the summary's answer, the session (None: SQL did not
    answer, or knows no such session), the newest messages a cold answer read (None when it
    read none), oldest first, and the gateway's state read with the session (None: not read)."""

    answer: SummaryAnswer
    info: SessionInfo | None
    newest: list[Message] | None = None
    state: SessionState | None = None


@dataclass(frozen=True, slots=True)
class _Walked:
    """What the tier walk of a context read found: the hot entry, the summary's answer, the SQL
    session when SQL was asked, the raw messages from the window on, and the turn count."""

    hot: HotSession
    answer: SummaryAnswer
    info: SessionInfo | None
    available: list[Message]
    turn_count: int


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
        tagger: TopicTagger,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self._s = settings
        self._store = store
        self._users = users
        self._hot = hot
        self._history = history
        self._tagger = tagger
        self._metrics = metrics
        self._errors = TierErrors(metrics.tier_errors)
        self._clock = clock
        self._knobs = Knobs(
            memory_mode=settings.memory_mode,
            summary_max_chars=settings.summary_max_chars,
            reconnect_gap_seconds=settings.reconnect_gap_seconds,
            reconnect_templates=settings.reconnect_templates,
            recent_transcript_max_chars=settings.recent_transcript_max_chars,
            answer_history_max_chars=settings.answer_history_max_chars,
            planning_history_max_chars=settings.planning_history_max_chars,
            chars_per_token=settings.chars_per_token,
        )
        # Kept across reads: a session's next context reads most of the same messages again.
        self._memo = Memo()

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
        below = await self._summary_below_hot(key, caller)
        answer, info = below.answer, below.info
        if info is not None and (answer.tier is Tier.WARM or owner is None):
            await self._backfill(info, summary=answer.summary if answer.tier is Tier.WARM else None, recent=None)
        return answer

    async def _summary_below_hot(self, key: SessionKey, caller: Caller, *, cold: bool = True, keep: int = 0) -> _Below:
        """The warm row, else the cold answer (unless not `cold`; leaving out the last `keep`
        turns, a context's window), else none; with the session and the gateway's state SQL
        returned. Raises Forbidden when SQL says the session is not the caller's.

        The cold answer's messages are read after the session's row, on its connection, only
        when that row has no summary and is the caller's: beside it, every warm read would pay
        for a statement too (one that finds the summary row and reads nothing), and a cold one
        gained next to no time (a cold summary 6.20 -> 6.05 ms, MariaDB on the same host): both
        statements' time is mostly the driver's Python, on this one loop."""

        def read_ends(info: SessionInfo) -> bool:
            # A stranger is refused below before any message of the session is read.
            return cold and caller.may_access(info.owner)

        read = self._store.summary_state_or_ends(
            key, head=_COLD_HEAD_MESSAGES, tail=_COLD_TAIL_MESSAGES, read_ends=read_ends, replica=True
        )
        summary, info, state, ends = await self._errors.sql("read_summary", read, (None, None, None, None))
        if info is None:
            return _Below(self._answer(key, Tier.NONE, None, 0), None)
        authorize(caller, info.owner)
        # A replica may hold an older state than the primary (a state write moves no message
        # count, which is what tells a replica's lag): only the primary's is shown.
        state = state if self._store.replica is None else None
        if summary is not None:
            return _Below(self._answer(key, Tier.WARM, summary, info.turn_count), info, state=state)
        through = window_start_turn(info.turn_count, keep) - 1 if keep else info.turn_count
        extracted, newest = (None, None) if ends is None else (self._cold_summary(info, *ends, through), ends[1])
        tier = Tier.NONE if extracted is None else Tier.COLD
        return _Below(self._answer(key, tier, extracted, info.turn_count), info, newest, state)

    async def _backfill(
        self,
        info: SessionInfo,
        *,
        summary: Summary | None,
        recent: list[Message] | None,
        state: SessionState | None = None,
    ) -> None:
        """What SQL gave, into the hot tier, in one round trip; with `state`, the gateway's state
        SQL gave with the session, cached unless a newer one was put meanwhile (HotTier.backfill)."""
        refill = self._hot.backfill(info.key, info.counters, summary=summary, recent=recent, state=state)
        await self._errors.hot("backfill", refill, None)

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

    def _cold_summary(
        self, info: SessionInfo, head: list[Message], tail: list[Message], through_turn: int
    ) -> Summary | None:
        """The cold answer (summarize/cold.py) of the session's completed turns up to
        `through_turn`: whole messages of its opening (`head`) and of its end (`tail`),
        SUMMARY_MAX_CHARS in all, read by one bounded statement. A cold read runs on the request
        path, so its cost must not grow with the session (a 10,000-turn session took 8 s read
        whole, and an extraction of 150 messages 60-130 ms); the summary job (scheduled by the
        service after a cold read of a session whose summary is due) reads every turn, batch by
        batch. None when nothing was answered yet."""
        return cold_digest(
            info, head, tail, tagger=self._tagger, max_chars=self._s.summary_max_chars, through_turn=through_turn
        )

    def _answer(self, key: SessionKey, tier: Tier, summary: Summary | None, turns: int) -> SummaryAnswer:
        self._metrics.summary_loads.labels(tier.value).inc()
        if summary is not None:
            self._metrics.summary_lag.observe(max(0, turns - summary.covered_turns))
        return SummaryAnswer(key=key, tier=tier, summary=summary, turn_count=turns)

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
        gathered = await self._gather(key, want, caller)
        return assemble(gathered, want, knobs=self._knobs, memo=self._memo)

    async def _gather(self, key: SessionKey, want: ContextRequest, caller: Caller) -> Gathered:
        """The tier walk of a context read: everything `assemble` needs, read (and backfilled)."""
        question, excluded = want.question, want.exclude_message_id
        max_chars = memory_budget(want)
        hot, known = await self._authorized(key, caller)
        keep = 0 if self._s.memory_mode == "none" else self._s.keep_recent_turns
        below, (available, info, rows) = await self._summary_and_window(
            key, caller, hot, known, max_chars=max_chars, keep=keep
        )
        answer, warm_info = below.answer, below.info
        retried = False
        if excluded is not None:
            # A retried load-then-append: its message is stored already and comes back as the
            # question. Without it the messages are not the session's: not written back to the list.
            kept = [m for m in available if m.message_id != excluded]
            retried, available = len(kept) < len(available), kept
        sql_info = info or warm_info
        warm_summary = answer.summary if answer.tier is Tier.WARM else None
        # The gateway's state read with the session: shown, and cached, when the hot tier lost it.
        found_state = below.state if hot.state is None else None
        if sql_info is not None and (rows is not None or warm_summary is not None or hot.owner is None):
            await self._backfill(sql_info, summary=warm_summary, recent=rows, state=found_state)
        elif sql_info is not None and found_state is not None:
            await self._errors.hot("put_state", self._hot.put_state(key, found_state, written=False), None)
        turn_count = sql_info.turn_count if sql_info else max(hot.turn_count or 0, answer.turn_count)
        recent = window(available, turn_count=turn_count, keep_recent_turns=keep)
        walked = _Walked(hot=hot, answer=answer, info=sql_info, available=available, turn_count=turn_count)
        shown, recent, snippets = await self._material(
            key, walked, recent, max_chars=max_chars, question=question, write_back=not retried
        )
        remembered = await self._remembered(key, walked, want.user_memory or "off", want.user_id)
        return Gathered(
            key=key,
            hot=hot,
            answer=answer,
            info=sql_info,
            turn_count=turn_count,
            shown=tuple(shown),
            recent=tuple(recent),
            snippets=tuple(snippets),
            remembered=remembered,
            now=self._clock(),
            state=hot.state if hot.state is not None else found_state,
        )

    async def _summary_and_window(
        self, key: SessionKey, caller: Caller, hot: HotSession, known: SessionInfo | None, *, max_chars: int, keep: int
    ) -> tuple[_Below, tuple[list[Message], SessionInfo | None, list[Message] | None]]:
        """The summary a context shows and its window's messages (`_context_summary`,
        `_window_rows`). When the hot tier knows nothing of the session, SQL answers both: the
        summary's read goes first, its session row serves the window, and a cold answer's newest
        messages are the window's rows when they reach back to it (two statements, not four).
        Otherwise the two run concurrently."""
        if hot.turn_count is None and keep > 0 and self._s.memory_mode == "summary":
            below = await self._context_summary(key, caller, hot, max_chars)
            window_rows = await self._window_rows(key, hot, known or below.info, keep, newest=below.newest)
            return below, window_rows
        return await asyncio.gather(
            self._context_summary(key, caller, hot, max_chars), self._window_rows(key, hot, known, keep)
        )

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

    async def _remembered(
        self, session: SessionKey, walked: _Walked, mode: UserMemory, user_id: str | None
    ) -> Remembered | None:
        """What SQL holds for the session to carry over from its user's earlier sessions in the
        tenant of its key: the profile and the user's most recent earlier summaries, as many as
        `mode` chooses from (assemble.py chooses). None when it carries nothing (mode off, no
        user, or SQL down: a context never fails for it)."""
        if mode == "off" or self._s.memory_mode == "none":
            return None
        owner = walked.hot.owner or (walked.info.owner if walked.info else None)
        # A stored session's own user, never a stated one: a session carries its owner's memory.
        user = owner.user_id if owner is not None else user_id
        if user is None:
            return None
        found = await self._errors.sql(
            "read_user_memory",
            self._users.carried(key_tenant(session), user, exclude=session, profile=True, earlier=earlier_wanted(mode)),
            None,
        )
        if found is None:
            return None
        profile, others = found
        return Remembered(mode, profile, tuple(others))

    async def _context_summary(self, key: SessionKey, caller: Caller, hot: HotSession, max_chars: int) -> _Below:
        """The summary a context shows, and the SQL session when SQL was asked."""
        if self._s.memory_mode != "summary":
            return _Below(SummaryAnswer(key, Tier.NONE, None, hot.turn_count or 0), None)
        if hot.summary is not None:
            turns = hot.turn_count if hot.turn_count is not None else hot.summary.covered_turns
            return _Below(self._answer(key, Tier.HOT, hot.summary, turns), None)
        whole = hot_list_whole(hot.recent, message_count=hot.message_count)
        if whole and content_chars(m for m in hot.recent if m.answered) <= max_chars:
            # The context will be the whole conversation, raw: a summary would not be shown,
            # and a young session's (none yet, its first LLM call still out) would be
            # extracted from SQL on every request until it lands.
            return _Below(self._answer(key, Tier.NONE, None, hot.turn_count or 0), None)
        # A warm row may be there (the hot summary evicted); an extraction is not made on a
        # request for a session the hot list holds whole: the policy condenses its raw turns
        # itself, until the summary job's summary lands.
        return await self._summary_below_hot(key, caller, cold=not whole, keep=self._s.keep_recent_turns)

    async def _window_rows(
        self,
        key: SessionKey,
        hot: HotSession,
        known: SessionInfo | None,
        keep: int,
        *,
        newest: list[Message] | None = None,
    ) -> tuple[list[Message], SessionInfo | None, list[Message] | None]:
        """Messages from the window's first turn (hot list, or SQL with one turn more), the SQL
        session when SQL was asked (`known` when the caller's check already asked it), and the
        rows to backfill. `newest`: the session's newest messages, read already (a cold answer's),
        which serve when they reach back to the window."""

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
        # One turn more than the window (down to turn 0, a greeting), so that the hot list this
        # refills is seen as complete by hot_window_complete next time.
        after_turn = window_start_turn(info.turn_count, max(keep, 1)) - 2
        if newest is not None and (len(newest) < _COLD_TAIL_MESSAGES or newest[0].turn <= after_turn):
            # A message's turn never decreases as its seq grows: every message after `after_turn`
            # is among them (or they are the whole session).
            tail = [m for m in newest if m.turn > after_turn]
            return tail, info, tail
        known_seq = max(info.message_count, hot.message_count or 0)
        rows = await self._errors.sql(
            "read_recent",
            self._store.messages_in_turns(key, after_turn=after_turn, replica=True, known_seq=known_seq),
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
        if not self._s.context_older_turns or (walked.answer.tier is Tier.COLD and (count or 0) > _COLD_MESSAGES):
            # The cold answer of a session longer than its read holds the newest turns before the
            # window raw already; the older ones would be read and condensed on the request path
            # (about 0.25 ms a message, up to OLDER_MAX_MESSAGES) until the summary the read
            # scheduled lands. A shorter session's are as few as the cold read's, and condensed
            # they are what its context was made of before it had a summary.
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
