"""Load shedding (admission.py): past MAX_INFLIGHT_REQUESTS requests in progress, or past
MAX_INFLIGHT_PER_TENANT of one tenant's, a new one is refused at once with 503, Retry-After and a
body that says why; the probes and /metrics are still answered, and the refusals are counted. A
request whose body is still arriving holds no slot, and the time its body took is charged to its
rate. A request whose work runs past REQUEST_TIMEOUT_MS is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator

import sqlalchemy as sa

from tests.helpers.daemon import Daemon, MakeDaemon, new_sid
from tiered_memory.model import Caller


@contextlib.asynccontextmanager
async def _held(d: Daemon, key: str) -> AsyncIterator[None]:
    """The session's row locked by another connection, as a stuck transaction holds it: the
    daemon's writes to the session wait, in progress, until it lets go (SQLite locks the file:
    every write waits, reads go on)."""
    engine = d.store._engine
    if d.store.dialect == "sqlite":
        path = engine.url.database
        assert path is not None
        held = sqlite3.connect(path, isolation_level=None)
        held.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            held.execute("ROLLBACK")
            held.close()
        return
    async with engine.connect() as conn:
        transaction = await conn.begin()
        locking = sa.text("SELECT session_id FROM sessions WHERE session_id = :key FOR UPDATE")
        await conn.execute(locking, {"key": key})
        try:
            yield
        finally:
            await transaction.rollback()


async def _in_flight(d: Daemon, n: int) -> None:
    """Wait until `n` requests are in progress (the gauge says so)."""
    for _ in range(500):
        if f"tiered_memory_requests_in_flight {n:.1f}" in await (await d.http.get("/metrics")).text():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never {n} requests in progress")


def _append(d: Daemon, sid: str, text: str, tenant: str | None = None) -> asyncio.Task[int]:
    """An append in the background: its status when answered."""

    async def post() -> int:
        headers = {"X-Tenant": tenant} if tenant else {}
        body = {"role": "user", "content": text}
        resp = await d.http.post(f"/v1/sessions/{sid}/messages", json=body, headers=headers)
        await resp.read()
        return resp.status

    return asyncio.create_task(post())


async def test_a_request_past_the_limit_is_refused_at_once(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    d = await make_daemon(backend_env | {"MAX_INFLIGHT_REQUESTS": "1"})
    sid = new_sid()
    await d.post(sid, "user", "我想订一张去上海的火车票")
    await d.post(sid, "assistant", "好的，哪天出发？")
    async with _held(d, sid):
        # An append waiting on its session's row: the one request this process takes on.
        waiting = _append(d, sid, "还有卧铺吗？")
        await _in_flight(d, 1)
        refused = await d.http.get(f"/v1/sessions/{sid}/summary")
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "1"
        error = (await refused.json())["error"]
        assert error["code"] == "overloaded"
        assert "MAX_INFLIGHT_REQUESTS" in error["message"]
        assert (await d.http.get("/healthz")).status == 200
        metrics = await (await d.http.get("/metrics")).text()
        assert "tiered_memory_requests_shed_total 1.0" in metrics
        assert 'route="/v1/sessions/{session_id}/summary",status="503"' in metrics
    assert await asyncio.wait_for(waiting, timeout=20) == 201
    # Nothing was changed by the refused request, and the next one is served.
    assert (await d.get(f"/v1/sessions/{sid}/summary"))["turn_count"] == 1
    assert (await d.get(f"/v1/sessions/{sid}"))["message_count"] == 3


async def test_a_body_still_arriving_holds_no_slot(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """Three appends whose bodies drip in, with one slot: none of them holds it (the body is read
    before admission), so other requests are served meanwhile, and each append is served once
    its body is whole. Before, each dripping body held a slot until it was read."""
    d = await make_daemon(backend_env | {"MAX_INFLIGHT_REQUESTS": "1", "BODY_TIMEOUT_SECONDS": "20"})
    sid = new_sid()
    await d.post(sid, "user", "我想订一张去上海的火车票")
    server = d.http.server
    body = '{"role": "assistant", "content": "好的，哪天出发？"}'.encode()
    head = (
        f"POST /v1/sessions/{sid}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    dripping = []
    for _ in range(3):
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(head + body[:10])
        await writer.drain()
        dripping.append((reader, writer))
    await asyncio.sleep(0.3)
    assert "tiered_memory_requests_in_flight 0.0" in await (await d.http.get("/metrics")).text()
    for _ in range(3):
        assert (await d.http.get(f"/v1/sessions/{sid}/summary")).status == 200
    statuses = []
    for reader, writer in dripping:
        writer.write(body[10:])
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(1000), timeout=10)
        writer.close()
        statuses.append(answer.split(b" ", 2)[1])
    # The first is stored; the two others carry no message_id, so each is a message of its own.
    assert statuses == [b"201"] * 3
    assert (await d.get(f"/v1/sessions/{sid}"))["message_count"] == 4


async def test_one_tenant_holds_at_most_its_share_of_the_slots(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """MAX_INFLIGHT_PER_TENANT: a tenant with two requests in progress (stuck on its store) is
    refused a third at once, saying which limit, while another tenant is still served within the
    process's three slots; once they end, the tenant is served again."""
    d = await make_daemon(backend_env | {"MAX_INFLIGHT_REQUESTS": "3", "MAX_INFLIGHT_PER_TENANT": "2"})
    sid = new_sid()
    for tenant in ("acme", "globex"):
        resp = await d.http.post(
            f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "你好"}, headers={"X-Tenant": tenant}
        )
        assert resp.status == 201
    async with _held(d, Caller(tenant="acme").session_key(sid)):
        stuck = [_append(d, sid, f"第{i}条", tenant="acme") for i in range(2)]
        await _in_flight(d, 2)
        refused = await d.http.get(f"/v1/sessions/{sid}", headers={"X-Tenant": "acme"})
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "1"
        assert "MAX_INFLIGHT_PER_TENANT" in (await refused.json())["error"]["message"]
        other = await d.http.get(f"/v1/sessions/{sid}", headers={"X-Tenant": "globex"})
        assert other.status == 200, await other.text()
    assert [await asyncio.wait_for(t, timeout=20) for t in stuck] == [201, 201]
    again = await d.http.get(f"/v1/sessions/{sid}", headers={"X-Tenant": "acme"})
    assert (await again.json())["message_count"] == 3


