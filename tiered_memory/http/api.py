"""HTTP API v1: the routes; each validates its request (request_input), calls the MemoryService and
shapes the JSON reply.

Domain errors become status codes at the edge (edge.py, `observe`); bad input is refused with a
4xx that names what was wrong, before anything is changed. Who is
asking (the token's tenant, the stated user) becomes a Caller at the edge, and names the session's
stored key; the service checks the Caller against the session's owner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tiered_memory.errors import InvalidInput
from tiered_memory.http import input as request_input
from tiered_memory.http.edge import TIER_KEY, reply
from tiered_memory.http.keys import METRICS_KEY, OPENAPI_KEY, SERVICE_KEY, SETTINGS_KEY
from tiered_memory.model import (
    Caller,
    ContextRequest,
    JobState,
    Message,
    RebuildJob,
    SessionState,
    Slice,
    SummaryAnswer,
)
from tiered_memory.prompt.assemble import ContextAnswer, Explained
from tiered_memory.reasoning import reasoning_fields
from tiered_memory.summarize.rebuilds import FAILURES
from tiered_memory.text.dialogue import tool_fields

log = structlog.get_logger("tiered_memory.http.api")


async def _body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, read within BODY_TIMEOUT_SECONDS."""
    return await request_input.json_object(request, timeout_s=request.app[SETTINGS_KEY].body_timeout_seconds)


def _summary_json(sid: str, answer: SummaryAnswer, now: float) -> dict[str, Any]:
    s = answer.summary
    return {
        "session_id": sid,
        "tier": answer.tier.value,
        "summary": s.text if s else None,
        "turn_count": answer.turn_count,
        "covered_turns": s.covered_turns if s else 0,
        "topics": list(s.topics) if s else [],
        "payload": s.structured.get("payload") if s else None,
        "source": s.source.value if s else None,
        "version": s.version if s else 0,
        "updated_at": s.updated_at if s else None,
        "age_seconds": round(max(0.0, now - s.updated_at), 3) if s else None,
    }


async def post_message(request: web.Request) -> web.Response:
    request_input.check_query(request)
    service = request.app[SERVICE_KEY]
    sid = request_input.session_id(request)
    max_bytes = request.app[SETTINGS_KEY].max_message_bytes
    caller, (new,) = request_input.callers_messages(request, sid, await _body(request), max_bytes=max_bytes)
    outcome = await service.append(new, caller=caller)
    r = outcome.result
    return reply(
        {
            "session_id": sid,
            "message_id": r.message.message_id,
            "turn_count": r.turn_count,
            "summary_scheduled": outcome.summary_scheduled,
        },
        status=200 if r.duplicate else 201,
    )


async def post_batch(request: web.Request) -> web.Response:
    """Store up to 500 messages of the session in one transaction, all or none (a bulk import)."""
    request_input.check_query(request)
    sid = request_input.session_id(request)
    body = await _body(request)
    max_bytes = request.app[SETTINGS_KEY].max_message_bytes
    caller, news = request_input.callers_messages(request, sid, body, max_bytes=max_bytes, batch=True)
    outcome = await request.app[SERVICE_KEY].append_batch(news, caller=caller)
    results = outcome.results
    created = any(not r.duplicate for r in results)
    return reply(
        {
            "session_id": sid,
            "messages": [
                {
                    "message_id": r.message.message_id,
                    "seq": r.message.seq,
                    "turn": r.message.turn,
                    "duplicate": r.duplicate,
                }
                for r in results
            ],
            "turn_count": results[-1].turn_count,
            "summary_scheduled": outcome.summary_scheduled,
        },
        status=201 if created else 200,
    )


async def patch_message(request: web.Request) -> web.Response:
    """Correct a stored message's content or a reply's status while no summary covers it."""
    request_input.check_query(request)
    sid, mid = request_input.session_id(request), request_input.message_id(request)
    patch = request_input.parse_patch(await _body(request), max_bytes=request.app[SETTINGS_KEY].max_message_bytes)
    caller = request_input.caller(request)
    outcome = await request.app[SERVICE_KEY].patch_message(caller.session_key(sid), mid, patch, caller=caller)
    r = outcome.result
    message = _message_json(r.message)
    return reply(
        {
            "session_id": sid,
            "message": message,
            "turn_count": r.turn_count,
            "changed": r.changed,
            "summary_scheduled": outcome.summary_scheduled,
        }
    )


