"""HTTP API v1, a user's routes: the user's summaries, profile and sessions, and the user's erasure.

A user is a user_id in the caller's tenant (a caller of none: the tenant-less namespace); a
caller that speaks for a user (X-User-ID) may ask only about that user.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
import urllib.parse
from typing import Any

from aiohttp import web

from tiered_memory.core.erasure import Erased
from tiered_memory.errors import Conflict, InvalidInput
from tiered_memory.http import input as request_input
from tiered_memory.http.edge import reply
from tiered_memory.http.keys import SERVICE_KEY
from tiered_memory.model import Caller, SessionInfo, Summary
from tiered_memory.prompt.users import FACT, PREFERENCE, TOPIC, ProfileItem, render_profile, user_key
from tiered_memory.tiers.sql.users import ErasureStatus

# How long DELETE /v1/users/{uid} waits for the erasure before it answers 202 (it runs on).
ERASE_WAIT_S = 5.0


async def get_user_summaries(request: web.Request) -> web.Response:
    request_input.check_query(request, "limit")
    user_id = request_input.path_user_id(request)
    limit = request_input.int_query(request, "limit", 10, 1, 100)
    caller = request_input.caller(request)
    rows = await request.app[SERVICE_KEY].users.summaries(user_id, caller=caller, limit=limit)
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


async def get_profile(request: web.Request) -> web.Response:
    """What the user's session summaries said, aggregated (users.py), and its rendered text."""
    request_input.check_query(request)
    user_id = request_input.path_user_id(request)
    profile, updated_at = await request.app[SERVICE_KEY].users.profile(user_id, caller=request_input.caller(request))

    def items(kind: str) -> list[dict[str, Any]]:
        return [_item_json(i, kind) for i in profile.of(kind)]

    rendered = {lang: render_profile(profile, lang) for lang in ("en", "zh")}
    return reply(
        {
            "user_id": user_id,
            "facts": items(FACT),
            "preferences": items(PREFERENCE),
            "topics": items(TOPIC),
            "sessions": profile.sessions,
            "updated_at": updated_at,
            "text": rendered,
        }
    )


def _item_json(item: ProfileItem, kind: str) -> dict[str, Any]:
    return {
        "topic" if kind == TOPIC else "text": item.text,
        "count": item.count,
        "first_seen": item.first_seen,
        "last_seen": item.last_seen,
    }


async def get_user_sessions(request: web.Request) -> web.Response:
    """Every session of the user, summarized or not, newest first, a page at a time."""
    request_input.check_query(request, "limit", "cursor")
    user_id = request_input.path_user_id(request)
    limit = request_input.int_query(request, "limit", 20, 1, 100)
    caller = request_input.caller(request)
    key = user_key(caller.tenant or "", user_id)
    raw = request.query.get("cursor")
    before = _cursor(raw, key) if raw is not None else None
    page = await request.app[SERVICE_KEY].users.sessions(user_id, caller=caller, before=before, limit=limit)
    last = page.sessions[-1][0] if page.sessions else None
    return reply(
        {
            "user_id": user_id,
            "sessions": [_session_json(caller, info, summary) for info, summary in page.sessions],
            "next_cursor": _make_cursor(key, last) if page.more and last is not None else None,
        }
    )


def _session_json(caller: Caller, info: SessionInfo, summary: Summary | None) -> dict[str, Any]:
    return {
        "session_id": caller.session_id(info.key),
        "turn_count": info.turn_count,
        "message_count": info.message_count,
        "created_at": info.created_at,
        "last_activity": info.last_activity,
        "closed_at": info.closed_at,
        "summarized": summary is not None,
        "covered_turns": summary.covered_turns if summary else 0,
        "topics": list(summary.topics) if summary else [],
        "summary_updated_at": summary.updated_at if summary else None,
    }


def _make_cursor(key: str, last: SessionInfo) -> str:
    """Where a page ended, for the next: the listing's user, and the last session's creation time
    and stored key (keyset paging). Opaque to clients; not a secret (it only narrows the user's list)."""
    raw = json.dumps({"u": key, "c": last.created_at, "s": last.key}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _cursor(raw: str, key: str) -> tuple[float, str]:
    """The (creation time, stored key) a cursor of this user's listing ends at. Raises
    InvalidInput for a cursor that is not one, or one of another user's listing."""
    try:
        decoded = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        user, at, session = decoded["u"], float(decoded["c"]), decoded["s"]
    # Whatever a made-up cursor raises (a huge number, JSON nested past the parser's depth) is
    # the same 400.
    except (binascii.Error, ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        raise InvalidInput("cursor: expected the next_cursor of an earlier page") from exc
    if not isinstance(user, str) or not isinstance(session, str) or not math.isfinite(at):
        raise InvalidInput("cursor: expected the next_cursor of an earlier page")
    if user != key:
        raise InvalidInput("cursor: it is another user's listing's; start again without it")
    return at, session


async def delete_user(request: web.Request) -> web.Response:
    """Erase the user: 200 when it finished within ERASE_WAIT_S, else 202 (it runs on, and
    `…/erasure` says when it is done). Idempotent: erasing again finds nothing more to remove."""
    request_input.check_query(request)
    user_id = request_input.path_user_id(request)
    caller = request_input.caller(request)
    service = request.app[SERVICE_KEY]
    url = _erasure_url(user_id)
    try:
        done = await service.users.erase(user_id, caller=caller, wait_s=ERASE_WAIT_S)
    except Conflict:
        done = None  # another process runs it: its status is the answer
    if done is None or not done.finished:
        status = await service.users.erasure(user_id, caller=caller)
        return reply(_erasure_json(user_id, status, done), status=202, headers={"Location": url})
    return reply(_erased_json(user_id, done))


async def get_erasure(request: web.Request) -> web.Response:
    request_input.check_query(request)
    user_id = request_input.path_user_id(request)
    status = await request.app[SERVICE_KEY].users.erasure(user_id, caller=request_input.caller(request))
    return reply(_erasure_json(user_id, status, None))


def _erased_json(user_id: str, done: Erased) -> dict[str, Any]:
    return {"user_id": user_id, "state": "finished", "sessions": done.sessions, "messages": done.messages}


def _erasure_json(user_id: str, status: ErasureStatus, run: Erased | None) -> dict[str, Any]:
    finished = status.finished_at is not None
    return {
        "user_id": user_id,
        "state": "finished" if finished else "running",
        "requested_at": status.requested_at,
        "finished_at": status.finished_at,
        # Counted when a run finishes; a run still going adds what it removed so far.
        "sessions": status.sessions + (run.sessions if run and not finished else 0),
        "messages": status.messages + (run.messages if run and not finished else 0),
        "url": _erasure_url(user_id),
    }


def _erasure_url(user_id: str) -> str:
    return f"/v1/users/{urllib.parse.quote(user_id, safe='')}/erasure"


def add_user_routes(app: web.Application) -> None:
    app.router.add_get("/v1/users/{user_id:[^/]+}/summaries", get_user_summaries)
    app.router.add_get("/v1/users/{user_id:[^/]+}/profile", get_profile)
    app.router.add_get("/v1/users/{user_id:[^/]+}/sessions", get_user_sessions)
    app.router.add_get("/v1/users/{user_id:[^/]+}/erasure", get_erasure)
    app.router.add_delete("/v1/users/{user_id:[^/]+}", delete_user)
