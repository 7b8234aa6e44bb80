"""Logs, read from what a daemon process writes: message content, questions, system prompts and LLM
replies stay out of them unless LOG_MESSAGE_CONTENT=true; every request is one line (JSON off a
terminal, console text on one)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.daemon import new_sid
from tests.helpers.processes import run_cli
from tiered_memory.testing import Behaviour, DaemonProcess, FakeLlm, read_terminal

# ASCII, so that no renderer's escaping of other characters could hide it from the search.
MARK = "zq7MARK4417xv"
# Configured tokens and a wrong one, which no log line may ever hold either.
TOKEN = "zq7TOKENunrestricted0042"
TENANT_TOKEN = "zq7TOKENacme0000000042"
WRONG_TOKEN = "zq7TOKENwrong000000042"


# What a daemon process is asked until it answers: its probes are among the request lines the tests
# count (/readyz would add lines of another route).
PROBE = "/healthz"


async def _stop(daemon: DaemonProcess) -> None:
    """SIGTERM, which must stop it within 30 s (else it is killed, and the test fails)."""
    code = await daemon.shutdown(timeout_s=30)
    assert code != -signal.SIGKILL, "the daemon did not stop on SIGTERM within 30 s"


async def _converse(daemon: DaemonProcess) -> None:
    """Start `daemon` (its readiness asked with the token too), then: appends, a load-then-append
    turn, a framed context read, a refused request, requests with a tenant's token and a wrong one,
    and a summary whose LLM reply (holding the mark) is rejected."""
    async with aiohttp.ClientSession(daemon.base, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        await daemon.start(http)
        # A header aiohttp cannot parse, holding a configured token: a 400, and no byte of it logged.
        host, port = "127.0.0.1", daemon.port
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\x01\r\n\r\n".encode())
        assert (await reader.read()).startswith(b"HTTP/1.0 400")
        writer.close()
        # A client that goes away halfway through its body: a 499 `client_closed`, not an error.
        reader, writer = await asyncio.open_connection(host, port)
        head = f"POST /v1/sessions/s-gone/messages HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        writer.write(f'{head}Content-Type: application/json\r\nContent-Length: 900\r\n\r\n{{"role":'.encode())
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
        sid = new_sid()
        for i in range(3):
            for role in ("user", "assistant"):
                async with http.post(
                    f"/v1/sessions/{sid}/messages", json={"role": role, "content": f"第{i}轮 {MARK} {role}"}
                ) as resp:
                    assert resp.status == 201, await resp.text()
        async with http.post(
            f"/v1/sessions/{sid}/turns", json={"content": f"还有 {MARK} 吗", "system_prompt": f"规则 {MARK}"}
        ) as resp:
            assert resp.status == 201, await resp.text()
        async with http.get(
            f"/v1/sessions/{sid}/context", params={"question": f"问 {MARK}", "system_prompt": f"规则 {MARK}"}
        ) as resp:
            assert resp.status == 200
        async with http.post(f"/v1/sessions/{sid}/messages", json={"role": "robot", "content": MARK}) as resp:
            assert resp.status == 400
        for token, status in ((TENANT_TOKEN, 201), (WRONG_TOKEN, 401)):
            async with http.post(
                f"/v1/sessions/{sid}/messages",
                json={"role": "user", "content": MARK},
                headers={"Authorization": f"Bearer {token}"},
            ) as resp:
                assert resp.status == status
        for _ in range(600):
            async with http.get(f"/v1/sessions/{sid}/summary") as resp:
                if (await resp.json())["tier"] in ("hot", "warm"):
                    return
            await asyncio.sleep(0.05)
        raise AssertionError("no summary was written")


@pytest.mark.slow
@pytest.mark.parametrize("log_content", [False, True], ids=["content-off", "content-on"])
async def test_content_is_logged_only_when_asked(
    backend_env: dict[str, str], fake_llm: FakeLlm, tmp_path: Path, log_content: bool
) -> None:
    """At LOG_LEVEL=DEBUG, with requests and an LLM reply all carrying a distinctive string, the
    daemon's log lines (append, request, llm_summary_failed, summary_written) never hold it; with
    LOG_MESSAGE_CONTENT=true the append lines carry the content. No bearer token, configured or
    wrong, is ever in the log."""
    fake_llm.behaviour = Behaviour(text=f"这不是 JSON：{MARK}")
    env = backend_env | {
        "LOG_LEVEL": "DEBUG",
        "LOG_FORMAT": "json",
        "LOG_MESSAGE_CONTENT": str(log_content).lower(),
        "LLM_BASE_URL": fake_llm.url,
        "SUMMARY_MODEL": "summary-model",
        "API_TOKENS": f"{TOKEN},acme:{TENANT_TOKEN}",
    }
    log_path = tmp_path / "daemon.log"
    daemon = DaemonProcess(env, log_path, ready_path=PROBE)
    try:
        await _converse(daemon)
    finally:
        await _stop(daemon)
    text = log_path.read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    events = {r["event"] for r in records}
    assert {"append", "request", "llm_summary_failed", "summary_written"} <= events, events
    assert fake_llm.requests, "the LLM was never asked"
    assert (MARK in text) is log_content
    assert "zq7TOKEN" not in text
    bad = [r for r in records if r["event"] == "bad_http_request"]
    assert [(r["level"], r["status"]) for r in bad] == [("warning", 400)], bad
    assert not [r for r in records if r.get("level") == "error"]
    gone = [r for r in records if r["event"] == "client_closed"]
    assert [(r["status"], r["route"]) for r in gone] == [(499, "/v1/sessions/{session_id}/messages")], gone
    appended = [r for r in records if r["event"] == "append"]
    assert len(appended) == 8
    assert all((MARK in r.get("content", "")) is log_content for r in appended)


async def _serve_and_call(daemon: DaemonProcess, sid: str) -> None:
    """Start a daemon process, make one request per kind, stop it."""
    try:
        async with aiohttp.ClientSession(daemon.base) as http:
            await daemon.start(http)
            for role in ("user", "assistant"):
                async with http.post(f"/v1/sessions/{sid}/messages", json={"role": role, "content": "你好"}) as resp:
                    assert resp.status == 201
            async with http.get(f"/v1/sessions/{sid}/summary", headers={"X-Request-ID": "req-summary-1"}) as resp:
                assert resp.status == 200
            async with http.get(f"/v1/sessions/{sid}/context") as resp:
                assert resp.status == 200
            async with http.post(f"/v1/sessions/{sid}/turns", json={"content": "还有呢"}) as resp:
                assert resp.status == 201
            async with http.get("/v1/sessions/bad{id}/summary") as resp:
                assert resp.status == 400
            async with http.get("/nowhere") as resp:
                assert resp.status == 404
    finally:
        await _stop(daemon)


@pytest.mark.slow
async def test_one_json_request_line_per_request_off_a_terminal(backend_env: dict[str, str], tmp_path: Path) -> None:
    """At the default LOG_LEVEL (INFO), with stderr not a terminal, every request is one JSON line
    with its route template (never the raw path), method, status, duration_ms, session id, request
    id and, for the reads that walk the tiers, the tier that answered."""
    env = backend_env | {"LOG_LEVEL": "INFO"}
    env.pop("LOG_FORMAT", None)
    # Unset whatever this process's environment says: the default is what is under test.
    environ = {k: v for k, v in os.environ.items() if k != "LOG_FORMAT"}
    sid = new_sid()
    log_path = tmp_path / "daemon.log"
    await _serve_and_call(DaemonProcess(env, log_path, environ=environ, ready_path=PROBE), sid)
    records = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line.startswith("{")]
    requests = [r for r in records if r["event"] == "request"]
    by_route = {(r["method"], r["route"], r["status"]): r for r in requests}
    summary = by_route[("GET", "/v1/sessions/{session_id}/summary", 200)]
    assert summary["tier"] in ("hot", "warm", "cold", "none")
    assert (summary["session_id"], summary["request_id"], summary["level"]) == (sid, "req-summary-1", "info")
    assert isinstance(summary["duration_ms"], float)
    assert by_route[("GET", "/v1/sessions/{session_id}/context", 200)]["tier"] in ("hot", "warm", "cold", "none")
    assert by_route[("POST", "/v1/sessions/{session_id}/turns", 201)]["tier"] in ("hot", "warm", "cold", "none")
    assert by_route[("POST", "/v1/sessions/{session_id}/messages", 201)]["tier"] is None
    assert by_route[("GET", "/v1/sessions/{session_id}/summary", 400)]["session_id"] == "bad{id}"
    assert by_route[("GET", "unmatched", 404)]["session_id"] is None
    assert ("GET", "/healthz", 200) in by_route
    assert all(sid not in r["route"] for r in requests)
    # One line per request: 2 appends, summary, context, turn, the bad id, the 404, and the probes.
    probes = sum(1 for r in requests if r["route"] == "/healthz")
    assert len(requests) == 7 + probes


@pytest.mark.slow
async def test_request_lines_are_human_readable_on_a_terminal(tmp_path: Path) -> None:
    """With stderr a terminal and LOG_FORMAT unset (auto), the same line is console text, not JSON;
    LOG_FORMAT=json still forces JSON there."""
    sid = new_sid()
    for fmt, expect_json in (("auto", False), ("json", True)):
        env = {"DATA_DIR": str(tmp_path / fmt), "LOG_FORMAT": fmt}
        master, slave = pty.openpty()
        try:
            await _serve_and_call(DaemonProcess(env, terminal=slave, ready_path=PROBE), sid)
        finally:
            os.close(slave)
        output = read_terminal(master)
        os.close(master)
        text = re.sub(r"\x1b\[[0-9;]*m", "", output.decode("utf-8", "replace"))
        lines = [line for line in text.splitlines() if "request" in line and "/summary" in line]
        assert lines, text[-2000:]
        if expect_json:
            assert json.loads(lines[0])["route"] == "/v1/sessions/{session_id}/summary"
        else:
            assert not lines[0].lstrip().startswith("{")
            assert "route=/v1/sessions/{session_id}/summary" in lines[0]
            assert "tier=" in lines[0]


@pytest.mark.slow
async def test_readiness_and_admin_commands_log_no_alembic_line(tmp_path: Path) -> None:
    """A new embedded database is migrated at start-up: one `schema_migrated` line (0 → the newest
    version), and none of Alembic's own. Each /readyz looks at the schema, and so does `check`:
    neither logs a line of Alembic's (its context announcements were two INFO lines a probe)."""
    env = {"DATA_DIR": str(tmp_path / "data"), "LOG_FORMAT": "json", "LOG_LEVEL": "INFO"}
    log_path = tmp_path / "daemon.log"
    daemon = DaemonProcess(env, log_path)
    try:
        async with aiohttp.ClientSession(daemon.base) as http:
            await daemon.start(http)
            for _ in range(3):
                async with http.get("/readyz") as resp:
                    assert resp.status == 200
    finally:
        await _stop(daemon)
    text = log_path.read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert [r for r in records if r["event"] == "request" and r["route"] == "/readyz"], text[-2000:]
    assert not [r for r in records if r.get("logger", "").startswith("alembic")], text[-2000:]
    migrated = [(r["from_version"], r["to_version"]) for r in records if r["event"] == "schema_migrated"]
    assert len(migrated) == 1
    assert migrated[0][0] == 0
    assert migrated[0][1] > 0
    code, out, err = await run_cli(env, "check")
    assert code == 0, out + err
    assert "alembic" not in err