async def delete_message(request: web.Request) -> web.Response:
    """Remove the session's newest message while no summary covers its turn (an agent framework
    taking back its last item); 404 once it is gone, so a repeat is told so."""
    request_input.check_query(request)
    sid, mid = request_input.session_id(request), request_input.message_id(request)
    caller = request_input.caller(request)
    await request.app[SERVICE_KEY].delete_message(caller.session_key(sid), mid, caller=caller)
    return web.Response(status=204)


def _state_reply(sid: str, state: SessionState) -> web.Response:
    response = reply({"session_id": sid, "state": state.value, "version": state.version})
    response.headers["ETag"] = f'"{state.version}"'
    return response


async def get_state(request: web.Request) -> web.Response:
    """The gateway's state of the session (null and version 0 when it has none), with its ETag."""
    call = request_input.session_call(request)
    return _state_reply(call.sid, await request.app[SERVICE_KEY].get_state(call.key, caller=call.caller))


async def put_state(request: web.Request) -> web.Response:
    """Replace the gateway's state of the session; with If-Match, only over that version."""
    request_input.check_query(request)
    sid = request_input.session_id(request)
    value = request_input.state_object(await _body(request))
    if_match = request_input.if_match(request)
    caller = request_input.caller(request)
    state = await request.app[SERVICE_KEY].put_state(caller.session_key(sid), value, if_match=if_match, caller=caller)
    return _state_reply(sid, state)


async def get_summary(request: web.Request) -> web.Response:
    call = request_input.session_call(request)
    answer = await request.app[SERVICE_KEY].load_best_summary(call.key, caller=call.caller)
    request[TIER_KEY] = answer.tier.value
    return reply(_summary_json(call.sid, answer, time.time()))


def _max_chars(request: web.Request) -> int:
    return request_input.int_query(request, "max_chars", request.app[SETTINGS_KEY].context_max_chars, 1, 1_000_000)


def _context_json(sid: str, ctx: ContextAnswer, caller: Caller) -> dict[str, Any]:
    carried = ctx.carried
    return {
        "session_id": sid,
        "summary_tier": ctx.summary_tier.value,
        "summary": ctx.summary,
        "covered_turns": ctx.covered_turns,
        "topics": list(ctx.topics),
        "messages": [
            {
                "role": m.role,
                # A call message that says nothing of its own: null, as the chat-completions API has it.
                "content": None if m.tool_calls and not m.content else m.content,
                **tool_fields(m.tool_calls, m.tool_call_id, m.name),
            }
            for m in ctx.messages
        ],
        "turn_count": ctx.turn_count,
        "recent_transcript": ctx.recent_transcript,
        "answer_transcript": ctx.answer_transcript,
        "estimated_tokens": ctx.estimated_tokens,
        "planning": ctx.planning,
        "planning_history": ctx.planning_history,
        "compressions": ctx.compressions,
        "compression_applied": ctx.compression_applied,
        # How many of the request's kb_snippets the context shows, the first ones (left out without any).
        **({"kb_snippets_used": ctx.kb_snippets_used} if ctx.kb_snippets_used is not None else {}),
        # The gateway's own state (PUT …/state) and its version (left out when unknown: SQL down).
        **({"state": ctx.state.value, "state_version": ctx.state.version} if ctx.state is not None else {}),
        # What the memory carried over from the user's earlier sessions (USER_MEMORY); null for nothing.
        "user_memory": {
            "mode": carried.mode,
            "session_id": caller.session_id(carried.earlier.session_key) if carried.earlier else None,
            "profile": carried.profile is not None,
        }
        if carried is not None
        else None,
    }


