"""What a request says, validated: the session id in the path, the JSON body of an append, the
caller's headers (X-Tenant, X-User-ID) and the query parameters. Everything here raises
InvalidInput (a 400 that names the field) or Forbidden before anything is read or changed; the
handlers in api.py call it first.
"""

from __future__ import annotations

import asyncio
import json
import re
import unicodedata
import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp import web

from tiered_memory.errors import BodyTimeout, Forbidden, InvalidInput, UnsupportedMedia
from tiered_memory.http.auth import PRINCIPAL_KEY
from tiered_memory.model import (
    USER_MEMORY_MODES,
    Caller,
    Channel,
    MessageStatus,
    NewMessage,
    Patch,
    Role,
    SessionKey,
    UserMemory,
)
from tiered_memory.prompt.kb_snippets import KB_SNIPPETS_MAX, KB_SNIPPETS_MAX_BYTES
from tiered_memory.reasoning import THINKING_DURATION_MAX
from tiered_memory.settings import valid_tenant

# `{` and `}` are excluded so a session id can never break the Redis hash tag it is wrapped in.
# Both are used with fullmatch: `$` also matches before a trailing newline, which let "a\n" in.
SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_MESSAGE_ID = re.compile(r"[\x21-\x7e]{1,128}")
# What rebuilds.py makes a job id of: 16 random bytes in hex.
_JOB_ID = re.compile(r"[0-9a-f]{32}")
_MESSAGE_FIELDS = {
    "role",
    "content",
    "user_id",
    "message_id",
    "channel",
    "status",
    "tool_calls",
    "tool_call_id",
    "name",
    "thinking_content",
    "thinking_duration",
}
# A function name as the chat-completions API accepts it.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CALLS_MAX = 64


def session_id(request: web.Request) -> str:
    sid = request.match_info["session_id"]
    if not SESSION_ID.fullmatch(sid) or sid in (".", ".."):
        # "." and ".." would name a path segment, not a session, to any proxy or client that
        # normalizes URLs.
        raise InvalidInput(
            "session_id: expected 1-128 characters of ASCII letters, digits and . _ : - (not '.' or '..')"
        )
    return sid


def path_user_id(request: web.Request) -> str:
    return _checked_user_id(request.match_info["user_id"], "user_id")


def _optional_str(body: dict[str, Any], name: str, pattern: re.Pattern[str]) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidInput(f"{name}: expected a string of 1-128 printable ASCII characters")
    return value


# The body encodings aiohttp's server decodes (br and zstd when their module is installed: a body
# it cannot decode is then a 400); any other it would pass on undecoded, as if it were identity.
_DECODED = frozenset({"identity", "gzip", "deflate", "br", "zstd"})
# A percent sign that does not start an escape: yarl keeps it as it is, so that a query would be
# read as something nobody meant.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


# How long a request's body took to arrive (BODY_SECONDS_KEY), set by `read_body`.
BODY_SECONDS_KEY = web.RequestKey("body_seconds", float)


async def read_body(request: web.BaseRequest, *, timeout_s: float) -> None:
    """Read the request's body whole (aiohttp keeps it for `json`), within `timeout_s`
    (BODY_TIMEOUT_SECONDS) whatever the pace it arrives at, noting how long it took under
    BODY_SECONDS_KEY; at most client_max_size (a larger one is aiohttp's 413). Raises
    UnsupportedMedia (a Content-Encoding the server does not decode, which aiohttp would read as
    identity), InvalidInput (a body that cannot be read as sent) or BodyTimeout."""
    if not request.body_exists or BODY_SECONDS_KEY in request:
        return  # none, or read already (admission.py reads it before the handler)
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in _DECODED:
        raise UnsupportedMedia("Content-Encoding: expected identity, gzip, deflate, br or zstd")
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with asyncio.timeout(timeout_s):
            await request.read()
    except TimeoutError:
        raise BodyTimeout(f"body: not received within {timeout_s:g} s (BODY_TIMEOUT_SECONDS)") from None
    except web.RequestPayloadError:
        # The body cannot be read as sent: a broken gzip/deflate stream or a malformed chunk.
        raise InvalidInput("body: could not be read (malformed Content-Encoding or chunked body)") from None
    finally:
        request[BODY_SECONDS_KEY] = loop.time() - started


