"""The requests of each measurement: raw request bytes, the factories that hand them to the
load generator's workers, and the checks that an answer is the one being measured."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from bench.benchkit import loadgen
from bench.benchkit.seed import USER_ID
from tiered_memory.testing import ZH_12_TURNS

# An answer from the tier the measurement is about (a hot read that fell to SQL does not count).
SUMMARY_FROM = {tier: f'"tier":"{tier}"'.encode() for tier in ("hot", "warm", "cold")}
CONTEXT_FROM = {tier: f'"summary_tier":"{tier}"'.encode() for tier in ("hot", "cold")}
# The budget of the growth sweep's contexts and turns: less than the shortest session's text (10
# turns of ZH_12_TURNS, about 300 characters), so that the budget policy runs at every length and
# the sweep compares its cost on 10 turns with its cost on 10,000, not a whole short session
# shown raw with a long one chosen from.
GROWTH_BUDGET = 200


def _budget(max_chars: int | None, sep: str = "?") -> str:
    return f"{sep}max_chars={max_chars}" if max_chars is not None else ""


def get(path: str) -> bytes:
    return loadgen.request("GET", path)


def post(path: str, body: dict[str, Any]) -> bytes:
    return loadgen.request("POST", path, json.dumps(body, ensure_ascii=False).encode("utf-8"))


def ok(status: int, *needles: bytes) -> loadgen.Check:
    """The answer has this status and holds every needle."""
    return lambda s, b: s == status and all(n in b for n in needles)


def answered(s: int, _b: bytes) -> bool:
    return s in (200, 201)


def spread(requests: Sequence[bytes]) -> loadgen.Factory:
    """Each worker walks the requests from its own offset, so that workers rarely share a session."""
    n = len(requests)
    return lambda w, i: requests[(w * 7919 + i) % n]


def once(requests: Sequence[bytes]) -> loadgen.Factory:
    """Every request once across all workers, then stop: a pool of sessions each read once."""
    it = iter(requests)
    return lambda _w, _i: next(it, None)


def one_per_share(request: bytes) -> loadgen.Factory:
    """`request` once in each share (for a read timed alone, as a cold read is)."""
    return lambda _w, i: request if i == 0 else None


def summaries(session_ids: Sequence[str]) -> list[bytes]:
    return [get(f"/v1/sessions/{s}/summary") for s in session_ids]


def contexts(session_ids: Sequence[str], max_chars: int | None = None) -> list[bytes]:
    return [get(f"/v1/sessions/{s}/context{_budget(max_chars)}") for s in session_ids]


def cold_contexts(session_ids: Sequence[str]) -> list[bytes]:
    """Contexts at a budget the sessions do not fit, so that each read walks to the summary of
    a session that has none, the cold extraction (one that fits is shown whole, raw, and needs
    no summary: after its first read it is answered from the hot tier)."""
    return contexts(session_ids, GROWTH_BUDGET)


def question_path(session_id: str, max_chars: int | None = None) -> str:
    """A context read with a question, which ranks the session's earlier turns (BM25) for it."""
    q = "%E5%88%9A%E6%89%8D%E9%82%A3%E4%B8%AA%E4%BA%A7%E5%93%81%E5%A4%9A%E5%B0%91%E9%92%B1"  # 刚才那个产品多少钱
    return f"/v1/sessions/{session_id}/context?question={q}{_budget(max_chars, '&')}"


def recall_path(session_id: str) -> str:
    q = "%E4%BA%A7%E5%93%81%E4%BB%B7%E6%A0%BC"  # 产品价格
    return f"/v1/sessions/{session_id}/recall?q={q}&k=5"


def questions(session_ids: Sequence[str], max_chars: int | None = None) -> list[bytes]:
    return [get(question_path(s, max_chars)) for s in session_ids]


def recalls(session_ids: Sequence[str]) -> list[bytes]:
    return [get(recall_path(s)) for s in session_ids]


def per_worker(prefix: str) -> Callable[[int], str]:
    """Session `{prefix}-{w}` for worker w: each connection is one gateway's call."""
    return lambda w: f"{prefix}-{w}"


def conversation(
    session: str | Callable[[int], str], tag: str, *, turns_call: bool = False, max_chars: int | None = None
) -> loadgen.Factory:
    """Worker w plays `session(w)` (or the one session given): a user message then its reply,
    again and again; with `turns_call` the user message is a load-then-append call (its context
    at `max_chars`, None: the daemon's default). Message ids
    are `tag` and a counter of this factory, so that a factory used for several rounds never
    repeats one (a repeat would measure the retry path)."""
    counter = itertools.count()

    def make(w: int, i: int) -> bytes:
        user, assistant = ZH_12_TURNS[(i // 2) % len(ZH_12_TURNS)]
        sid, mid = session if isinstance(session, str) else session(w), f"{tag}-{next(counter)}"
        if i % 2:
            return post(f"/v1/sessions/{sid}/messages", {"role": "assistant", "content": assistant, "message_id": mid})
        body = {"content": user, "message_id": mid, "user_id": USER_ID}
        if turns_call:
            return post(f"/v1/sessions/{sid}/turns{_budget(max_chars)}", body)
        return post(f"/v1/sessions/{sid}/messages", {"role": "user", **body})

    return make


def naive_conversation(prefix: str) -> loadgen.Factory:
    """The same user and reply posts for the naive append ceiling (which knows no turns)."""
    user, reply = ZH_12_TURNS[0]

    def make(w: int, i: int) -> bytes:
        role, content = ("assistant", reply) if i % 2 else ("user", user)
        return post(f"/v1/sessions/{prefix}-{w}/messages", {"role": role, "content": content})

    return make


def chat(prefix: str, concurrency: int, tag: str) -> loadgen.Factory:
    """A gateway's loop per connection: read the context, post the user's message, post the reply."""
    talk = conversation(per_worker(prefix), tag)
    reads = contexts([f"{prefix}-{w}" for w in range(concurrency)])
    return lambda w, i: reads[w] if i % 3 == 0 else talk(w, i // 3 * 2 + i % 3 - 1)


def chat_parts(_w: int, i: int) -> str:
    return "context" if i % 3 == 0 else "append"


def by_role(_w: int, i: int) -> str:
    return "append_assistant" if i % 2 else "append_user"


def turns_only(_w: int, i: int) -> str | None:
    """A load-then-append conversation: the calls are measured, the replies between them are not."""
    return None if i % 2 else "turns"


async def closed_sessions(http: aiohttp.ClientSession, base: str, sids: Sequence[str], turns: int = 6) -> None:
    """Each session of `sids` played through the daemon at `base` (`turns` turns), then closed:
    its summary in SQL and the hot tier, as a hot read of it finds it."""
    for sid in sids:
        for t in range(1, turns + 1):
            user = f"第{t}个问题：我叫王芳，下周三去杭州出差，预算三千元。"
            for role, text in (("user", user), ("assistant", f"好的，第{t}个回答已记下。")):
                body = {"role": role, "content": text, "message_id": f"{sid}-{t}-{role}", "user_id": USER_ID}
                async with http.post(f"{base}/v1/sessions/{sid}/messages", json=body) as r:
                    if r.status != 201:
                        raise RuntimeError(f"append to {sid}: {r.status} {await r.text()}")
        async with http.post(f"{base}/v1/sessions/{sid}/close") as r:
            if r.status != 200 or not (await r.json())["persisted"]:
                raise RuntimeError(f"close of {sid}: {r.status}")
