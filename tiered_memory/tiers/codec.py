"""JSON encodings of messages, summaries and rebuild jobs, shared by the Redis tier and the SQL summary row."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import orjson

from tiered_memory.model import (
    Channel,
    JobState,
    Message,
    MessageStatus,
    RebuildJob,
    Role,
    SessionKey,
    SessionState,
    Summary,
    SummarySource,
)


def message_to_dict(m: Message) -> dict[str, Any]:
    return {
        "sid": m.key,
        "seq": m.seq,
        "turn": m.turn,
        "role": m.role.value,
        "content": m.content,
        "mid": m.message_id,
        "ts": m.created_at,
        "uid": m.user_id,
        "ch": m.channel.value,
        "st": m.status.value,
        # Only a tool call or result carries these: the hot list of a plain conversation stays as small.
        **({"tc": m.tool_calls} if m.tool_calls else {}),
        **({"tci": m.tool_call_id} if m.tool_call_id is not None else {}),
        **({"tn": m.name} if m.name is not None else {}),
        # No reasoning (thinking_content, thinking_duration): no read of the hot tier shows it, and
        # it would make a reply's record up to twice as large (reasoning.py).
    }


def message_from_dict(d: dict[str, Any]) -> Message:
    return Message(
        key=SessionKey(str(d["sid"])),
        seq=int(d["seq"]),
        turn=int(d["turn"]),
        role=Role(d["role"]),
        content=str(d["content"]),
        message_id=str(d["mid"]),
        created_at=float(d["ts"]),
        user_id=d.get("uid"),
        channel=Channel(d.get("ch", "chat")),
        status=MessageStatus(d.get("st", "completed")),
        tool_calls=str(d.get("tc", "")),
        tool_call_id=d.get("tci"),
        name=d.get("tn"),
    )


def loads(raw: str | bytes) -> object:
    """Any JSON value; orjson first, json for what json wrote and orjson does not read back (NaN
    in an LLM's payload)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def dumps_text(value: object) -> str:
    """dumps as text, for drivers that bind JSON columns as strings."""
    return dumps(value).decode("utf-8")


def _loads(raw: str | bytes) -> dict[str, Any]:
    doc = loads(raw)
    if not isinstance(doc, dict):
        raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
    return doc


def dumps(value: object) -> bytes:
    """Compact UTF-8 JSON. orjson does it several times faster than json, on every hot read and
    write; json takes what orjson refuses (an integer beyond 64 bits in an LLM's payload)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def encode_message(m: Message) -> bytes:
    return dumps(message_to_dict(m))


def decode_message(raw: str | bytes) -> Message:
    return message_from_dict(_loads(raw))


class MessageDecoder:
    """`decode_message` with a bounded memo by the encoding: a context read decodes a session's
    whole recent list, hundreds of messages on a session of short turns, and all but the newest
    were decoded by the read before (a message is immutable; a changed one is another encoding).
    Bounded by the bytes of the encodings it keeps (each kept with its message), the least
    recently used going first. Belongs to one event loop."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self._max = max_bytes
        self._held = 0
        self._decoded: OrderedDict[str | bytes, Message] = OrderedDict()

    def __call__(self, raw: str | bytes) -> Message:
        found = self._decoded.get(raw)
        if found is not None:
            self._decoded.move_to_end(raw)
            return found
        message = decode_message(raw)
        self._decoded[raw] = message
        self._held += len(raw)
        while self._held > self._max and self._decoded:
            dropped, _ = self._decoded.popitem(last=False)
            self._held -= len(dropped)
        return message


def encode_summary(s: Summary) -> bytes:
    return dumps(
        {
            "text": s.text,
            "covered": s.covered_turns,
            "version": s.version,
            "source": s.source.value,
            "updated_at": s.updated_at,
            "created_at": s.created_at,
            "topics": list(s.topics),
            "structured": s.structured,
            "compressions": s.compressions,
        }
    )


def decode_summary(raw: str | bytes) -> Summary:
    d = _loads(raw)
    return Summary(
        text=str(d["text"]),
        covered_turns=int(d["covered"]),
        version=int(d["version"]),
        source=SummarySource(d["source"]),
        updated_at=float(d["updated_at"]),
        created_at=float(d.get("created_at", d["updated_at"])),
        topics=tuple(str(t) for t in d.get("topics", ())),
        structured=dict(d.get("structured") or {}),
        compressions=int(d.get("compressions", 0)),
    )


def encode_state(state: SessionState) -> str:
    """A gateway's state as the hot tier keeps it beside its version: '' for none."""
    return "" if state.value is None else json.dumps(state.value, ensure_ascii=False)


def state_of(version: bytes | str | None, value: bytes | str | None) -> SessionState | None:
    """The state the hot tier holds (version and JSON); None when it does not know it."""
    if version is None:
        return None
    return SessionState(int(version), json.loads(value) if value else None)


def encode_job(job: RebuildJob) -> bytes:
    return dumps(
        {
            "id": job.job_id,
            "state": job.state.value,
            "queued_at": job.queued_at,
            "started_at": job.started_at,
            "ended_at": job.ended_at,
            "reason": job.reason,
            "version": job.version,
            "covered": job.covered_turns,
            "source": job.source.value if job.source else None,
            "slices": job.slices,
        }
    )


def decode_job(raw: str | bytes) -> RebuildJob:
    d = _loads(raw)

    def number(name: str) -> float | None:
        return None if d.get(name) is None else float(d[name])

    def count(name: str) -> int | None:
        return None if d.get(name) is None else int(d[name])

    return RebuildJob(
        job_id=str(d["id"]),
        state=JobState(d["state"]),
        queued_at=float(d["queued_at"]),
        started_at=number("started_at"),
        ended_at=number("ended_at"),
        reason=None if d.get("reason") is None else str(d["reason"]),
        version=count("version"),
        covered_turns=count("covered"),
        source=SummarySource(d["source"]) if d.get("source") else None,
        slices=count("slices"),
    )
