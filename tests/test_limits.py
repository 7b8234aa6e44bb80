"""What one caller may make a session cost: MAX_SESSION_MESSAGES and MAX_SESSION_BYTES refuse an
append past them with 409 `session_full`, storing nothing; a retry of a stored message is still
answered; bytes are UTF-8's. Each runs on the embedded backends and on real Redis + MariaDB."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, new_sid, play
from tiered_memory.client import AsyncClient, Client
from tiered_memory.model import SessionKey
from tiered_memory.testing import ZH_12_TURNS


async def _status(daemon: Daemon, sid: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages", json=body)
    answer: dict[str, object] = await resp.json()
    return resp.status, answer


@pytest.mark.parametrize("limit", ["MAX_SESSION_MESSAGES", "MAX_SESSION_BYTES"])
async def test_a_full_session_refuses_more_and_changes_nothing(
    backend_env: dict[str, str], limit: str, make_daemon: MakeDaemon
) -> None:
    """Four messages fit (4 messages; 4 × 9 bytes of 你好吗 = 36 bytes); the fifth is 409
    `session_full`, in a batch too, and nothing is stored; a retry of the fourth is 200; another
    session is not touched."""
    daemon = await make_daemon(backend_env | {limit: "4" if limit == "MAX_SESSION_MESSAGES" else "36"})
    sid = new_sid()
    for n in range(4):
        status, _ = await _status(daemon, sid, {"role": "user", "content": "你好吗", "message_id": f"m{n}"})
        assert status == 201
    status, answer = await _status(daemon, sid, {"role": "user", "content": "你好吗", "message_id": "m4"})
    assert status == 409
    error = answer["error"]
    assert isinstance(error, dict)
    assert error["code"] == "session_full"
    assert limit in error["message"]
    batch = await daemon.http.post(
        f"/v1/sessions/{sid}/messages/batch", json={"messages": [{"role": "user", "content": "x"}]}
    )
    assert batch.status == 409
    assert await daemon.store.count_messages(sid) == 4
    status, _ = await _status(daemon, sid, {"role": "user", "content": "你好吗", "message_id": "m3"})
    assert status == 200  # a retry of a stored message is not a new one
    other = new_sid()
    assert (await _status(daemon, other, {"role": "user", "content": "你好吗"}))[0] == 201


async def test_pages_are_bounded_in_bytes_and_lead_on(daemon: Daemon) -> None:
    """`…/messages` pages hold at most 1 MiB of text (one message at least) and say where the next
    begins; `…/slices` pages by turn. Following the cursors, and the client's iterators, give
    everything once."""
    sid = new_sid()
    for b in range(4):
        batch = [{"role": "user", "content": f"{b}-{i} " + "x" * 32_000} for i in range(10)]
        resp = await daemon.http.post(f"/v1/sessions/{sid}/messages/batch", json={"messages": batch})
        assert resp.status == 201, await resp.text()
    first = await daemon.get(f"/v1/sessions/{sid}/messages")
    assert len(first["messages"]) == 32  # 32 × 32 KB fit in 1 MiB, a 33rd does not
    assert first["next_from_seq"] == 33
    rest = await daemon.get(f"/v1/sessions/{sid}/messages?from_seq=33")
    assert [m["seq"] for m in rest["messages"]] == list(range(33, 41))
    assert rest["next_from_seq"] is None
    few = await daemon.get(f"/v1/sessions/{sid}/messages?limit=5")
    assert (len(few["messages"]), few["next_from_seq"]) == (5, 6)

    talk = new_sid()
    # Settled at each cadence point: one slice each (a pass that lags covers two, as it should).
    for start in range(0, len(ZH_12_TURNS), 3):
        await play(daemon, talk, ZH_12_TURNS[start : start + 3])
        await daemon.settle()
    await daemon.settle()
    page = await daemon.get(f"/v1/sessions/{talk}/slices?limit=2")
    assert [s["to_turn"] for s in page["slices"]] == [3, 6]
    assert page["next_from_turn"] == 7
    last = await daemon.get(f"/v1/sessions/{talk}/slices?from_turn=7&limit=2")
    assert ([s["to_turn"] for s in last["slices"]], last["next_from_turn"]) == ([9, 12], None)

    base = str(daemon.http.make_url(""))
    async with AsyncClient(base) as client:
        assert [m.seq async for m in client.iter_messages(sid)] == list(range(1, 41))
        assert [s.to_turn for s in await client.slices(talk)] == [3, 6, 9, 12]

    def blocking() -> list[int]:
        with Client(base) as client:
            return [m.seq for m in client.iter_messages(sid)]

    assert await asyncio.to_thread(blocking) == list(range(1, 41))


ACME = "acme-token-0123456789"
BETA = "beta-token-0123456789"


async def _as(daemon: Daemon, token: str, method: str, path: str, body: object = None) -> tuple[int, dict[str, object]]:
    resp = await daemon.http.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})
    answer: dict[str, object] = await resp.json() if resp.content_type == "application/json" else {}
    return resp.status, answer


def _quota_error(answer: dict[str, object], setting: str) -> None:
    error = answer["error"]
    assert isinstance(error, dict)
    assert error["code"] == "quota_exceeded"
    assert setting in str(error["message"])


async def test_a_tenant_at_its_session_quota_opens_no_more_until_it_deletes_one(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """TENANT_MAX_SESSIONS=2: acme's third session is 409 `quota_exceeded` and is not created,
    while its two sessions still take messages and beta still opens its own two; once acme
    deletes one, a new one opens. The refusals are counted."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME},beta:{BETA}", "TENANT_MAX_SESSIONS": "2"}
    daemon = await make_daemon(env)
    first, second, third = new_sid(), new_sid(), new_sid()
    for sid in (first, second):
        assert (await _as(daemon, ACME, "POST", f"/v1/sessions/{sid}/messages", {"role": "user", "content": "hi"}))[
            0
        ] == 201
    status, answer = await _as(
        daemon, ACME, "POST", f"/v1/sessions/{third}/messages", {"role": "user", "content": "hi"}
    )
    assert status == 409
    _quota_error(answer, "TENANT_MAX_SESSIONS")
    batch = {"messages": [{"role": "user", "content": "hi"}]}
    assert (await _as(daemon, ACME, "POST", f"/v1/sessions/{third}/messages/batch", batch))[0] == 409
    assert (await _as(daemon, ACME, "GET", f"/v1/sessions/{third}"))[0] == 404
    assert (await _as(daemon, ACME, "POST", f"/v1/sessions/{first}/messages", {"role": "assistant", "content": "yo"}))[
        0
    ] == 201
    for _ in range(2):
        assert (
            await _as(daemon, BETA, "POST", f"/v1/sessions/{new_sid()}/messages", {"role": "user", "content": "hi"})
        )[0] == 201

    assert (await _as(daemon, ACME, "DELETE", f"/v1/sessions/{second}"))[0] in (200, 204)
    assert (await _as(daemon, ACME, "POST", f"/v1/sessions/{third}/messages", {"role": "user", "content": "hi"}))[
        0
    ] == 201
    metrics = await (await daemon.http.get("/metrics")).text()
    assert 'tiered_memory_quota_refusals_total{quota="sessions"} 2.0' in metrics


