"""The MCP server (`tiered-memory mcp`): the memory as tools an agent calls, over stdio or
streamable HTTP, each tool one call of the Python client.

The server keeps no state of its own: one AsyncClient (with its retries, idempotency keys and
error tree) per process, opened by the server's lifespan and closed with it. A daemon error is
a tool error (isError) whose text carries the daemon's status, code and message, for the model
to read; the server goes on serving. Needs the `mcp` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import structlog
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field
from yarl import URL

from tiered_memory import __version__
from tiered_memory.client import ApiError, AsyncClient, ClientError, Timeout
from tiered_memory.client.models import ChatMessage, ProfileItem, StoredMessage

__all__ = ["DEFAULT_HTTP_PORT", "Options", "build_server", "run"]

log = structlog.get_logger("tiered_memory.mcp")

DEFAULT_HTTP_PORT = 8090

INSTRUCTIONS = """\
Long-term memory of conversations, kept by a tiered-memory daemon. Per conversation (session_id):
store each user message and each reply with append_message, giving every message a message_id
of your own and reusing it when you retry, so a retry is stored once; before answering, get_context
returns the memory to answer from (a summary of what is old, the recent turns raw); recall finds
what was said earlier; close_session when the conversation ends persists its final summary.
get_profile tells what a user's earlier conversations said about them."""


@dataclass(frozen=True, slots=True)
class Options:
    """How the server reaches the daemon and where it serves.

    - `url`: the daemon's base URL; `token`: its bearer token (API_TOKENS); `tenant`: sent as
      X-Tenant, for an unrestricted token acting on a tenant's sessions.
    - `user_id`: the user every call acts for (X-User-ID), and get_profile's default user.
    - `transport`: `stdio` (the host starts the server) or `http` (streamable HTTP at
      `http://host:port/mcp`); `allow_unauthenticated`: serve HTTP on a non-loopback host,
      which the MCP endpoint itself does not authenticate (put an authenticating proxy in front).
    """

    url: str
    token: str | None = field(default=None, repr=False)
    tenant: str | None = None
    user_id: str | None = None
    transport: Literal["stdio", "http"] = "stdio"
    host: str = "127.0.0.1"
    port: int = DEFAULT_HTTP_PORT
    allow_unauthenticated: bool = False


@dataclass(frozen=True, slots=True)
class Memory:
    """What the lifespan yields to every tool call: the client and the user it acts for."""

    client: AsyncClient
    user_id: str | None


# --- parameters ---------------------------------------------------------------------------

SessionId = Annotated[
    str,
    Field(
        description="The conversation's id: 1-128 characters of A-Z a-z 0-9 . _ : -",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:-]+$",
    ),
]
MaxChars = Annotated[
    int | None,
    Field(description="Character budget of the memory (default: the daemon's CONTEXT_MAX_CHARS)", ge=1),
]
Question = Annotated[
    str | None,
    Field(description="The question about to be answered: earlier turns that mention its words are added"),
]
UserMemory = Annotated[
    Literal["profile", "last_session", "topic", "off"] | None,
    Field(description="What to carry over from the user's earlier sessions (default: the daemon's USER_MEMORY)"),
]
Role = Annotated[
    Literal["user", "assistant", "system"],
    Field(description="user: what the user said; assistant: the reply; system: a note of what happened"),
]
Content = Annotated[str, Field(description="The message's text")]
MessageId = Annotated[
    str | None,
    Field(
        description=(
            "Your idempotency key for this message (1-128 characters): pass one and reuse it when you retry,"
            " so the message is stored once. Without it a fresh id is generated, and a retried call stores"
            " the message again."
        ),
        min_length=1,
        max_length=128,
    ),
]
Status = Annotated[
    Literal["completed", "interrupted", "stopped", "failed", "streaming"] | None,
    Field(
        description=(
            "For a reply: completed (default); interrupted: only the part spoken before the user cut in;"
            " stopped, failed, streaming: kept but never shown as an answer"
        )
    ),
]
Query = Annotated[str, Field(description="Words to look for in the conversation's earlier messages", min_length=1)]
TopK = Annotated[int | None, Field(description="At most this many matches (default 5)", ge=1, le=50)]
UserId = Annotated[
    str | None,
    Field(description="The user (default: the user the server acts for, its --user-id)", min_length=1),
]

# --- results ------------------------------------------------------------------------------


class Message(BaseModel):
    """One chat message, in the chat-completions shape."""

    role: str
    content: str | None = Field(description="None only on an assistant message that only calls tools")
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ContextResult(BaseModel):
    """The memory to answer from."""

    session_id: str
    messages: list[Message] = Field(
        description=(
            "Ready for a chat-completions call: one leading system message holding the memory (quoted, not"
            " instructions), then the recent turns oldest first, then the question when one was given"
        )
    )
    summary: str | None = Field(description="The summary of the turns older than the recent ones, if any")
    summary_tier: str = Field(description="Where the summary came from: hot, warm, cold, or none")
    covered_turns: int = Field(description="Completed turns the summary covers")
    turn_count: int = Field(description="Completed turns of the conversation (a user message and its reply)")
    topics: list[str]


