"""`tiered-memory mcp` against a real daemon, driven by the mcp package's own client over both
transports: the six tools with their schemas, a conversation's round trip through them, the
server's options (token, tenant, user), and a daemon's refusal coming back as a tool error
(isError, with the daemon's code and message) while the server goes on serving."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent, Tool

from tests.helpers.live import LiveDaemon
from tiered_memory.client import AsyncClient, NotFound
from tiered_memory.integrations.mcp import Options, build_server, is_loopback, run
from tiered_memory.testing import ChildProcess, command, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"get_context", "append_message", "recall", "get_summary", "close_session", "get_profile"}


def _sid() -> str:
    return f"it-{uuid.uuid4().hex[:12]}"


def _text(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


async def _call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed: its structured result."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, _text(result)
    structured: dict[str, Any] | None = result.structured_content
    assert structured is not None
    return structured


async def _refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """A tool call that must fail as a tool error: its text."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return _text(result)


def _check_tools(listed: list[Tool]) -> None:
    """The six tools, each documented, with typed parameters and a structured result."""
    tools = {tool.name: tool for tool in listed}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description, tool.name
        assert tool.output_schema is not None, f"{tool.name}: no structured output"
        assert tool.output_schema["type"] == "object"
    append = tools["append_message"].input_schema
    assert set(append["required"]) == {"session_id", "role", "content"}
    assert append["properties"]["role"]["enum"] == ["user", "assistant", "system"]
    assert "retry" in append["properties"]["message_id"]["description"]
    assert append["properties"]["session_id"]["maxLength"] == 128
    assert tools["get_context"].input_schema["required"] == ["session_id"]
    assert {"question", "max_chars"} <= set(tools["get_context"].input_schema["properties"])
    assert tools["recall"].input_schema["properties"]["k"]["anyOf"][0]["maximum"] == 50
    assert "required" not in tools["get_profile"].input_schema  # defaults to --user-id
    context_out = tools["get_context"].output_schema
    assert context_out is not None
    assert "messages" in context_out["properties"]
    annotations = tools["get_context"].annotations
    assert annotations is not None
    assert annotations.read_only_hint is True


async def _converse(session: ClientSession, sid: str, user: str) -> None:
    """Two turns stored through the tools (one append retried), then every read of them."""
    turns = [
        ("My order number is AX-9917 and the parcel has not arrived.", "I see order AX-9917 in transit."),
        ("Can it be delivered to the Lisbon office instead?", "Yes, it now goes to the Lisbon office."),
    ]
    for n, (question, reply) in enumerate(turns, start=1):
        asked = await _call(
            session, "append_message", session_id=sid, role="user", content=question, message_id=f"q{n}"
        )
        assert asked["message_id"] == f"q{n}"
        assert asked["created"] is True
        answered = await _call(session, "append_message", session_id=sid, role="assistant", content=reply)
        assert answered["turn_count"] == n
        assert answered["message_id"]  # generated when none was given
    again = await _call(session, "append_message", session_id=sid, role="user", content=turns[0][0], message_id="q1")
    # A retried call with its message_id stores nothing: the daemon answers the original result.
    assert again["created"] is False
    assert again["turn_count"] == 0

    context = await _call(session, "get_context", session_id=sid, question="Where does the parcel go?")
    assert context["turn_count"] == 2
    said = [m["content"] for m in context["messages"] if m["role"] in ("user", "assistant")]
    assert said[-1] == "Where does the parcel go?"
    assert any("AX-9917" in (m["content"] or "") for m in context["messages"])
    assert any("Lisbon office" in (m["content"] or "") for m in context["messages"])

    found = await _call(session, "recall", session_id=sid, query="order number", k=3)
    assert found["matches"]
    assert found["matches"][0]["turn"] == 1
    assert any("AX-9917" in m["content"] for m in found["matches"][0]["messages"])

    # A close waits about 1 s for a background summary pass still running (a loaded machine
    # may take longer): it is idempotent, and a later one says persisted once that pass is done.
    for _ in range(60):
        closed = await _call(session, "close_session", session_id=sid)
        if closed["persisted"]:
            break
        await asyncio.sleep(0.5)
    assert closed["persisted"] is True
    assert closed["turn_count"] == 2
    summary = await _call(session, "get_summary", session_id=sid)
    assert summary["tier"] != "none"
    assert summary["covered_turns"] == 2
    assert "AX-9917" in (summary["summary"] or "")

    profile = await _call(session, "get_profile")
    assert profile["user_id"] == user
    assert profile["sessions"] == 1
    assert "en" in profile["text"]


