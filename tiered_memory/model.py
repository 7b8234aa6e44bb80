"""The domain's plain data: messages, summaries, sessions and the tier that answered.

Everything here is immutable and free of I/O, so every layer can share it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, NewType


class Role(enum.StrEnum):
    """Who said a message. `tool` is a tool's result, answering one call of an assistant message's
    `tool_calls`; `system` is a gateway's event of what happened (call transferred, on hold, DTMF
    entered): summarized as an event and shown inside the leading system message."""

    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


class Channel(enum.StrEnum):
    VOICE = "voice"
    CHAT = "chat"


class MessageStatus(enum.StrEnum):
    """How an assistant reply ended. A completed reply answers the user's question, and so does
    an interrupted one: the part actually spoken before the user cut in (shown and summarized
    marked as cut, so the model does not repeat it). The others are kept verbatim but never
    shown or summarized as if they had answered it."""

    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    FAILED = "failed"
    STREAMING = "streaming"

    @property
    def answers(self) -> bool:
        """Whether a reply that ended so answers its question (and completes its turn)."""
        return self in (MessageStatus.COMPLETED, MessageStatus.INTERRUPTED)


class Tier(enum.StrEnum):
    """Which tier answered a read: the provenance every summary answer carries."""

    HOT = "hot"
    WARM = "warm"
    COLD = "cold"
    NONE = "none"


class SummarySource(enum.StrEnum):
    LLM = "llm"
    DETERMINISTIC = "deterministic"


# What a session carries over from its user's earlier sessions (USER_MEMORY, ?user_memory=; users.py):
# nothing, the user's profile, the most recent earlier session's summary, or the earlier session
# whose topics the new one names.
UserMemory = Literal["off", "profile", "last_session", "topic"]
USER_MEMORY_MODES: tuple[UserMemory, ...] = ("off", "profile", "last_session", "topic")

# Between a tenant and a session id in a stored session key (Caller.session_key).
TENANT_SEPARATOR = "/"

# A session as it is stored: `<tenant>/<session id>`, or the id itself in the tenant-less namespace
# (Caller.session_key). Below the HTTP edge a session is named by its key (`key` parameters, the
# `session_key` log field); the id a caller knows it by lives only at the edge (api, client,
# integrations), where `session_id` means that id.
SessionKey = NewType("SessionKey", str)


def key_tenant(key: str) -> str:
    """The tenant whose namespace a stored session key is in ('' for none)."""
    tenant, separator, _ = key.partition(TENANT_SEPARATOR)
    return tenant if separator else ""


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose a session is: the tenant of the token that created it ('' for an unrestricted token or
    a daemon without tokens) and the user_id it was created for (None: not user-restricted)."""

    tenant: str
    user_id: str | None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking, as the HTTP edge established it: the tenant it acts in (its token's, or the
    one an unrestricted token states with X-Tenant; None: neither, or no authentication) and the
    user it speaks for (None: not stated).

    A caller of no tenant that states no user may touch every session of the tenant-less
    namespace: that is the trusted gateway (or operator) mode, and what every caller is on a
    daemon without tokens.
    """

    tenant: str | None = None
    user_id: str | None = None

    def session_key(self, session_id: str) -> SessionKey:
        """Where the session a caller names by `session_id` is stored: a tenant's sessions live
        under `<tenant>/<session_id>`, so each tenant has its own namespace of ids. Two tenants may
        use the same id without meeting, and a tenant cannot tell whether another one uses an id
        (with one namespace, "someone else's" answers 403 where "nobody's" answers empty or 404).
        A caller of no tenant names the stored key itself; `/` is in no session id the API
        accepts, so the namespaces cannot overlap."""
        return SessionKey(session_id if self.tenant is None else f"{self.tenant}{TENANT_SEPARATOR}{session_id}")

    def session_id(self, key: SessionKey) -> str:
        """The id this caller knows the session stored under `key` by (the inverse of session_key)."""
        if self.tenant is None:
            return key
        return key.removeprefix(f"{self.tenant}{TENANT_SEPARATOR}")

    @property
    def unrestricted(self) -> bool:
        return self.tenant is None and self.user_id is None

    def may_access(self, owner: Owner) -> bool:
        """Whether this caller may read or change a session of `owner`. A session without a user_id
        is not restricted to a user, only to its tenant."""
        if self.tenant is not None and owner.tenant != self.tenant:
            return False
        return self.user_id is None or owner.user_id is None or owner.user_id == self.user_id


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message as a gateway hands it in, validated but not yet stored."""

    key: SessionKey
    role: Role
    content: str
    message_id: str
    user_id: str | None = None
    channel: Channel = Channel.CHAT
    status: MessageStatus = MessageStatus.COMPLETED
    tool_calls: str = ""
    """An assistant message's calls: the JSON array as the gateway sent it (compact); '' for none."""
    tool_call_id: str | None = None
    """A tool result's call: the `id` of one of an earlier assistant message's tool_calls."""
    name: str | None = None
    """A tool result's tool name."""
    thinking_content: str | None = None
    """An assistant message's reasoning as the model gave it (reasoning.py: stored and returned
    with the message, never shown to a model or summarized)."""
    thinking_duration: int | None = None
    """How long the model reasoned, in whole seconds."""


