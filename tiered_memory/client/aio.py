"""AsyncClient: the whole v1 API over aiohttp, with retries that are safe because writes are idempotent.

Every write carries a `message_id` (generated here when the caller gives none) and every retry
of it reuses that id, so a request whose answer was lost on the way (a cut connection, a daemon
restarted mid-request) is stored exactly once: the daemon answers the retry 200 with the original
result. Connection failures and 5xx answers are retried with exponential backoff and full jitter
(a 503's Retry-After is honoured); a 4xx never is; a timeout is not either, because the request
may still be running and the caller owns the latency budget.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp

from tiered_memory.client._transport import Transport
from tiered_memory.client.errors import ClientError, Conflict, NotFound, Timeout, Unavailable
from tiered_memory.client.models import (
    AppendResult,
    BatchMessage,
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
    build,
    context_of,
    matches_of,
    profile_of,
    rebuild_job_of,
    slices_of,
)

# The daemon answers at most this many messages per page of GET /messages.
_PAGE = 1000
# A rebuild job is polled this soon first, then twice as late each time up to the poll interval:
# a short session's rebuild is done in a moment, a long one's takes minutes.
_FIRST_POLL_S = 0.05


def new_message_id() -> str:
    """A fresh idempotency key for one message (what the client uses when the caller gives none)."""
    return uuid.uuid4().hex


def _sid(session_id: str) -> str:
    return quote(session_id, safe="")


class AsyncClient:
    """A client of one tiered-memory daemon. Use it as `async with AsyncClient(url) as mem: ...`,
    or call `aclose()`; one instance serves any number of concurrent calls on pooled connections.

    - `token`: sent as `Authorization: Bearer <token>` (the daemon's API_TOKENS).
    - `timeout`: seconds for one attempt, connection to last byte (default 10).
      `rebuild_summary` waits for a job that calls the LLM once per batch: its `wait_timeout`
      (default 600 s) bounds the wait, each of its calls is one short attempt.
    - `retries`: further attempts after a connection failure or a 5xx (default 2); `backoff` the
      first wait in seconds (doubled each time, jittered, at most `max_backoff`); a 503's
      Retry-After is waited for when longer, up to `max_backoff`.
    - `user_id` on a call is sent as X-User-ID (and as the body's user_id on writes): the user the
      gateway acts for, which the daemon checks against the session's owner.
    - `headers`: sent with every call; e.g. `{"X-Tenant": "acme"}` for an unrestricted token that
      acts on a tenant's sessions.
    - `session`: an aiohttp.ClientSession to use instead of an own one (its owner closes it).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError("expected retries >= 0, timeout > 0 and backoff >= 0")
        self._transport = Transport(
            base_url,
            token=token,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_backoff=max_backoff,
            session=session,
            headers=headers,
        )
        self._call = self._transport.call

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (unless the session was handed in)."""
        await self._transport.aclose()

    # --- writes ---------------------------------------------------------------------------

    async def append(
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
        """Store one message (`role` user, assistant, tool or system; `status` completed,
        interrupted, stopped, failed or streaming for a reply). An assistant message may carry
        `tool_calls` (then `content` may be None); a `tool` message answers one of them by its
        `tool_call_id`. An assistant message may carry the model's reasoning (`thinking_content`)
        and how long it took (`thinking_duration`, seconds): stored and listed with the message,
        never put in a context or a summary. Durable when this returns; stored once however often
        it is retried."""
        body = _body(
            role=role,
            content=content,
            message_id=message_id or new_message_id(),
            user_id=user_id,
            channel=channel,
            status=status,
            tool_calls=tool_calls,
            tool_call_id=tool_call_id,
            name=name,
            thinking_content=thinking_content,
            thinking_duration=thinking_duration,
        )
        code, data = await self._call("POST", f"/v1/sessions/{_sid(session_id)}/messages", body=body, user_id=user_id)
        return build(AppendResult, data, created=code == 201)

    async def append_batch(
        self, session_id: str, messages: list[dict[str, Any]], *, user_id: str | None = None
    ) -> BatchResult:
        """Store up to 500 messages (each a dict as `append` takes it: role, content, message_id,
        channel, status, tool and reasoning fields) in one transaction, all or none: a bulk
        import. Give each a `message_id` and a retried batch stores nothing twice (generated here
        when missing)."""
        items = [{**m, "message_id": m.get("message_id") or new_message_id()} for m in messages]
        path = f"/v1/sessions/{_sid(session_id)}/messages/batch"
        code, data = await self._call("POST", path, body={"messages": items}, user_id=user_id)
        return build(
            BatchResult, data, messages=[build(BatchMessage, m) for m in data["messages"]], created=code == 201
        )

    async def patch_message(
        self,
        session_id: str,
        message_id: str,
        *,
        content: str | None = None,
        status: str | None = None,
        user_id: str | None = None,
    ) -> PatchResult:
        """Correct a stored message while no summary covers it: a transcript's `content`, or a
        reply's `status` (a streaming reply finalized, a reply cut by a barge-in, with the part
        that was spoken as `content`). Repeating it changes nothing (`changed` False)."""
        body = _body(content=content, status=status)
        path = f"/v1/sessions/{_sid(session_id)}/messages/{quote(message_id, safe='')}"
        _, data = await self._call("PATCH", path, body=body, user_id=user_id)
        return build(PatchResult, data, message=build(StoredMessage, data["message"]))

    async def delete_message(self, session_id: str, message_id: str, *, user_id: str | None = None) -> bool:
        """Remove the session's newest message while no summary covers its turn (an agent
        framework taking back its last item): the turn it completed is open again. True when this
        call removed it; False when the session has no such message (any more: a retry whose first
        attempt's answer was lost, or an unknown session), so repeating it is safe. Conflict with
        code `already_summarized` once a summary covers its turn, `conflict` when it is not the
        newest (or a summary of the session is being made: try again)."""
        path = f"/v1/sessions/{_sid(session_id)}/messages/{quote(message_id, safe='')}"
        try:
            await self._call("DELETE", path, user_id=user_id)
        except NotFound:
            return False
        return True

    async def state(self, session_id: str, *, user_id: str | None = None) -> GatewayState:
        """The gateway's own state of the session (what it needs back after a reconnect)."""
        _, data = await self._call("GET", f"/v1/sessions/{_sid(session_id)}/state", user_id=user_id)
        return build(GatewayState, data)

    async def put_state(
        self, session_id: str, state: dict[str, Any], *, if_match: int | None = None, user_id: str | None = None
    ) -> GatewayState:
        """Replace the gateway's state of the session (a JSON object of at most 8 KB); with
        `if_match` (the version read), only over that version: Conflict (412) when another
        writer came first."""
        headers = {"If-Match": f'"{if_match}"'} if if_match is not None else None
        path = f"/v1/sessions/{_sid(session_id)}/state"
        _, data = await self._call("PUT", path, body=state, user_id=user_id, headers=headers)
        return build(GatewayState, data)

    async def turn(
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
        """Load-then-append, the per-utterance call: the context to send the model (ending with
        the user's `content` as the question, framed by `system_prompt`, led by what `user_memory`
        carries over from the user's earlier sessions, with this turn's `kb_snippets`, best first,
        before the recent turns: counted in `max_chars`, never stored), and the message stored."""
        body = _body(
            content=content,
            message_id=message_id or new_message_id(),
            user_id=user_id,
            channel=channel,
            system_prompt=system_prompt,
            kb_snippets=list(kb_snippets) if kb_snippets is not None else None,
        )
        code, data = await self._call(
            "POST",
            f"/v1/sessions/{_sid(session_id)}/turns",
            body=body,
            params=_params(max_chars=max_chars, user_memory=user_memory),
            user_id=user_id,
        )
        return TurnResult(
            context=context_of(data),
            message_id=data["message_id"],
            summary_scheduled=data["summary_scheduled"],
            turn_count=data["turn_count"],
            created=code == 201,
        )

    async def close(
        self, session_id: str, *, user_id: str | None = None, attempt_timeout: float | None = None
    ) -> CloseResult:
        """Persist the final summary and mark the session closed (idempotent; call it at hang-up)."""
        _, data = await self._call(
            "POST", f"/v1/sessions/{_sid(session_id)}/close", user_id=user_id, attempt_timeout=attempt_timeout
        )
        return build(CloseResult, data)

    async def delete(self, session_id: str, *, user_id: str | None = None) -> None:
        """Remove the session from every tier (idempotent: an unknown session is no error)."""
        await self._call("DELETE", f"/v1/sessions/{_sid(session_id)}", user_id=user_id)

    async def delete_summary(self, session_id: str, *, user_id: str | None = None) -> None:
        """Forget the session's summary in both tiers; its messages stay. NotFound for an unknown session."""
        await self._call("DELETE", f"/v1/sessions/{_sid(session_id)}/summary", user_id=user_id)

    async def start_rebuild(
        self, session_id: str, *, user_id: str | None = None, attempt_timeout: float | None = None
    ) -> RebuildJob:
        """Start recomputing every slice and the summary from the stored messages, with the
        daemon's current prompt and model, as a job, and answer at once; while the session's
        rebuild is still going, that job (`started` False). Follow it with `rebuild_job`."""
        path = f"/v1/sessions/{_sid(session_id)}/summary/rebuild"
        _, data = await self._call("POST", path, user_id=user_id, attempt_timeout=attempt_timeout, ok=(202,))
        return rebuild_job_of(data)

    async def rebuild_job(
        self, session_id: str, job_id: str, *, user_id: str | None = None, attempt_timeout: float | None = None
    ) -> RebuildJob:
        """A rebuild job as it is now (from any replica). NotFound past an hour after it ended."""
        path = f"/v1/sessions/{_sid(session_id)}/summary/rebuild/{quote(job_id, safe='')}"
        _, data = await self._call("GET", path, user_id=user_id, attempt_timeout=attempt_timeout)
        return rebuild_job_of(data)

    async def rebuild_summary(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        attempt_timeout: float | None = None,
        wait_timeout: float = 600.0,
        poll_interval: float = 1.0,
    ) -> RebuildResult:
        """Recompute every slice and the summary from the stored messages and wait for it: start
        the job, poll it (soon at first, then at most every `poll_interval` seconds) until it
        ended, then read the summary and every slice. Raises Timeout when it has not ended
        within `wait_timeout` seconds (it goes on: `rebuild_job` follows it); when it failed,
        Conflict (code `conflict`: a summary of the session was being written; try again),
        NotFound (the session is unknown, or was deleted meanwhile) or Unavailable (the message
        store was down, or the daemon running it stopped: try again)."""
        if wait_timeout <= 0 or poll_interval <= 0:
            raise ValueError("expected wait_timeout > 0 and poll_interval > 0")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_timeout
        job = await self.start_rebuild(session_id, user_id=user_id, attempt_timeout=attempt_timeout)
        delay = min(_FIRST_POLL_S, poll_interval)
        while not job.ended:
            left = deadline - loop.time()
            if left <= 0:
                raise Timeout(
                    f"rebuild {job.job_id} of {session_id}: still {job.state} after {wait_timeout} s;"
                    " it goes on (rebuild_job follows it)"
                )
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, poll_interval)
            job = await self.rebuild_job(session_id, job.job_id, user_id=user_id, attempt_timeout=attempt_timeout)
        if job.result is None:
            raise _rebuild_error(job)
        summary = await self.summary(session_id, user_id=user_id)
        return RebuildResult(
            session_id=session_id,
            summary=summary.summary if summary.version == job.result.version else None,
            covered_turns=job.result.covered_turns,
            version=job.result.version,
            source=job.result.source,
            slices=await self.slices(session_id, user_id=user_id),
            job_id=job.job_id,
        )

    # --- reads ----------------------------------------------------------------------------

    async def context(
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
        """The memory to send the model, within `max_chars` (CONTEXT_MAX_CHARS by default); with
        `user_memory` (`profile`, `last_session`, `topic`, `off`; USER_MEMORY by default), led by
        what the session carries over from its user's earlier sessions; with `kb_snippets` (this
        turn's knowledge-base passages, best first, sent in the URL: keep them short, or use
        `turn`), those that fit before the recent turns (`Context.kb_snippets_used`)."""
        params = _params(max_chars=max_chars, system_prompt=system_prompt, question=question, user_memory=user_memory)
        params += [("kb_snippet", snippet) for snippet in kb_snippets or ()]
        _, data = await self._call("GET", f"/v1/sessions/{_sid(session_id)}/context", params=params, user_id=user_id)
        return context_of(data)

    async def summary(self, session_id: str, *, user_id: str | None = None) -> SummaryResult:
        """The best summary and the tier that answered; tier `none` for an unknown session."""
        _, data = await self._call("GET", f"/v1/sessions/{_sid(session_id)}/summary", user_id=user_id)
        return build(SummaryResult, data)

    async def session(self, session_id: str, *, user_id: str | None = None) -> SessionInfo:
        """The session's bookkeeping; NotFound for an unknown session."""
        _, data = await self._call("GET", f"/v1/sessions/{_sid(session_id)}", user_id=user_id)
        return build(SessionInfo, data)

    async def slices(self, session_id: str, *, user_id: str | None = None) -> list[Slice]:
        """Every summarization of the session, oldest first (a page at a time)."""
        out: list[Slice] = []
        following: int | None = 1
        while following is not None:
            # The first page asks as an older daemon understands (it knows no from_turn).
            params = _params(from_turn=following if following > 1 else None)
            path = f"/v1/sessions/{_sid(session_id)}/slices"
            _, data = await self._call("GET", path, params=params, user_id=user_id)
            out.extend(slices_of(data["slices"]))
            following = data.get("next_from_turn")
        return out

    async def recall(
        self, session_id: str, query: str, *, k: int | None = None, user_id: str | None = None
    ) -> list[RecallMatch]:
        """The session's earlier messages that best match `query` (at most `k`, 5 by default), best first."""
        params = _params(q=query, k=k)
        _, data = await self._call("GET", f"/v1/sessions/{_sid(session_id)}/recall", params=params, user_id=user_id)
        return matches_of(data["matches"])

    async def messages(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        from_seq: int | None = None,
        to_seq: int | None = None,
        limit: int | None = None,
    ) -> list[StoredMessage]:
        """Stored messages by seq range, oldest first: one page (at most 1000, and at most 1 MiB
        of text, so it may hold fewer than `limit`; `iter_messages` follows the pages)."""
        params = _params(from_seq=from_seq, to_seq=to_seq, limit=limit)
        _, data = await self._call("GET", f"/v1/sessions/{_sid(session_id)}/messages", params=params, user_id=user_id)
        return [build(StoredMessage, m) for m in data["messages"]]

    async def messages_page(
        self, session_id: str, user_id: str | None, from_seq: int
    ) -> tuple[list[StoredMessage], int | None]:
        """One page of messages from `from_seq`, and where the next begins (None after the last).
        A daemon older than the cursors says nothing of the next page: a full page means more."""
        params = _params(from_seq=from_seq, limit=_PAGE)
        _, data = await self._call("GET", f"/v1/sessions/{_sid(session_id)}/messages", params=params, user_id=user_id)
        page = [build(StoredMessage, m) for m in data["messages"]]
        if "next_from_seq" in data:
            return page, data["next_from_seq"]
        return page, page[-1].seq + 1 if len(page) == _PAGE else None

    async def iter_messages(self, session_id: str, *, user_id: str | None = None) -> AsyncIterator[StoredMessage]:
        """Every stored message of the session, oldest first, fetched a page at a time."""
        following: int | None = 1
        while following is not None:
            page, following = await self.messages_page(session_id, user_id, following)
            for m in page:
                yield m

    async def user_summaries(
        self, user_id: str, *, limit: int | None = None, as_user: str | None = None
    ) -> list[UserSummary]:
        """The user's most recent session summaries, newest first (`as_user`: the X-User-ID to state)."""
        _, data = await self._call(
            "GET", f"/v1/users/{quote(user_id, safe='')}/summaries", params=_params(limit=limit), user_id=as_user
        )
        return [build(UserSummary, s) for s in data["summaries"]]

    async def profile(self, user_id: str, *, as_user: str | None = None) -> UserProfile:
        """What the user's sessions said, aggregated; NotFound before any summary of the user."""
        _, data = await self._call("GET", f"/v1/users/{quote(user_id, safe='')}/profile", user_id=as_user)
        return profile_of(data)

    async def user_sessions(self, user_id: str, *, as_user: str | None = None) -> AsyncIterator[UserSession]:
        """Every session of the user, newest first, read a page at a time."""
        cursor: str | None = ""
        while cursor is not None:
            page, cursor = await self.user_sessions_page(user_id, cursor or None, as_user=as_user)
            for s in page:
                yield s

    async def user_sessions_page(
        self, user_id: str, cursor: str | None, *, as_user: str | None = None
    ) -> tuple[list[UserSession], str | None]:
        """One page of the user's sessions from `cursor` (None: the first), and the next page's cursor."""
        path = f"/v1/users/{quote(user_id, safe='')}/sessions"
        _, data = await self._call("GET", path, params=_params(cursor=cursor), user_id=as_user)
        return [build(UserSession, s) for s in data["sessions"]], data.get("next_cursor")

    async def erase_user(self, user_id: str, *, as_user: str | None = None) -> Erasure:
        """Erase the user (every session, message, summary, the profile); `state` is `running`
        while it goes on (ask `erasure`). Safe to repeat."""
        _, data = await self._call("DELETE", f"/v1/users/{quote(user_id, safe='')}", ok=(200, 202), user_id=as_user)
        return build(Erasure, data)

    async def erasure(self, user_id: str, *, as_user: str | None = None) -> Erasure:
        """The state of the user's erasure; NotFound when none was asked for."""
        _, data = await self._call("GET", f"/v1/users/{quote(user_id, safe='')}/erasure", user_id=as_user)
        return build(Erasure, data)

    # --- operations -----------------------------------------------------------------------

    async def healthz(self) -> bool:
        """True when the daemon process answers (liveness)."""
        await self._call("GET", "/healthz")
        return True

    async def readyz(self) -> Readiness:
        """Whether the daemon can take writes (SQL reachable and migrated) and each tier's state."""
        code, data = await self._call("GET", "/readyz", ok=(200, 503), retry=False)
        return Readiness(ready=code == 200, status=data["status"], tiers=dict(data["tiers"]))

    async def openapi(self) -> dict[str, Any]:
        """The OpenAPI 3 document the daemon serves."""
        _, data = await self._call("GET", "/openapi.json")
        return dict(data)

    async def metrics_text(self) -> str:
        """The Prometheus exposition of /metrics."""
        _, raw = await self._call("GET", "/metrics", decode=False)
        return str(raw.decode("utf-8"))


def _rebuild_error(job: RebuildJob) -> ClientError:
    """The error a failed rebuild job raises: by its code, as the daemon would answer it."""
    error = job.error or {}
    code = error.get("code", "internal")
    message = f"rebuild {job.job_id} failed: {error.get('message', 'no reason given')}"
    if code == "conflict":
        return Conflict(409, code, message)
    if code == "not_found":
        return NotFound(404, code, message)
    return Unavailable(f"{message} ({code})")


def _body(**fields: object) -> dict[str, object]:
    return {k: v for k, v in fields.items() if v is not None}


def _params(**fields: object) -> list[tuple[str, str]]:
    """The query of the fields given, as pairs: a parameter may repeat (`kb_snippet`)."""
    return [(k, str(v)) for k, v in fields.items() if v is not None]