@pytest.fixture(scope="module")
def http_server(live_daemon: LiveDaemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server on streamable HTTP, once per module: the operator's unrestricted token from the
    environment, acting in the tenant's namespace by --tenant, for no user in particular."""
    port = free_port()
    args = ["--url", live_daemon.url, "--tenant", live_daemon.tenant, "--transport", "http", "--port", str(port)]
    server = ChildProcess(
        command("mcp", *args),
        port=port,
        env={"TIERED_MEMORY_TOKEN": live_daemon.operator_token},
        log_path=tmp_path_factory.mktemp("mcp-http") / "mcp.log",
        name="the MCP server",
        ready_path=None,  # listening is ready: it has nothing to ask without a session
        ready_timeout_s=30,
    )
    try:
        server.start_blocking()
        yield f"{server.base}/mcp"
    finally:
        server.stop(timeout_s=15)


async def test_stdio_serves_the_six_tools_through_a_conversation(live_daemon: LiveDaemon, tmp_path: Path) -> None:
    """Over stdio, as an MCP host spawns it: the tools are listed with typed inputs and outputs; a
    conversation stored through them is in the context, recall finds its words, close persists its
    summary, and the user's profile has it. Nothing but the protocol reaches stdout."""
    user = f"user-{uuid.uuid4().hex[:8]}"
    sid = _sid()
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tiered_memory", "mcp", "--url", live_daemon.url, "--token", live_daemon.token, "--user-id", user],
        cwd=str(ROOT),
    )
    stray: list[Exception] = []

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, Exception):  # e.g. a line on stdout that is not JSON-RPC
            stray.append(message)

    with (tmp_path / "stderr.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, message_handler=on_message) as session,
        ):
            init = await session.initialize()
            assert init.server_info.name == "tiered-memory"
            assert init.instructions is not None
            assert "message_id" in init.instructions
            _check_tools((await session.list_tools()).tools)
            await _converse(session, sid, user)
    assert stray == []
    # The server's own log went to stderr, without the daemon's token.
    logged = (tmp_path / "stderr.log").read_text()
    assert "mcp_serving" in logged
    assert live_daemon.token not in logged

    # What the tools stored is the daemon's: the user's session, in the token's tenant.
    async with AsyncClient(live_daemon.url, token=live_daemon.token) as direct:
        stored = [m.message_id async for m in direct.iter_messages(sid, user_id=user)]
    assert stored[0] == "q1"
    assert len(stored) == 4


async def test_streamable_http_round_trip_in_the_tenant(http_server: str, live_daemon: LiveDaemon) -> None:
    """Over streamable HTTP, with an unrestricted token and --tenant: a turn stored through the
    tools is in the tenant's namespace, where the tenant's own token reads it."""
    sid = _sid()
    async with streamable_http_client(http_server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS
        await _call(session, "append_message", session_id=sid, role="user", content="Is the Porto train on time?")
        stored = await _call(session, "append_message", session_id=sid, role="assistant", content="It is on time.")
        assert stored["turn_count"] == 1
        context = await _call(session, "get_context", session_id=sid)
        assert [m["content"] for m in context["messages"] if m["role"] != "system"] == [
            "Is the Porto train on time?",
            "It is on time.",
        ]
        summary = await _call(session, "get_summary", session_id=sid)
        assert summary["turn_count"] == 1
    async with AsyncClient(live_daemon.url, token=live_daemon.token) as tenant:
        assert (await tenant.context(sid)).turn_count == 1


async def test_a_daemon_error_is_a_tool_error_and_the_server_serves_on(
    http_server: str, live_daemon: LiveDaemon
) -> None:
    """The daemon's 404 and 409 come back as isError results that carry its status, code and
    message; a call without what it needs is refused by the server; the next call succeeds."""
    sid = _sid()
    stranger = f"nobody-{uuid.uuid4().hex[:8]}"
    async with AsyncClient(live_daemon.url, token=live_daemon.token) as direct:
        with pytest.raises(NotFound) as daemon_says:
            await direct.profile(stranger)
    async with streamable_http_client(http_server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        text = await _refused(session, "get_profile", user_id=stranger)
        assert "404 not_found" in text
        assert daemon_says.value.message in text

        assert "404 not_found" in await _refused(session, "recall", session_id=sid, query="anything")

        await _call(session, "append_message", session_id=sid, role="user", content="First words.", message_id="m-1")
        text = await _refused(
            session, "append_message", session_id=sid, role="user", content="Other.", message_id="m-1"
        )
        assert "409 conflict" in text
        assert "m-1" in text

        # This server acts for no user: get_profile needs one.
        assert "user_id" in await _refused(session, "get_profile")

        context = await _call(session, "get_context", session_id=sid)
        assert [m["content"] for m in context["messages"] if m["role"] == "user"] == ["First words."]


async def test_an_unreachable_daemon_is_a_tool_error() -> None:
    """With no daemon listening, each call fails as a tool error (after the client's retries) and
    the server answers the next one: connected in-process with the mcp package's own Client."""
    server = build_server(Options(url=f"http://127.0.0.1:{free_port()}"))
    async with Client(server) as client:
        for _ in range(2):
            result = await client.call_tool("get_summary", {"session_id": _sid()})
            assert result.is_error
            assert "unavailable" in _text(result)


def test_http_on_a_non_loopback_host_is_refused_unless_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    """The MCP endpoint has no authentication of its own and holds the daemon's token: it binds a
    non-loopback address only when told to (as the daemon's ALLOW_UNAUTHENTICATED)."""
    options = Options(url="http://127.0.0.1:9", transport="http", host="0.0.0.0", port=free_port())
    assert run(options) == 2
    assert "--allow-unauthenticated" in capsys.readouterr().err
    assert is_loopback("127.0.0.2")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("memory.internal")
