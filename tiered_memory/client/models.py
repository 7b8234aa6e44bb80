"""The answers of the v1 API as typed, immutable values, built from the daemon's JSON.

Fields are the JSON keys of the OpenAPI document (`/openapi.json`). Keys a newer daemon adds are
ignored, so an older client keeps working; a key it lacks reads as None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def build(cls: type[T], data: dict[str, Any], **nested: object) -> T:
    """An instance of the dataclass `cls` from a JSON object; `nested` replaces raw fields."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    return cls(**{name: nested[name] if name in nested else data.get(name) for name in names})


@dataclass(frozen=True, slots=True)
class AppendResult:
    """POST /messages. `created` is False when the message_id was stored already (a retry):
    nothing was stored twice."""

    session_id: str
    message_id: str
    turn_count: int
    summary_scheduled: bool
    created: bool = True


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """GET /summary: the best summary and the tier that answered (hot, warm, cold or none)."""

    session_id: str
    tier: str
    summary: str | None
    turn_count: int
    covered_turns: int
    topics: list[str]
    payload: dict[str, Any] | None
    source: str | None
    version: int
    updated_at: float | None
    age_seconds: float | None

    @property
    def lag_turns(self) -> int:
        """Completed turns the summary does not cover yet."""
        return max(0, self.turn_count - self.covered_turns)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message for a chat-completions call; a tool call or result carries its fields."""

    role: str
    content: str | None
    """None only on an assistant message that only calls tools."""
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The message as a chat-completions request takes it (only the fields it has)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True, slots=True)
class Context:
    """GET /context: the memory to send the model; `messages` is ready for a chat-completions call."""

    session_id: str
    summary_tier: str
    summary: str | None
    covered_turns: int
    topics: list[str]
    messages: list[ChatMessage]
    turn_count: int
    recent_transcript: str
    answer_transcript: str
    estimated_tokens: dict[str, int]
    planning: dict[str, Any] | None
    planning_history: str
    compressions: int = 0
    """How many times the session's turns were merged into its summary (0: no summary)."""
    compression_applied: bool = False
    """Whether this context's memory holds text of the session's summary."""
    state: dict[str, Any] | None = None
    """The gateway's own state of the session (PUT …/state); None when it has none."""
    state_version: int | None = None
    user_memory: CarriedMemory | None = None
    """What the memory carried over from the user's earlier sessions (`user_memory=`); None for nothing."""
    kb_snippets_used: int | None = None
    """How many of the call's `kb_snippets` the messages show, the first ones; None when it gave none."""


@dataclass(frozen=True, slots=True)
class CarriedMemory:
    """The mode, the earlier session whose summary the memory shows (None: none), and whether it
    shows the user's profile."""

    mode: str
    session_id: str | None
    profile: bool


@dataclass(frozen=True, slots=True)
class GatewayState:
    """GET or PUT …/state: the gateway's own state of the session and its version (0 and None
    before any PUT): give the version back as `if_match` to write over exactly it."""

    session_id: str
    state: dict[str, Any] | None
    version: int


@dataclass(frozen=True, slots=True)
class TurnResult:
    """POST /turns: the context as it was before the user's message (ending with it as the
    question), and the append of that message. `turn_count` is the answer's: the session's
    completed turns after the append (a user's message completes none; `context.turn_count` too)."""

    context: Context
    message_id: str
    summary_scheduled: bool
    turn_count: int
    created: bool = True


@dataclass(frozen=True, slots=True)
class CloseResult:
    """POST /close. `persisted`: the warm row covers every turn; `cached`: Redis holds it too."""

    session_id: str
    persisted: bool
    cached: bool
    turn_count: int


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    user_id: str | None
    turn_count: int
    message_count: int
    covered_turns: int
    created_at: float
    last_activity: float
    closed: bool
    closed_at: float | None


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message of the cold tier, as stored: `seq` numbers the session's messages from 1."""

    seq: int
    turn: int
    role: str
    content: str
    status: str
    message_id: str
    channel: str
    created_at: float
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    thinking_content: str | None = None
    """An assistant reply's reasoning, as it was appended; never part of a context."""
    thinking_duration: int | None = None
    """How long the model reasoned, in seconds."""


@dataclass(frozen=True, slots=True)
class BatchMessage:
    message_id: str
    seq: int
    turn: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class BatchResult:
    """POST …/messages/batch: each message's place, in order; `created` when any was new."""

    session_id: str
    messages: list[BatchMessage]
    turn_count: int
    summary_scheduled: bool
    created: bool = True


@dataclass(frozen=True, slots=True)
class PatchResult:
    """PATCH …/messages/{message_id}: the message as stored now, and whether it changed."""

    session_id: str
    message: StoredMessage
    turn_count: int
    changed: bool
    summary_scheduled: bool


