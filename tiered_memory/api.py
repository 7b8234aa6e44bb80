"""HTTP API v1: parse and validate requests, call the MemoryService, shape the JSON replies.

Errors are `{"error": {"code", "message"}}`. Domain errors map to status codes here and only here;
bad input is refused with a 4xx that names what was wrong, before anything is changed. Who is
asking (the token's tenant, the stated user) becomes a Caller here; the service checks it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote_to_bytes

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tiered_memory.auth import PRINCIPAL_KEY, valid_tenant
from tiered_memory.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    SqlUnavailable,
    TierUnavailable,
    Unauthorized,
)
from tiered_memory.metrics import Metrics
from tiered_memory.model import Caller, Channel, Message, MessageStatus, NewMessage, Role, Slice, SummaryAnswer
from tiered_memory.reads import ContextAnswer
from tiered_memory.service import MemoryService
from tiered_memory.settings import Settings
from tiered_memory.tiers.codec import dumps

log = structlog.get_logger("tiered_memory.api")

SERVICE_KEY = web.AppKey("service", MemoryService)
METRICS_KEY = web.AppKey("metrics", Metrics)
SETTINGS_KEY = web.AppKey("settings", Settings)
OPENAPI_KEY = web.AppKey("openapi", bytes)
# The tier that answered a read (hot, warm, cold, none), for the request's log line.
TIER_KEY = web.RequestKey("tier", str)

# `{` and `}` are excluded so a session id can never break the Redis hash tag it is wrapped in.
# Both are used with fullmatch: `$` also matches before a trailing newline, which let "a\n" in.
_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_MESSAGE_ID = re.compile(r"[\x21-\x7e]{1,128}")
_MESSAGE_FIELDS = {"role", "content", "user_id", "message_id", "channel", "status"}
_RETRY_AFTER_S = "1"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def reply(body: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # UTF-8 JSON: Chinese stays readable, and takes a third of the bytes that ASCII escapes would.
    return web.Response(
        body=dumps(body), status=status, headers=headers, content_type="application/json", charset="utf-8"
    )


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return reply({"error": {"code": code, "message": message}}, status=status, headers=headers)


def _session_id(request: web.Request) -> str:
    sid = request.match_info["session_id"]
    if not _SESSION_ID.fullmatch(sid):
        raise InvalidInput("session_id: expected 1-128 characters of ASCII letters, digits and . _ : -")
    return sid


def _optional_str(body: dict[str, Any], name: str, pattern: re.Pattern[str]) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidInput(f"{name}: expected a string of 1-128 printable ASCII characters")
    return value


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except (ValueError, RecursionError):
        # ValueError covers malformed JSON and undecodable bytes; RecursionError absurd nesting.
        raise InvalidInput("body: expected a JSON object") from None
    except LookupError:
        # The Content-Type names a charset Python does not know, so decoding cannot even start.
        raise InvalidInput("body: unknown charset in Content-Type; expected utf-8") from None
    except web.RequestPayloadError:
        # The body cannot be read as sent: a broken gzip/deflate stream or a malformed chunk.
        raise InvalidInput("body: could not be read (malformed Content-Encoding or chunked body)") from None
    if not isinstance(body, dict):
        raise InvalidInput("body: expected a JSON object")
    return body


def _encodable(text: str) -> bool:
    # JSON may carry "\ud800": a str Python accepts but no database or UTF-8 encoder does.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _user_id(value: object, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 128 or not _encodable(value):
        raise InvalidInput(f"{name}: expected a string of 1-128 characters")
    return value


def _caller(request: web.Request, body_user_id: str | None = None) -> Caller:
    """The tenant the request acts in and the user it speaks for.

    The tenant is the token's; an unrestricted token (or any caller of a daemon without tokens)
    may state one with X-Tenant, and a restricted token may state only its own (another is the
    403, whether or not the session exists). The user is stated by the X-User-ID header or the
    body's user_id, which must then agree."""
    principal = request.get(PRINCIPAL_KEY)
    tenant = principal.tenant if principal else None
    stated_tenant = _one_header(request, "X-Tenant")
    if stated_tenant is not None:
        if not valid_tenant(stated_tenant):
            raise InvalidInput("X-Tenant: expected 1-64 characters of ASCII letters, digits and . _ -")
        if tenant is not None and stated_tenant != tenant:
            raise Forbidden
        tenant = stated_tenant
    header_user = _one_header(request, "X-User-ID")
    stated = _user_id(header_user, "X-User-ID") if header_user is not None else None
    if stated is not None and body_user_id is not None and stated != body_user_id:
        raise InvalidInput("user_id: expected the same user as the X-User-ID header")
    return Caller(tenant=tenant, user_id=stated or body_user_id)


