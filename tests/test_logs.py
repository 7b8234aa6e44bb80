"""Log hygiene, read from what a daemon process writes: message content, questions, system
prompts and LLM replies stay out of the logs unless LOG_MESSAGE_CONTENT=true."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import new_sid
from tests.fake_llm import Behaviour, FakeLlm

# ASCII, so that no renderer's escaping of other characters could hide it from the search.
MARK = "zq7MARK4417xv"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _converse(base: str) -> None:
    """Appends, a load-then-append turn, a framed context read, a refused request and a
    summary whose LLM reply (holding the mark) is rejected."""
    async with aiohttp.ClientSession(base) as http:
        for _ in range(300):
            try:
                async with http.get("/healthz") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
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
    LOG_MESSAGE_CONTENT=true the append lines carry the content."""
    fake_llm.behaviour = Behaviour(text=f"这不是 JSON：{MARK}")
    port = _free_port()
    env = os.environ | backend_env
    env |= {
        "PORT": str(port),
        "LOG_LEVEL": "DEBUG",
        "LOG_FORMAT": "json",
        "LOG_MESSAGE_CONTENT": str(log_content).lower(),
        "LLM_BASE_URL": fake_llm.url,
        "SUMMARY_MODEL": "summary-model",
    }
    log_path = tmp_path / "daemon.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tiered_memory", "serve", env=env, stdout=log_file, stderr=log_file
        )
        try:
            await _converse(f"http://127.0.0.1:{port}")
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), timeout=30)
    text = log_path.read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    events = {r["event"] for r in records}
    assert {"append", "request", "llm_summary_failed", "summary_written"} <= events, events
    assert fake_llm.requests, "the LLM was never asked"
    assert (MARK in text) is log_content
    appended = [r for r in records if r["event"] == "append"]
    assert len(appended) == 7
    assert all((MARK in r.get("content", "")) is log_content for r in appended)
