"""The memory inspector: its page (`GET /ui` and its two files, in the package) and the reads only
it makes (`GET /v1/sessions/{id}/inspect`, `GET /v1/overview`). The page's other reads are the
API's own (a user's sessions, slices, messages, the context with `explain=true`).

The page holds no data: it asks for a token, keeps it in the tab's sessionStorage, and sends it
with every read, so a tenant's token sees that tenant's sessions only, as through the API. What
it shows is stored text, written by users: it is rendered as text, never as HTML, and the page is
served with a Content-Security-Policy that allows its own script and style files and nothing else
(no inline script, no other origin, no frames), so that a message that got HTML past the page
would still run nothing. UI_ENABLED turns it on or off (on by default for a loopback HOST).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from aiohttp import web

from tiered_memory.core.inspection import SessionInspection, overview
from tiered_memory.errors import NotFound
from tiered_memory.http import input as request_input
from tiered_memory.http.auth import UI_PREFIX
from tiered_memory.http.edge import reply
from tiered_memory.http.keys import INSPECTION_KEY, METRICS_KEY, SETTINGS_KEY

# Nothing but the page's own files: no inline script or style, no other origin, no frame, no form
# submission, no <base>; fetches go to this daemon only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_UI_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
# The page's files, by the name the URL gives them, and their media types.
_FILES = {
    "": ("index.html", "text/html"),
    "inspector.js": ("inspector.js", "text/javascript"),
    "dom.js": ("dom.js", "text/javascript"),
    "diff.js": ("diff.js", "text/javascript"),
    "inspector.css": ("inspector.css", "text/css"),
}


def _ui_file(name: str) -> tuple[bytes, str]:
    """A file of the page, read from the package (a wheel or the source tree alike)."""
    found = _FILES.get(name)
    if found is None:
        raise NotFound(f"the inspector has no file {name[:64]!r}")
    filename, media = found
    return resources.files("tiered_memory").joinpath("ui", filename).read_bytes(), media


async def get_ui(request: web.Request) -> web.Response:
    body, media = _ui_file(request.match_info.get("name", ""))
    return web.Response(body=body, content_type=media, charset="utf-8", headers=_UI_HEADERS)


async def get_inspect(request: web.Request) -> web.Response:
    """One session across its tiers: ages and TTLs, the summary and its recent versions, the lag."""
    call = request_input.session_call(request)
    found = await request.app[INSPECTION_KEY].session(call.key, caller=call.caller)
    return reply(_inspection_json(call.sid, found))


async def get_overview(request: web.Request) -> web.Response:
    """This process's state from its metrics: which tiers answer, the lag, breakers, LLM failures."""
    request_input.check_query(request)
    return reply(overview(request.app[METRICS_KEY].registry))


def _age(now: float, then: float | None) -> float | None:
    return round(max(0.0, now - then), 1) if then is not None else None


def _seconds(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


def _inspection_json(sid: str, s: SessionInspection) -> dict[str, Any]:
    info, summary, hot = s.info, s.summary, s.hot
    hot_json: dict[str, Any]
    if hot.session is None or hot.expiries is None:
        hot_json = {"present": False, "error": "unavailable"}
    else:
        h, left = hot.session, hot.expiries
        present = h.summary is not None or bool(h.recent) or h.turn_count is not None
        hot_json = {
            "present": present,
            "error": None,
            "messages": len(h.recent),
            "turn_count": h.turn_count,
            "summary_version": h.summary.version if h.summary else None,
            # Since the hot tier last saw the session active (its counters are written with each turn).
            "age_s": _age(s.now, h.last_activity),
            # The longest-lived of its entries: the session is hot until then.
            "ttl_s": _seconds(
                max((t for t in (left.summary_s, left.recent_s, left.counters_s) if t is not None), default=None)
            ),
            "ttls_s": {
                "summary": _seconds(left.summary_s),
                "recent": _seconds(left.recent_s),
                "counters": _seconds(left.counters_s),
            },
        }
    return {
        "session_id": sid,
        "user_id": info.user_id,
        "turn_count": info.turn_count,
        "message_count": info.message_count,
        "covered_turns": summary.covered_turns if summary else 0,
        "lag_turns": s.lag_turns,
        "created_at": info.created_at,
        "last_activity": info.last_activity,
        "closed": info.closed,
        "closed_at": info.closed_at,
        "tiers": {
            "hot": hot_json,
            "warm": {
                "present": summary is not None,
                "version": summary.version if summary else None,
                "covered_turns": summary.covered_turns if summary else None,
                "age_s": _age(s.now, summary.updated_at) if summary else None,
            },
            "cold": {
                "present": s.stored_messages > 0,
                "messages": s.stored_messages,
                "age_s": _age(s.now, info.last_activity),
            },
        },
        "summary": {
            "text": summary.text,
            "version": summary.version,
            "source": summary.source.value,
            "covered_turns": summary.covered_turns,
            "topics": list(summary.topics),
            "updated_at": summary.updated_at,
        }
        if summary
        else None,
        "versions": [
            {
                "version": v.version,
                "text": v.text,
                "source": v.source,
                "covered_turns": v.covered_turns,
                "created_at": v.created_at,
            }
            for v in s.versions
        ],
    }


def add_inspector_routes(app: web.Application) -> None:
    """The inspector's reads, and its page when UI_ENABLED."""
    app.router.add_get("/v1/sessions/{session_id:[^/]+}/inspect", get_inspect)
    app.router.add_get("/v1/overview", get_overview)
    if app[SETTINGS_KEY].ui_enabled:
        app.router.add_get(UI_PREFIX, get_ui)
        app.router.add_get(UI_PREFIX + "/{name:[a-z.]+}", get_ui)
