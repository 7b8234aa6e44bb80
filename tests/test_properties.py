"""Properties that hold for any input: request parsing (the function and the HTTP layer), the
deterministic summarizer, and the context budgets.

Every test is derandomized with a bounded number of examples, so CI runs the same inputs each time
and a failure reproduces locally with the same command.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.daemon import Daemon, new_sid
from tests.helpers.examples import bounded
from tiered_memory.errors import InvalidInput
from tiered_memory.http.input import parse_message
from tiered_memory.model import Message, MessageStatus, NewMessage, Role, SessionKey
from tiered_memory.prompt.context import alternate, compose
from tiered_memory.prompt.kb_snippets import KB_SHARE, fitting, reserve, shown
from tiered_memory.prompt.policy import Candidates, choose
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.text.quoting import frame_chars

# Any code point, lone surrogates included: JSON can carry "\ud800" and Python accepts it as str.
_ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=60)
# What a stored message can hold: validated appends never carry a lone surrogate (see parse_message).
_STORED_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | _ANY_TEXT
)
_JSON = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_ANY_TEXT, inner, max_size=4), max_leaves=12
)


_VALID = {
    "role": st.sampled_from(["user", "assistant"]),
    "content": st.text(min_size=1, max_size=40),
    "user_id": st.sampled_from(["u-prop"]) | st.text(min_size=1, max_size=130),
    "message_id": st.from_regex(r"[\x21-\x7e]{1,130}", fullmatch=True),
    "channel": st.sampled_from(["voice", "chat"]),
    "status": st.sampled_from(["completed", "stopped", "failed", "streaming"]),
}
_BODIES = (
    # Near-valid: role and content present, the other fields valid when present.
    st.fixed_dictionaries(
        {"role": _VALID["role"], "content": _VALID["content"]},
        optional={k: v for k, v in _VALID.items() if k not in ("role", "content")},
    )
    # Each field valid, of any type, or any text (lone surrogates included).
    | st.fixed_dictionaries({}, optional={k: v | _JSON | _ANY_TEXT for k, v in _VALID.items()})
    # Any object.
    | st.dictionaries(_ANY_TEXT, _JSON, max_size=4)
)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@bounded(200)
@given(body=_BODIES, max_bytes=st.sampled_from([1, 5, 40, 32_768]))
def test_parse_message_accepts_or_refuses_with_invalid_input(body: dict[str, Any], max_bytes: int) -> None:
    """Any JSON object is either a valid NewMessage or an InvalidInput naming a field; no other
    exception, and what is accepted keeps every documented constraint."""
    refused: str | None = None
    try:
        new = parse_message(SessionKey("s-1"), body, max_bytes=max_bytes)
    except InvalidInput as exc:
        refused = str(exc)
    if refused is not None:
        assert ":" in refused  # "field: what was expected"
        return
    assert isinstance(new, NewMessage)
    assert new.role.value == body["role"]
    assert new.content.strip()
    assert _utf8(new.content)
    assert len(new.content.encode("utf-8")) <= max_bytes
    assert new.user_id is None or (0 < len(new.user_id) <= 128 and _utf8(new.user_id))
    assert 1 <= len(new.message_id) <= 128
    assert all(0x21 <= ord(c) <= 0x7E for c in new.message_id)
    assert new.role is Role.ASSISTANT or new.status is MessageStatus.COMPLETED


_WIRE_BODIES = (
    _BODIES.map(lambda b: json.dumps(b, ensure_ascii=True, allow_nan=True).encode())
    | _JSON.map(lambda v: json.dumps(v, ensure_ascii=True, allow_nan=True).encode())
    | st.binary(max_size=80)
)


@pytest.mark.parametrize("route", ["messages", "turns"])
async def test_http_appends_answer_4xx_for_anything_malformed(daemon: Daemon, route: str) -> None:
    """Any body POSTed to /messages or /turns (JSON of any shape, lone surrogates, huge numbers,
    deep nesting, bytes that are not JSON) answers a documented status with a JSON body, never a
    5xx; a refused body stores nothing."""
    sid = new_sid()
    await daemon.post(sid, "user", "第一个问题", user_id="u-prop", message_id="m-first")
    loop = asyncio.get_running_loop()

    async def send(body: bytes) -> tuple[int, Any, int]:
        resp = await daemon.http.post(
            f"/v1/sessions/{sid}/{route}", data=body, headers={"Content-Type": "application/json"}
        )
        reply = await resp.json()
        info = await daemon.get(f"/v1/sessions/{sid}")
        return resp.status, reply, info["message_count"]

    @bounded(60)
    @given(body=_WIRE_BODIES)
    def check(body: bytes) -> None:
        before = asyncio.run_coroutine_threadsafe(daemon.store.get_session(sid), loop).result(30)
        assert before is not None
        status, reply, count = asyncio.run_coroutine_threadsafe(send(body), loop).result(30)
        assert status in (200, 201, 400, 403, 409), (status, reply)
        if status >= 400:
            assert set(reply) == {"error"}
            assert set(reply["error"]) == {"code", "message"}
            assert count == before.message_count
        else:
            assert reply["message_id"]

    # The daemon serves on this loop; Hypothesis drives it synchronously from a worker thread.
    await asyncio.to_thread(check)


@pytest.fixture(scope="module")
def extractor() -> Extractor:
    return Extractor()


_ROLES_AND_STATUSES = st.tuples(st.sampled_from(list(Role)), st.sampled_from(list(MessageStatus)))
_CONVERSATIONS = st.lists(
    st.tuples(_ROLES_AND_STATUSES, _STORED_TEXT | st.sampled_from(["我叫李雷，今年35岁。", "每天2次，每次1条。"])),
    max_size=8,
)


def _messages(items: list[tuple[tuple[Role, MessageStatus], str]], first_seq: int = 1) -> list[Message]:
    out = []
    turn = 0
    for seq, ((role, status), content) in enumerate(items, start=first_seq):
        turn += role is Role.USER
        out.append(
            Message(
                SessionKey("s"),
                seq,
                turn,
                role,
                content,
                f"m{seq}",
                0.0,
                status=MessageStatus.COMPLETED if role is Role.USER else status,
            )
        )
    return out


@bounded(100)
@given(
    first=_CONVERSATIONS,
    second=_CONVERSATIONS,
    previous_text=st.none() | _STORED_TEXT,
    max_chars=st.sampled_from([0, 1, 2, 3, 7, 20, 80, 300, 1400]),
)
def test_extract_never_raises_and_stays_within_max_chars(
    extractor: Extractor,
    first: list[tuple[tuple[Role, MessageStatus], str]],
    second: list[tuple[tuple[Role, MessageStatus], str]],
    previous_text: str | None,
    max_chars: int,
) -> None:
    """Any conversation, of any script and length, summarizes within max_chars, with at most ten
    topics and a JSON-serialisable state; merging a second batch into that state (and an LLM's
    previous text) stays within max_chars too."""
    one = extractor.extract(_messages(first), max_chars=max_chars)
    assert len(one.text) <= max_chars
    assert len(one.topics) <= 10
    state = json.loads(json.dumps(one.structured))
    two = extractor.extract(
        _messages(second, first_seq=len(first) + 1),
        previous_structured=state,
        previous_text=previous_text,
        max_chars=max_chars,
    )
    assert len(two.text) <= max_chars
    assert len(two.topics) <= 10
    json.dumps(two.structured)


_BUDGET_MESSAGES = st.lists(
    st.tuples(_ROLES_AND_STATUSES, st.text(st.sampled_from("ab好 "), max_size=30)), max_size=10
).map(_messages)


@bounded(200)
@given(
    summary=st.none() | st.text(st.sampled_from("摘要ab "), max_size=200),
    messages=_BUDGET_MESSAGES,
    max_chars=st.integers(min_value=1, max_value=300),
)
def test_the_chosen_context_never_exceeds_its_budget(
    summary: str | None, messages: list[Message], max_chars: int
) -> None:
    """Whatever the messages and the summary, the policy's memory and raw turns, composed as the
    daemon sends them, stay within max_chars, with at most one leading system message, alternating
    and starting with a user message; from 200 characters on, the newest answered message is there."""
    facts = None if summary is None else (lambda room, _before, _by_rank: summary[: max(room, 0)])
    sel = choose(Candidates(messages=messages, whole=True, lang="zh", facts=facts, frame=frame_chars()), max_chars)
    out = compose(sel.system, alternate(sel.raw), max_chars=max_chars)
    assert sum(len(m.content) for m in out) <= max_chars  # the block's tags included
    assert all(m.role != "system" for m in out[1:])
    turns = [m for m in out if m.role != "system"]
    assert not turns or turns[0].role == "user"
    assert all(a.role != b.role for a, b in itertools.pairwise(turns))
    answered = [m for m in messages if m.answered]
    if max_chars >= 200 and answered and answered[-1].role is Role.USER:
        assert any(answered[-1].content[-1:] in m.content for m in turns)


@bounded(200)
@given(
    summary=st.none() | st.text(st.sampled_from("摘要ab "), max_size=200),
    messages=_BUDGET_MESSAGES,
    snippets=st.lists(st.text(st.sampled_from("资料ab <>/reference"), min_size=1, max_size=90), max_size=5),
    lang=st.sampled_from(["zh", "en"]),
    max_chars=st.integers(min_value=1, max_value=400),
)
def test_a_context_with_snippets_never_exceeds_its_budget(
    summary: str | None, messages: list[Message], snippets: list[str], lang: str, max_chars: int
) -> None:
    """Whatever the snippets beside the memory, the context as the daemon assembles it (the
    snippets' reserve first, the memory in the rest, then the snippets placed) stays within
    max_chars, with at most one leading system message, alternating from a user message; it
    shows the first snippets that fit their share at least, each whole."""
    facts = None if summary is None else (lambda room, _before, _by_rank: summary[: max(room, 0)])
    budget = max_chars - reserve(snippets, max_chars)
    sel = choose(Candidates(messages=messages, whole=True, lang=lang, facts=facts, frame=frame_chars()), budget)
    out, used, reference = shown(
        compose(sel.system, alternate(sel.raw), max_chars=budget), snippets, max_chars=max_chars, lang=lang
    )
    assert sum(len(m.content) for m in out) <= max_chars
    assert used >= fitting(snippets, int(max_chars * KB_SHARE))
    assert all(m.role != "system" for m in out[1:])
    turns = [m for m in out if m.role != "system"]
    assert not turns or turns[0].role == "user"
    assert all(a.role != b.role for a, b in itertools.pairwise(turns))
    if used:
        assert turns[0].content.startswith(reference)
        assert reference.count("\n[") == used + 1  # the label, then one line per snippet