def _one_header(request: web.Request, name: str) -> str | None:
    values = request.headers.getall(name, [])
    if len(values) > 1:
        raise InvalidInput(f"{name}: expected one header")
    return values[0] if values else None


def _query(request: web.Request, *allowed: str) -> None:
    """Refuse query parameters the route does not read, or read twice: a misspelt one would
    otherwise be ignored without a word. So is a query string that is not UTF-8 once
    percent-decoded: aiohttp would hand on U+FFFD in place of the bytes, so that a question or a
    search text would be answered for text nobody sent."""
    raw = request.rel_url.raw_query_string
    if raw:
        try:
            unquote_to_bytes(raw.replace("+", " ")).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput("query string: expected UTF-8 (percent-encoded)") from None
    unknown = sorted({name[:64] for name in request.query if name not in allowed})
    if unknown:
        expected = ", ".join(allowed) if allowed else "none"
        raise InvalidInput(f"unknown query parameter(s): {', '.join(unknown)}; expected {expected}")
    for name in allowed:
        if len(request.query.getall(name, [])) > 1:
            raise InvalidInput(f"{name}: expected at most one value")


def parse_message(session_id: str, body: dict[str, Any], *, max_bytes: int) -> NewMessage:
    """Validate an append body; raises InvalidInput naming the first bad field."""
    unknown = sorted(set(body) - _MESSAGE_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown field(s): {', '.join(unknown)}; expected {sorted(_MESSAGE_FIELDS)}")
    role = body.get("role")
    if role not in ("user", "assistant"):
        raise InvalidInput("role: expected 'user' or 'assistant'")
    content = body.get("content")
    if not isinstance(content, str) or not content.strip():
        raise InvalidInput("content: expected a non-empty string")
    if not _encodable(content):
        raise InvalidInput("content: expected valid Unicode text (it holds a lone surrogate)")
    size = len(content.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInput(f"content: expected at most {max_bytes} bytes of UTF-8 (MAX_MESSAGE_BYTES), got {size}")
    channel = body.get("channel", "chat")
    if channel not in ("voice", "chat"):
        raise InvalidInput("channel: expected 'voice' or 'chat'")
    user_id = _user_id(body.get("user_id"), "user_id")
    status = body.get("status", "completed")
    if status not in ("completed", "stopped", "failed", "streaming"):
        raise InvalidInput("status: expected 'completed', 'stopped', 'failed' or 'streaming'")
    if role == "user" and status != "completed":
        raise InvalidInput("status: only an assistant message can be stopped, failed or streaming")
    message_id = _optional_str(body, "message_id", _MESSAGE_ID) or uuid.uuid4().hex
    return NewMessage(
        session_id=session_id,
        role=Role(role),
        content=content,
        message_id=message_id,
        user_id=user_id,
        channel=Channel(channel),
        status=MessageStatus(status),
    )


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
    _query(request)
    service = request.app[SERVICE_KEY]
    sid = _session_id(request)
    new = parse_message(sid, await _json_object(request), max_bytes=request.app[SETTINGS_KEY].max_message_bytes)
    caller = _caller(request, new.user_id)
    new = dataclasses.replace(new, session_id=caller.session_key(sid), user_id=caller.user_id)
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


async def get_summary(request: web.Request) -> web.Response:
    _query(request)
    sid, caller = _session_id(request), _caller(request)
    answer = await request.app[SERVICE_KEY].load_best_summary(caller.session_key(sid), caller=caller)
    request[TIER_KEY] = answer.tier.value
    return reply(_summary_json(sid, answer, time.time()))


def _max_chars(request: web.Request) -> int:
    return _int_query(request, "max_chars", request.app[SETTINGS_KEY].context_max_chars, 1, 1_000_000)


def _framing_text(value: object, name: str, max_bytes: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _encodable(value) or len(value.encode("utf-8")) > max_bytes:
        raise InvalidInput(f"{name}: expected a string of at most {max_bytes} bytes of UTF-8 (MAX_MESSAGE_BYTES)")
    return value or None


def _context_json(sid: str, ctx: ContextAnswer) -> dict[str, Any]:
    return {
        "session_id": sid,
        "summary_tier": ctx.summary_tier.value,
        "summary": ctx.summary,
        "covered_turns": ctx.covered_turns,
        "topics": list(ctx.topics),
        "messages": [{"role": m.role, "content": m.content} for m in ctx.messages],
        "turn_count": ctx.turn_count,
        "recent_transcript": ctx.recent_transcript,
        "answer_transcript": ctx.answer_transcript,
        "estimated_tokens": ctx.estimated_tokens,
        "planning": ctx.planning,
        "planning_history": ctx.planning_history,
    }


async def get_context(request: web.Request) -> web.Response:
    _query(request, "max_chars", "system_prompt", "question")
    limit = request.app[SETTINGS_KEY].max_message_bytes
    sid, caller = _session_id(request), _caller(request)
    ctx = await request.app[SERVICE_KEY].context(
        caller.session_key(sid),
        caller=caller,
        max_chars=_max_chars(request),
        system_prompt=_framing_text(request.query.get("system_prompt"), "system_prompt", limit),
        question=_framing_text(request.query.get("question"), "question", limit),
    )
    request[TIER_KEY] = ctx.summary_tier.value
    return reply(_context_json(sid, ctx))


async def post_turn(request: web.Request) -> web.Response:
    """Load-then-append: the context as it was before the user's new message (with that message
    as the closing question), then the message recorded. One round trip per utterance."""
    _query(request, "max_chars")
    settings = request.app[SETTINGS_KEY]
    sid = _session_id(request)
    body = await _json_object(request)
    system_prompt = _framing_text(body.pop("system_prompt", None), "system_prompt", settings.max_message_bytes)
    body.setdefault("role", "user")
    if body["role"] != "user":
        raise InvalidInput("role: a turn starts with the user's message; expected 'user'")
    new = parse_message(sid, body, max_bytes=settings.max_message_bytes)
    caller = _caller(request, new.user_id)
    new = dataclasses.replace(new, session_id=caller.session_key(sid), user_id=caller.user_id)
    service = request.app[SERVICE_KEY]
    ctx = await service.context(
        new.session_id,
        caller=caller,
        max_chars=_max_chars(request),
        system_prompt=system_prompt,
        question=new.content,
        exclude_message_id=new.message_id if "message_id" in body else None,
    )
    outcome = await service.append(new, caller=caller)
    r = outcome.result
    request[TIER_KEY] = ctx.summary_tier.value
    return reply(
        {
            **_context_json(sid, ctx),
            "message_id": r.message.message_id,
            "turn_count": r.turn_count,
            "summary_scheduled": outcome.summary_scheduled,
        },
        status=200 if r.duplicate else 201,
    )


async def post_close(request: web.Request) -> web.Response:
    _query(request)
    sid, caller = _session_id(request), _caller(request)
    result = await request.app[SERVICE_KEY].close(caller.session_key(sid), caller=caller)
    return reply(
        {
            "session_id": sid,
            "persisted": result.persisted,
            "cached": result.cached,
            "turn_count": result.turn_count,
        }
    )


async def get_session(request: web.Request) -> web.Response:
    _query(request)
    sid, caller = _session_id(request), _caller(request)
    info = await request.app[SERVICE_KEY].session(caller.session_key(sid), caller=caller)
    return reply(
        {
            "session_id": sid,
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
    _query(request)
    sid, caller = _session_id(request), _caller(request)
    await request.app[SERVICE_KEY].delete(caller.session_key(sid), caller=caller)
    return web.Response(status=204)


async def delete_summary(request: web.Request) -> web.Response:
    _query(request)
    sid, caller = _session_id(request), _caller(request)
    await request.app[SERVICE_KEY].reset_summary(caller.session_key(sid), caller=caller)
    return web.Response(status=204)


async def get_user_summaries(request: web.Request) -> web.Response:
    _query(request, "limit")
    user_id = request.match_info["user_id"]
    if not 0 < len(user_id) <= 128 or not _encodable(user_id):
        raise InvalidInput("user_id: expected 1-128 characters")
    limit = _int_query(request, "limit", 10, 1, 100)
    caller = _caller(request)
    rows = await request.app[SERVICE_KEY].user_summaries(user_id, caller=caller, limit=limit)
    now = time.time()
    return reply(
        {
            "user_id": user_id,
            "summaries": [
                {
                    "session_id": caller.session_id(key),
                    "summary": s.text,
                    "turn_count": turns,
                    "covered_turns": s.covered_turns,
                    "topics": list(s.topics),
                    "source": s.source.value,
                    "updated_at": s.updated_at,
                    "age_seconds": round(max(0.0, now - s.updated_at), 3),
                }
                for key, turns, s in rows
            ],
        }
    )


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


async def get_slices(request: web.Request) -> web.Response:
    _query(request)
    sid = _session_id(request)
    caller = _caller(request)
    slices = await request.app[SERVICE_KEY].slices(caller.session_key(sid), caller=caller)
    return reply({"session_id": sid, "slices": [_slice_json(sid, s) for s in slices]})


async def get_recall(request: web.Request) -> web.Response:
    """The earlier messages that best match `q` (BM25 over the session's messages), with their
    turn's raw messages and the slice that covers them."""
    _query(request, "q", "k")
    sid = _session_id(request)
    limit = request.app[SETTINGS_KEY].max_message_bytes
    raw = request.query.get("q")
    query = _framing_text(raw, "q", limit)
    if query is None or not query.strip():
        raise InvalidInput("q: expected a non-empty search text")
    k = _int_query(request, "k", 5, 1, 50)
    caller = _caller(request)
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


def _int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """The query parameter `name` as an integer in [low, high], `default` when absent."""
    raw = request.query.get(name)
    if raw is None:
        return default
    # The length is checked before int(), which refuses more than 4300 digits with a ValueError
    # (a 500 for a long query parameter); digits beyond those of `high` are out of range anyway.
    digits = raw.lstrip("0") or "0"
    if not (raw.isascii() and raw.isdigit()) or len(digits) > len(str(high)) or not low <= int(digits) <= high:
        raise InvalidInput(f"{name}: expected an integer from {low} to {high}")
    return int(digits)


async def get_messages(request: web.Request) -> web.Response:
    _query(request, "from_seq", "to_seq", "limit")
    sid = _session_id(request)
    first = _int_query(request, "from_seq", 1, 1, 2**31 - 1)
    last = _int_query(request, "to_seq", 2**31 - 1, 1, 2**31 - 1)
    limit = _int_query(request, "limit", 1000, 1, 1000)
    caller = _caller(request)
    rows = await request.app[SERVICE_KEY].messages(
        caller.session_key(sid), caller=caller, first_seq=first, last_seq=last, limit=limit
    )
    return reply({"session_id": sid, "messages": [_message_json(m) for m in rows]})


def _message_json(m: Message) -> dict[str, Any]:
    return {
        "seq": m.seq,
        "turn": m.turn,
        "role": m.role.value,
        "content": m.content,
        "status": m.status.value,
        "message_id": m.message_id,
        "channel": m.channel.value,
        "created_at": m.created_at,
    }


async def post_rebuild(request: web.Request) -> web.Response:
    _query(request)
    sid = _session_id(request)
    caller = _caller(request)
    summary, slices = await request.app[SERVICE_KEY].rebuild_summary(caller.session_key(sid), caller=caller)
    return reply(
        {
            "session_id": sid,
            "summary": summary.text if summary else None,
            "covered_turns": summary.covered_turns if summary else 0,
            "version": summary.version if summary else 0,
            "source": summary.source.value if summary else None,
            "slices": [_slice_json(sid, s) for s in slices],
        }
    )


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
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/summary", get_summary)
    app.router.add_delete("/v1/sessions/{session_id:[^/]+}/summary", delete_summary)
    app.router.add_post("/v1/sessions/{session_id:[^/]+}/summary/rebuild", post_rebuild)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/slices", get_slices)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/messages", get_messages)
    app.router.add_get("/v1/users/{user_id:[^/]+}/summaries", get_user_summaries)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/context", get_context)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/recall", get_recall)
    app.router.add_post("/v1/sessions/{session_id:[^/]+}/close", post_close)
    app.router.add_post("/v1/sessions/{session_id:[^/]+}/turns", post_turn)
    app.router.add_get("/v1/sessions/{session_id:[^/]+}", get_session)
    app.router.add_delete("/v1/sessions/{session_id:[^/]+}", delete_session)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi_document)


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bind request and session ids to the logs, time the request, map domain errors to status
    codes (the one place where errors become HTTP), and write the request's one log line: route
    template, method, status, duration_ms, session_id and the tier that answered a read."""
    request_id = request.headers.get("X-Request-ID") or uuid.uuid4().hex
    session_id = request.match_info.get("session_id")
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id, session_id=session_id)
    started = time.perf_counter()
    try:
        response = await _mapped(request, handler)
    finally:
        structlog.contextvars.clear_contextvars()
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    elapsed = time.perf_counter() - started
    request.app[METRICS_KEY].request_seconds.labels(route, request.method, str(response.status)).observe(elapsed)
    # The ids are passed, not bound: the context is cleared above, before this line.
    log.info(
        "request",
        route=route,
        method=request.method,
        status=response.status,
        duration_ms=round(elapsed * 1000, 3),
        session_id=session_id,
        tier=request.get(TIER_KEY),
        request_id=request_id,
    )
    response.headers["X-Request-ID"] = request_id
    return response


async def _mapped(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except InvalidInput as exc:
        response = error_response(400, "invalid_input", str(exc))
        if request.content.exception() is not None:
            # The body stream broke (a Content-Encoding that does not decode): aiohttp drops the
            # connection after this reply, so it must say so, or a pooled client reuses it and
            # its next request fails with a disconnect.
            response.force_close()
        return response
    except Unauthorized as exc:
        return error_response(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"})
    except NotFound as exc:
        return error_response(404, "not_found", str(exc))
    except Forbidden:
        # One body whatever the reason: it must not tell whose the session is.
        return error_response(403, "forbidden", Forbidden.message)
    except Conflict as exc:
        return error_response(409, "conflict", str(exc))
    except SqlUnavailable as exc:
        log.warning("sql_unavailable", error=str(exc))
        return error_response(
            503, "sql_unavailable", "the message store is unavailable; retry", {"Retry-After": _RETRY_AFTER_S}
        )
    except TierUnavailable as exc:
        log.warning("tier_unavailable", tier=exc.tier, error=str(exc))
        return error_response(503, "unavailable", str(exc), {"Retry-After": _RETRY_AFTER_S})
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS_KEY].max_body_bytes
        return error_response(413, "request_entity_too_large", f"body: expected at most {limit} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400:
            # Its headers carry meaning (Allow on a 405, WWW-Authenticate on a 401); only the body changes.
            headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
            return error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason, headers)
        raise
    except Exception:
        log.exception("request_failed")
        return error_response(500, "internal", "internal error")
