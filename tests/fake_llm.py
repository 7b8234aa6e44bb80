"""A local HTTP server that speaks the chat-completions protocol, with scripted behaviour.

The one place the LLM is faked: at the wire, so the daemon's real HTTP client, timeouts and
parsing are what the tests exercise.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_MARKER = re.compile(r"«([A-Za-z0-9_-]+)»")


@dataclass
class Behaviour:
    """What the next replies look like. `mode` is one of ok, status, malformed, empty, no_choices."""

    mode: str = "ok"
    text: str = "用户咨询了产品，助手给出了建议。"
    status: int = 500
    delay_s: float = 0.0


@dataclass
class FakeLlm:
    behaviour: Behaviour = field(default_factory=Behaviour)
    requests: list[dict[str, Any]] = field(default_factory=list)
    usage: list[dict[str, int]] = field(default_factory=list)  # what each ok reply reported
    in_flight: int = 0
    max_in_flight: int = 0  # the most requests in flight at once (a test of a concurrency bound)
    completed: int = 0
    url: str = ""
    # Calls in flight per conversation, keyed by the «marker» its messages carry, and the most
    # seen at once: a test of "one summarization per session at a time" across processes.
    in_flight_by_marker: dict[str, int] = field(default_factory=dict)
    max_in_flight_by_marker: dict[str, int] = field(default_factory=dict)
    _runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"body": body, "headers": dict(request.headers)})
        markers = set(_MARKER.findall(str(body["messages"][-1]["content"])))
        for m in markers:
            self.in_flight_by_marker[m] = self.in_flight_by_marker.get(m, 0) + 1
            self.max_in_flight_by_marker[m] = max(self.max_in_flight_by_marker.get(m, 0), self.in_flight_by_marker[m])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            b = self.behaviour
            if b.delay_s:
                await asyncio.sleep(b.delay_s)
            if b.mode == "status":
                return web.json_response({"error": {"message": "scripted failure"}}, status=b.status)
            if b.mode == "malformed":
                return web.Response(text="{not json", content_type="application/json")
            if b.mode == "no_choices":
                return web.json_response({"id": "x", "choices": []})
            content = "   " if b.mode == "empty" else b.text
            # A token a character: what the tests of the usage counters add up.
            usage = {
                "prompt_tokens": sum(len(m["content"]) for m in body["messages"]),
                "completion_tokens": len(content),
            }
            self.usage.append(usage)
            return web.json_response(
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
                    "usage": usage,
                }
            )
        finally:
            self.in_flight -= 1
            self.completed += 1
            for m in markers:
                self.in_flight_by_marker[m] -= 1

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def last_user_prompt(self) -> str:
        body = self.requests[-1]["body"]
        return str(body["messages"][-1]["content"])


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)
