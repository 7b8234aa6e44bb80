"""How the client reaches the daemon: one API call with its retries (connection errors and 5xx,
with jittered exponential backoff that honours `Retry-After`), its error mapped to the client's
exception tree, and the caller's trace context propagated. `AsyncClient` says what to call."""

from __future__ import annotations

import asyncio
import functools
import json
import random
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from yarl import URL

from tiered_memory.client.errors import Timeout, Unavailable, api_error


class Transport:
    """The connection pool and the retry policy of one client."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        timeout: float,
        retries: int,
        backoff: float,
        max_backoff: float,
        session: aiohttp.ClientSession | None,
        headers: Mapping[str, str] | None,
    ) -> None:
        self._base = URL(base_url.rstrip("/"))
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._own_session = session is None
        self._session = session
        self._headers = dict(headers or {})
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"

    async def aclose(self) -> None:
        """Close the connection pool (unless the session was handed in)."""
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: list[tuple[str, str]] | None = None,
        user_id: str | None = None,
        attempt_timeout: float | None = None,
        ok: tuple[int, ...] = (200, 201, 204),
        retry: bool = True,
        decode: bool = True,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One API call with its retries: the final status and the decoded JSON body (None for
        204; the raw bytes when not `decode`)."""
        attempts = self._retries + 1 if retry else 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                status, retry_after, raw = await self._attempt(
                    method, path, params, body, user_id, attempt_timeout, headers
                )
            except Unavailable:
                if last:
                    raise
                await asyncio.sleep(self.delay(attempt, None))
                continue
            if status in ok:
                if not decode:
                    return status, raw
                return status, json.loads(raw) if raw else None
            if status >= 500 and not last:
                await asyncio.sleep(self.delay(attempt, retry_after))
                continue
            if status >= 500:
                raise Unavailable(
                    f"{method} {path}: {status} after {attempts} attempt(s): {_message(raw)}",
                    status=status,
                    retry_after=retry_after,
                )
            error = _decode_error(raw)
            raise api_error(status, error.get("code", "error"), error.get("message", _message(raw)))
        raise AssertionError("unreachable")

    async def _attempt(
        self,
        method: str,
        path: str,
        params: list[tuple[str, str]] | None,
        body: dict[str, Any] | None,
        user_id: str | None,
        attempt_timeout: float | None,
        extra_headers: dict[str, str] | None = None,
    ) -> tuple[int, float | None, bytes]:
        headers = dict(self._headers) | (extra_headers or {})
        if user_id is not None:
            headers["X-User-ID"] = user_id
        _propagate_trace(headers)
        url = self._base.with_path(self._base.path.rstrip("/") + path, encoded=True)
        try:
            async with self._http().request(
                method,
                url,
                params=params,
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=attempt_timeout or self._timeout),
            ) as resp:
                raw = await resp.read()
                return resp.status, _retry_after(resp.headers.get("Retry-After")), raw
        except TimeoutError as exc:
            # aiohttp's ServerTimeoutError is a connection error too: checked first, it is a timeout.
            raise Timeout(f"{method} {path}: no answer within {attempt_timeout or self._timeout} s") from exc
        except aiohttp.ClientError as exc:
            raise Unavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry `attempt` (0 first): jittered within the doubling backoff,
        at least the answer's `Retry-After`, never past `max_backoff`."""
        jittered = random.uniform(0, min(self._max_backoff, self._backoff * 2**attempt))
        if retry_after is not None:
            return min(self._max_backoff, max(retry_after, jittered))
        return jittered


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: the backoff decides


def _decode_error(raw: bytes) -> dict[str, str]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    error = doc.get("error") if isinstance(doc, dict) else None
    return {k: str(v) for k, v in error.items()} if isinstance(error, dict) else {}


def _message(raw: bytes) -> str:
    return _decode_error(raw).get("message") or raw[:200].decode("utf-8", "replace")


def _propagate_trace(headers: dict[str, str]) -> None:
    """The caller's trace context (W3C `traceparent`, through the propagators its OpenTelemetry
    set-up configured) into `headers`, so that the daemon's spans join the gateway's trace;
    nothing without opentelemetry-api installed or without a current span."""
    inject = _trace_injector()
    if inject is not None:
        inject(headers)


@functools.cache
def _trace_injector() -> Callable[[dict[str, str]], None] | None:
    # Looked up once: a failed import searches sys.path again on every try.
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    return propagate.inject