async def get_context(request: web.Request) -> web.Response:
    names = ("max_chars", "system_prompt", "question", "user_memory", "explain", "kb_snippet")
    call = request_input.session_call(request, *names, repeated={"kb_snippet"})
    explain = request_input.bool_query(request, "explain")
    limit = request.app[SETTINGS_KEY].max_message_bytes
    want = ContextRequest(
        _max_chars(request),
        system_prompt=request_input.framing_text(request.query.get("system_prompt"), "system_prompt", limit),
        question=request_input.framing_text(request.query.get("question"), "question", limit),
        user_memory=request_input.user_memory(request),
        user_id=call.caller.user_id,
        # A GET has no body: the snippets come as `kb_snippet`, once for each, in their order.
        kb_snippets=request_input.kb_snippets(request.query.getall("kb_snippet", None), "kb_snippet"),
    )
    ctx = await request.app[SERVICE_KEY].context(call.key, want, caller=call.caller)
    request[TIER_KEY] = ctx.summary_tier.value
    body = _context_json(call.sid, ctx, call.caller)
    if explain:
        body["explain"] = _explain_json(ctx.explained)
    return reply(body)


def _explain_json(explained: Explained | None) -> dict[str, Any] | None:
    """Where each part of the context came from (`?explain=true`, the inspector's preview): the
    memory text's pieces with their origin, and the raw messages shown after it."""
    if explained is None:
        return None
    return {
        "memory": [{"origin": origin, "text": text} for origin, text in explained.memory],
        "raw": [{"seq": m.seq, "turn": m.turn, "role": m.role.value, "chars": len(m.content)} for m in explained.raw],
        "layout": explained.layout,
    }


async def post_turn(request: web.Request) -> web.Response:
    """Load-then-append: the context as it was before the user's new message (with that message
    as the closing question), then the message recorded. One round trip per utterance."""
    request_input.check_query(request, "max_chars", "user_memory")
    user_memory = request_input.user_memory(request)
    settings = request.app[SETTINGS_KEY]
    sid = request_input.session_id(request)
    body = await _body(request)
    system_prompt = request_input.framing_text(
        body.pop("system_prompt", None), "system_prompt", settings.max_message_bytes
    )
    kb_snippets = request_input.kb_snippets(body.pop("kb_snippets", None), "kb_snippets")
    body.setdefault("role", "user")
    if body["role"] != "user":
        raise InvalidInput("role: a turn starts with the user's message; expected 'user'")
    caller, (new,) = request_input.callers_messages(request, sid, body, max_bytes=settings.max_message_bytes)
    want = ContextRequest(
        _max_chars(request),
        system_prompt=system_prompt,
        exclude_message_id=new.message_id if "message_id" in body else None,
        user_memory=user_memory,
        kb_snippets=kb_snippets,
    )
    turn = await request.app[SERVICE_KEY].turn(new, want, caller=caller)
    ctx, r = turn.context, turn.appended.result
    request[TIER_KEY] = ctx.summary_tier.value
    return reply(
        {
            **_context_json(sid, ctx, caller),
            "message_id": r.message.message_id,
            "turn_count": r.turn_count,
            "summary_scheduled": turn.appended.summary_scheduled,
        },
        status=200 if r.duplicate else 201,
    )


async def post_close(request: web.Request) -> web.Response:
    call = request_input.session_call(request)
    result = await request.app[SERVICE_KEY].close(call.key, caller=call.caller)
    return reply(
        {
            "session_id": call.sid,
            "persisted": result.persisted,
            "cached": result.cached,
            "turn_count": result.turn_count,
        }
    )


async def get_session(request: web.Request) -> web.Response:
    call = request_input.session_call(request)
    info = await request.app[SERVICE_KEY].session(call.key, caller=call.caller)
    return reply(
        {
            "session_id": call.sid,
            "user_id": info.user_id,
            "turn_count": info.turn_count,
            "message_count": info.message_count,
            "covered_turns": info.covered_turns,
            "created_at": info.created_at,
            "last_activity": info.last_activity,
            "closed": info.closed,
            "closed_at": info.closed_at,
        }
    )


async def delete_session(request: web.Request) -> web.Response:
    call = request_input.session_call(request)
    await request.app[SERVICE_KEY].delete(call.key, caller=call.caller)
    return web.Response(status=204)


async def delete_summary(request: web.Request) -> web.Response:
    call = request_input.session_call(request)
    await request.app[SERVICE_KEY].reset_summary(call.key, caller=call.caller)
    return web.Response(status=204)


