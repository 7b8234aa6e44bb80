"""Lifecycle events: what a receiver is told when a session's summary changes, a session closes, its
final summary is made, or a user is erased; how each is signed, and when a failed delivery is
tried again. Pure: tiers/sql/outbox.py stores the events in the transactions that cause them, and
delivery.py sends them.

An event as delivered (a webhook's JSON body, a stream entry's `event` field):

    {"id": "…", "type": "summary.updated", "created_at": 1767225600.5, "tenant": "acme",
     "session_id": "call-7", "user_id": "u-1", "payload": {...}}

`session_id` is the id the tenant knows the session by; `id` is the same on every delivery of the
event (a retry, a replay), so a receiver drops the duplicates of at-least-once delivery by it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiered_memory.model import Summary, key_tenant
from tiered_memory.prompt.users import user_key

SUMMARY_UPDATED = "summary.updated"
SESSION_CLOSED = "session.closed"
SUMMARY_FINAL = "summary.final"
USER_ERASED = "user.erased"
EVENT_TYPES = (SUMMARY_UPDATED, SESSION_CLOSED, SUMMARY_FINAL, USER_ERASED)

# The headers a webhook carries: the event's id and type, and the signature over timestamp and body.
ID_HEADER = "X-Tiered-Memory-Event-Id"
TYPE_HEADER = "X-Tiered-Memory-Event-Type"
TIMESTAMP_HEADER = "X-Tiered-Memory-Timestamp"
SIGNATURE_HEADER = "X-Tiered-Memory-Signature"

# A failed delivery is tried again after 2 s, 4 s, 8 s … up to 10 minutes, each wait a random part
# of that (jitter: receivers that come back are not hit by every sender at the same instant).
_FIRST_RETRY_S = 2.0
_MAX_RETRY_S = 600.0
# A final summary's event held longer than this (the last pass that was to release it never
# reported: its process died) is released by the sweeper with the summary SQL holds. Far above an
# LLM pass, queued behind SUMMARY_CONCURRENCY others included.
HELD_MAX_S = 900.0


@dataclass(frozen=True, slots=True)
class Sink:
    """Where events go: a webhook URL, or the Redis stream (`url` is then the stream's name).
    `id` is what the outbox rows of this sink carry: short, fixed, and not the URL itself (a URL may
    hold credentials)."""

    kind: str  # "webhook" | "stream"
    url: str

    @property
    def id(self) -> str:
        return f"{self.kind[0]}:{hashlib.sha256(self.url.encode()).hexdigest()[:16]}"


def sinks_of(webhook_urls: Sequence[str], stream: str | None) -> tuple[Sink, ...]:
    return (*(Sink("webhook", url) for url in webhook_urls), *((Sink("stream", stream),) if stream else ()))


@dataclass(frozen=True, slots=True)
class Event:
    """An event before it is stored: its id, type, subject (the session's stored key, or the user's
    key for a user's event: a receiver gets one subject's events in order) and what it says."""

    event_id: str
    type: str
    tenant: str
    session_key: str | None
    user_id: str | None
    payload: dict[str, Any]
    created_at: float

    @property
    def subject(self) -> str:
        if self.session_key is not None:
            return self.session_key
        return f"user:{user_key(self.tenant, self.user_id or '')}"


def summary_payload(summary: Summary | None, *, turn_count: int) -> dict[str, Any]:
    """What an event says of a summary (None: the session has none)."""
    if summary is None:
        return {"summary": None, "turn_count": turn_count}
    return {
        "summary": {
            "text": summary.text,
            "version": summary.version,
            "covered_turns": summary.covered_turns,
            "source": summary.source.value,
            "topics": list(summary.topics),
            "payload": summary.structured.get("payload"),
            "updated_at": summary.updated_at,
        },
        "turn_count": turn_count,
    }


def body(
    *,
    event_id: str,
    type: str,
    created_at: float,
    tenant: str,
    session_key: str | None,
    user_id: str | None,
    payload: Mapping[str, Any],
) -> bytes:
    """The event as delivered (see the module's doc), UTF-8 JSON."""
    session_id = None
    if session_key is not None:
        session_id = session_key.removeprefix(f"{tenant}/") if key_tenant(session_key) else session_key
    document = {
        "id": event_id,
        "type": type,
        "created_at": created_at,
        "tenant": tenant,
        "session_id": session_id,
        "user_id": user_id,
        "payload": payload,
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def signature(secret: bytes, timestamp: str, raw_body: bytes) -> str:
    """`sha256=` and the hex HMAC-SHA256 of `timestamp`, a dot and the body, keyed by WEBHOOK_SECRET:
    what SIGNATURE_HEADER carries (docs/OPERATIONS.md shows a receiver's check)."""
    mac = hmac.new(secret, timestamp.encode() + b"." + raw_body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def retry_delay(attempts: int, rng: random.Random | None = None) -> float:
    """Seconds before the next try after `attempts` failed ones: exponential, capped, with full
    jitter over its upper half."""
    ceiling = min(_MAX_RETRY_S, _FIRST_RETRY_S * 2.0 ** max(0, attempts - 1))
    draw: float = (rng or random.Random()).random()
    return ceiling * (0.5 + 0.5 * draw)


def check_receiver_urls(urls: Sequence[str], *, https_only: bool) -> None:
    """WEBHOOK_URLS' receivers: http(s) URLs with a host, https only when `https_only`
    (WEBHOOK_REQUIRE_HTTPS). Raises ValueError naming the variable; the message never repeats a
    URL: it may carry a password."""
    for url in urls:
        try:
            parsed = urllib.parse.urlsplit(url)
            host = parsed.hostname
        except ValueError:
            raise ValueError(
                "WEBHOOK_URLS: expected http(s) URLs separated by commas, got one that does not parse"
            ) from None
        if parsed.scheme not in ("http", "https") or not host:
            raise ValueError(
                f"WEBHOOK_URLS: expected http(s) URLs separated by commas, got a {parsed.scheme or 'relative'} URL"
            )
        if https_only and parsed.scheme != "https":
            raise ValueError("WEBHOOK_URLS: expected https URLs only (WEBHOOK_REQUIRE_HTTPS), got an http URL")