def stored_bytes(m: NewMessage | Message) -> int:
    """UTF-8 bytes a message adds to what its session and tenant store (MAX_SESSION_BYTES,
    TENANT_MAX_BYTES): its content, its tool calls and its reasoning, which a prompt never
    carries but the cold tier keeps."""
    reasoning = m.thinking_content or ""
    return len(m.content.encode()) + len(m.tool_calls.encode()) + len(reasoning.encode())


@dataclass(frozen=True, slots=True)
class TurnPlace:
    """Where a new message goes in its session (see `next_turn`)."""

    turn: int
    completed_after: int
    """The turns completed once it is stored."""
    completes: bool
    """It completes its turn (an answer to a waiting question)."""
    pending_after: bool
    """A question waits once it is stored."""


def next_turn(new: NewMessage, *, completed: int, pending: bool) -> TurnPlace:
    """The turn rule: where `new` goes after `completed` turns, with a question waiting or not
    (`pending`). Pure, so that every store numbers turns alike."""
    if new.role is Role.USER:
        # Opens (or, after another user message, continues) turn completed+1.
        return TurnPlace(completed + 1, completed, completes=False, pending_after=True)
    if new.role is not Role.ASSISTANT or new.tool_calls or not new.status.answers:
        # Tool traffic and a gateway's event belong to the turn in progress and answer nothing; a
        # stopped, failed or streaming reply leaves the question open.
        return TurnPlace(completed + 1, completed, completes=False, pending_after=pending)
    if pending:
        return TurnPlace(completed + 1, completed + 1, completes=True, pending_after=False)
    # A greeting before any question, or a further part of a reply already given: it completes
    # nothing and goes with the next turn, so that the summary of that turn takes it in (the
    # turn it followed may be summarized already).
    return TurnPlace(completed + 1, completed, completes=False, pending_after=False)


@dataclass(frozen=True, slots=True)
class Message:
    """A stored message. `seq` numbers a session's messages 1, 2, 3… in commit order;
    `turn` is the turn it belongs to (a user message opens turn n, the assistant reply closes it)."""

    key: SessionKey
    seq: int
    turn: int
    role: Role
    content: str
    message_id: str
    created_at: float
    user_id: str | None = None
    channel: Channel = Channel.CHAT
    status: MessageStatus = MessageStatus.COMPLETED
    tool_calls: str = ""
    """The JSON array of an assistant message's tool calls, verbatim (compact); '' for none."""
    tool_call_id: str | None = None
    name: str | None = None
    thinking_content: str | None = None
    """An assistant message's reasoning (reasoning.py); None where it was not read (the hot tier
    and every read that feeds a context, a summary or the recall index leave it out)."""
    thinking_duration: int | None = None
    """How long the model reasoned, in whole seconds."""

    @property
    def size(self) -> int:
        """Characters the message costs a prompt: its content and its tool calls."""
        return len(self.content) + len(self.tool_calls)

    @property
    def answered(self) -> bool:
        """A message memory may show and summarize: all but an assistant reply that was stopped,
        failed or is still streaming."""
        return self.role is not Role.ASSISTANT or self.status.answers


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append committed. `duplicate` is true when the message_id was already stored;
    `completed_turn` when this message was the reply that completed a turn."""

    message: Message
    turn_count: int
    message_count: int
    duplicate: bool
    completed_turn: bool = False
    content_chars: int = 0
    """Characters of all the session's messages after this one."""
    owner: Owner = Owner("", None)
    """The session's owner after this append (it may have just claimed a session without a user)."""

    @property
    def counters(self) -> SessionCounters:
        """The session's counters after this append, as the hot tier keeps them."""
        return SessionCounters(
            self.turn_count, self.message_count, self.message.created_at, self.owner, self.content_chars
        )


@dataclass(frozen=True, slots=True)
class SessionCounters:
    """A session's counters as the hot tier keeps them beside its messages (what a refill from
    SQL writes back)."""

    turn_count: int
    message_count: int
    last_activity: float
    owner: Owner
    content_chars: int = 0


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """The durable bookkeeping of one session, as the SQL tier keeps it."""

    key: SessionKey
    user_id: str | None
    turn_count: int
    message_count: int
    created_at: float
    last_activity: float
    closed_at: float | None
    covered_turns: int = 0
    content_chars: int = 0
    tenant: str = ""
    content_bytes: int = 0  # UTF-8 bytes its messages store (model.stored_bytes)

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    @property
    def owner(self) -> Owner:
        return Owner(self.tenant, self.user_id)

    @property
    def counters(self) -> SessionCounters:
        return SessionCounters(self.turn_count, self.message_count, self.last_activity, self.owner, self.content_chars)