def _slice_json(sid: str, s: Slice) -> dict[str, Any]:
    return {
        "from_turn": s.from_turn,
        "to_turn": s.to_turn,
        "first_seq": s.first_seq,
        "last_seq": s.last_seq,
        "summary": s.text,
        "source": s.source.value,
        "model": s.model,
        "prompt_id": s.prompt_id,
        "summary_version": s.summary_version,
        "created_at": s.created_at,
        "messages_url": f"/v1/sessions/{sid}/messages?from_seq={s.first_seq}&to_seq={s.last_seq}",
    }


# What one page of `…/messages` or `…/slices` holds at most, in bytes of text: a page of a thousand
# 32 KiB messages would be 32 MiB in one reply. A page holds one item at least, whatever its size.
PAGE_MAX_BYTES = 1024 * 1024
T = TypeVar("T")


async def get_slices(request: web.Request) -> web.Response:
    request_input.check_query(request, "from_turn", "limit")
    sid = request_input.session_id(request)
    first = request_input.int_query(request, "from_turn", 1, 1, 2**31 - 1)
    limit = request_input.int_query(request, "limit", 100, 1, 1000)
    caller = request_input.caller(request)
    rows = await request.app[SERVICE_KEY].slices(
        caller.session_key(sid), caller=caller, from_turn=first, limit=limit + 1
    )
    kept, more = page(rows, limit=limit, max_bytes=PAGE_MAX_BYTES, size=lambda s: len(s.text.encode()))
    # The cursor is a turn: a page never ends inside a run of slices that end at the same turn.
    while more and len(kept) > 1 and kept[-1].to_turn == rows[len(kept)].to_turn:
        kept.pop()
    following = kept[-1].to_turn + 1 if more and kept else None
    return reply({"session_id": sid, "slices": [_slice_json(sid, s) for s in kept], "next_from_turn": following})


async def get_recall(request: web.Request) -> web.Response:
    """The earlier messages that best match `q` (BM25 over the session's messages), with their
    turn's raw messages and the slice that covers them."""
    request_input.check_query(request, "q", "k")
    sid = request_input.session_id(request)
    limit = request.app[SETTINGS_KEY].max_message_bytes
    raw = request.query.get("q")
    query = request_input.framing_text(raw, "q", limit)
    if query is None or not query.strip():
        raise InvalidInput("q: expected a non-empty search text")
    k = request_input.int_query(request, "k", 5, 1, 50)
    caller = request_input.caller(request)
    matches = await request.app[SERVICE_KEY].recall(caller.session_key(sid), caller=caller, query=query, k=k)
    return reply(
        {
            "session_id": sid,
            "query": query,
            "matches": [
                {
                    "seq": m.seq,
                    "turn": m.turn,
                    "score": round(m.score, 4),
                    "slice": _slice_json(sid, m.slice) if m.slice else None,
                    "messages": [_message_json(x) for x in m.messages],
                }
                for m in matches
            ],
        }
    )


async def get_messages(request: web.Request) -> web.Response:
    request_input.check_query(request, "from_seq", "to_seq", "limit")
    sid = request_input.session_id(request)
    first = request_input.int_query(request, "from_seq", 1, 1, 2**31 - 1)
    last = request_input.int_query(request, "to_seq", 2**31 - 1, 1, 2**31 - 1)
    limit = request_input.int_query(request, "limit", 1000, 1, 1000)
    caller = request_input.caller(request)
    rows = await request.app[SERVICE_KEY].messages(
        caller.session_key(sid),
        caller=caller,
        first_seq=first,
        last_seq=last,
        limit=limit + 1,
        max_bytes=PAGE_MAX_BYTES,
    )
    kept, more = page(
        rows,
        limit=limit,
        max_bytes=PAGE_MAX_BYTES,
        # Bytes, as the read measured them (tool calls and reasoning hold UTF-8 text too).
        size=lambda m: len(m.content.encode()) + len(m.tool_calls.encode()) + len((m.thinking_content or "").encode()),
    )
    following = kept[-1].seq + 1 if more and kept else None
    return reply({"session_id": sid, "messages": [_message_json(m) for m in kept], "next_from_seq": following})


def page(rows: Sequence[T], *, limit: int, max_bytes: int, size: Callable[[T], int]) -> tuple[list[T], bool]:
    """The first of `rows` (read `limit` + 1, to know whether more follow) that make one page: at
    most `limit`, and no more than `max_bytes` by `size` (one at least); and whether more follow."""
    kept: list[T] = []
    used = 0
    for row in rows[:limit]:
        used += size(row)
        if kept and used > max_bytes:
            break
        kept.append(row)
    return kept, len(kept) < len(rows)


