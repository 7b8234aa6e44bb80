"""Client: the blocking twin of AsyncClient, for code without an event loop (WSGI apps, scripts).

It runs an AsyncClient on an event loop of its own, in one background thread, and waits for each
call. So both clients share one implementation of retries, idempotency keys, timeouts and error
mapping (they cannot drift apart), and the blocking client keeps aiohttp's connection pool across
calls. Any number of threads may call one Client at once; `close()` (or `with`) stops the thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from tiered_memory.client.aio import AsyncClient
from tiered_memory.client.models import (
    AppendResult,
    BatchResult,
    CloseResult,
    Context,
    Erasure,
    GatewayState,
    PatchResult,
    Readiness,
    RebuildJob,
    RebuildResult,
    RecallMatch,
    SessionInfo,
    Slice,
    StoredMessage,
    SummaryResult,
    TurnResult,
    UserProfile,
    UserSession,
    UserSummary,
)

T = TypeVar("T")


class Client:
    """Blocking client of one daemon; the arguments and answers are AsyncClient's."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tiered-memory-client", daemon=True)
        self._thread.start()
        self._closed = False

        async def make() -> AsyncClient:
            # Built on the client's loop: aiohttp binds its session to the loop that creates it.
            return AsyncClient(
                base_url,
                token=token,
                timeout=timeout,
                retries=retries,
                backoff=backoff,
                max_backoff=max_backoff,
                headers=headers,
            )

        self._async = self._run(make())

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and stop the client's thread; idempotent."""
        if self._closed:
            return
        self._run(self._async.aclose())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def append(
        self,
        session_id: str,
        role: str,
        content: str | None,
        *,
        message_id: str | None = None,
        user_id: str | None = None,
        channel: str | None = None,
        status: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
        thinking_content: str | None = None,
        thinking_duration: int | None = None,
    ) -> AppendResult:
        return self._run(
            self._async.append(
                session_id,
                role,
                content,
                message_id=message_id,
                user_id=user_id,
                channel=channel,
                status=status,
                tool_calls=tool_calls,
                tool_call_id=tool_call_id,
                name=name,
                thinking_content=thinking_content,
                thinking_duration=thinking_duration,
            )
        )

    def append_batch(
        self, session_id: str, messages: list[dict[str, Any]], *, user_id: str | None = None
    ) -> BatchResult:
        return self._run(self._async.append_batch(session_id, messages, user_id=user_id))

    def patch_message(
        self,
        session_id: str,
        message_id: str,
        *,
        content: str | None = None,
        status: str | None = None,
        user_id: str | None = None,
    ) -> PatchResult:
        return self._run(
            self._async.patch_message(session_id, message_id, content=content, status=status, user_id=user_id)
        )

    def delete_message(self, session_id: str, message_id: str, *, user_id: str | None = None) -> bool:
        return self._run(self._async.delete_message(session_id, message_id, user_id=user_id))

    def state(self, session_id: str, *, user_id: str | None = None) -> GatewayState:
        return self._run(self._async.state(session_id, user_id=user_id))

    def put_state(
        self, session_id: str, state: dict[str, Any], *, if_match: int | None = None, user_id: str | None = None
    ) -> GatewayState:
        return self._run(self._async.put_state(session_id, state, if_match=if_match, user_id=user_id))

    def turn(
        self,
        session_id: str,
        content: str,
        *,
        message_id: str | None = None,
        user_id: str | None = None,
        channel: str | None = None,
        system_prompt: str | None = None,
        max_chars: int | None = None,
        user_memory: str | None = None,
        kb_snippets: Sequence[str] | None = None,
    ) -> TurnResult:
        return self._run(
            self._async.turn(
                session_id,
                content,
                message_id=message_id,
                user_id=user_id,
                channel=channel,
                system_prompt=system_prompt,
                max_chars=max_chars,
                user_memory=user_memory,
                kb_snippets=kb_snippets,
            )
        )

    def close_session(
        self, session_id: str, *, user_id: str | None = None, attempt_timeout: float | None = None
    ) -> CloseResult:
        """POST /close (named so that `close()` can stay the client's own)."""
        return self._run(self._async.close(session_id, user_id=user_id, attempt_timeout=attempt_timeout))

    def delete(self, session_id: str, *, user_id: str | None = None) -> None:
        self._run(self._async.delete(session_id, user_id=user_id))

    def delete_summary(self, session_id: str, *, user_id: str | None = None) -> None:
        self._run(self._async.delete_summary(session_id, user_id=user_id))

    def start_rebuild(
        self, session_id: str, *, user_id: str | None = None, attempt_timeout: float | None = None
    ) -> RebuildJob:
        return self._run(self._async.start_rebuild(session_id, user_id=user_id, attempt_timeout=attempt_timeout))

    def rebuild_job(
        self, session_id: str, job_id: str, *, user_id: str | None = None, attempt_timeout: float | None = None
    ) -> RebuildJob:
        return self._run(self._async.rebuild_job(session_id, job_id, user_id=user_id, attempt_timeout=attempt_timeout))

    def rebuild_summary(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        attempt_timeout: float | None = None,
        wait_timeout: float = 600.0,
        poll_interval: float = 1.0,
    ) -> RebuildResult:
        return self._run(
            self._async.rebuild_summary(
                session_id,
                user_id=user_id,
                attempt_timeout=attempt_timeout,
                wait_timeout=wait_timeout,
                poll_interval=poll_interval,
            )
        )

    def context(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        max_chars: int | None = None,
        system_prompt: str | None = None,
        question: str | None = None,
        user_memory: str | None = None,
        kb_snippets: Sequence[str] | None = None,
    ) -> Context:
        return self._run(
            self._async.context(
                session_id,
                user_id=user_id,
                max_chars=max_chars,
                system_prompt=system_prompt,
                question=question,
                user_memory=user_memory,
                kb_snippets=kb_snippets,
            )
        )

    def summary(self, session_id: str, *, user_id: str | None = None) -> SummaryResult:
        return self._run(self._async.summary(session_id, user_id=user_id))

    def session(self, session_id: str, *, user_id: str | None = None) -> SessionInfo:
        return self._run(self._async.session(session_id, user_id=user_id))

    def slices(self, session_id: str, *, user_id: str | None = None) -> list[Slice]:
        return self._run(self._async.slices(session_id, user_id=user_id))

    def recall(
        self, session_id: str, query: str, *, k: int | None = None, user_id: str | None = None
    ) -> list[RecallMatch]:
        return self._run(self._async.recall(session_id, query, k=k, user_id=user_id))

    def messages(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        from_seq: int | None = None,
        to_seq: int | None = None,
        limit: int | None = None,
    ) -> list[StoredMessage]:
        return self._run(
            self._async.messages(session_id, user_id=user_id, from_seq=from_seq, to_seq=to_seq, limit=limit)
        )

    def iter_messages(self, session_id: str, *, user_id: str | None = None) -> Iterator[StoredMessage]:
        """Every stored message, oldest first, a page at a time (the pages AsyncClient follows)."""
        following: int | None = 1
        while following is not None:
            page, following = self._run(self._async.messages_page(session_id, user_id, following))
            yield from page

    def user_summaries(
        self, user_id: str, *, limit: int | None = None, as_user: str | None = None
    ) -> list[UserSummary]:
        return self._run(self._async.user_summaries(user_id, limit=limit, as_user=as_user))

    def profile(self, user_id: str, *, as_user: str | None = None) -> UserProfile:
        return self._run(self._async.profile(user_id, as_user=as_user))

    def user_sessions(self, user_id: str, *, as_user: str | None = None) -> Iterator[UserSession]:
        """Every session of the user, newest first, a page at a time."""
        cursor: str | None = ""
        while cursor is not None:
            page, cursor = self._run(self._async.user_sessions_page(user_id, cursor or None, as_user=as_user))
            yield from page

    def erase_user(self, user_id: str, *, as_user: str | None = None) -> Erasure:
        return self._run(self._async.erase_user(user_id, as_user=as_user))

    def erasure(self, user_id: str, *, as_user: str | None = None) -> Erasure:
        return self._run(self._async.erasure(user_id, as_user=as_user))

    def healthz(self) -> bool:
        return self._run(self._async.healthz())

    def readyz(self) -> Readiness:
        return self._run(self._async.readyz())

    def openapi(self) -> dict[str, Any]:
        return self._run(self._async.openapi())

    def metrics_text(self) -> str:
        return self._run(self._async.metrics_text())