@dataclass(frozen=True, slots=True)
class Summary:
    """A session summary. `covered_turns` is the watermark: turns 1..covered_turns are inside it.
    `version` grows by one with every write so that a stale writer can be refused."""

    text: str
    covered_turns: int
    version: int
    source: SummarySource
    updated_at: float
    created_at: float
    topics: tuple[str, ...] = ()
    structured: dict[str, Any] = field(default_factory=dict)
    compressions: int = 0


@dataclass(frozen=True, slots=True)
class Slice:
    """What one summarization covered: turns from_turn..to_turn (messages first_seq..last_seq),
    a digest of just that range, and how the summary it produced was made."""

    from_turn: int
    to_turn: int
    first_seq: int
    last_seq: int
    text: str
    source: SummarySource
    summary_version: int
    created_at: float
    model: str | None = None
    prompt_id: str | None = None


@dataclass(frozen=True, slots=True)
class SummaryAnswer:
    """The answer of `load_best_summary`: the best summary found and where it came from."""

    key: SessionKey
    tier: Tier
    summary: Summary | None
    turn_count: int


@dataclass(frozen=True, slots=True)
class SessionState:
    """What a gateway keeps of a session across reconnects (a JSON object) and its version, for
    optimistic concurrency; version 0 and None when it has none."""

    version: int
    value: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class HotSession:
    """What the hot tier holds for one session, read in one round trip.
    `recent` is ordered by seq; `message_count` is the count SQL had at the last hot write;
    `owner` is None when the hot tier does not know it (the counters expired, or were never set)."""

    summary: Summary | None
    recent: tuple[Message, ...]
    turn_count: int | None
    message_count: int | None
    last_activity: float | None
    content_chars: int | None = None
    owner: Owner | None = None
    state: SessionState | None = None
    """None when the hot tier does not know the gateway's state (not: it has none)."""

    @property
    def counters(self) -> SessionCounters | None:
        """The counters, or None when the hot tier does not know them all."""
        if self.turn_count is None or self.message_count is None or self.last_activity is None or self.owner is None:
            return None
        return SessionCounters(
            self.turn_count, self.message_count, self.last_activity, self.owner, self.content_chars or 0
        )


@dataclass(frozen=True, slots=True)
class ContextRequest:
    """What a context is asked for: its memory budget and what frames it."""

    max_chars: int
    system_prompt: str | None = None
    question: str | None = None
    """The user's new message, shown last."""
    exclude_message_id: str | None = None
    """A retried load-then-append's message, stored already: left out of the history (it is the
    question)."""
    user_memory: UserMemory | None = None
    """What the session carries over from its user's earlier sessions; None: USER_MEMORY."""
    user_id: str | None = None
    """The user of a session not stored yet."""
    kb_snippets: tuple[str, ...] | None = None
    """The caller's knowledge-base snippets for this turn, best first (kb_snippets.py): shown, never
    stored; None when the request gave none."""


@dataclass(frozen=True, slots=True)
class AppendAnswer:
    """What an append did: the stored message with SQL's counters, and whether a summary is due."""

    result: AppendResult
    summary_scheduled: bool


@dataclass(frozen=True, slots=True)
class Patch:
    """What a patch sets; None leaves it as stored."""

    content: str | None = None
    status: MessageStatus | None = None


@dataclass(frozen=True, slots=True)
class PatchResult:
    message: Message
    turn_count: int
    changed: bool
    """False when the message already was as the patch asks (a repeated patch)."""
    completed_turn: bool
    """Whether this patch completed the message's turn (a streaming reply finalized)."""
    session_bytes: int = 0
    """The session's text after the patch, in bytes: what the recall postings it drops will read
    back from SQL at the next question."""


@dataclass(frozen=True, slots=True)
class BatchAnswer:
    """What a bulk append did: each message's result, in order, and whether a summary is due."""

    results: list[AppendResult]
    summary_scheduled: bool


@dataclass(frozen=True, slots=True)
class PatchAnswer:
    """What a patch did, and whether it made a summary due (a reply finalized at a cadence point)."""

    result: PatchResult
    summary_scheduled: bool


@dataclass(frozen=True, slots=True)
class CloseResult:
    """`persisted`: the warm row covers every turn; `cached`: Redis holds that summary too."""

    key: SessionKey
    persisted: bool
    cached: bool
    turn_count: int


class JobState(enum.StrEnum):
    """Where a rebuild job is: waiting for the session's summary lock or its first
    SUMMARY_CONCURRENCY slot (`queued`), merging batches (`running`), or ended (`done`, `failed`)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED)


@dataclass(frozen=True, slots=True)
class RebuildJob:
    """One `POST …/summary/rebuild` as the hot tier keeps it. Times are epoch seconds of the
    replica that made the change. A failed job's `reason` is a code (rebuilds.FAILURES); a done
    one carries what it made: the summary's `version`, `covered_turns` and `source` (None, with
    version 0, when the session had no completed turn) and how many `slices` it wrote."""

    job_id: str
    state: JobState
    queued_at: float
    started_at: float | None = None
    ended_at: float | None = None
    reason: str | None = None
    version: int | None = None
    covered_turns: int | None = None
    source: SummarySource | None = None
    slices: int | None = None
