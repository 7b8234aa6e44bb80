"""Summaries from an OpenAI-compatible chat-completions endpoint.

The LLM is an optional improvement, never a dependency: every way it can fail (timeout, HTTP
error, broken connection, malformed or empty reply) raises LlmFailed with a reason, and the
caller falls back to the deterministic summarizer. A circuit breaker stops calling an LLM that
keeps failing, so a dead endpoint costs one timeout per probe, not one per summary.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from tiered_memory.breaker import CircuitBreaker
from tiered_memory.errors import LlmFailed
from tiered_memory.model import Message, Role
from tiered_memory.summarize.payload import check_text, parse_llm_payload

T = TypeVar("T")

_SPEAKER = {Role.USER: "用户", Role.ASSISTANT: "助手"}


def default_prompt(summary_format: str = "text") -> str:
    """The built-in system prompt: for text, the prompt of the system this daemon replaces
    (Chinese, 150 characters); for structured, the JSON memory-merge prompt."""
    name = "summary_structured_zh.txt" if summary_format == "structured" else "summary_zh.txt"
    return resources.files("tiered_memory").joinpath(f"prompts/{name}").read_text(encoding="utf-8")


def load_prompt(path: Path | None, summary_format: str = "text") -> str:
    return path.read_text(encoding="utf-8") if path is not None else default_prompt(summary_format)


def render_request(previous: str | None, messages: Sequence[Message]) -> str:
    """The user message sent to the LLM: the previous summary, then only the new turns."""
    transcript = "\n".join(f"{_SPEAKER[m.role]}：{m.content}" for m in messages)
    return f"已有摘要：{previous or '无'}\n\n新增对话：\n{transcript}"


def render_structured_request(previous: Mapping[str, Any] | None, messages: Sequence[Message]) -> str:
    """The same for the structured format: the previous payload as JSON, then only the new turns."""
    transcript = "\n".join(f"{_SPEAKER[m.role]}：{m.content}" for m in messages)
    memory = json.dumps(previous or {}, ensure_ascii=False)
    return f"已有长期记忆：{memory}\n\n新增对话：\n{transcript}"


class LlmSummarizer:
    """Calls `POST {base_url}/chat/completions`; one instance shares one aiohttp session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        max_tokens: int,
        timeout_s: float,
        prompt: str,
        max_chars: int,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self._session = session
        self._breaker = breaker
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._model = model
        self._max_tokens = max_tokens
        self._timeout = timeout_s
        self._prompt = prompt
        self._max_chars = max_chars
        self.model = model
        # Recorded on every slice, so a summary made under another prompt can be found and rebuilt.
        self.prompt_id = hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:12]

    async def summarize(self, previous: str | None, messages: Sequence[Message]) -> str:
        """A text summary merging `previous` with `messages`, at most max_chars long.

        Raises LlmFailed on any failure (including a reply that is empty, says there is nothing
        to summarize, or answers the user); never waits longer than the configured timeout.
        """
        return await self._guarded(
            lambda: self._complete_text(render_request(previous, messages)),
        )

    async def summarize_structured(
        self, previous: Mapping[str, Any] | None, messages: Sequence[Message]
    ) -> dict[str, Any]:
        """A structured payload merging `previous` with `messages`, limits enforced.
        Raises LlmFailed as `summarize`, and for a reply that is not the JSON object asked for."""
        return await self._guarded(lambda: self._complete_payload(render_structured_request(previous, messages)))

    async def _complete_text(self, user_content: str) -> str:
        return check_text(await self._complete(user_content))[: self._max_chars]

    async def _complete_payload(self, user_content: str) -> dict[str, Any]:
        return parse_llm_payload(await self._complete(user_content), max_chars=self._max_chars)

    async def _guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        # A garbage reply counts like no reply: an LLM that answers nonsense for every call is
        # as down as one that times out, and each call still costs its latency.
        breaker = self._breaker
        if breaker is not None and not breaker.allow():
            raise LlmFailed("circuit_open", "the LLM failed repeatedly; not called until the breaker probes it")
        try:
            result = await call()
        except LlmFailed:
            if breaker is not None:
                breaker.failure()
            raise
        if breaker is not None:
            breaker.success()
        return result

    async def _complete(self, user_content: str) -> str:
        body = {
            "model": self._model,
            "max_tokens": self._max_tokens,
            "temperature": 0.2,
            "messages": [
                {"role": "system", "content": self._prompt},
                {"role": "user", "content": user_content},
            ],
        }
        try:
            async with asyncio.timeout(self._timeout):
                async with self._session.post(self._url, json=body, headers=self._headers) as resp:
                    if resp.status >= 400:
                        raise LlmFailed("http_error", f"status {resp.status}")
                    raw = await resp.read()
        except TimeoutError as exc:
            raise LlmFailed("timeout", f"no reply within {self._timeout}s") from exc
        except aiohttp.ClientError as exc:
            raise LlmFailed("transport", type(exc).__name__) from exc
        return self._parse(raw)

    def _parse(self, raw: bytes) -> str:
        try:
            doc: Any = json.loads(raw)
            content = doc["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LlmFailed("malformed", type(exc).__name__) from exc
        if not isinstance(content, str):
            raise LlmFailed("malformed", "content is not a string")
        if not content.strip():
            raise LlmFailed("empty", "blank content")
        return content