async def test_a_tenant_at_its_byte_quota_stores_nothing_more(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """TENANT_MAX_BYTES=36 (4 × 你好吗) over all of acme's sessions: the fifth message, in any of
    them, is 409 and stores nothing; a retry of a stored one is still answered; beta still stores its own 36."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME},beta:{BETA}", "TENANT_MAX_BYTES": "36"}
    daemon = await make_daemon(env)
    sids = [new_sid(), new_sid()]
    for n in range(4):
        body = {"role": "user", "content": "你好吗", "message_id": f"m{n}"}
        assert (await _as(daemon, ACME, "POST", f"/v1/sessions/{sids[n % 2]}/messages", body))[0] == 201
    status, answer = await _as(
        daemon, ACME, "POST", f"/v1/sessions/{sids[0]}/messages", {"role": "user", "content": "x"}
    )
    assert status == 409
    _quota_error(answer, "TENANT_MAX_BYTES")
    assert [await daemon.store.count_messages(SessionKey(f"acme/{sid}")) for sid in sids] == [2, 2]
    retry = {"role": "user", "content": "你好吗", "message_id": "m2"}
    assert (await _as(daemon, ACME, "POST", f"/v1/sessions/{sids[0]}/messages", retry))[0] == 200
    for _ in range(4):
        assert (
            await _as(daemon, BETA, "POST", f"/v1/sessions/{sids[0]}/messages", {"role": "user", "content": "你好吗"})
        )[0] == 201
    metrics = await (await daemon.http.get("/metrics")).text()
    assert 'tiered_memory_quota_refusals_total{quota="bytes"} 1.0' in metrics