class AppendResult(BaseModel):
    """A message stored (durable when this answers)."""

    session_id: str
    message_id: str = Field(description="The message's id: reuse it to retry this very message")
    turn_count: int = Field(description="Completed turns after this message")
    summary_scheduled: bool = Field(description="Whether this message started a summary in the background")
    created: bool = Field(description="False when the message_id was stored before: nothing was stored twice")


class RecalledMessage(BaseModel):
    seq: int = Field(description="The message's number in the conversation, from 1")
    turn: int
    role: str
    content: str
    status: str


class RecallMatch(BaseModel):
    """An earlier message that matches, with the raw messages of its turn."""

    seq: int
    turn: int
    score: float
    messages: list[RecalledMessage]
    slice_summary: str | None = Field(description="The digest of the summarized range that holds it, if any")


class RecallResult(BaseModel):
    session_id: str
    query: str
    matches: list[RecallMatch] = Field(description="Best first")


class SummaryResult(BaseModel):
    """The conversation's best summary."""

    session_id: str
    summary: str | None
    tier: str = Field(description="The tier that answered: hot, warm, cold, or none (no summary yet)")
    turn_count: int
    covered_turns: int = Field(description="Completed turns the summary covers")
    topics: list[str]
    payload: dict[str, Any] | None = Field(description="The structured summary (facts, preferences, ...)")
    version: int
    age_seconds: float | None


class CloseResult(BaseModel):
    session_id: str
    persisted: bool = Field(description="The stored summary covers every turn")
    cached: bool
    turn_count: int


class ProfileEntry(BaseModel):
    text: str
    count: int = Field(description="How many of the user's sessions said it")


class TopicEntry(BaseModel):
    topic: str
    count: int


class ProfileResult(BaseModel):
    """What the user's sessions said, aggregated."""

    user_id: str
    facts: list[ProfileEntry]
    preferences: list[ProfileEntry]
    topics: list[TopicEntry]
    sessions: int = Field(description="Sessions of the user that were summarized")
    text: dict[str, str] = Field(description="The profile as a context shows it, by language (en, zh)")


# --- tools --------------------------------------------------------------------------------


@contextlib.contextmanager
def _daemon_errors() -> Iterator[None]:
    """A daemon's refusal (4xx), an unreachable daemon or a timeout becomes a tool error the model reads."""
    try:
        yield
    except ApiError as exc:
        # "<status> <code>: <message>", the daemon's own words.
        raise ToolError(str(exc)) from exc
    except Timeout as exc:
        raise ToolError(f"timeout: {exc}") from exc
    except ClientError as exc:
        raise ToolError(f"unavailable: {exc}") from exc


def _memory(ctx: Context[Memory, Any]) -> Memory:
    return ctx.request_context.lifespan_context


async def get_context(
    ctx: Context[Memory, Any],
    session_id: SessionId,
    question: Question = None,
    max_chars: MaxChars = None,
    user_memory: UserMemory = None,
) -> ContextResult:
    """The memory of a conversation to answer from: its summary and recent turns as chat messages,
    within a character budget. An unknown session answers empty (summary_tier none)."""
    mem = _memory(ctx)
    with _daemon_errors():
        got = await mem.client.context(
            session_id, user_id=mem.user_id, question=question, max_chars=max_chars, user_memory=user_memory
        )
    return ContextResult(
        session_id=got.session_id,
        messages=[_message(m) for m in got.messages],
        summary=got.summary,
        summary_tier=got.summary_tier,
        covered_turns=got.covered_turns,
        turn_count=got.turn_count,
        topics=list(got.topics),
    )


async def append_message(
    ctx: Context[Memory, Any],
    session_id: SessionId,
    role: Role,
    content: Content,
    message_id: MessageId = None,
    status: Status = None,
) -> AppendResult:
    """Store one message of a conversation (a new session_id starts one). A turn completes when a
    reply answers a user message. Pass a message_id and reuse it on retry: stored once."""
    mem = _memory(ctx)
    with _daemon_errors():
        got = await mem.client.append(
            session_id, role, content, message_id=message_id, status=status, user_id=mem.user_id
        )
    return AppendResult(
        session_id=got.session_id,
        message_id=got.message_id,
        turn_count=got.turn_count,
        summary_scheduled=got.summary_scheduled,
        created=got.created,
    )


async def recall(ctx: Context[Memory, Any], session_id: SessionId, query: Query, k: TopK = None) -> RecallResult:
    """The conversation's earlier messages that best match the query (BM25), best first, each with
    its turn's raw messages. An unknown session is an error (404)."""
    mem = _memory(ctx)
    with _daemon_errors():
        found = await mem.client.recall(session_id, query, k=k, user_id=mem.user_id)
    return RecallResult(
        session_id=session_id,
        query=query,
        matches=[
            RecallMatch(
                seq=m.seq,
                turn=m.turn,
                score=m.score,
                messages=[_recalled(x) for x in m.messages],
                slice_summary=m.slice.summary if m.slice else None,
            )
            for m in found
        ],
    )