@dataclass(frozen=True, slots=True)
class Slice:
    """One summarization: the turns and message seqs it covered and a digest of that range."""

    from_turn: int
    to_turn: int
    first_seq: int
    last_seq: int
    summary: str
    source: str
    model: str | None
    prompt_id: str | None
    summary_version: int
    created_at: float
    messages_url: str


@dataclass(frozen=True, slots=True)
class RecallMatch:
    """GET /recall: one earlier message that matches the query, with its turn's raw messages and
    the slice that covers it (None while no summary covers it yet)."""

    seq: int
    turn: int
    score: float
    slice: Slice | None
    messages: list[StoredMessage]


@dataclass(frozen=True, slots=True)
class RebuildOutcome:
    """What a done rebuild job made: the summary's version (0 when the session had no completed
    turn), the turns it covers, its source, and how many slices it wrote (read them at `slices_url`)."""

    version: int
    covered_turns: int
    source: str | None
    slice_count: int
    slices_url: str


@dataclass(frozen=True, slots=True)
class RebuildJob:
    """POST or GET …/summary/rebuild: a rebuild job. `state` is queued, running, done (`result`)
    or failed (`error`: its `code` and `message`). `started` (POST only) is False when the POST
    answered with the session's job still going instead of starting one."""

    session_id: str
    job_id: str
    state: str
    url: str
    queued_at: float
    started_at: float | None
    ended_at: float | None
    result: RebuildOutcome | None = None
    error: dict[str, str] | None = None
    started: bool | None = None

    @property
    def ended(self) -> bool:
        return self.state in ("done", "failed")


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """`rebuild_summary`'s answer once its job is done: the new summary as read right after
    (`summary` is its text, None when a newer summary was written meanwhile or there is none),
    and every slice."""

    session_id: str
    summary: str | None
    covered_turns: int
    version: int
    source: str | None
    slices: list[Slice] = field(default_factory=list)
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class UserSummary:
    session_id: str
    summary: str
    turn_count: int
    covered_turns: int
    topics: list[str]
    source: str
    updated_at: float
    age_seconds: float


@dataclass(frozen=True, slots=True)
class ProfileItem:
    """A fact, preference (`text`) or topic (`topic`) of a user's profile: how many of the user's
    sessions said it, first and last."""

    count: int
    first_seen: float
    last_seen: float
    text: str | None = None
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class UserProfile:
    """GET /v1/users/{uid}/profile: what the user's sessions said, aggregated; `text` is the
    profile as a context shows it, by language (`en`, `zh`)."""

    user_id: str
    facts: list[ProfileItem]
    preferences: list[ProfileItem]
    topics: list[ProfileItem]
    sessions: int
    updated_at: float
    text: dict[str, str]


@dataclass(frozen=True, slots=True)
class UserSession:
    """One session of a user (GET /v1/users/{uid}/sessions), summarized or not."""

    session_id: str
    turn_count: int
    message_count: int
    created_at: float
    last_activity: float
    closed_at: float | None
    summarized: bool
    covered_turns: int
    topics: list[str]
    summary_updated_at: float | None


@dataclass(frozen=True, slots=True)
class Erasure:
    """DELETE /v1/users/{uid} or GET …/erasure: `running` or `finished`, and what it removed."""

    user_id: str
    state: str
    sessions: int
    messages: int
    requested_at: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class Readiness:
    """GET /readyz. `ready` is False when the daemon answered 503 (SQL unreachable or its schema
    not migrated); `tiers` says which tier is `ok` or `degraded`."""

    ready: bool
    status: str
    tiers: dict[str, str]


def context_of(data: dict[str, Any]) -> Context:
    messages = [build(ChatMessage, m) for m in data.get("messages") or []]
    carried = data.get("user_memory")
    return build(Context, data, messages=messages, user_memory=build(CarriedMemory, carried) if carried else None)


def profile_of(data: dict[str, Any]) -> UserProfile:
    def items(name: str) -> list[ProfileItem]:
        return [build(ProfileItem, i) for i in data[name]]

    return build(UserProfile, data, facts=items("facts"), preferences=items("preferences"), topics=items("topics"))


def slices_of(items: list[dict[str, Any]]) -> list[Slice]:
    return [build(Slice, s) for s in items]


def matches_of(items: list[dict[str, Any]]) -> list[RecallMatch]:
    return [
        build(
            RecallMatch,
            m,
            slice=build(Slice, m["slice"]) if m.get("slice") else None,
            messages=[build(StoredMessage, x) for x in m.get("messages") or []],
        )
        for m in items
    ]


def rebuild_job_of(data: dict[str, Any]) -> RebuildJob:
    result = data.get("result")
    return build(RebuildJob, data, result=build(RebuildOutcome, result) if result else None)