def _message_json(m: Message) -> dict[str, Any]:
    return {
        "seq": m.seq,
        "turn": m.turn,
        "role": m.role.value,
        "content": m.content,
        "status": m.status.value,
        "message_id": m.message_id,
        "channel": m.channel.value,
        **tool_fields(m.tool_calls, m.tool_call_id, m.name),
        **reasoning_fields(m),
        "created_at": m.created_at,
    }


def _job_json(sid: str, job: RebuildJob) -> dict[str, Any]:
    """A rebuild job as the API shows it: where it is, and what it made (the slices themselves
    are paginated at `…/slices`) or why it failed, in the shape of an error."""
    done = job.state is JobState.DONE
    failed = job.state is JobState.FAILED
    reason = job.reason or "internal"
    return {
        "session_id": sid,
        "job_id": job.job_id,
        "state": job.state.value,
        "url": f"/v1/sessions/{sid}/summary/rebuild/{job.job_id}",
        "queued_at": job.queued_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "result": {
            "version": job.version or 0,
            "covered_turns": job.covered_turns or 0,
            "source": job.source.value if job.source else None,
            "slice_count": job.slices or 0,
            "slices_url": f"/v1/sessions/{sid}/slices",
        }
        if done
        else None,
        "error": {"code": reason, "message": FAILURES.get(reason, FAILURES["internal"])} if failed else None,
    }


async def post_rebuild(request: web.Request) -> web.Response:
    """Start rebuilding the summary as a job and answer 202 at once, with its URL in Location;
    while one is going for the session, that one (`started` false)."""
    request_input.check_query(request)
    sid = request_input.session_id(request)
    caller = request_input.caller(request)
    started = await request.app[SERVICE_KEY].start_rebuild(caller.session_key(sid), caller=caller)
    body = {**_job_json(sid, started.job), "started": started.started}
    return reply(body, status=202, headers={"Location": body["url"]})


async def get_rebuild(request: web.Request) -> web.Response:
    """A rebuild job of the session, from the hot tier (whichever replica runs it)."""
    request_input.check_query(request)
    sid, job_id = request_input.session_id(request), request_input.job_id(request)
    caller = request_input.caller(request)
    job = await request.app[SERVICE_KEY].rebuild_job(caller.session_key(sid), job_id, caller=caller)
    return reply(_job_json(sid, job))


async def healthz(_request: web.Request) -> web.Response:
    return reply({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    tiers = await request.app[SERVICE_KEY].readiness()
    # Without Redis the daemon still serves every request from SQL, so it stays in rotation;
    # without SQL it can acknowledge no write, so it leaves it.
    status = 200 if tiers["sql"] == "ok" else 503
    overall = "ok" if all(v == "ok" for v in tiers.values()) else "degraded"
    return reply({"status": overall, "tiers": tiers}, status=status)


async def openapi_document(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI_KEY], content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/sessions/{session_id:[^/]+}/messages", post_message)
    app.router.add_post("/v1/sessions/{session_id:[^/]+}/messages/batch", post_batch)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/summary", get_summary)
    app.router.add_delete("/v1/sessions/{session_id:[^/]+}/summary", delete_summary)
    app.router.add_post("/v1/sessions/{session_id:[^/]+}/summary/rebuild", post_rebuild)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/summary/rebuild/{job_id:[^/]+}", get_rebuild)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/slices", get_slices)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/messages", get_messages)
    app.router.add_patch("/v1/sessions/{session_id:[^/]+}/messages/{message_id:[^/]+}", patch_message)
    app.router.add_delete("/v1/sessions/{session_id:[^/]+}/messages/{message_id:[^/]+}", delete_message)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/context", get_context)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/state", get_state)
    app.router.add_put("/v1/sessions/{session_id:[^/]+}/state", put_state)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/recall", get_recall)
    app.router.add_post("/v1/sessions/{session_id:[^/]+}/close", post_close)
    app.router.add_post("/v1/sessions/{session_id:[^/]+}/turns", post_turn)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}", get_session)
    app.router.add_delete("/v1/sessions/{session_id:[^/]+}", delete_session)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi_document)