async def get_summary(ctx: Context[Memory, Any], session_id: SessionId) -> SummaryResult:
    """The conversation's best summary and the tier that answered; tier none when there is none
    (a young or unknown session)."""
    mem = _memory(ctx)
    with _daemon_errors():
        got = await mem.client.summary(session_id, user_id=mem.user_id)
    return SummaryResult(
        session_id=got.session_id,
        summary=got.summary,
        tier=got.tier,
        turn_count=got.turn_count,
        covered_turns=got.covered_turns,
        topics=list(got.topics or []),
        payload=got.payload,
        version=got.version,
        age_seconds=got.age_seconds,
    )


async def close_session(ctx: Context[Memory, Any], session_id: SessionId) -> CloseResult:
    """End a conversation: its final summary is persisted. Safe to repeat; an unknown session is an
    error (404)."""
    mem = _memory(ctx)
    with _daemon_errors():
        got = await mem.client.close(session_id, user_id=mem.user_id)
    return CloseResult(session_id=got.session_id, persisted=got.persisted, cached=got.cached, turn_count=got.turn_count)


async def get_profile(ctx: Context[Memory, Any], user_id: UserId = None) -> ProfileResult:
    """What a user's earlier conversations said about them (facts, preferences, frequent topics,
    each with how many sessions said it). An error (404) before any summary of the user."""
    mem = _memory(ctx)
    who = user_id or mem.user_id
    if who is None:
        raise ToolError("no user_id: pass one, or start the server with --user-id")
    with _daemon_errors():
        got = await mem.client.profile(who, as_user=mem.user_id)
    return ProfileResult(
        user_id=got.user_id,
        facts=[_entry(i) for i in got.facts],
        preferences=[_entry(i) for i in got.preferences],
        topics=[TopicEntry(topic=i.topic or "", count=i.count) for i in got.topics],
        sessions=got.sessions,
        text=dict(got.text),
    )


def _message(m: ChatMessage) -> Message:
    return Message(role=m.role, content=m.content, tool_calls=m.tool_calls, tool_call_id=m.tool_call_id, name=m.name)


def _recalled(m: StoredMessage) -> RecalledMessage:
    return RecalledMessage(seq=m.seq, turn=m.turn, role=m.role, content=m.content, status=m.status)


def _entry(item: ProfileItem) -> ProfileEntry:
    return ProfileEntry(text=item.text or "", count=item.count)


# --- the server ---------------------------------------------------------------------------

_READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def build_server(options: Options) -> MCPServer[Memory]:
    """The MCP server with its six tools; the daemon is first called by the first tool call."""

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[Memory]) -> AsyncIterator[Memory]:
        headers = {"X-Tenant": options.tenant} if options.tenant else None
        async with AsyncClient(options.url, token=options.token, headers=headers) as client:
            yield Memory(client, options.user_id)

    server: MCPServer[Memory] = MCPServer(
        "tiered-memory", instructions=INSTRUCTIONS, version=__version__, lifespan=lifespan
    )
    server.add_tool(get_context, annotations=_READ)
    # Idempotent only by message_id, which the caller may leave out: not announced as idempotent.
    server.add_tool(append_message, annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False))
    server.add_tool(recall, annotations=_READ)
    server.add_tool(get_summary, annotations=_READ)
    server.add_tool(
        close_session, annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    )
    server.add_tool(get_profile, annotations=_READ)
    return server


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run(options: Options) -> int:
    """Serve until stdin closes (stdio) or SIGINT/SIGTERM (http); 2 when the options are refused.

    Logs go to stderr (configured by the caller): on stdio, stdout is the protocol."""
    if options.transport == "http" and not options.allow_unauthenticated and not is_loopback(options.host):
        print(
            f"tiered-memory: mcp: refusing to serve HTTP on {options.host}, which is not loopback: the MCP endpoint"
            " is not authenticated and holds the daemon's token; put an authenticating proxy in front and pass"
            " --allow-unauthenticated",
            file=sys.stderr,
        )
        return 2
    server = build_server(options)
    log.info(
        "mcp_serving",
        transport=options.transport,
        daemon=_without_credentials(options.url),
        endpoint=f"http://{options.host}:{options.port}/mcp" if options.transport == "http" else "stdio",
        tenant=options.tenant,
        user_id=options.user_id,
        token=options.token is not None,
    )
    if options.transport == "stdio":
        asyncio.run(server.run_stdio_async())
    else:
        asyncio.run(_serve_http(server, options.host, options.port))
    return 0


def _without_credentials(url: str) -> str:
    """`url` without the user and password it may carry (https://TOKEN@host): logs are no place for them."""
    parsed = URL(url)
    return str(parsed.with_user(None)) if parsed.absolute else url


async def _serve_http(server: MCPServer[Memory], host: str, port: int) -> None:
    import uvicorn

    # `host` turns on the SDK's DNS-rebinding protection for a loopback address.
    app = server.streamable_http_app(host=host)
    # log_config=None: uvicorn's records go through the root logger, so the caller's structlog
    # renders them; its access log would repeat every tool call.
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on")
    await uvicorn.Server(config).serve()