async def json_object(request: web.Request, *, timeout_s: float) -> dict[str, Any]:
    """The body, a JSON object (read by `read_body`, unless it was already); raises
    InvalidInput, UnsupportedMedia or BodyTimeout."""
    await read_body(request, timeout_s=timeout_s)
    try:
        body = await request.json(loads=json.loads)
    except (ValueError, RecursionError):
        # ValueError covers malformed JSON and undecodable bytes; RecursionError absurd nesting.
        raise InvalidInput("body: expected a JSON object") from None
    except LookupError:
        # The Content-Type names a charset Python does not know, so decoding cannot even start.
        raise InvalidInput("body: unknown charset in Content-Type; expected utf-8") from None
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
    """A user id, wherever it is stated (the X-User-ID header, a body's user_id, the path): 1-128
    characters of valid Unicode with no control character and no whitespace at either end. The
    HTTP parser strips a header's surrounding whitespace, so a body's " victim " would otherwise
    name another user than the header's " victim "."""
    return None if value is None else _checked_user_id(value, name)


def _checked_user_id(value: object, name: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 128 or not _encodable(value):
        raise InvalidInput(f"{name}: expected a string of 1-128 characters")
    if value != value.strip() or any(unicodedata.category(c) == "Cc" for c in value):
        raise InvalidInput(f"{name}: expected no whitespace at either end and no control characters")
    return value


def caller(request: web.Request, body_user_id: str | None = None) -> Caller:
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


def check_query(request: web.Request, *allowed: str, repeated: Collection[str] = ()) -> None:
    """Refuse query parameters the route does not read, or read twice (but those `repeated`, a
    list's items, of `allowed` too): a misspelt one would otherwise be ignored without a word.
    So is a query string that is not UTF-8 once
    percent-decoded: aiohttp would hand on U+FFFD in place of the bytes, so that a question or a
    search text would be answered for text nobody sent."""
    raw = request.rel_url.raw_query_string
    if raw:
        if _BAD_ESCAPE.search(raw):
            raise InvalidInput("query string: a malformed percent escape (expected % and two hex digits)")
        try:
            unquote_to_bytes(raw.replace("+", " ")).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput("query string: expected UTF-8 (percent-encoded)") from None
    unknown = {name for name in request.query if name not in allowed}
    if unknown:
        # Named by what the route reads, not by what was sent: an error echoes nothing of the
        # request (a token pasted into a query string would come back in logs and proxies).
        expected = ", ".join(allowed) if allowed else "none"
        raise InvalidInput(f"{len(unknown)} unknown query parameter(s): this route reads {expected}")
    for name in allowed:
        if name not in repeated and len(request.query.getall(name, [])) > 1:
            raise InvalidInput(f"{name}: expected at most one value")


@dataclass(frozen=True, slots=True)
class SessionCall:
    """A request on one session: its id as the caller named it (what replies echo) and the caller."""

    sid: str
    caller: Caller

    @property
    def key(self) -> SessionKey:
        """The stored session's key, in the caller's tenant."""
        return self.caller.session_key(self.sid)


def session_call(request: web.Request, *allowed: str, repeated: Collection[str] = ()) -> SessionCall:
    """The preamble of a request on one session, in the order every handler checks it: the query
    (`allowed`: the names it takes; `repeated`: those of them that may come more than once), the
    session id, the caller."""
    check_query(request, *allowed, repeated=repeated)
    return SessionCall(session_id(request), caller(request))


def parse_message(key: SessionKey, body: dict[str, Any], *, max_bytes: int) -> NewMessage:
    """Validate an append body; raises InvalidInput naming the first bad field."""
    unknown = sorted(set(body) - _MESSAGE_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown field(s): {', '.join(unknown)}; expected {sorted(_MESSAGE_FIELDS)}")
    role = body.get("role")
    if role not in ("user", "assistant", "tool", "system"):
        raise InvalidInput("role: expected 'user', 'assistant', 'tool' or 'system'")
    tool_calls = _tool_calls(body.get("tool_calls"), role, max_bytes)
    # An assistant message that only calls tools says nothing of its own (content null or "").
    content = "" if tool_calls and body.get("content") in (None, "") else _content(body.get("content"), max_bytes)
    channel = body.get("channel", "chat")
    if channel not in ("voice", "chat"):
        raise InvalidInput("channel: expected 'voice' or 'chat'")
    user_id = _user_id(body.get("user_id"), "user_id")
    status = _status(body.get("status", "completed"))
    if role != "assistant" and status is not MessageStatus.COMPLETED:
        raise InvalidInput("status: only an assistant message can be interrupted, stopped, failed or streaming")
    if tool_calls and status is not MessageStatus.COMPLETED:
        raise InvalidInput("status: an assistant message with tool_calls is 'completed' (its calls were made)")
    tool_call_id = _optional_str(body, "tool_call_id", _MESSAGE_ID)
    if (role == "tool") != (tool_call_id is not None):
        raise InvalidInput("tool_call_id: expected on a 'tool' message (the id of the call it answers), and only there")
    name = body.get("name")
    if name is not None and (role != "tool" or not isinstance(name, str) or not _TOOL_NAME.fullmatch(name)):
        raise InvalidInput("name: expected on a 'tool' message only, 1-64 ASCII letters, digits, _ or -")
    thinking_content = _thinking_content(body.get("thinking_content"), role, max_bytes)
    thinking_duration = _thinking_duration(body.get("thinking_duration"), role)
    message_id = _optional_str(body, "message_id", _MESSAGE_ID) or uuid.uuid4().hex
    return NewMessage(
        key=key,
        role=Role(role),
        content=content,
        message_id=message_id,
        user_id=user_id,
        channel=Channel(channel),
        status=status,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        name=name,
        thinking_content=thinking_content,
        thinking_duration=thinking_duration,
    )


def callers_messages(
    request: web.Request, sid: str, body: dict[str, Any], *, max_bytes: int, batch: bool = False
) -> tuple[Caller, list[NewMessage]]:
    """An append body (a message, or with `batch` a batch of them) and its caller, checked in
    that order (a bad body is named before a bad header). The body may state the user, who is
    part of the caller, so its messages are parsed under the tenant-less key first and then
    given the caller's key and user."""
    parsed = Caller().session_key(sid)
    if batch:
        news = parse_batch(parsed, body, max_bytes=max_bytes)
    else:
        news = [parse_message(parsed, body, max_bytes=max_bytes)]
    user_ids = {m.user_id for m in news if m.user_id is not None}
    if len(user_ids) > 1:
        raise InvalidInput("messages: expected one user_id for the batch's messages")
    who = caller(request, next(iter(user_ids), None))
    return who, [replace(m, key=who.session_key(sid), user_id=who.user_id) for m in news]


def _tool_calls(value: object, role: object, max_bytes: int) -> str:
    """An assistant message's tool calls in the chat-completions shape (`id`, `type: "function"`,
    `function: {name, arguments}`), as compact JSON kept verbatim (other keys a provider adds are
    kept too); '' for none."""
    if value is None:
        return ""
    if role != "assistant":
        raise InvalidInput("tool_calls: expected on an 'assistant' message only")
    if not isinstance(value, list) or not 1 <= len(value) <= TOOL_CALLS_MAX:
        raise InvalidInput(f"tool_calls: expected a list of 1 to {TOOL_CALLS_MAX} calls")
    ids: set[str] = set()
    for i, call in enumerate(value):
        _check_tool_call(f"tool_calls[{i}]", call, ids)
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if not _encodable(text):
        raise InvalidInput("tool_calls: expected valid Unicode text (it holds a lone surrogate)")
    if len(text.encode("utf-8")) > max_bytes:
        raise InvalidInput(f"tool_calls: expected at most {max_bytes} bytes of JSON (MAX_MESSAGE_BYTES)")
    return text


def _check_tool_call(where: str, call: object, ids: set[str]) -> None:
    """One of `tool_calls`, at `where` (`tool_calls[i]`); raises InvalidInput naming its first bad
    field. Its id is added to `ids`, those of the calls before it, which it must not repeat."""
    if not isinstance(call, dict):
        raise InvalidInput(f"{where}: expected a JSON object")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not _MESSAGE_ID.fullmatch(call_id):
        raise InvalidInput(f"{where}.id: expected a string of 1-128 printable ASCII characters")
    if call_id in ids:
        raise InvalidInput(f"{where}.id: {call_id!r} appears twice in tool_calls")
    ids.add(call_id)
    if call.get("type") != "function":
        raise InvalidInput(f"{where}.type: expected 'function'")
    function = call.get("function")
    if not isinstance(function, dict):
        raise InvalidInput(f"{where}.function: expected an object with 'name' and 'arguments'")
    if not isinstance(function.get("name"), str) or not _TOOL_NAME.fullmatch(function["name"]):
        raise InvalidInput(f"{where}.function.name: expected 1-64 ASCII letters, digits, _ or -")
    if not isinstance(function.get("arguments"), str) or not _encodable(function["arguments"]):
        raise InvalidInput(f"{where}.function.arguments: expected a string (the arguments as JSON text)")


def _content(value: object, max_bytes: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput("content: expected a non-empty string")
    if not _encodable(value):
        raise InvalidInput("content: expected valid Unicode text (it holds a lone surrogate)")
    size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInput(f"content: expected at most {max_bytes} bytes of UTF-8 (MAX_MESSAGE_BYTES), got {size}")
    return value


def _thinking_content(value: object, role: object, max_bytes: int) -> str | None:
    """An assistant message's reasoning, kept verbatim; None for none (null, absent or "": a
    gateway that got no reasoning may send an empty one)."""
    if value is None or value == "":
        return None
    if role != "assistant":
        raise InvalidInput("thinking_content: expected on an 'assistant' message only (the model's reasoning)")
    if not isinstance(value, str):
        raise InvalidInput("thinking_content: expected a string or null")
    if not _encodable(value):
        raise InvalidInput("thinking_content: expected valid Unicode text (it holds a lone surrogate)")
    size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInput(
            f"thinking_content: expected at most {max_bytes} bytes of UTF-8 (MAX_MESSAGE_BYTES), got {size}"
        )
    return value


def _thinking_duration(value: object, role: object) -> int | None:
    """How long an assistant message's model reasoned, in whole seconds; None for unknown."""
    if value is None:
        return None
    if role != "assistant":
        raise InvalidInput("thinking_duration: expected on an 'assistant' message only (the model's reasoning time)")
    # bool is an int to Python, and 12.0 a float to JSON's reader: neither is a count of seconds.
    if type(value) is not int or not 0 <= value <= THINKING_DURATION_MAX:
        raise InvalidInput(f"thinking_duration: expected an integer number of seconds, 0 to {THINKING_DURATION_MAX}")
    return value


def _status(value: object) -> MessageStatus:
    if value not in ("completed", "interrupted", "stopped", "failed", "streaming"):
        raise InvalidInput("status: expected 'completed', 'interrupted', 'stopped', 'failed' or 'streaming'")
    return MessageStatus(value)


def message_id(request: web.Request) -> str:
    """The message id of the path."""
    value = request.match_info["message_id"]
    if not _MESSAGE_ID.fullmatch(value):
        raise InvalidInput("message_id: expected 1-128 printable ASCII characters")
    return value


def job_id(request: web.Request) -> str:
    """The rebuild job id of the path."""
    value = request.match_info["job_id"]
    if not _JOB_ID.fullmatch(value):
        raise InvalidInput("job_id: expected the 32 lowercase hex digits of a job POST …/summary/rebuild started")
    return value


def parse_patch(body: dict[str, Any], *, max_bytes: int) -> Patch:
    """Validate a message patch: `content` and/or `status`, nothing else."""
    unknown = sorted(set(body) - {"content", "status"})
    if unknown:
        raise InvalidInput(f"unknown field(s): {', '.join(unknown)}; expected 'content' and/or 'status'")
    if not body:
        raise InvalidInput("body: expected 'content' and/or 'status'")
    content = _content(body["content"], max_bytes) if "content" in body else None
    status = _status(body["status"]) if "status" in body else None
    return Patch(content=content, status=status)


def framing_text(value: object, name: str, max_bytes: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _encodable(value) or len(value.encode("utf-8")) > max_bytes:
        raise InvalidInput(f"{name}: expected a string of at most {max_bytes} bytes of UTF-8 (MAX_MESSAGE_BYTES)")
    return value or None


def kb_snippets(value: object, name: str) -> tuple[str, ...] | None:
    """A context's knowledge-base snippets (`kb_snippets` in a body, the repeated `kb_snippet`
    query parameter, named `name`): a list of at most KB_SNIPPETS_MAX non-empty strings of valid
    Unicode, KB_SNIPPETS_MAX_BYTES of UTF-8 in all; None when not given. Raises InvalidInput
    naming the field, and the snippet when one is at fault."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidInput(f"{name}: expected a list of strings")
    if len(value) > KB_SNIPPETS_MAX:
        raise InvalidInput(f"{name}: expected at most {KB_SNIPPETS_MAX} snippets, got {len(value)}")
    size = 0
    for i, snippet in enumerate(value):
        if not isinstance(snippet, str) or not snippet.strip():
            raise InvalidInput(f"{name}[{i}]: expected a non-empty string")
        if not _encodable(snippet):
            raise InvalidInput(f"{name}[{i}]: expected valid Unicode text (it holds a lone surrogate)")
        size += len(snippet.encode("utf-8"))
    if size > KB_SNIPPETS_MAX_BYTES:
        raise InvalidInput(f"{name}: expected at most {KB_SNIPPETS_MAX_BYTES} bytes of UTF-8 in all, got {size}")
    return tuple(value)


def user_memory(request: web.Request) -> UserMemory | None:
    """`?user_memory=`: what the session carries over from its user's earlier sessions (None: not
    given, USER_MEMORY applies)."""
    value = request.query.get("user_memory")
    if value is None:
        return None
    for mode in USER_MEMORY_MODES:
        if value == mode:
            return mode
    raise InvalidInput(f"user_memory: expected one of {', '.join(USER_MEMORY_MODES)}")


def bool_query(request: web.Request, name: str) -> bool:
    """The query parameter `name` as `true` or `false` (absent: false)."""
    raw = request.query.get(name, "false")
    if raw not in ("true", "false"):
        raise InvalidInput(f"{name}: expected true or false")
    return raw == "true"


def int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
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


# A gateway's state: what it needs back after a reconnect, not a store of its own.
STATE_MAX_BYTES = 8192


def state_object(body: dict[str, Any]) -> dict[str, Any]:
    """A gateway state: the body's JSON object itself, valid Unicode text throughout, at most
    STATE_MAX_BYTES as compact JSON."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if not _encodable(text):
        raise InvalidInput("body: expected valid Unicode text (a key or value holds a lone surrogate)")
    size = len(text.encode("utf-8"))
    if size > STATE_MAX_BYTES:
        raise InvalidInput(f"body: expected a state of at most {STATE_MAX_BYTES} bytes of JSON, got {size}")
    return body


def if_match(request: web.Request) -> int | None:
    """The state version an If-Match header names ("3", as the ETag gives it); None without one."""
    value = _one_header(request, "If-Match")
    if value is None:
        return None
    text = value.strip().removeprefix('"').removesuffix('"')
    if not text.isdigit() or len(text) > 9:
        raise InvalidInput('If-Match: expected the ETag of a state read before, e.g. "3"')
    return int(text)


BATCH_MAX = 500


def parse_batch(key: SessionKey, body: dict[str, Any], *, max_bytes: int) -> list[NewMessage]:
    """Validate a bulk append: `{"messages": [...]}`, 1 to BATCH_MAX messages as for one append;
    raises InvalidInput naming the first bad message by its index."""
    unknown = sorted(set(body) - {"messages"})
    if unknown:
        raise InvalidInput(f"unknown field(s): {', '.join(unknown)}; expected 'messages'")
    items = body.get("messages")
    if not isinstance(items, list) or not 1 <= len(items) <= BATCH_MAX:
        got = len(items) if isinstance(items, list) else type(items).__name__
        raise InvalidInput(f"messages: expected a list of 1 to {BATCH_MAX} messages, got {got}")
    out: list[NewMessage] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidInput(f"messages[{i}]: expected a JSON object")
        try:
            out.append(parse_message(key, item, max_bytes=max_bytes))
        except InvalidInput as exc:
            raise InvalidInput(f"messages[{i}].{exc}") from None
    ids = [m.message_id for m in out]
    if len(set(ids)) != len(ids):
        raise InvalidInput("messages: a message_id appears twice in the batch")
    return out