async def test_the_time_a_body_took_is_charged_to_the_rate(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """A body that took two seconds to arrive counts two more against its tenant's rate: at one
    request a second, the tenant's next request a second after it is refused (429), where
    another tenant's, whose body came at once, is served."""
    d = await make_daemon(backend_env | {"RATE_LIMITS": "*=1/s", "BODY_TIMEOUT_SECONDS": "10"})
    sid = new_sid()
    server = d.http.server
    body = '{"role": "user", "content": "你好"}'.encode()
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        f"POST /v1/sessions/{sid}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Tenant: slow\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body[:5]
    )
    await writer.drain()
    await asyncio.sleep(2.2)
    writer.write(body[5:])
    answer = await asyncio.wait_for(reader.read(1000), timeout=10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 201"), answer[:200]
    calm = await d.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "你好"}, headers={"X-Tenant": "calm"}
    )
    assert calm.status == 201
    await asyncio.sleep(1.1)
    assert (await d.http.get(f"/v1/sessions/{sid}", headers={"X-Tenant": "calm"})).status == 200
    assert (await d.http.get(f"/v1/sessions/{sid}", headers={"X-Tenant": "slow"})).status == 429


async def test_a_request_past_its_deadline_is_cancelled_with_a_504(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """A request whose work is still waiting past REQUEST_TIMEOUT_MS (here an append waiting on
    its session's row, which a stuck transaction holds) is answered 504 `deadline_exceeded` in
    about the deadline. The write itself runs whole once the row is free (a commit is never cut
    in two), so the gateway's retry with the same message_id finds it: stored once."""
    d = await make_daemon(backend_env | {"REQUEST_TIMEOUT_MS": "500"})
    sid = new_sid()
    await d.post(sid, "user", "我想订一张去上海的火车票")
    body = {"role": "assistant", "content": "好的，哪天出发？", "message_id": "reply-1"}
    loop = asyncio.get_running_loop()
    async with _held(d, sid):
        started = loop.time()
        resp = await d.http.post(f"/v1/sessions/{sid}/messages", json=body)
        waited = loop.time() - started
        assert resp.status == 504, await resp.text()
        assert (await resp.json())["error"]["code"] == "deadline_exceeded"
    assert waited < 3
    for _ in range(100):
        retried = await d.http.post(f"/v1/sessions/{sid}/messages", json=body)
        if retried.status != 504:
            break
    assert retried.status in (200, 201), await retried.text()
    assert (await d.get(f"/v1/sessions/{sid}"))["message_count"] == 2
